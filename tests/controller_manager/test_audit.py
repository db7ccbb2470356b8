"""Audit log: atomic JSON lines from many writers, strict reader, overlap checker and its CLI."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from controller_manager.audit import AuditLog, AuditRecord, find_overlaps, main, now, read_records
from rangeshard.core.errors import ConfigError
from rangeshard.core.process import popen


def rec(instance: str, start: float, end: float, key: str = "ns/a", ctype: str = "replicaset") -> AuditRecord:
    return AuditRecord(controller_type=ctype, instance_id=instance, key=key, start=start, end=end)


def write_lines(path: Path, *records: AuditRecord) -> Path:
    path.write_text("".join(r.model_dump_json(by_alias=True) + "\n" for r in records))
    return path


# -- find_overlaps ----------------------------------------------------------


def test_overlapping_intervals_of_two_instances_are_found() -> None:
    a, b = rec("A", 1.0, 3.0), rec("B", 2.0, 4.0)
    assert find_overlaps([b, a]) == [(a, b)]


def test_containment_is_an_overlap() -> None:
    outer, inner = rec("A", 1.0, 10.0), rec("B", 2.0, 3.0)
    assert find_overlaps([inner, outer]) == [(outer, inner)]


def test_touching_intervals_are_not_overlaps() -> None:
    assert find_overlaps([rec("A", 1.0, 2.0), rec("B", 2.0, 3.0)]) == []
    assert find_overlaps([rec("B", 2.0, 3.0), rec("A", 1.0, 2.0)]) == []


def test_zero_length_intervals() -> None:
    # A zero-length record at the very start or end of another does not overlap it ...
    assert find_overlaps([rec("A", 1.0, 2.0), rec("B", 1.0, 1.0), rec("C", 2.0, 2.0)]) == []
    # ... but strictly inside it does.
    a, b = rec("A", 1.0, 2.0), rec("B", 1.5, 1.5)
    assert find_overlaps([a, b]) == [(a, b)]


def test_same_instance_never_counts() -> None:
    assert find_overlaps([rec("A", 1.0, 3.0), rec("A", 2.0, 4.0)]) == []


def test_different_controller_types_and_keys_never_count() -> None:
    assert find_overlaps([rec("A", 1.0, 3.0, ctype="replicaset"), rec("B", 2.0, 4.0, ctype="deployment")]) == []
    assert find_overlaps([rec("A", 1.0, 3.0, key="ns/a"), rec("B", 2.0, 4.0, key="ns/b")]) == []


def test_every_overlapping_pair_is_reported_once() -> None:
    a, b, c = rec("A", 0.0, 10.0), rec("B", 1.0, 2.0), rec("C", 1.5, 5.0)
    a2 = rec("A", 4.0, 6.0)  # overlaps a (same instance: ignored) and c
    got = find_overlaps([c, a2, b, a])
    assert got == [(a, b), (a, c), (b, c), (c, a2)]


def test_old_records_leave_the_sweep() -> None:
    records = [rec("A" if i % 2 else "B", float(i), float(i) + 1.0) for i in range(1000)]
    assert find_overlaps(records) == []
    records.append(rec("C", 500.5, 500.6))
    (pair,) = find_overlaps(records)
    assert pair[0].start == 500.0 and pair[1].instance_id == "C"


def test_record_rejects_end_before_start() -> None:
    with pytest.raises(ValueError, match="before start"):
        rec("A", 2.0, 1.0)


# -- AuditLog and read_records ------------------------------------------------


def test_log_roundtrip_and_camel_case(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as audit:
        t0 = now()
        audit.record("replicaset", "m1-1", "default/web", t0, t0 + 0.5)
        audit.record("deployment", "m1-2", "default/web", t0, t0 + 0.25)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert {"controllerType", "instanceId", "key", "start", "end"} <= first.keys()
    records = read_records([path])
    assert records[0] == AuditRecord(
        controller_type="replicaset", instance_id="m1-1", key="default/web", start=t0, end=t0 + 0.5
    )
    assert records[1].controller_type == "deployment"


def test_now_is_wall_clock() -> None:
    assert abs(now() - time.time()) < 1.0


def test_record_after_close_is_dropped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog(path)
    audit.close()
    audit.close()
    with caplog.at_level(logging.WARNING):
        audit.record("replicaset", "x", "k", 1.0, 2.0)
    assert path.read_text() == ""
    assert "closed" in caplog.text


def test_reader_ignores_unknown_fields_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    line = json.dumps({"controllerType": "replicaset", "instanceId": "x", "key": "k", "start": 1, "end": 2, "pid": 7})
    path.write_text(line + "\n\n" + line + "\n")
    assert len(read_records([path])) == 2


def test_partial_last_line_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write_lines(tmp_path / "a.jsonl", rec("A", 1.0, 2.0))
    with path.open("a") as f:
        f.write('{"controllerType": "replicaset", "instanceId": "B", "ke')
    with caplog.at_level(logging.WARNING):
        records = read_records([path])
    assert [r.instance_id for r in records] == ["A"]
    assert f"{path}:2: ignoring a partially written last line" in caplog.text


def test_malformed_lines_are_reported_with_file_and_line(tmp_path: Path) -> None:
    good = json.dumps({"controllerType": "replicaset", "instanceId": "x", "key": "k", "start": 1, "end": 2})
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "\n".join(
            [
                good,
                "not json",
                "[1, 2]",
                json.dumps({"controllerType": "replicaset", "instanceId": "x", "key": "k", "start": 1}),
                json.dumps({"controllerType": "replicaset", "instanceId": "x", "key": "k", "start": 3, "end": 2}),
                json.dumps({"controllerType": "replicaset", "instanceId": "x", "key": "k", "start": "soon", "end": 2}),
            ]
        )
        + "\n"
    )
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ConfigError) as ei:
        read_records([path, missing])
    problems = ei.value.problems
    assert len(problems) == 6
    assert problems[0].startswith(f"{path}:2: invalid JSON: ")
    assert problems[1] == f"{path}:3: expected a JSON object, got list"
    assert problems[2] == f"{path}:4: end: Field required"
    assert problems[3] == f"{path}:5: end (2.0) is before start (3.0)"
    assert problems[4].startswith(f"{path}:6: start: ")
    assert problems[5].startswith(f"{missing}: cannot read: ")


def test_threads_share_one_log(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    audit = AuditLog(path)

    def write(i: int) -> None:
        for j in range(200):
            audit.record("replicaset", f"t{i}", f"ns/{j}", float(j), float(j) + 0.5)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    audit.close()
    assert len(read_records([path])) == 800


WRITER = """
import sys
from controller_manager.audit import AuditLog
path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
audit = AuditLog(path)
print("ready", flush=True)
sys.stdin.read()  # start together: the parent closes stdin once every writer is ready
for j in range(n):
    # Long keys: every line is far beyond PIPE_BUF (4096 bytes).
    audit.record("replicaset", name, f"ns/{j}-" + name * 1500, float(j), float(j) + 0.5)
audit.close()
"""


def test_concurrent_writer_processes_produce_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    n_procs, n_records = 4, 300
    procs = [
        popen(
            [sys.executable, "-c", WRITER, str(path), f"p{i}", str(n_records)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n_procs)
    ]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline() == "ready\n"
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()  # release them at once
    for p in procs:
        assert p.wait(timeout=60) == 0
        assert p.stdout is not None
        p.stdout.close()
    data = path.read_bytes()
    assert data.endswith(b"\n")
    records = read_records([path])  # raises on any torn or interleaved line
    assert len(records) == n_procs * n_records
    for i in range(n_procs):
        mine = [r for r in records if r.instance_id == f"p{i}"]
        assert [r.start for r in mine] == [float(j) for j in range(n_records)]  # each writer's order kept
    assert find_overlaps(records) == []


# -- main() -------------------------------------------------------------------


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller_manager.audit", *map(str, args)], capture_output=True, text=True, timeout=60
    )


def test_cli_no_overlap_exits_0(tmp_path: Path) -> None:
    f1 = write_lines(tmp_path / "m1.jsonl", rec("A", 1.0, 2.0), rec("A", 3.0, 4.0, key="ns/b"))
    f2 = write_lines(tmp_path / "m2.jsonl", rec("B", 2.0, 3.0), rec("B", 1.0, 2.0, ctype="deployment"))
    res = run_cli(f1, f2)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    assert res.stdout.strip() == "4 records, 3 keys, 3 instances, 2 controller types: 0 overlap(s)"


def test_cli_overlap_exits_1_and_prints_both_records(tmp_path: Path) -> None:
    f1 = write_lines(tmp_path / "m1.jsonl", rec("A", 1000.0, 1002.0))
    f2 = write_lines(tmp_path / "m2.jsonl", rec("B", 1001.5, 1003.0))
    res = run_cli(f1, f2)
    assert res.returncode == 1, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "OVERLAP replicaset key='ns/a' for 0.500000 s"
    assert lines[1] == "  instance A: 1970-01-01T00:16:40.000000Z .. 1970-01-01T00:16:42.000000Z (2.000000 s)"
    assert lines[2] == "  instance B: 1970-01-01T00:16:41.500000Z .. 1970-01-01T00:16:43.000000Z (1.500000 s)"
    assert lines[3] == "2 records, 1 keys, 2 instances, 1 controller types: 1 overlap(s)"


def test_cli_malformed_input_exits_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("garbage\n")
    res = run_cli(bad)
    assert res.returncode == 2
    assert f"{bad}:1: invalid JSON" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_cli(tmp_path / "nope.jsonl")
    assert res.returncode == 2
    assert "cannot read" in res.stderr and "Traceback" not in res.stderr


def test_main_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "FILE" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_main_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write_lines(tmp_path / "m.jsonl", rec("A", 1.0, 3.0), rec("B", 2.0, 4.0))
    assert main([str(f)]) == 1
    assert "OVERLAP" in capsys.readouterr().out
