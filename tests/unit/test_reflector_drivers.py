"""The proxy's watch cache loop and the manager's informer drive the same reflector, and decide alike.

One script of answers (a list in two pages, a watch that brings one event
and then 410, a relist, a watch that fails with 500, a relist after the
backoff) is played to each driver: the proxy's :func:`reflect` (asyncio)
and the :class:`Informer` (a thread). Both must send the same requests and
take the same decisions, and those decisions are made by one class,
:class:`rangeshard.core.reflector.Reflector` (spied on here).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

import controller_manager.informer as informer_module
from controller_manager.informer import Informer
from controller_manager.resources import REPLICASETS
from hashing import MAX_HASH, UID_PATH, HashRange
from range_filter_proxy.cached import CachedObject, CacheSettings
from range_filter_proxy.errors import UpstreamError, UpstreamGone
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.reflector import reflect
from range_filter_proxy.upstream import ListResult, Upstream
from range_filter_proxy.watchstream import WatchEvent
from rangeshard.core import reflector as core
from rangeshard.core.rest import GVR
from tests.range_filter_proxy.fakes import INFOS, PODS


def obj(name: str, rv: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "ns", "uid": name, "resourceVersion": rv},
    }


#: What the server answers, in order: ("list", items, rv, continue) or ("watch", events, error code or None).
SCRIPT: list[tuple[Any, ...]] = [
    ("list", [obj("a", "5"), obj("b", "6")], "10", "c1"),
    ("list", [obj("c", "7")], "10", None),
    ("watch", [obj("a", "11")], 410),
    ("list", [obj("a", "11")], "20", None),
    ("watch", [], 500),
    ("list", [obj("a", "11")], "21", None),
]
#: The requests both drivers must send for it (the last list's watch is where the test stops).
EXPECTED = [
    ("list", {"limit": "500"}),
    ("list", {"limit": "500", "continue": "c1"}),
    ("watch", "10"),
    ("list", {"limit": "500"}),
    ("watch", "20"),
    ("list", {"limit": "500"}),
    ("watch", "21"),
]
#: The reflector's decisions for it.
DECISIONS = [
    ("page", core.Phase.LIST),
    ("page", core.Phase.WATCH),
    ("failed", core.Phase.LIST),
    ("page", core.Phase.WATCH),
    ("failed", core.Phase.WAIT),
    ("page", core.Phase.WATCH),
]


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, core.Phase]]:
    """Records what every :class:`Reflector` decides (both drivers' instances: it is one class)."""
    seen: list[tuple[str, core.Phase]] = []
    for name in ("page", "failed", "watch_ended"):
        real: Callable[..., core.Phase] = getattr(core.Reflector, name)

        def spy(self: core.Reflector, *args: Any, _real: Callable[..., core.Phase] = real, _n: str = name) -> Any:
            phase = _real(self, *args)
            seen.append((_n, phase))
            return phase

        monkeypatch.setattr(core.Reflector, name, spy)
    return seen


class _ScriptedUpstream(Upstream):
    def __init__(self) -> None:
        self.requests: list[tuple[str, Any]] = []
        self.done = asyncio.Event()

    async def list(self, gvr: GVR, params: Mapping[str, str] | None = None) -> ListResult:
        self.requests.append(("list", dict(params or {})))
        _, items, rv, token = SCRIPT[len(self.requests) - 1]
        return ListResult(items, rv, token)

    async def watch_apply(self, gvr: GVR, resource_version: str, apply: Callable[[WatchEvent], None]) -> int:
        self.requests.append(("watch", resource_version))
        if len(self.requests) > len(SCRIPT):
            self.done.set()
            await asyncio.Event().wait()  # the test cancels the loop here
        _, events, code = SCRIPT[len(self.requests) - 1]
        for o in events:
            apply(WatchEvent("MODIFIED", o))
        raise UpstreamGone("too old") if code == 410 else UpstreamError("boom", code)


class _Target:
    info = INFOS[PODS]
    rv = 0

    def install(self, objects: dict[tuple[str, str], CachedObject], resource_version: str) -> None:
        self.rv = int(resource_version)

    def apply(self, event: WatchEvent) -> None:
        self.rv = int(event.object["metadata"]["resourceVersion"])

    def vanished(self, reason: str) -> bool:
        return False


def test_the_proxy_loop_drives_the_reflector(decisions: list[tuple[str, core.Phase]]) -> None:
    async def run() -> list[tuple[str, Any]]:
        up = _ScriptedUpstream()
        task = asyncio.create_task(reflect(_Target(), up, ProxyMetrics(), CacheSettings()))
        await asyncio.wait_for(up.done.wait(), 10)
        task.cancel()
        return up.requests

    assert asyncio.run(run()) == EXPECTED
    assert decisions == DECISIONS


class _Resp:
    def __init__(self, status: int, data: bytes = b"", lines: list[str] | None = None) -> None:
        self.status, self.data, self.lines = status, data, lines or []

    def release_conn(self) -> None: ...
    def close(self) -> None: ...


def test_the_informer_drives_the_same_reflector(
    decisions: list[tuple[str, core.Phase]], monkeypatch: pytest.MonkeyPatch
) -> None:
    requests: list[tuple[str, Any]] = []
    done = threading.Event()
    monkeypatch.setattr(informer_module, "_iter_lines", lambda resp: iter(resp.lines))
    informer = Informer(
        None,
        REPLICASETS,
        path=UID_PATH,
        range_source=lambda: (1, HashRange(0, MAX_HASH)),
        on_event=lambda kind, o: None,
        name="t",
    )

    def get(selector: str, timeout: Any, **params: Any) -> _Resp:
        if params.get("watch"):
            requests.append(("watch", params["resourceVersion"]))
            if len(requests) > len(SCRIPT):
                done.set()
                informer._stop.set()
                raise ConnectionError("the test is over")
            _, events, code = SCRIPT[len(requests) - 1]
            lines = [json.dumps({"type": "MODIFIED", "object": o}) for o in events]
            if code == 410:
                return _Resp(200, lines=[*lines, json.dumps({"type": "ERROR", "object": {"code": 410}})])
            return _Resp(code, b"boom")
        requests.append(("list", {k: v for k, v in params.items() if v}))
        _, items, rv, token = SCRIPT[len(requests) - 1]
        return _Resp(200, json.dumps({"items": items, "metadata": {"resourceVersion": rv, "continue": token}}).encode())

    monkeypatch.setattr(informer, "_get", get)
    informer.start()
    assert done.wait(10)
    informer.stop()
    # The informer's first page of a list also says what it is not older than (controller_manager.freshness):
    # nothing seen yet is any version, later the highest version it saw; the reflector's requests are the same.
    floors = [p.pop("resourceVersion", None) for kind, p in requests if kind == "list" and "continue" not in p]
    matches = {p.pop("resourceVersionMatch", None) for kind, p in requests if kind == "list"}
    assert requests == EXPECTED
    assert floors == ["0", "11", "20"]
    assert matches == {None, "NotOlderThan"}
    assert decisions[: len(DECISIONS)] == DECISIONS
