"""``rangeshard registry list -o wide`` and ``rangeshard status`` name stuck instances (issue 38, item 2).

The proxy is stood in for by a server answering ``/metrics`` with the
proxy's progress families (the proxy's own numbers are tested in
tests/range_filter_proxy/test_progress*.py); the registry is real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rangeshard.cli.progress import Progress, describe, parse
from rangeshard.cli.statefile import Component, UpState, write_state
from rangeshard.core.etcd import EtcdClient
from rangeshard.core.etcdserver import EtcdServer
from rangeshard.core.process import process_start_time
from registry import Registry
from tests.helpers import MetricsServer, progress_metrics
from tests.registry.test_cli import run

CT = "gadget"


def _registered(etcd_client: EtcdClient, key_prefix: str) -> None:
    reg = Registry(etcd_client, key_prefix)
    lease = etcd_client.grant_lease(300)  # the test runs a dozen CLI processes: longer than 30 s on a busy machine
    for iid in ("a", "b", "c"):
        reg.join(CT, iid, lease)


def _progress_cells(table: str) -> dict[str, str]:
    """``instance -> PROGRESS cell`` of the rows of a wide table."""
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines() if line.startswith("│")]
    return {row[0]: row[-1] for row in rows}


METRICS = progress_metrics((CT, "a", 13, 84.0, 5.0), (CT, "b", 0, 0.0, 5.0), (CT, "c", None, 0.0, 120.0))


def test_parse_and_describe() -> None:
    got = parse(METRICS)
    assert got[CT, "a"] == Progress(True, 13, 84.0, True, 5.0)
    assert describe(got[CT, "a"]) == "STUCK: 13 unanswered, oldest 84s (> 5s)"
    assert describe(got[CT, "b"]) == "ok"
    assert describe(got[CT, "c"]) == "not measurable" and got[CT, "c"].unreconciled is None
    assert describe(Progress(True, 2, 1.5, False, 5.0)) == "waiting: 2 unanswered, oldest 1s"
    assert describe(None) == "-"


def test_registry_list_wide_shows_stuck_instances(
    etcd_server: EtcdServer, etcd_client: EtcdClient, key_prefix: str, tmp_path: Path
) -> None:
    _registered(etcd_client, key_prefix)
    base = ("registry", "list", "--etcd", etcd_server.url, "--prefix", key_prefix, "--state-dir", str(tmp_path))
    with MetricsServer(METRICS) as proxy:
        wide = run(*base, "-o", "wide", "--proxy", proxy.url)
        assert wide.returncode == 0, wide.stderr
        cells = _progress_cells(wide.stdout)
        assert cells == {
            "a": "STUCK: 13 unanswered, oldest 84s (> 5s)",
            "b": "ok",
            "c": "not measurable",
        }, wide.stdout

        as_json = json.loads(run(*base, "-o", "json", "--proxy", proxy.url).stdout)
        by_id = {d["instanceId"]: d["progress"] for d in as_json}
        assert by_id["a"] == {
            "measurable": True,
            "unreconciled": 13,
            "oldestSeconds": 84.0,
            "stuck": True,
            "stuckAfterSeconds": 5.0,
        }
        assert by_id["c"]["measurable"] is False and by_id["c"]["unreconciled"] is None

        # Without --proxy, the proxy of a `rangeshard up` in the state dir is asked.
        me = os.getpid()
        proxy_component = Component(
            name="proxy",
            kind="proxy",
            pid=me,
            startTime=process_start_time(me),
            port=int(proxy.url.rsplit(":", 1)[1]),
            url=proxy.url,
            healthUrl=proxy.url + "/readyz",
        )
        write_state(tmp_path, UpState(upPid=me, detached=True, components=[proxy_component]))
        wide = run(*base, "-o", "wide")
        assert _progress_cells(wide.stdout)["a"] == "STUCK: 13 unanswered, oldest 84s (> 5s)", wide.stdout

        # `rangeshard status`: the stuck instance makes it exit 1, and says which.
        status = run("status", "--state-dir", str(tmp_path))
        assert status.returncode == 1, status.stdout + status.stderr
        assert "STUCK: 13 unanswered, oldest 84s (> 5s)" in status.stdout and "not measurable" in status.stdout
        doc = json.loads(run("status", "--state-dir", str(tmp_path), "-o", "json").stdout)
        assert doc["stuck"] == [f"{CT}/a"] and doc["progressError"] is None
        assert {p["instanceId"]: p["stuck"] for p in doc["progress"]} == {"a": True, "b": False, "c": False}

        proxy.text = progress_metrics((CT, "a", 0, 0.0, 5.0), (CT, "b", 1, 2.0, 5.0))
        status = run("status", "--state-dir", str(tmp_path))
        assert status.returncode == 0, status.stdout + status.stderr
        assert "waiting: 1 unanswered, oldest 2s" in status.stdout

    # The proxy gone: progress is unknown (said so), never healthy.
    wide = run(*base, "-o", "wide", "--proxy", proxy.url)
    assert wide.returncode == 0 and "progress: unknown" in wide.stdout
    assert set(_progress_cells(wide.stdout).values()) == {"-"}, wide.stdout
