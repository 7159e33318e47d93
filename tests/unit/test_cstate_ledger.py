"""cstate's per-sample idle time from the kernel's residency words (IdleLedger): a stretch
that straddles a read splits exactly there, no sample holds more idle time than its length,
and what the samples hold adds up to what the CPU idled."""

from __future__ import annotations

from gpujitter.probes.cstate import IDLE_STATES, IdleLedger, residency_at

T0 = 55_000_000_000_000  # a monotonic clock some 15 hours after boot
WORD = 1 << 64


class Cpu:
    """One CPU's residency words, changed as cstate.bpf.c's cpu_idle program changes them."""

    def __init__(self) -> None:
        self.words = [0] * IDLE_STATES
        self.state = -1

    def enter(self, state: int, at_ns: int) -> None:
        self.words[state] = (self.words[state] + 1 - 2 * at_ns) % WORD
        self.state = state

    def leave(self, at_ns: int) -> None:
        self.words[self.state] = (self.words[self.state] + 2 * at_ns - 1) % WORD
        self.state = -1

    def read(self) -> dict[int, list[int]]:
        return {0: list(self.words)}


def test_a_word_gives_the_residency_at_the_read_in_progress_or_not() -> None:
    cpu = Cpu()
    cpu.enter(1, T0)
    cpu.leave(T0 + 300)
    assert residency_at(cpu.words[1], T0 + 1_000) == 300
    cpu.enter(1, T0 + 2_000)
    assert residency_at(cpu.words[1], T0 + 2_500) == 800  # 300 done, 500 in progress
    # a clock read a little behind the kernel's: the stretch has not begun yet
    fresh = Cpu()
    fresh.enter(2, T0)
    assert residency_at(fresh.words[2], T0 - 5) == 0


def test_a_stretch_that_straddles_reads_splits_at_each_read() -> None:
    cpu = Cpu()
    cpu.enter(1, T0 - 500)
    ledger = IdleLedger(cpu.read(), T0)  # idle since before the first read
    assert ledger.take(cpu.read(), T0 + 1_000) == {0: [(1, 1_000)]}  # idle throughout
    cpu.leave(T0 + 1_600)
    cpu.enter(1, T0 + 1_800)
    assert ledger.take(cpu.read(), T0 + 2_000) == {0: [(1, 800)]}  # 600 + 200 so far
    cpu.leave(T0 + 2_100)
    assert ledger.take(cpu.read(), T0 + 3_000) == {0: [(1, 100)]}
    assert ledger.since_ns == T0 + 3_000


def test_a_stretch_begun_after_a_reads_copy_is_held_back_to_fit_the_next_interval() -> None:
    # The CPU enters its state after the words were copied but before the read was stamped:
    # no read shows those 10 ns before it. The next sample gets at most its own length; the
    # 10 ns come with the first sample that has room for them.
    cpu = Cpu()
    before = cpu.read()
    cpu.enter(1, T0 - 10)
    ledger = IdleLedger(before, T0)
    assert ledger.take(cpu.read(), T0 + 1_000) == {0: [(1, 1_000)]}
    assert ledger.take(cpu.read(), T0 + 2_000) == {0: [(1, 1_000)]}
    cpu.leave(T0 + 2_500)
    assert ledger.take(cpu.read(), T0 + 3_000) == {0: [(1, 510)]}  # 500 and the 10 held back
    assert ledger.take(cpu.read(), T0 + 4_000) == {0: []}


def test_over_its_length_a_sample_is_cut_from_its_largest_state_first() -> None:
    cpu = Cpu()
    before = cpu.read()
    cpu.enter(0, T0 - 40)
    cpu.leave(T0 - 10)
    cpu.enter(3, T0 - 5)
    ledger = IdleLedger(before, T0)
    cpu.leave(T0 + 985)
    taken = ledger.take(cpu.read(), T0 + 1_000)  # 30 + 990 gained in 1 000 ns
    assert taken == {0: [(0, 30), (3, 970)]}
    assert ledger.take(cpu.read(), T0 + 2_000) == {0: [(3, 20)]}
