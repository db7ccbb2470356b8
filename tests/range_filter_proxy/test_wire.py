"""The fast watch-line decoder (``range_filter_proxy.wire``) agrees with the general one, or steps aside.

* For generated objects (labels, owner references with and without a
  controller, namespaced or not, unknown members anywhere), the cached object
  built from the fast path equals the one built from the fully decoded dict:
  bytes, hashes, resourceVersion, namespace, name, labels.
* A line in kube-apiserver's exact encoding is kept whole: the cache stores
  no copy of the object and sends that line itself to watchers of its type;
  other line ends keep the object bytes and build the line.
* Every line the fast path cannot vouch for (a wrong type anywhere it reads,
  an extra top-level member, a missing kind, BOOKMARK/ERROR, broken JSON) goes
  to the general path and gets exactly its answer or error.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hashing import ObjectHashes
from range_filter_proxy.cache import WatchCache
from range_filter_proxy.cached import CachedEvent, CachedObject, CacheSettings
from range_filter_proxy.errors import UpstreamError, UpstreamGone
from range_filter_proxy.metrics import ProxyMetrics
from range_filter_proxy.upstream import ListResult
from range_filter_proxy.watchstream import WatchEvent, decode_watch_line
from range_filter_proxy.wire import decode_line
from rangeshard.core.http1 import LineSplitter
from tests.range_filter_proxy.fakes import INFOS, PODS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test

POD = INFOS[PODS]

_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_UID = st.uuids().map(str)
_INT = st.integers(-(2**63), 2**63 - 1)
_OWNER = st.fixed_dictionaries(
    {"apiVersion": st.just("apps/v1"), "kind": st.just("ReplicaSet"), "name": _TEXT, "uid": _UID},
    optional={"controller": st.booleans(), "blockOwnerDeletion": st.booleans()},
)
_META = st.fixed_dictionaries(
    {"name": _TEXT, "resourceVersion": st.integers(1, 10**12).map(str)},
    optional={
        "namespace": _TEXT,
        "uid": _UID,
        "labels": st.dictionaries(_TEXT, _TEXT, max_size=4),
        "annotations": st.dictionaries(_TEXT, _TEXT, max_size=3),
        "ownerReferences": st.lists(_OWNER, max_size=3),
        "finalizers": st.lists(_TEXT, max_size=2),
        "generation": st.integers(0, 10**6),
    },
)
_OBJECT = st.fixed_dictionaries(
    {"apiVersion": st.just("v1"), "kind": st.just("Pod"), "metadata": _META},
    optional={
        "spec": st.dictionaries(_TEXT, _INT | _TEXT | st.lists(_INT, max_size=3), max_size=4),
        "status": st.fixed_dictionaries({"phase": _TEXT}),
    },
)


def _line(etype: str, obj: Any) -> bytes:
    return b'{"type":"' + etype.encode() + b'","object":' + orjson.dumps(obj) + b"}"


def _fields(o: CachedObject) -> tuple[Any, ...]:
    return (o.raw, o.hashes, o.rv, o.namespace, o.name, dict(o.labels))


@settings(max_examples=300, deadline=None)
@given(obj=_OBJECT, etype=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
def test_fast_path_builds_the_same_cached_object(obj: dict[str, Any], etype: str) -> None:
    line = _line(etype, obj)
    ev = decode_watch_line(line, "w")
    assert ev.wire is not None, "a kube-apiserver line of an object event takes the fast path"
    assert ev.type == etype and ev.raw == orjson.dumps(obj)
    fast = CachedObject.from_wire(ev.wire, ev.raw, POD)
    general = CachedObject.build(orjson.loads(line)["object"], POD, ev.raw)
    assert _fields(fast) == _fields(general)
    assert fast.hashes == ObjectHashes.of(obj)
    # The dict is still there for whoever asks (decoded from the bytes on first use).
    assert ev.object == obj


def test_previous_version_lends_labels_and_hashes() -> None:
    meta = {"name": "a", "namespace": "ns", "uid": "u-1", "resourceVersion": "1", "labels": {"app": "x"}}
    first = CachedObject.from_wire(_wire({"kind": "Pod", "apiVersion": "v1", "metadata": meta}), b"{}", POD)
    second = CachedObject.from_wire(
        _wire({"kind": "Pod", "apiVersion": "v1", "metadata": {**meta, "resourceVersion": "2"}}), b"{}", POD, first
    )
    assert second.labels is first.labels and second.hashes is first.hashes and second.rv == 2
    relabelled = CachedObject.from_wire(
        _wire({"kind": "Pod", "apiVersion": "v1", "metadata": {**meta, "resourceVersion": "3", "labels": {}}}),
        b"{}",
        POD,
        second,
    )
    assert dict(relabelled.labels) == {}


def _wire(obj: dict[str, Any]) -> Any:
    decoded = decode_line(_line("ADDED", obj))
    assert decoded is not None
    return decoded.object


_POD_META = {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "5"}


@pytest.mark.parametrize(
    "line",
    [
        # Types the structs do not read as such: the general path's lenient reading applies.
        _line("ADDED", {"kind": "Pod", "apiVersion": "v1", "metadata": {**_POD_META, "labels": {"n": 1}}}),
        _line("ADDED", {"kind": "Pod", "apiVersion": "v1", "metadata": {**_POD_META, "resourceVersion": 5}}),
        _line(
            "ADDED",
            {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {**_POD_META, "ownerReferences": [{"uid": "o", "controller": "true"}]},
            },
        ),
        _line("ADDED", {"kind": "Pod", "apiVersion": "v1", "metadata": {**_POD_META, "namespace": None}}),
        # No kind: the general path fills it in and re-encodes.
        _line("ADDED", {"apiVersion": "v1", "metadata": _POD_META}),
        # Not exactly {"type","object"}.
        b'{"type":"ADDED","object":'
        + orjson.dumps({"kind": "Pod", "apiVersion": "v1", "metadata": _POD_META})
        + b',"x":1}',
        b'{"type": "ADDED", "object": '
        + orjson.dumps({"kind": "Pod", "apiVersion": "v1", "metadata": _POD_META})
        + b"}",
        # Not an object event.
        b'{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}',
    ],
)
def test_lines_the_fast_path_does_not_vouch_for_take_the_general_path(line: bytes) -> None:
    ev = decode_watch_line(line, "w")
    assert ev.wire is None
    assert ev.object == orjson.loads(line)["object"]


def test_general_path_reads_a_wrongly_typed_controller_flag_as_no_controller() -> None:
    obj = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {**_POD_META, "ownerReferences": [{"uid": "o", "controller": "true"}]},
    }
    ev = decode_watch_line(_line("MODIFIED", obj), "w")
    built = CachedObject.build(ev.object, POD, ev.raw)
    assert built.hashes.owner is None and built.hashes == ObjectHashes.of_fields("u", "ns", None)


@pytest.mark.parametrize(
    ("line", "error", "text"),
    [
        (b'{"type":"ADDED","object":{"kind":"Pod"', UpstreamError, "undecodable"),
        (b'{"type":"ADDED","object":[1]}', UpstreamError, "malformed"),
        (
            b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"code":410,"message":"old"}}',
            UpstreamGone,
            "old",
        ),
        (
            b'{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"code":500,"message":"x"}}',
            UpstreamError,
            "x",
        ),
    ],
)
def test_errors_are_the_general_paths(line: bytes, error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        decode_watch_line(line, "watch pods")


def test_bad_resource_version_is_an_upstream_error_naming_the_object() -> None:
    line = _line("ADDED", {"kind": "Pod", "apiVersion": "v1", "metadata": {**_POD_META, "resourceVersion": "x1"}})
    ev = decode_watch_line(line, "w")
    assert ev.wire is not None and ev.raw is not None
    with pytest.raises(UpstreamError, match="'a'"):
        CachedObject.from_wire(ev.wire, ev.raw, POD)


def test_watch_event_needs_an_object_or_bytes_and_metadata() -> None:
    with pytest.raises(ValueError, match="needs its object"):
        WatchEvent("ADDED")
    assert WatchEvent("ADDED", {"metadata": {"name": "n"}}).object == {"metadata": {"name": "n"}}
    assert "name='a'" in repr(
        decode_watch_line(_line("ADDED", {"kind": "Pod", "apiVersion": "v1", "metadata": _POD_META}), "w")
    )


# ---- the upstream's line kept whole: no copy of the object, the line passed on as it came ------------------


def test_line_split_keeps_line_ends_and_only_lf_ends_a_line() -> None:
    lines = LineSplitter(1 << 20)
    assert lines.split([b'{"a":1}\n{"b"', b':2}\r\n\n  \n{"c":\r3}\n{"d"']) == [
        b'{"a":1}\n',
        b'{"b":2}\r\n',
        b'{"c":\r3}\n',
    ]
    assert lines.split([b":4}"]) == []
    assert lines.rest() == b'{"d":4}'


@async_test()
async def test_a_canonical_line_is_stored_once_and_sent_as_it_came() -> None:
    obj = {"kind": "Pod", "apiVersion": "v1", "metadata": {**_POD_META, "resourceVersion": "7"}}
    line = _line("MODIFIED", obj) + b"\n"
    ev = decode_watch_line(line, "w")
    assert ev.wire is not None and ev.line_type == "MODIFIED" and ev.data is line
    assert ev.raw == orjson.dumps(obj) and ev.object == obj
    cache = WatchCache(POD, FakeUpstream(), ProxyMetrics(), CacheSettings())
    cache.replace(ListResult([{**obj, "metadata": {**obj["metadata"], "resourceVersion": "6"}}], "6"))
    cache.apply(ev)
    stored = cache.objects[("ns", "a")]
    assert stored.data is line and bytes(stored.raw) == orjson.dumps(obj)
    event = cache.history[-1]
    assert event.line("MODIFIED") is line, "the upstream's line itself, not a copy"
    assert event.line("ADDED") == b'{"type":"ADDED","object":' + orjson.dumps(obj) + b"}\n"
    assert orjson.loads(stored.at_rv(9))["metadata"]["resourceVersion"] == "9"


@pytest.mark.parametrize("end", [b"}", b"} \r\n", b"}\r\n"])
def test_other_line_ends_keep_the_object_but_build_the_line(end: bytes) -> None:
    obj = {"kind": "Pod", "apiVersion": "v1", "metadata": _POD_META}
    line = _line("ADDED", obj)[:-1] + end
    ev = decode_watch_line(line, "w")
    assert ev.wire is not None and ev.line_type is None and ev.raw == orjson.dumps(obj)
    built = CachedObject.from_wire(ev.wire, ev.data or b"", POD, start=ev.start, end=ev.end)
    assert built.raw == orjson.dumps(obj)
    assert CachedEvent.of("ADDED", 5, built, None, 0.0).line("ADDED") == _line("ADDED", obj) + b"\n"
