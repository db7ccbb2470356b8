"""One behaviour for list options: the local API server and the proxy in front of it answer alike (kube's).

Both parse collection GETs with rangeshard.core.listoptions.ListQuery. Before,
the proxy accepted ``watch=t`` and the API server did not, and a bad
``resourceVersionMatch`` got 422 from one and 400 from the other.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from range_filter_proxy.process import ProxyProcess
from rangeshard.core.listoptions import ListQuery

PODS = "/api/v1/namespaces/default/pods"

INVALID = [  # 422 Invalid, kind ListOptions, the field named
    ({"resourceVersionMatch": "Exact"}, "resourceVersionMatch", "forbidden unless resourceVersion is provided"),
    ({"resourceVersion": "5", "resourceVersionMatch": "Sometimes"}, "resourceVersionMatch", "Unsupported value"),
    ({"resourceVersion": "0", "resourceVersionMatch": "Exact"}, "resourceVersionMatch", 'for resourceVersion "0"'),
    ({"watch": "1", "resourceVersion": "5", "resourceVersionMatch": "Exact"}, "resourceVersionMatch", "for watch"),
    ({"sendInitialEvents": "true"}, "sendInitialEvents", "forbidden for list"),
    ({"watch": "t", "sendInitialEvents": "true"}, "resourceVersionMatch", "to NotOlderThan"),
    (
        {"watch": "T", "sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"},
        "allowWatchBookmarks",
        "allowWatchBookmarks to true",
    ),
]

BAD = [  # 400 BadRequest
    {"watch": "yes"},
    {"watch": "on"},
    {"allowWatchBookmarks": "maybe"},
    {"limit": "-1"},
    {"limit": "²"},
    {"watch": "1", "timeoutSeconds": "2.5"},
    {"continue": "abc", "resourceVersion": "7"},
]


def _both(local_apiserver: Any, proxy: ProxyProcess) -> list[str]:
    return [local_apiserver.url, proxy.url]


@pytest.mark.parametrize(("params", "field", "needle"), INVALID)
def test_forbidden_combinations_are_422_listoptions_from_both(
    local_apiserver: Any, proxy: ProxyProcess, params: dict[str, str], field: str, needle: str
) -> None:
    for url in _both(local_apiserver, proxy):
        resp = httpx.get(url + PODS, params=params, timeout=10)
        assert resp.status_code == 422, (url, resp.text)
        status = resp.json()
        assert status["reason"] == "Invalid" and needle in status["message"], (url, status)
        assert status["details"]["kind"] == "ListOptions" and status["details"]["group"] == "meta.k8s.io"
        assert status["details"]["causes"][0]["field"] == field


@pytest.mark.parametrize("params", BAD)
def test_unparsable_values_are_400_from_both(local_apiserver: Any, proxy: ProxyProcess, params: dict[str, str]) -> None:
    for url in _both(local_apiserver, proxy):
        resp = httpx.get(url + PODS, params=params, timeout=10)
        assert resp.status_code == 400, (url, resp.text)
        assert resp.json()["reason"] == "BadRequest"


@pytest.mark.parametrize("spelling", ["t", "T", "TRUE", "True", "1"])
def test_go_booleans_open_a_watch_on_both(local_apiserver: Any, proxy: ProxyProcess, spelling: str) -> None:
    for url in _both(local_apiserver, proxy):
        with httpx.stream("GET", url + PODS, params={"watch": spelling, "timeoutSeconds": "1"}, timeout=10) as resp:
            assert resp.status_code == 200, url
            assert resp.headers["content-type"].startswith("application/json")
            resp.read()  # the watch ends after its 1 s timeout


@pytest.mark.parametrize("spelling", ["f", "F", "FALSE", "False", "0", ""])
def test_go_false_spellings_are_a_list(local_apiserver: Any, proxy: ProxyProcess, spelling: str) -> None:
    for url in _both(local_apiserver, proxy):
        resp = httpx.get(url + PODS, params={"watch": spelling}, timeout=10)
        assert resp.status_code == 200 and resp.json()["kind"] == "PodList", url


def test_list_query_values() -> None:
    q = ListQuery.parse({"watch": "t", "timeoutSeconds": "999999999", "limit": "0", "allowWatchBookmarks": "1"})
    assert q.watch and q.allow_watch_bookmarks and q.limit is None
    assert q.timeout_seconds == 86_400  # capped
    assert ListQuery.parse({}, watch_path=True).watch
    assert ListQuery.parse({"continue": "x", "resourceVersion": "0"}).continue_token == "x"
