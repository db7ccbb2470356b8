"""Liveness probes of external controllers (issue 38, item 1): the kubelet's rules, probe by probe.

* ``httpGet``: 200..399 passes (a redirect is not followed and passes), any
  other status fails with its body in the answer, so does a refused
  connection; a server that does not answer fails after ``timeoutSeconds``;
  HTTPS is not verified (a self-signed certificate passes).
* ``exec``: exit code 0 passes; another code fails with the output; a
  command that outlives ``timeoutSeconds`` is killed with everything it started.
* The count (:class:`LivenessCount`, driven by a :class:`ManualClock`): the
  first probe ``initialDelaySeconds`` after the start, then every
  ``periodSeconds``; a success resets the failures; the
  ``failureThreshold``-th failure in a row fires once.
* The prober thread, for real: it fires the action of the run it watches,
  once, and drops an answer that arrives after the run ended.

Servers are tiny loopback HTTP servers in this process; every wait polls with a deadline.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from controller_manager.config import LivenessProbeSection
from controller_manager.probes import LivenessCount, Prober, ProbeResult, http_get, probe_url, run_exec
from rangeshard.core.clock import ManualClock
from tests.helpers import wait_until
from tests.security.certs import make_pki


class _Server:
    """A loopback HTTP server answering ``GET /<code>`` with that status; ``/hang`` waits until released."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.release = threading.Event()
        self.agents: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.agents.append(self.headers.get("User-Agent", ""))
                if self.path == "/hang":
                    outer.release.wait(30)
                    code = 200
                else:
                    code = int(self.path.strip("/").split("?")[0])
                body = f"status {code} from the test server".encode()
                self.send_response(code)
                if 300 <= code < 400:
                    self.send_header("Location", "http://192.0.2.1/elsewhere")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="test-probe-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        yield c


def _probe(**fields: object) -> LivenessProbeSection:
    return LivenessProbeSection.model_validate(fields)


@pytest.mark.parametrize("code", [200, 204, 301, 302, 399])
def test_an_http_probe_passes_on_200_to_399(server: _Server, client: httpx.Client, code: int) -> None:
    result = http_get(client, f"http://127.0.0.1:{server.port}/{code}", {}, 1.0)
    assert result == ProbeResult(True, f"HTTP {code}")


@pytest.mark.parametrize("code", [400, 404, 500, 503])
def test_an_http_probe_fails_on_other_statuses_with_the_body(server: _Server, client: httpx.Client, code: int) -> None:
    result = http_get(client, f"http://127.0.0.1:{server.port}/{code}", {}, 1.0)
    assert result == ProbeResult(False, f"HTTP {code}: status {code} from the test server")


def test_an_http_probe_fails_on_a_refused_connection(client: httpx.Client) -> None:
    s = _Server()
    port = s.port
    s.close()
    result = http_get(client, f"http://127.0.0.1:{port}/200", {}, 1.0)
    assert not result.ok
    assert result.answer.startswith(f"GET http://127.0.0.1:{port}/200: ConnectError:"), result.answer


def test_an_http_probe_that_gets_no_answer_fails_after_its_timeout(server: _Server, client: httpx.Client) -> None:
    t0 = time.monotonic()
    result = http_get(client, f"http://127.0.0.1:{server.port}/hang", {}, 1.0)
    took = time.monotonic() - t0
    assert result == ProbeResult(False, f"GET http://127.0.0.1:{server.port}/hang: timed out after 1s")
    assert 1.0 <= took < 3.0, took


def test_the_probe_url_and_headers(server: _Server) -> None:
    probe = _probe(
        httpGet={"path": "/200?verbose", "port": server.port, "httpHeaders": [{"name": "User-Agent", "value": "me"}]}
    )
    prober = Prober("g", probe)
    prober.start()
    try:
        assert prober.describe() == f"GET http://127.0.0.1:{server.port}/200?verbose"
        assert prober.check() == ProbeResult(True, "HTTP 200")
    finally:
        prober.stop()
    assert server.agents == ["me"]
    action = _probe(httpGet={"port": 8443, "host": "::1", "scheme": "HTTPS"}).http_get
    assert action is not None
    assert probe_url(action) == "https://[::1]:8443/"
    assert probe_url(action, 9000) == "https://[::1]:9000/"


def test_an_https_probe_does_not_verify_the_certificate(tmp_path: Path) -> None:
    """As the kubelet: a controller's self-signed serving certificate (kube-controller-manager's) is fine."""
    pki = make_pki(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    s = _Server(tls)
    try:
        probe = _probe(httpGet={"path": "/204", "port": s.port, "scheme": "HTTPS"})
        prober = Prober("g", probe)
        prober.start()
        try:
            assert prober.check() == ProbeResult(True, "HTTP 204")
        finally:
            prober.stop()
    finally:
        s.close()


def test_an_exec_probe_passes_on_exit_code_0_and_fails_otherwise() -> None:
    assert run_exec(["true"], 1.0) == ProbeResult(True, "exit code 0")
    assert run_exec(["sh", "-c", "echo unwell; exit 3"], 1.0) == ProbeResult(False, "exit code 3: unwell")
    missing = run_exec(["/nonexistent/probe"], 1.0)
    assert not missing.ok and missing.answer.startswith("cannot run /nonexistent/probe:"), missing.answer


def test_an_exec_probe_gets_the_given_environment() -> None:
    result = run_exec(["sh", "-c", 'echo "$RANGESHARD_PROBE_TEST"'], 1.0, {"RANGESHARD_PROBE_TEST": "seen"})
    assert result == ProbeResult(True, "exit code 0: seen")


def test_an_exec_probe_that_outlives_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    # A background process that would keep the output pipe open: killed with the probe's process group.
    script = f"sleep 60 & echo $! > {pid_file}; sleep 60"
    t0 = time.monotonic()
    result = run_exec(["sh", "-c", script], 1.0)
    took = time.monotonic() - t0
    assert result == ProbeResult(False, "sh: timed out after 1s (killed)")
    assert 1.0 <= took < 4.0, took
    background = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(background, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{background}/stat").read_text().split()[2] == "Z"

    wait_until(gone, 5, "the probe's background process to be killed")


def test_the_count_follows_the_kubelet() -> None:
    clock = ManualClock()
    start = clock.monotonic()
    count = LivenessCount(
        _probe(exec={"command": ["true"]}, initialDelaySeconds=5, periodSeconds=10, failureThreshold=3), start
    )
    assert count.next_due == start + 5  # the first probe after initialDelaySeconds
    clock.advance(5)
    assert not count.observe(False, clock.monotonic())
    assert (count.failures, count.next_due) == (1, start + 15)
    clock.advance(10)
    assert not count.observe(False, clock.monotonic())
    clock.advance(10)
    assert not count.observe(True, clock.monotonic())  # a success resets the failures
    assert count.failures == 0
    for _ in range(2):
        clock.advance(10)
        assert not count.observe(False, clock.monotonic())
    clock.advance(10)
    assert count.observe(False, clock.monotonic())  # the third failure in a row fires
    assert count.failures == 3 and count.fired
    clock.advance(10)
    assert not count.observe(False, clock.monotonic()), "fires once per process"


def test_a_probe_longer_than_its_period_is_followed_by_the_next_at_once_not_a_burst() -> None:
    clock = ManualClock()
    count = LivenessCount(_probe(exec={"command": ["true"]}, periodSeconds=2), clock.monotonic())
    clock.advance(7)  # the first probe (due at once) took 7 s
    count.observe(False, clock.monotonic())
    assert count.next_due == clock.monotonic()
    count.observe(False, clock.monotonic())
    assert count.next_due == clock.monotonic() + 2


def test_the_prober_fires_once_after_failure_threshold_failures(tmp_path: Path) -> None:
    healthy, marks = tmp_path / "healthy", tmp_path / "marks"
    healthy.touch()
    probe = _probe(
        exec={"command": ["sh", "-c", f"echo x >> {marks}; cat {healthy}"]}, periodSeconds=1, failureThreshold=2
    )
    prober = Prober("g", probe)
    fired: list[tuple[ProbeResult, int]] = []

    def probes() -> int:
        return len(marks.read_text().splitlines()) if marks.exists() else 0

    prober.start()
    try:
        prober.watch(lambda result, failures: fired.append((result, failures)))
        wait_until(lambda: probes() >= 1, 10, "the first probe")
        healthy.unlink()
        t0 = time.monotonic()
        wait_until(lambda: fired, 10, "the failure action")
        took = time.monotonic() - t0
        (result, failures), *more = fired
        assert failures == 2 and not more
        assert not result.ok and result.answer.startswith("exit code 1: cat:"), result.answer
        assert took < 6, took  # two probes a period apart (each answers at once), with room for a loaded host
        seen = probes()
        healthy.touch()
        prober.watch(lambda result, failures: fired.append((result, failures)))  # the restarted process
        wait_until(lambda: probes() >= seen + 3, 10, "three probes of the restarted process")
        assert len(fired) == 1, "a healthy restarted process is not killed"
    finally:
        prober.stop()


def test_the_first_probe_waits_initial_delay_seconds(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    probe = _probe(exec={"command": ["sh", "-c", f"echo x >> {marks}"]}, initialDelaySeconds=1, periodSeconds=1)
    prober = Prober("g", probe)
    prober.start()
    try:
        t0 = time.monotonic()
        prober.watch(lambda result, failures: None)
        wait_until(marks.exists, 10, "the first probe")
        assert time.monotonic() - t0 >= 1.0
    finally:
        prober.stop()


def test_an_answer_that_arrives_after_the_run_ended_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    started = tmp_path / "started"
    probe = _probe(
        exec={"command": ["sh", "-c", f"touch {started}; sleep 1; exit 1"]},
        periodSeconds=1,
        timeoutSeconds=5,
        failureThreshold=1,
    )
    prober = Prober("g", probe)
    fired: list[int] = []
    with caplog.at_level(logging.DEBUG, logger="controller_manager.probes"):
        prober.start()
        try:
            prober.watch(lambda result, failures: fired.append(failures))
            wait_until(started.exists, 10, "the probe to start")
            prober.unwatch()  # the process ended while its probe ran
            wait_until(
                lambda: any("answer of an ended process dropped" in r.getMessage() for r in caplog.records),
                10,
                "the late answer to be dropped",
            )
        finally:
            prober.stop()
    assert fired == [], "the failed answer counted against no process"
