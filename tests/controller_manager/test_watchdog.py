"""The manager's watchdog (issue 38, item 3): when a built-in controller counts as stuck, and what follows.

Runtimes are stand-ins exposing what the watchdog reads (a
:class:`ReconcileTracker` and informers' silences); time is a fake clock.
The real processes are tested in tests/e2e/test_stuck_manager.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from controller_manager.config import WatchdogSection
from controller_manager.watchdog import ReconcileTracker, Watchdog, stuck_reasons


@dataclass
class FakeInformer:
    name: str
    quiet: float | None = None

    def silence(self, now: float) -> float | None:
        return self.quiet


@dataclass
class FakeRuntime:
    name: str
    reconciles: ReconcileTracker = field(default_factory=ReconcileTracker)
    informers: list[FakeInformer] = field(default_factory=list)

    @property
    def watched_informers(self) -> list[FakeInformer]:
        return self.informers


SETTINGS = WatchdogSection.model_validate({"reconcileTimeouts": 3, "informerSilenceSeconds": 10, "exitAfterSeconds": 5})


def test_a_streak_of_outlived_reconciles_and_its_reset() -> None:
    t = ReconcileTracker()
    for i in range(3):
        t.begin("w0", f"ns/k{i}", 100.0)
        t.end("w0", f"ns/k{i}", outlived=True)
    assert t.streak() == (3, "ns/k2") and t.running() == {}
    rt = FakeRuntime("rs", t)
    assert stuck_reasons(rt, SETTINGS, 0.0) == ["3 reconciles in a row outlived their timeout (the last: ns/k2)"]
    t.begin("w1", "ns/ok", 100.0)
    t.end("w1", "ns/ok", outlived=False)  # any other result clears it
    assert t.streak()[0] == 0 and stuck_reasons(rt, SETTINGS, 0.0) == []


def test_a_hung_reconcile_and_a_silent_informer() -> None:
    rt = FakeRuntime("rs", informers=[FakeInformer("rs-replicasets", None), FakeInformer("rs-pods", 4.0)])
    rt.reconciles.begin("worker-rs-0", "ns/a", deadline=50.0)
    assert stuck_reasons(rt, SETTINGS, 50.5) == []  # within the grace
    assert stuck_reasons(rt, SETTINGS, 52.0) == ["worker worker-rs-0 is still reconciling ns/a 2.0s past its deadline"]
    rt.reconciles.end("worker-rs-0", "ns/a", outlived=True)
    rt.informers[1].quiet = 11.0
    assert stuck_reasons(rt, SETTINGS, 52.0) == [
        "informer rs-pods: its open watch brought no event and no bookmark for 11s (informerSilenceSeconds 10)"
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stuck_then_recovered_then_stuck_past_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rt, other = FakeRuntime("rs"), FakeRuntime("dep")
    changes: list[tuple[str, bool]] = []
    dog = Watchdog(SETTINGS, [rt, other], on_stuck=lambda n, s: changes.append((n, s)), clock=clock, tick=0.5)
    informer = FakeInformer("rs-replicasets", 11.0)
    rt.informers.append(informer)
    with caplog.at_level(logging.INFO, logger="controller_manager.watchdog"):
        dog.check()
        assert list(dog.reasons()) == ["rs"] and changes == [("rs", True)]
        clock.now += 0.5
        informer.quiet = 11.5  # the same reason, a larger number: not logged again
        dog.check()
        assert sum("stuck (not ready)" in r.message for r in caplog.records) == 1
        clock.now += 0.5
        informer.quiet = 0.2
        dog.check()
        assert dog.reasons() == {} and changes[-1] == ("rs", False) and dog.expired() is None
        assert any("no longer stuck" in r.message for r in caplog.records)

        informer.quiet = 30.0
        clock.now += 0.5
        dog.check()
        stuck_at = clock.now
        while clock.now - stuck_at < 5:  # stuck for less than the bound: not expired
            assert dog.expired() is None
            clock.now += 0.5
            dog.check()
        expired = dog.expired()
        assert expired is not None and expired.startswith("rs: stuck for 5s (watchdog.exitAfterSeconds 5)")
        assert "leaving the registry" in expired
        assert any(r.levelno == logging.ERROR and r.message == expired for r in caplog.records)


def test_exit_after_zero_never_expires_and_a_pause_judges_nothing() -> None:
    clock = Clock()
    settings = SETTINGS.model_copy(update={"exit_after_seconds": 0.0})
    rt = FakeRuntime("rs", informers=[FakeInformer("rs-replicasets", 50.0)])
    dog = Watchdog(settings, [rt], clock=clock, tick=0.5)
    for _ in range(100):
        clock.now += 0.5
        dog.check()
    assert dog.reasons() and dog.expired() is None
    # A paused process (SIGSTOP): the first tick after it judges nothing, the next one judges afresh.
    fresh = Watchdog(SETTINGS, [rt], clock=clock, tick=0.5)
    rt.informers[0].quiet = 1.0
    fresh.check()
    assert fresh.reasons() == {}
    clock.now += 60
    rt.informers[0].quiet = 61.0  # silent across the pause, and not yet read since
    fresh.check()
    assert fresh.reasons() == {}, "the tick after a pause judges nothing"
    clock.now += 0.5
    fresh.check()
    assert fresh.reasons() == {}, "the pause's silence is not the informer's"
    for _ in range(21):  # silent for 11 s since the pause ended: that is the informer's
        clock.now += 0.5
        fresh.check()
    assert list(fresh.reasons()) == ["rs"]
