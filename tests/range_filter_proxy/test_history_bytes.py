"""The event history is bounded by bytes as well as by events and seconds (issue 49: ``--history-max-bytes``).

The byte bound wins over both minimums (``history_events``, ``history_seconds``):
the oldest events go until the history's bytes (each event's object bytes plus
a fixed overhead) fit; a watch from before the window gets 410, one inside it
replays; the bytes are exported as gauges and reset by a relist. The flag
rejects a bound below 1 with a clear error.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from range_filter_proxy.cached import EVENT_OVERHEAD_BYTES, CacheSettings, WatchFilter, event_bytes
from range_filter_proxy.cli import ProxyFlags, proxy_settings
from range_filter_proxy.errors import UpstreamUnavailable
from tests.range_filter_proxy.fakes import PODS, FakeUpstream
from tests.range_filter_proxy.helpers import async_test, eventually
from tests.range_filter_proxy.test_cache import _drain, _metric, _names, _started, _take

BIG = "x" * 4000  # ~4 KiB per event, like a real pod


@async_test()
async def test_the_history_keeps_no_more_bytes_than_its_bound_whatever_the_minimums_say() -> None:
    fake = FakeUpstream()
    # Minimums that alone would keep everything (10,000 events, an hour); the byte bound: ~5 events.
    cache, metrics = await _started(fake, history_events=10_000, history_seconds=3600)
    start = cache.rv
    fake.create(PODS, "p0", spec={"blob": BIG})
    await eventually(lambda: len(cache.objects) == 1)
    size = event_bytes(cache.history[-1])
    assert size > 4000 + EVENT_OVERHEAD_BYTES
    bound = cache.settings.history_max_bytes = 5 * size  # every event of p0..p9 has this size
    for i in range(1, 12):
        fake.create(PODS, f"p{i}", spec={"blob": BIG})
    await eventually(lambda: len(cache.objects) == 12)
    sizes = [event_bytes(ev) for ev in cache.history]
    assert sum(sizes) == cache.history_bytes <= bound
    assert len(cache.history) in (4, 5)  # the newest that fit (p10 and p11 are a byte longer than p0..p9)
    assert cache.history_bytes + size > bound  # one more would not
    kept = len(cache.history)
    assert [ev.cur.name for ev in cache.history] == [f"p{i}" for i in range(12 - kept, 12)]
    assert _metric(metrics, "range_filter_proxy_history_events", resource="pods") == kept
    assert _metric(metrics, "range_filter_proxy_history_bytes", resource="pods") == cache.history_bytes
    # A watch from before the window: 410; from inside it: the rest.
    old = cache.add_watcher(WatchFilter(), resume_from=start, bookmarks=False, initial_events_end=False, timeout=None)
    events = await _drain(old.stream())
    assert [e["type"] for e in events] == ["ERROR"] and events[0]["object"]["code"] == 410
    inside = cache.history[-3].rv
    w = cache.add_watcher(WatchFilter(), resume_from=inside, bookmarks=False, initial_events_end=False, timeout=None)
    assert _names(await _take(w, 2)) == [("ADDED", "p10"), ("ADDED", "p11")]
    # Small events: the event minimum governs again only under the byte bound.
    for i in range(12):
        fake.update(PODS, f"p{i}", spec={})
    await eventually(lambda: cache.history[-1].cur.name == "p11" and cache.history[-1].rv == fake.rv)
    assert cache.history_bytes <= bound
    assert sum(event_bytes(ev) for ev in cache.history) == cache.history_bytes
    # A relist clears the history and its bytes.
    fake.disconnect(PODS, UpstreamUnavailable("connection reset"))
    await eventually(lambda: _metric(metrics, "range_filter_proxy_relists_total", resource="pods") == 2)
    assert not cache.history and cache.history_bytes == 0
    assert _metric(metrics, "range_filter_proxy_history_bytes", resource="pods") == 0
    await cache.stop()


def test_the_default_bound_and_the_flag() -> None:
    assert CacheSettings().history_max_bytes == 64 * 1024 * 1024
    assert ProxyFlags.model_validate({"upstream": "http://127.0.0.1:9"}).history_max_bytes == 64 * 1024 * 1024
    flags = ProxyFlags.model_validate({"upstream": "http://127.0.0.1:9", "history_max_bytes": 1 << 20})
    assert proxy_settings(flags).settings.history_max_bytes == 1 << 20
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        ProxyFlags.model_validate({"upstream": "http://127.0.0.1:9", "history_max_bytes": 0})


def test_the_command_names_a_bad_bound() -> None:
    from rangeshard.cli.main import app  # noqa: PLC0415

    result = CliRunner().invoke(app, ["proxy", "--upstream", "http://127.0.0.1:9", "--history-max-bytes", "-5"])
    assert result.exit_code == 2
    assert "--history-max-bytes: Input should be greater than or equal to 1" in result.output
    assert "Traceback" not in result.output
