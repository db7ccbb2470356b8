"""``bench.scale.backlog_rates``: a manager's rate counts only while it is active with a backlog."""

from __future__ import annotations

from bench.scale import backlog_rates


def test_only_intervals_active_with_a_backlog_at_both_ends_count() -> None:
    # (time, reconciles, reconcile cpu, queue depth, active, process cpu) per manager per sample.
    m0 = [
        (0.0, 0, 0.0, 50, False, 0.0),  # locked: not counted
        (1.0, 0, 0.0, 50, True, 0.1),
        (2.0, 100, 0.02, 40, True, 0.3),  # counted: 100 in 1 s
        (3.0, 190, 0.04, 0, True, 0.5),  # drained at the end: not counted
        (4.0, 195, 0.05, 0, True, 0.6),
    ]
    m1 = [(0.0, 0, 0.0, 0, True, 0.0), (1.0, 5, 0.0, 0, True, 0.0)] + [(2.0, 5, 0.0, 0, True, 0.0)] * 3
    rates = backlog_rates([list(row) for row in zip(m0, m1, strict=True)])
    assert rates[0] == {"reconciles": 100, "seconds": 1.0, "reconcileCpu": 0.02, "processCpu": 0.3 - 0.1}
    assert rates[1]["seconds"] == 0  # never had a backlog
    # A restarted manager (counter reset) is not a negative rate.
    reset = [[(0.0, 500, 1.0, 9, True, 5.0)], [(1.0, 3, 0.0, 9, True, 0.1)]]
    assert backlog_rates(reset) == [{"reconciles": 0, "seconds": 0, "reconcileCpu": 0, "processCpu": 0}]
