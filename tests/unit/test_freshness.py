"""The pure parts of "not older than the giver's last writes" (controller_manager.freshness, issue 46)."""

from __future__ import annotations

import threading

import pytest

from controller_manager.freshness import PeerFloors, WrittenVersions, as_version, list_params, merge, version_of


@pytest.mark.parametrize(
    ("value", "read"),
    [
        *(("12", 12), ("0", 0), (7, 7), ("", None), ("12a", None), ("-3", None), ("\u00b2", None)),
        *(("\uff11", None), (None, None), (True, None), (-1, None), (1.5, None)),
    ],
)
def test_a_resource_version_is_a_decimal_integer_or_nothing(value: object, read: int | None) -> None:
    assert as_version(value) == read


def test_the_version_of_an_object_a_list_or_a_status() -> None:
    assert version_of({"metadata": {"resourceVersion": "41"}}) == 41
    assert version_of({"kind": "Status", "status": "Success"}) is None
    assert version_of(None) is None
    assert version_of({"metadata": "x"}) is None


def test_merge_keeps_the_highest_version_per_resource() -> None:
    into = {"pods": 10}
    assert merge(into, {"pods": "9", "replicasets.apps": "3", "bad": "x"}) is True
    assert into == {"pods": 10, "replicasets.apps": 3}
    assert merge(into, {"pods": 10}) is False
    assert merge(into, None) is False


def test_written_versions_only_grow_and_are_thread_safe() -> None:
    written = WrittenVersions()

    def write(base: int) -> None:
        for i in range(500):
            written.record("pods", base + i)
            written.record("replicasets.apps", str(base - i))

    threads = [threading.Thread(target=write, args=(n * 1000,)) for n in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    written.record("pods", None)
    written.record("pods", "")
    assert written.snapshot() == {"pods": 4499, "replicasets.apps": 4000}
    assert written.get("pods") == 4499 and written.get("configmaps") == 0


def test_peer_floors_remember_a_record_that_vanished() -> None:
    floors = PeerFloors()
    floors.seen([{"pods": "30"}, None, {"pods": "12", "replicasets.apps": "8"}])
    assert (floors.get("pods"), floors.get("replicasets.apps")) == (30, 8)
    floors.seen([None])  # the record that published 30 is gone (a crash, a leave): its writes still count
    assert floors.get("pods") == 30
    assert floors.get("deployments.apps") == 0


def test_list_params_not_older_than_the_floor_any_version_without_one_consistent_after_a_timeout() -> None:
    assert list_params(0) == {"resourceVersion": "0"}
    assert list_params(57) == {"resourceVersion": "57", "resourceVersionMatch": "NotOlderThan"}
    assert list_params(57, unreachable=True) == {}
    assert list_params(0, unreachable=True) == {}
