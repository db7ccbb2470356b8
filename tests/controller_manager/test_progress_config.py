"""What a manager publishes for progress measurement (issue 38, item 2), and the config keys of stuck detection.

The registry record names the type's main resource (``mainResource: {group,
version, resource, by}``) and ``stuckAfterSeconds``; an external entry's main
resource is the ``shard`` entry marked ``main: true`` (at most one), else the
first. Malformed progress fields never make a record unreadable.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from controller_manager.config import load_config
from hashing import ShardBy
from rangeshard.core.errors import ConfigError
from registry import InstanceRecord, MainResource

HEAD = """
etcd: {endpoints: ["http://127.0.0.1:2379"]}
proxy: {url: "http://127.0.0.1:8001"}
"""


def _load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "m.yaml"
    path.write_text(HEAD + text)
    return load_config(path)


def test_the_watchdog_has_defaults(tmp_path: Path) -> None:
    wd = _load(tmp_path, "controllers: {replicaset: {}}\n").watchdog  # type: ignore[attr-defined]
    assert (wd.reconcile_timeouts, wd.informer_silence_seconds, wd.exit_after_seconds) == (3, 30.0, 60.0)
    text = "watchdog: {reconcileTimeouts: 2, informerSilenceSeconds: 3, exitAfterSeconds: 0}\n"
    wd = _load(tmp_path, text + "controllers: {replicaset: {}}\n").watchdog  # type: ignore[attr-defined]
    assert (wd.reconcile_timeouts, wd.informer_silence_seconds, wd.exit_after_seconds) == (2, 3.0, 0.0)


def test_stuck_after_seconds_has_a_default(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "controllers: {replicaset: {}}\n")
    assert cfg.stuck_after_seconds == 120.0  # type: ignore[attr-defined]
    cfg = _load(tmp_path, "stuckAfterSeconds: 5\ncontrollers: {replicaset: {}}\n")
    assert cfg.stuck_after_seconds == 5.0  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("stuckAfterSeconds: 0\n", "stuckAfterSeconds"),
        ("stuckAfterSeconds: '5'\n", "stuckAfterSeconds"),
        ("watchdog: {reconcileTimeouts: 0}\n", "watchdog.reconcileTimeouts"),
        ("watchdog: {informerSilenceSeconds: 0}\n", "watchdog.informerSilenceSeconds"),
        ("watchdog: {exitAfterSeconds: -1}\n", "watchdog.exitAfterSeconds"),
        ("watchdog: {silence: 3}\n", "watchdog.silence: unknown field"),
    ],
)
def test_bad_progress_keys_are_named(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, text + "controllers: {replicaset: {}}\n")
    assert any(needle in p for p in e.value.problems), e.value.problems


def _external(shard: str) -> str:
    return f"controllers:\n  gadget:\n    external:\n      shard: {shard}\n"


def test_the_main_resource_of_an_external_entry(tmp_path: Path) -> None:
    cfg = _load(tmp_path, _external("[{resource: gadgets.bars.example.org}, {resource: configmaps, by: owner}]"))
    ext = cfg.controllers["gadget"].external  # type: ignore[attr-defined]
    assert ext.published_main() == MainResource(group="bars.example.org", resource="gadgets", by=ShardBy.UID)
    cfg = _load(tmp_path, _external("[{resource: configmaps, by: owner}, {resource: deployments.apps, main: true}]"))
    ext = cfg.controllers["gadget"].external  # type: ignore[attr-defined]
    assert ext.published_main() == MainResource(group="apps", resource="deployments")
    assert ext.published_main().label == "deployments.apps"


def test_at_most_one_main(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, _external("[{resource: configmaps, main: true}, {resource: secrets, main: true}]"))
    assert any("at most one entry may be the main resource" in p for p in e.value.problems), e.value.problems


def test_the_record_carries_the_progress_fields() -> None:
    main = MainResource(group="apps", version="v1", resource="replicasets")
    rec = InstanceRecord.model_validate(
        {"instance_id": "a", "controller_type": "t", "hash_key": 5, "main_resource": main, "stuck_after_seconds": 7}
    )
    doc = orjson.loads(rec.to_json())
    assert doc["mainResource"] == {"group": "apps", "version": "v1", "resource": "replicasets", "by": "uid"}
    assert doc["stuckAfterSeconds"] == 7.0
    back = InstanceRecord.from_kv("t", "a", rec.to_json())
    assert back.main_resource == main and back.stuck_after_seconds == 7.0
    assert back.evolve(workload_num=3).main_resource == main


@pytest.mark.parametrize(
    "extra",
    [
        {"mainResource": "replicasets"},
        {"mainResource": {"group": "apps"}},
        {"mainResource": {"resource": "x", "by": "color"}},
        {"stuckAfterSeconds": "soon"},
        {"stuckAfterSeconds": -1},
    ],
)
def test_malformed_progress_fields_read_as_absent(extra: dict[str, object]) -> None:
    # An unreadable record would change every derived range: the fields are dropped, the record stays.
    rec = InstanceRecord.from_kv("t", "a", orjson.dumps({"hashKey": 9, **extra}))
    assert rec.hash_key == 9
    assert rec.main_resource is None and rec.stuck_after_seconds is None
