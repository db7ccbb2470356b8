"""Every retry loop takes its waits from the one Backoff; the policies its docstring lists are the ones in use.

The policies of the loops that are not tested through their loop elsewhere:
the local API server's garbage collector retrying one item and the
registry's transactions after a lost race.
"""

from __future__ import annotations

from local_apiserver.gc import _MAX_ATTEMPTS, _Work
from local_apiserver.resources import RESOURCES
from rangeshard.core.backoff import Backoff
from registry.registry import _race_backoff


def test_a_garbage_collection_item_is_retried_after_growing_waits() -> None:
    work = _Work("owner_gone", RESOURCES[0], {"metadata": {"name": "x"}})
    assert isinstance(work.retry, Backoff)
    delays = [work.retry.next_delay() for _ in range(_MAX_ATTEMPTS - 1)]
    assert delays[:6] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    # Each item has its own: another item's failures do not lengthen this one's first wait.
    assert _Work("owner_gone", RESOURCES[0], {"metadata": {"name": "y"}}).retry.next_delay() == 0.5


def test_lost_registry_races_pause_briefly_growing_and_spread() -> None:
    pauses = [_race_backoff() for _ in range(50)]
    firsts = [p.next_delay() for p in pauses]
    assert all(0.001 <= d <= 0.019 for d in firsts)
    assert len(set(firsts)) > 40  # jittered: racing writers do not retry in step
    one = _race_backoff()
    later = [one.next_delay() for _ in range(10)][-1]
    assert 0.01 <= later <= 0.19  # at most 0.1 +- 90 %
