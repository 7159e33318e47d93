"""progstats.CostMeter on counters fed by hand (the kernel's are read from each program fd's
fdinfo: the probes' kernel tests read real ones)."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from gpujitter.probes import progstats
from gpujitter.probes.progstats import MIN_STRETCH_NS, Cost, CostMeter

S = 1_000_000_000
SCHED = {"sched": [3]}


@pytest.fixture
def counters(monkeypatch: pytest.MonkeyPatch) -> dict[int, tuple[int, int]]:
    """fd -> (runs, ns) as the kernel would show them, statistics on all the time."""
    table: dict[int, tuple[int, int]] = {}

    def totals(fds: Iterable[int]) -> tuple[int, int]:
        return sum(table[fd][0] for fd in fds), sum(table[fd][1] for fd in fds)

    monkeypatch.setattr(progstats, "stats_on", lambda: True)
    monkeypatch.setattr(progstats, "_totals", totals)
    return table


def test_a_stretch_too_short_to_measure_leaves_the_last_cost(
    counters: dict[int, tuple[int, int]],
) -> None:
    meter = CostMeter()
    counters[3] = (1_000, 100_000)
    assert meter.tick(10 * S, lambda: SCHED) == {}  # the first read: a baseline
    counters[3] = (2_000, 300_000)
    second = Cost(200_000, 1_000, "bpf_stats")
    assert meter.tick(11 * S, lambda: SCHED) == {"sched": second}
    # A read right after (the runner's last tick, then a caller's): one more run in a few
    # microseconds is no rate, and the stretch goes on from the read before.
    counters[3] = (2_001, 300_100)
    assert meter.tick(11 * S + 5_000, lambda: SCHED) == {"sched": second}
    counters[3] = (2_500, 400_000)
    per_s = S / MIN_STRETCH_NS
    assert meter.tick(11 * S + MIN_STRETCH_NS, lambda: SCHED) == {
        "sched": Cost(round(100_000 * per_s), round(500 * per_s), "bpf_stats")
    }


def test_a_stretch_over_programs_that_came_or_went_is_not_a_rate(
    counters: dict[int, tuple[int, int]],
) -> None:
    """A probe that attaches or drops a program between two reads (a uprobe on a new
    interpreter): the totals are two sets' (one gone would even read a negative rate)."""
    meter = CostMeter()
    counters[3], counters[4] = (1_000, 100_000), (5_000, 900_000)
    meter.tick(10 * S, lambda: {"python_gc": [3, 4]})
    counters[3] = (1_500, 150_000)
    assert meter.tick(11 * S, lambda: {"python_gc": [3]}) == {}  # fd 4 went: no rate
    counters[3] = (2_500, 250_000)
    assert meter.tick(12 * S, lambda: {"python_gc": [3]}) == {
        "python_gc": Cost(100_000, 1_000, "bpf_stats")
    }


def test_a_meter_the_kernel_refuses_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the statistics cannot be switched on, a probe with programs is not measured
    (not "pending": no later second will measure it); once they can, it is not refused."""
    monkeypatch.setattr(progstats, "stats_on", lambda: False)
    monkeypatch.setattr(progstats, "enable_stats", lambda: -1)
    meter = CostMeter()
    assert meter.tick(10 * S, lambda: SCHED) == {} and meter.refused
    monkeypatch.setattr(progstats, "stats_on", lambda: True)
    monkeypatch.setattr(progstats, "_totals", lambda fds: (0, 0))
    meter.tick(11 * S, lambda: SCHED)
    assert not meter.refused
