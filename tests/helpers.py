"""Small test utilities shared by the suites (polling with a deadline, never bare sleeps; the CLI as a child;
missing prerequisites that fail under the README test command; a controller runtime driven by hand)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import pytest

from rangeshard.core.process import popen

if TYPE_CHECKING:
    from controller_manager.controller import ControllerRuntime
    from rangeshard.core.etcd import EtcdConfig

T = TypeVar("T")

REQUIRE_ALL = "RANGESHARD_REQUIRE_ALL"
"""Set to ``1`` by ``scripts/test.sh`` (the README test command): a missing prerequisite fails, never skips."""


def missing_prerequisite(what: str, *, module_level: bool = False) -> NoReturn:
    """A tool or package the test needs is missing: skip, or fail under ``RANGESHARD_REQUIRE_ALL=1``."""
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(f"{what} ({REQUIRE_ALL}=1: the full suite needs it)", pytrace=False)
    pytest.skip(what, allow_module_level=module_level)


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, message: str = "condition", interval: float = 0.02
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value: {last!r})")
        time.sleep(interval)
        last = predicate()
    return last


def run_cli(
    args: Sequence[str], log: Path, *, new_session: bool = False, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``python -m rangeshard.cli.main ARGS`` with stdout and stderr appended to ``log``.

    ``new_session`` puts it in its own process group (so a test can signal
    the group); ``env`` entries are added to this process's environment. It
    dies with this process (:func:`rangeshard.core.process.popen`).
    """
    with open(log, "ab") as logf:
        return popen(
            [sys.executable, "-m", "rangeshard.cli.main", *args],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=new_session,
            env={**os.environ, **env} if env else None,
        )


class MetricsServer:
    """A stand-in for a proxy's ``/metrics`` (and ``/readyz``) on a loopback port, served from a thread.

    ``text`` is what ``/metrics`` answers (change it at any time). With ``token``, ``/metrics``
    answers 401 unless the request carries ``Authorization: Bearer <token>`` (a secured proxy).
    Use as a context manager.
    """

    def __init__(self, text: str = "", token: str | None = None) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: PLC0415

        outer = self
        self.text = text
        self.token = token

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                metrics = self.path.startswith("/metrics")
                if metrics and outer.token and self.headers.get("Authorization") != f"Bearer {outer.token}":
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = (outer.text if metrics else "ok").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> MetricsServer:
        import threading  # noqa: PLC0415

        threading.Thread(target=self.server.serve_forever, name="fake-metrics", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def progress_metrics(*rows: tuple[str, str, float | None, float, float]) -> str:
    """Prometheus text of the proxy's progress families: ``(type, instance, count or None, oldest, stuck after)``.

    ``count`` ``None`` is "not measurable" (NaN); stuck is derived as the proxy derives it.
    """
    families: dict[str, list[str]] = {
        "rangeshard_unreconciled_objects": [],
        "rangeshard_unreconciled_oldest_seconds": [],
        "rangeshard_unreconciled_measurable": [],
        "rangeshard_unreconciled_stuck": [],
        "rangeshard_stuck_after_seconds": [],
    }
    for ctype, instance, count, oldest, after in rows:
        labels = f'{{type="{ctype}",instance="{instance}"}}'
        measurable = count is not None
        values = {
            "rangeshard_unreconciled_objects": count if measurable else "NaN",
            "rangeshard_unreconciled_oldest_seconds": oldest if measurable else "NaN",
            "rangeshard_unreconciled_measurable": 1 if measurable else 0,
            "rangeshard_unreconciled_stuck": 1 if measurable and oldest > after else 0,
            "rangeshard_stuck_after_seconds": after,
        }
        for name, value in values.items():
            families[name].append(f"{name}{labels} {value}")
    return "".join(
        f"# TYPE {name} gauge\n" + "".join(line + "\n" for line in lines) for name, lines in families.items()
    )


def offline_runtime(controller_cls: Any, etcd_config: EtcdConfig, key_prefix: str) -> ControllerRuntime:
    """A ``replicaset`` runtime (instance ``t0``, not started) whose API client reaches nobody: its steps run by hand."""
    from kubernetes import client as k8s  # noqa: PLC0415 (only the controller-manager suites need it)

    from controller_manager.controller import ControllerRuntime  # noqa: PLC0415
    from controller_manager.metrics import Metrics  # noqa: PLC0415
    from controller_manager.shardhost import ShardSettings  # noqa: PLC0415

    settings = ShardSettings(etcd_config, key_prefix, "replicaset", "t0", lease_ttl=5, reconcile_timeout=5.0)
    api = k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9"))
    return ControllerRuntime(controller_cls, api_client=api, shard=settings, workers=1, metrics=Metrics())
