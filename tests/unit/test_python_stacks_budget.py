"""python_stacks' sample budget, the kernel's own code (probes/bpf/python_stacks_budget.h)
compiled here with cc and driven by timer fires at chosen times: shares in proportion to
CPU time, feeders first, the cap, no thread starved."""

from __future__ import annotations

import ctypes as ct
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujitter.probes import registry
from gpujitter.probes.base import BPF_DIR
from gpujitter.probes.python_stacks import BURST_SAMPLES, CONSTANTS, OTHERS_SHARE
from tests.proportion import proportional_tail

BUDGET_C = Path(__file__).parent.parent / "fixtures" / "python_stacks_budget" / "budget.c"
SPACING_NS = registry.get("python_stacks").thresholds["spacing"]
MS = 1_000_000


class Budget:
    """One py_budget in this process's memory, spent as the BPF program spends it."""

    def __init__(self, lib: ct.CDLL, seed: int) -> None:
        self.lib = lib
        self.state = ct.create_string_buffer(lib.budget_size())
        lib.budget_seed(seed)

    def spend(self, now_ns: int, feeder: bool = False, known: bool = False) -> bool:
        return bool(self.lib.budget_spend(self.state, now_ns, feeder, known))


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ct.CDLL:
    defines = {
        **CONSTANTS,
        "THRESHOLD_SPACING_NS": f"{SPACING_NS}LL",
        "OTHERS_SPACING_NS": f"{OTHERS_SHARE * SPACING_NS}LL",
    }
    out = tmp_path_factory.mktemp("budget") / "budget.so"
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    cmd = ["gcc", "-O2", "-shared", "-fPIC", f"-I{BPF_DIR}", *flags, "-o", str(out), str(BUDGET_C)]
    subprocess.run(cmd, check=True)
    so = ct.CDLL(str(out))
    so.budget_size.restype = ct.c_size_t
    so.budget_spend.restype = ct.c_bool
    so.budget_spend.argtypes = [ct.c_char_p, ct.c_uint64, ct.c_bool, ct.c_bool]
    so.budget_seed.argtypes = [ct.c_uint32]
    return so


def _locked(offsets_ms: list[float], every_ms: float, seconds: float) -> Iterator[tuple[int, int]]:
    """(time, thread) of timer fires in a fixed pattern: thread i ends a period every
    `every_ms` of wall time at offset offsets_ms[i], as threads that share CPUs evenly do
    when the scheduler keeps their order (the phases that set the shares first-come)."""
    cycle = 1
    while cycle * every_ms < seconds * 1000:
        for i, off in enumerate(offsets_ms):
            yield int((cycle * every_ms + off) * MS), i
        cycle += 1


# ms into each 30 ms: uneven gaps, and all six within a millisecond
PHASES = {"uneven": [0.0, 0.5, 1.0, 1.5, 15.0, 16.0], "bunched": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]}


@pytest.mark.parametrize("phases", PHASES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_with_twice_the_demand_the_shares_follow_cpu_time_not_the_timers_phases(
    lib: ct.CDLL, phases: str, seed: int
) -> None:
    """Regression: the budget went to whichever timer fired once it had refilled, so six
    equally busy threads in a fixed order drew shares set by their phases (in CI 9 to 46
    samples for equal CPU time). Six threads each ending a period every 30 ms (200 periods
    a second against a budget of 100): each period is as likely to be sampled as another."""
    budget = Budget(lib, seed)
    took = [0] * len(PHASES[phases])
    for now_ns, i in _locked(PHASES[phases], 30, 20):
        took[i] += budget.spend(now_ns)
    assert sum(took) <= 20 * 1e9 / SPACING_NS + BURST_SAMPLES, took
    assert proportional_tail(took, [1] * len(took)) >= 1e-4, took


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_thread_with_five_times_the_cpu_gets_five_times_the_samples(
    lib: ct.CDLL, seed: int
) -> None:
    """One thread always running (a period every 10 ms) beside five that run a fifth of the
    time each, their periods ending just before its own."""
    budget = Budget(lib, seed)
    busy = list(_locked([0.5], 10, 20))
    fifths = [(t, i + 1) for t, i in _locked([0.0, 0.1, 0.2, 0.3, 0.4], 50, 20)]
    took = [0] * 6
    for now_ns, i in sorted([*busy, *fifths]):
        took[i] += budget.spend(now_ns)
    assert proportional_tail(took, [5, 1, 1, 1, 1, 1]) >= 1e-4, took


def test_under_the_budget_every_period_is_sampled(lib: ct.CDLL) -> None:
    budget = Budget(lib, 1)
    fires = list(_locked([0.0, 7.0], 25, 5))  # 80 periods a second
    assert sum(budget.spend(now_ns) for now_ns, _ in fires) == len(fires)


def test_feeders_take_every_period_and_the_others_share_a_twentieth(lib: ct.CDLL) -> None:
    """A feeder running half the time (a period every 20 ms) is sampled at every period;
    five always-busy others together get no more than their twentieth, and each some."""
    budget = Budget(lib, 1)
    feeder = list(_locked([3.0], 20, 10))
    others = [(t, i + 1) for t, i in _locked([0, 1, 2, 4, 5], 10, 10)]
    took = [0] * 6
    for now_ns, i in sorted([*feeder, *others]):
        took[i] += budget.spend(now_ns, feeder=i == 0, known=True)
    assert took[0] == len(feeder), took
    assert sum(took[1:]) <= 10 * 1e9 / (OTHERS_SHARE * SPACING_NS) + BURST_SAMPLES, took
    assert min(took[1:]) > 0, took


def test_a_jump_in_demand_stays_under_the_cap(lib: ct.CDLL) -> None:
    """From one thread under the budget to sixteen busy ones at once: the cap holds in every
    second, while the thinning has yet to learn the new demand, and after."""
    budget = Budget(lib, 1)
    quiet = list(_locked([0.0], 20, 2))
    busy = [(t + 2_000 * MS, i) for t, i in _locked([0.4 * k for k in range(16)], 10, 3)]
    taken = [t for t, i in [*quiet, *busy] if budget.spend(t)]
    for start_ns in range(0, 5_000 * MS, 100 * MS):
        in_second = sum(1 for t in taken if start_ns <= t < start_ns + 1_000 * MS)
        assert in_second <= 1e9 / SPACING_NS + BURST_SAMPLES, (start_ns, in_second)


def test_the_proportion_check_reads_the_chi_square_tail() -> None:
    """The check above: 1 for counts exactly in proportion, erfc(sqrt(2)) for 60 and 40 of
    two equal shares (chi-square 4, one degree of freedom), and under 1e-4 for CI's counts
    of six equally busy processes under the first-come budget (2026-12-02)."""
    assert proportional_tail([25, 50], [1, 2]) == 1.0
    assert abs(proportional_tail([60, 40], [1, 1]) - math.erfc(math.sqrt(2))) < 1e-12
    assert proportional_tail([23, 23, 46, 17, 9, 30], [1] * 6) < 1e-4
