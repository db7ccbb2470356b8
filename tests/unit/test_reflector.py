"""The one reflector (rangeshard.core.reflector), sans I/O: paged lists, watch from the list's RV, 410, backoff."""

from __future__ import annotations

import pytest

from rangeshard.core.backoff import Backoff
from rangeshard.core.reflector import LIST_PAGE_SIZE, Phase, Reflector, ReflectorError


def reflector(**kw: int) -> Reflector:
    return Reflector(Backoff(0.5, 4.0), **kw)


def test_a_paged_list_carries_each_continue_token_then_watches_from_the_first_pages_rv() -> None:
    r = reflector(page_size=2)
    assert r.phase is Phase.LIST
    assert r.list_params() == {"limit": "2"}
    assert r.page("10", "c1") is Phase.LIST
    assert r.list_params() == {"limit": "2", "continue": "c1"}
    assert r.page("", "c2") is Phase.LIST
    assert r.list_params() == {"limit": "2", "continue": "c2"}
    assert r.page("11", None) is Phase.WATCH
    assert r.resource_version == "10"


def test_an_unpaged_answer_is_the_whole_list() -> None:
    r = reflector()
    assert r.list_params() == {"limit": str(LIST_PAGE_SIZE)}
    assert r.page("7", None) is Phase.WATCH
    assert r.resource_version == "7"


def test_a_list_of_more_pages_than_the_bound_fails() -> None:
    r = reflector(max_pages=3)
    r.page("1", "a")
    r.page("1", "b")
    with pytest.raises(ReflectorError, match="more than 3 list pages"):
        r.page("1", "c")


def test_a_clean_watch_end_rewatches_from_the_last_rv_seen() -> None:
    r = reflector()
    r.page("10", None)
    assert r.watch_ended(5, 60.0, "42") is Phase.WATCH
    assert r.resource_version == "42"
    assert r.watch_ended(0, 60.0) is Phase.WATCH  # a long quiet watch that timed out: fine
    assert r.resource_version == "42"


def test_a_watch_that_ends_at_once_without_a_line_is_a_failure() -> None:
    r = reflector()
    r.page("10", None)
    assert r.watch_ended(0, 0.1, "10") is Phase.WAIT
    assert r.delay == 0.5
    r.relist()
    r.page("10", None)
    assert r.watch_ended(1, 0.1, "11") is Phase.WATCH  # a quick end after a line is a clean end


def test_410_while_watching_relists_at_once_from_the_first_page() -> None:
    r = reflector(page_size=2)
    r.page("10", "c1")
    r.page("10", None)
    assert r.failed(410) is Phase.LIST
    assert r.list_params() == {"limit": "2"}
    assert r.backoff.failures == 0
    assert r.page("20", None) is Phase.WATCH
    assert r.resource_version == "20"


def test_410_while_listing_an_expired_continue_is_backed_off() -> None:
    r = reflector(page_size=2)
    r.page("10", "c1")
    assert r.failed(410) is Phase.WAIT
    assert r.delay == 0.5
    r.relist()
    assert r.list_params() == {"limit": "2"}


def test_failures_back_off_and_a_successful_list_resets_the_backoff() -> None:
    r = reflector()
    delays = []
    for _ in range(5):
        assert r.failed(500) is Phase.WAIT
        delays.append(r.delay)
        r.relist()
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]
    r.page("1", None)
    assert r.failed() is Phase.WAIT
    assert r.delay == 0.5


def test_relist_forgets_a_half_read_list() -> None:
    r = reflector(page_size=2)
    r.page("10", "c1")
    r.relist()
    assert r.list_params() == {"limit": "2"}
    assert r.page("30", None) is Phase.WATCH
    assert r.resource_version == "30"
