"""``rangeshard dashboard`` end to end: a real etcd, the real command, a real headless Chromium.

The browser is Debian's ``chromium`` (``/usr/bin/chromium``, or ``$CHROMIUM``)
driven by the Python ``playwright`` package with ``executable_path``: no
browser build is downloaded. A missing browser or driver fails these tests
loudly; nothing here skips.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from PIL import Image, ImageChops
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright
from typer.testing import CliRunner

from hashing import MAX_HASH
from rangeshard.cli.main import app as cli_app
from rangeshard.core.etcd import EtcdClient, EtcdConfig
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import free_port, popen
from registry import Registry, State
from tests.helpers import MetricsServer, progress_metrics, wait_until

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

COLOURS = {  # the page's CSS variables, as computed styles report them
    "init": "rgb(59, 125, 216)",
    "locked": "rgb(217, 142, 4)",
    "wait": "rgb(142, 68, 201)",
    "active": "rgb(35, 145, 74)",
}


@dataclass
class Dashboard:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _start_dashboard(etcd_url: str, prefix: str, log: Path, *extra: str) -> Dashboard:
    port = free_port()
    cmd = [sys.executable, "-m", "rangeshard.cli.main", "--log-level", "info", "dashboard"]
    cmd += ["--etcd", etcd_url, "--port", str(port), "--prefix", prefix, *extra]
    with log.open("wb") as out:
        proc = popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    dash = Dashboard(f"http://127.0.0.1:{port}/", proc, log)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"dashboard exited with {proc.returncode}:\n{dash.log_text()}")
        try:
            return httpx.get(dash.url + "readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, timeout=20, message="dashboard /readyz")
    return dash


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def dashboard(etcd_server: EtcdServer, key_prefix: str, tmp_path: Path) -> Iterator[Dashboard]:
    dash = _start_dashboard(etcd_server.url, key_prefix, tmp_path / "dashboard.log")
    yield dash
    _stop(dash.proc)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.fail(f"headless Chromium not found at {chromium}: apt-get install -y chromium (or set $CHROMIUM)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        # A fresh profile directory (playwright passes it as --user-data-dir).
        b = p.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, timeout=30_000
        )
        try:
            yield b
        finally:
            b.close()


def _join(registry: Registry, client: EtcdClient, ctype: str, instance: str, workload: int) -> int:
    lease = client.grant_lease(60)
    registry.join(ctype, instance, lease, host="test-host", pid=4242, workload_num=workload)
    return lease


def _ring(dash: Dashboard) -> dict[str, object]:
    r = httpx.get(dash.url + "api/ring", timeout=5)
    assert r.status_code == 200
    doc: dict[str, object] = r.json()
    return doc


def _png(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def _changed_fraction(a: Image.Image, b: Image.Image) -> float:
    if a.size != b.size:
        return 1.0
    diff = ImageChops.difference(a, b).convert("L").point(lambda v: 255 if v > 16 else 0)
    hist = diff.histogram()
    return hist[255] / (a.size[0] * a.size[1])


def test_api_ring_and_events(dashboard: Dashboard, etcd_client: EtcdClient, key_prefix: str) -> None:
    """The JSON view is exact, and an event stream delivers each registry change."""
    reg = Registry(etcd_client, key_prefix)
    _join(reg, etcd_client, "replicaset", "rs-a", 7)

    def types() -> list[dict[str, object]]:
        doc = _ring(dashboard)
        assert doc["synced"] is True and doc["etcd"] == "ok" and doc["prefix"] == key_prefix
        assert doc["maxHash"] == MAX_HASH
        return doc["controllerTypes"]  # type: ignore[return-value]

    wait_until(lambda: len(types()) == 1, message="first instance in /api/ring")
    with httpx.Client(timeout=httpx.Timeout(10.0)) as http, http.stream("GET", dashboard.url + "api/events") as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.iter_lines()

        def next_ring() -> dict[str, object]:
            deadline = time.monotonic() + 10
            event = None
            for line in lines:  # a read blocks at most the client's 10 s timeout
                if time.monotonic() > deadline:
                    break
                if line.startswith("event: "):
                    event = line[len("event: ") :]
                elif line.startswith("data: ") and event == "ring":
                    doc: dict[str, object] = orjson.loads(line[len("data: ") :])
                    return doc
            raise AssertionError("no ring event within 10 s")

        first = next_ring()  # the current view, sent on connect
        assert [i["instanceId"] for i in first["controllerTypes"][0]["instances"]] == ["rs-a"]  # type: ignore[index]
        _join(reg, etcd_client, "replicaset", "rs-b", 3)
        doc = next_ring()
        while len(doc["controllerTypes"][0]["instances"]) < 2:  # type: ignore[index]
            doc = next_ring()
    insts = doc["controllerTypes"][0]["instances"]  # type: ignore[index]
    assert [i["instanceId"] for i in insts] == ["rs-b", "rs-a"]
    b, a = insts
    assert (b["rangeStart"], b["rangeEnd"]) == (0, 2**62 - 1)
    assert (a["rangeStart"], a["rangeEnd"]) == (2**62, MAX_HASH)
    assert b["rangeEndHex"] == "0x3fffffffffffffff" and a["rangeEndHex"] == "0x7fffffffffffffff"
    assert b["share"] == pytest.approx(0.5) and a["share"] == pytest.approx(0.5)
    assert b["isLocked"] is True and b["state"] == "locked" and b["giver"] == "rs-a"
    assert a["state"] == "init" and a["workloadNum"] == 7 and a["host"] == "test-host" and a["pid"] == 4242
    assert b["pinned"] is False and a["pinned"] is False
    # A pin (its own key, outside the record) shows in the ring as soon as it is written, and goes with unpin.
    reg.pin("replicaset", "rs-b")

    def pinned() -> dict[str, bool]:
        return {i["instanceId"]: i["pinned"] for i in types()[0]["instances"]}  # type: ignore[index]

    wait_until(lambda: pinned() == {"rs-b": True, "rs-a": False}, message="rs-b pinned in /api/ring")
    reg.unpin("replicaset", "rs-b")
    wait_until(lambda: pinned() == {"rs-b": False, "rs-a": False}, message="rs-b unpinned in /api/ring")


def test_page_draws_the_ring_live(
    dashboard: Dashboard, browser: BrowserContext, etcd_client: EtcdClient, key_prefix: str
) -> None:
    reg = Registry(etcd_client, key_prefix)
    leases = {
        "rs-a": _join(reg, etcd_client, "replicaset", "rs-a", 7),
        "rs-b": _join(reg, etcd_client, "replicaset", "rs-b", 3),
        "dep-a": _join(reg, etcd_client, "deployment", "dep-a", 11),
    }
    page: Page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    requests: list[str] = []
    page.on("request", lambda req: requests.append(req.url))
    console_errors: list[str] = []
    page.on("console", lambda msg: console_errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    try:
        page.goto(dashboard.url, wait_until="domcontentloaded")
        rs = page.locator('section.ctype[data-type="replicaset"]')
        segs = rs.locator(".bar .seg")
        expect(segs).to_have_count(2, timeout=15_000)
        expect(page.locator('section.ctype[data-type="deployment"] .bar .seg')).to_have_count(1)
        expect(page.get_by_test_id("conn")).to_have_text("live")
        expect(page.get_by_test_id("etcd")).to_have_text("etcd: ok")

        # Segments in hash order, labelled with workloadNum and id; colour by state; lock marker.
        expect(segs.nth(0)).to_have_attribute("data-instance", "rs-b")
        expect(segs.nth(1)).to_have_attribute("data-instance", "rs-a")
        expect(segs.nth(0).locator(".id")).to_have_text("rs-b")
        expect(segs.nth(0).locator(".wl")).to_have_text("3")
        expect(segs.nth(1).locator(".wl")).to_have_text("7")
        b_seg, a_seg = segs.nth(0), segs.nth(1)
        assert b_seg.evaluate("e => getComputedStyle(e).backgroundColor") == COLOURS["locked"]
        assert a_seg.evaluate("e => getComputedStyle(e).backgroundColor") == COLOURS["init"]
        expect(b_seg.locator(".lock")).to_be_visible()
        expect(a_seg.locator(".lock")).to_be_hidden()

        bar = rs.locator(".bar")
        page.wait_for_function(  # width transitions done: both halves equal
            """() => { const s = document.querySelectorAll('section[data-type="replicaset"] .seg');
                       return s.length === 2 && Math.abs(s[0].offsetWidth - s[1].offsetWidth) <= 2; }""",
            timeout=10_000,
        )
        before = _png(bar.screenshot(animations="disabled"))

        # Another instance joins: it splits rs-a's half (tie on size, rs-a has the higher workload).
        leases["rs-c"] = _join(reg, etcd_client, "replicaset", "rs-c", 1)
        expect(segs).to_have_count(3, timeout=10_000)
        expect(rs.locator('.seg[data-instance="rs-c"] .id')).to_have_text("rs-c")
        expect(rs.locator('tbody tr[data-instance="rs-c"]')).to_contain_text("locked")
        expect(segs.nth(1)).to_have_attribute("data-instance", "rs-c")
        page.wait_for_function(
            """() => { const s = [...document.querySelectorAll('section[data-type="replicaset"] .seg')];
                       if (s.length !== 3) return false;
                       const [b, c, a] = s.map(e => e.getBoundingClientRect().width);
                       return Math.abs(b - 2 * c) <= 4 && Math.abs(c - a) <= 3; }""",
            timeout=10_000,
        )
        widths = [box["width"] for box in (segs.nth(i).bounding_box() for i in range(3)) if box]
        bar_box = bar.bounding_box()
        assert bar_box is not None and len(widths) == 3
        assert sum(widths) == pytest.approx(bar_box["width"], abs=4)
        assert widths[0] == pytest.approx(bar_box["width"] / 2, abs=4)
        after = _png(bar.screenshot(animations="disabled"))
        changed = _changed_fraction(before, after)
        assert changed > 0.05, f"the bar looks the same after a join ({changed:.2%} of pixels changed)"

        # State and lock changes are drawn: rs-a unlocks rs-b and both become active.
        reg.unlock("replicaset", "rs-b", "rs-a")
        reg.heartbeat("replicaset", "rs-b", leases["rs-b"], state=State.ACTIVE)
        reg.heartbeat("replicaset", "rs-a", leases["rs-a"], state=State.ACTIVE, workload_num=42)
        expect(rs.locator('.seg[data-instance="rs-b"]')).to_have_attribute("data-locked", "false")
        expect(rs.locator('.seg[data-instance="rs-b"]')).to_have_attribute("data-state", "active")
        expect(rs.locator('.seg[data-instance="rs-a"] .wl')).to_have_text("42")
        expect(rs.locator('.seg[data-instance="rs-b"] .lock')).to_be_hidden()

        # A lease revoked (the instance left): its segment disappears, the neighbour takes the range.
        etcd_client.revoke_lease(leases.pop("rs-a"))
        expect(segs).to_have_count(2, timeout=10_000)
        expect(rs.locator('.seg[data-instance="rs-a"]')).to_have_count(0)

        assert all(u.startswith((dashboard.url, "data:")) for u in requests), (
            f"page fetched outside the dashboard: {requests}"
        )
        assert not console_errors, f"JavaScript errors: {console_errors}"
    finally:
        page.close()
        for lease in leases.values():
            etcd_client.revoke_lease(lease)


def test_stuck_instances_are_marked(
    browser: BrowserContext, etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str, tmp_path: Path
) -> None:
    """With --proxy, each instance's progress is in /api/ring and a stuck one is marked on its segment."""
    reg = Registry(etcd_client, key_prefix)
    leases = [_join(reg, etcd_client, "gadget", iid, 1) for iid in ("g-a", "g-b")]
    metrics = progress_metrics(("gadget", "g-a", 13, 84.0, 5.0), ("gadget", "g-b", None, 0.0, 120.0))
    with MetricsServer(metrics) as proxy:
        dash = _start_dashboard(
            etcd_server.url, key_prefix, tmp_path / "dashboard.log", "--proxy", proxy.url, "--state-dir", str(tmp_path)
        )
        page: Page = browser.new_page()
        try:

            def instances() -> dict[str, dict[str, object]]:
                doc = _ring(dash)
                types = doc["controllerTypes"]
                assert isinstance(types, list)
                found = {i["instanceId"]: i for t in types for i in t["instances"]}
                return found if all(i["progress"] is not None for i in found.values()) and len(found) == 2 else {}

            got = wait_until(instances, timeout=15, message="progress of both instances in /api/ring")
            assert got["g-a"]["progress"] == {
                "measurable": True,
                "unreconciled": 13,
                "oldestSeconds": 84.0,
                "stuck": True,
                "stuckAfterSeconds": 5.0,
            }
            assert got["g-a"]["progressText"] == "STUCK: 13 unanswered, oldest 84s (> 5s)"
            assert got["g-b"]["progressText"] == "not measurable"

            page.goto(dash.url, wait_until="domcontentloaded")
            seg = page.locator('section.ctype[data-type="gadget"] .seg[data-instance="g-a"]')
            expect(seg).to_have_attribute("data-stuck", "true", timeout=15_000)
            expect(seg.locator(".stk")).to_have_text("STUCK 13")
            expect(seg.locator(".stk")).to_be_visible()
            other = page.locator('section.ctype[data-type="gadget"] .seg[data-instance="g-b"]')
            expect(other).to_have_attribute("data-stuck", "false")
            expect(page.locator('tr[data-instance="g-b"] td.prog')).to_have_text("not measurable")

            proxy.text = progress_metrics(("gadget", "g-a", 0, 0.0, 5.0), ("gadget", "g-b", None, 0.0, 120.0))
            expect(seg).to_have_attribute("data-stuck", "false", timeout=15_000)
            expect(page.locator('tr[data-instance="g-a"] td.prog')).to_have_text("ok")
        finally:
            page.close()
            _stop(dash.proc)
            for lease in leases:
                etcd_client.revoke_lease(lease)


def test_etcd_outage_is_shown_and_recovers(etcd_server_factory: Callable[[], EtcdServer], tmp_path: Path) -> None:
    """While etcd is down the last known ring stays, marked unreachable; it recovers by itself."""
    etcd = etcd_server_factory()
    etcd.start()
    dash = _start_dashboard(etcd.url, "/outage", tmp_path / "dashboard.log")
    try:
        client = EtcdClient(EtcdConfig.from_urls(etcd.url))
        try:
            _join(Registry(client, "/outage"), client, "replicaset", "rs-a", 1)
        finally:
            client.close()

        def status() -> tuple[object, int]:
            doc = _ring(dash)
            types = doc["controllerTypes"]
            assert isinstance(types, list)
            return doc["etcd"], sum(len(t["instances"]) for t in types)

        wait_until(lambda: status() == ("ok", 1), timeout=10, message="the instance, etcd ok")
        etcd.stop()
        wait_until(lambda: status() == ("unreachable", 1), timeout=10, message="etcd unreachable, ring kept")
        etcd.start()
        wait_until(lambda: status() == ("ok", 1), timeout=15, message="etcd ok again")
    finally:
        _stop(dash.proc)


def test_sigterm_with_open_event_stream_exits_promptly(dashboard: Dashboard) -> None:
    """An open SSE connection must not hold up shutdown."""
    with httpx.Client(timeout=httpx.Timeout(10.0)) as http, http.stream("GET", dashboard.url + "api/events") as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())  # connected
        started = time.monotonic()
        dashboard.proc.send_signal(signal.SIGTERM)
        rc = dashboard.proc.wait(timeout=10)
        elapsed = time.monotonic() - started
    assert rc == 0, dashboard.log_text()
    assert elapsed < 3, f"shutdown took {elapsed:.1f}s with an event stream open"


def test_bad_options_exit_2(etcd_server: EtcdServer) -> None:
    runner = CliRunner()
    for extra, needle in ((["--port", "70000"], "--port"), (["--type", "Bad/Type"], "--type")):
        r = runner.invoke(cli_app, ["dashboard", "--etcd", etcd_server.url, *extra])
        assert r.exit_code == 2, r.output
        assert needle in r.output and "Traceback" not in r.output
