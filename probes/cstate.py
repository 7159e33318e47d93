"""cstate: per-CPU idle states and the wake-ups of watched threads onto idle CPUs. Traced
through power:cpu_idle, sched_switch and sched_waking (see cstate.bpf.c for the in-kernel side
and its cost). Wake-ups onto an idle CPU whose wake->run latency exceeds the `wake` threshold
stream as IdleWake (state, how long the CPU idled, the state's exit latency from cpuidle
sysfs); every CPU's idle residency per state arrives once a second as CpuStats (over the
interval between two reads of the kernel's counters, split exactly at each read: IdleLedger),
the wake->run histograms per state as Log2Hist.

State names and exit latencies come from /sys/devices/system/cpu/cpuN/cpuidle/stateK. Without
a cpuidle driver (no such directories) the kernel's default idle reports state 1 for HLT and
state 0 for polling, whose exit latency is not published (reported as -1).
"""

from __future__ import annotations

import ctypes as ct
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gpujitter.probes.base import BpfProbe, ProbeContext
from gpujitter.probes.events import CpuStats, Event, IdleWake
from gpujitter.probes.host import HostPaths
from gpujitter.probes.ledger import Ledger
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.registry import Hook, ProbeSpec
from gpujitter.probes.sched import IDLE_WAKE_CARRIED
from gpujitter.probes.topology import IdleState, cpuidle_states

if TYPE_CHECKING:
    from gpujitter.probes.bundle import Bundle

# Idle states counted per CPU (cpuidle has at most 10, CPUIDLE_STATE_MAX); the last slot also
# holds higher state numbers. The .bpf.c gets it as IDLE_STATES.
IDLE_STATES = 16


# The kernel's default idle without a cpuidle driver (cpu_idle_poll, default_idle_call).
DEFAULT_IDLE = {
    0: IdleState(0, "POLL", "", None, None),
    1: IdleState(1, "HLT", "", None, None),
}


def idle_states(paths: HostPaths, cpus: Iterable[int]) -> dict[int, dict[int, IdleState]]:
    """Per CPU: idle state number -> its state, from cpuidle sysfs."""
    out = {}
    for cpu in cpus:
        found = cpuidle_states(paths.sys / f"devices/system/cpu/cpu{cpu}/cpuidle")
        out[cpu] = {st.index: st for st in found} or dict(DEFAULT_IDLE)
    return out


def _state(states: dict[int, IdleState], n: int) -> IdleState:
    return states.get(n) or IdleState(n, f"state{n}", "", None, None)


# What the .bpf.c gets as -D options (it never restates them).
CONSTANTS = {"IDLE_STATES": IDLE_STATES}
# The probe whose programs run this one's share of these raw tracepoints where both are in
# one module and that probe's programs on them are attached (cstate.bpf.c, `carried`).
CARRIER = "sched"
CARRIED = ("sched_switch", "sched_waking")

_WORD = 1 << 64


def residency_at(word: int, at_ns: int) -> int:
    """A state's residency in ns at at_ns from its word in idle_now.residency2 (twice the
    residency, less twice the entry time plus one while the CPU is in that state, modulo
    2^64: cstate.bpf.c), at_ns not before the word was read."""
    if not word & 1:
        return word // 2
    doubled = (word - 1 + 2 * at_ns) % _WORD
    # a clock read here a little behind the kernel's (at_ns before the entry): nothing yet
    return 0 if doubled >= _WORD // 2 else doubled // 2


class IdleLedger(Ledger):
    """Per-(CPU, state) residency handed out sample by sample: what each gained between two
    reads of the kernel's words. Reads are stamped after the words are copied, so a stretch in
    progress counts up to the read and on from there in the next sample. A stretch that
    started between a word's copy and the stamp is the one thing no read shows: the gain of
    the next sample can then top its interval by that much (microseconds); it is held back
    for the samples after, so that no sample holds more idle time than its length and none
    is lost."""

    def __init__(self, words: dict[int, list[int]], read_ns: int) -> None:
        super().__init__(words, read_ns, residency_at)


class CstateProbe(BpfProbe):
    bpf_file = "cstate.bpf.c"
    rings = ("idle_wakes",)
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.paths = HostPaths()
        self.states: dict[int, dict[int, IdleState]] = {}
        self._cpus: list[int] = []
        self._ledger: IdleLedger | None = None
        self._hists: Log2Map | None = None
        self.carrier = 0  # the carrier's part number in this probe's module; 0: none
        self._shared: dict[str, Any] = {}

    def carried(self, bundle: Bundle) -> frozenset[str]:
        self.carrier = bundle.carrier(CARRIER, CARRIED)
        return frozenset(CARRIED) if self.carrier else frozenset()

    def attach(self, ctx: ProbeContext) -> None:
        self.bpf["carried"][ct.c_uint(0)] = ct.c_uint(self.carrier)
        if self.carrier:
            # The wake-ups that ride in the carrier's off-CPU records (sched.bpf.c).
            self._shared = ctx.shared
            ctx.shared[IDLE_WAKE_CARRIED] = self._carried_wake

    def close(self) -> None:
        if self.bpf is not None and self.carrier:
            # the carrier's programs stop running this probe's share before its maps go
            self.bpf["carried"][ct.c_uint(0)] = ct.c_uint(0)
            if self._shared.get(IDLE_WAKE_CARRIED) == self._carried_wake:
                del self._shared[IDLE_WAKE_CARRIED]
        super().close()

    def start(self, ctx: ProbeContext) -> None:
        self._cpus = ctx.topology.cpus
        self.states = idle_states(self.paths, self._cpus)
        super().start(ctx)
        names = [_state(self.states[self._cpus[0]], n).name for n in range(IDLE_STATES)]
        self._hists = Log2Map(
            self.bpf["wake_log2"], [f"wake_to_run.{n}" for n in [*names, "busy"]], self.name
        )
        self._ledger = IdleLedger(*self._read_words())

    def decode(self, ring: str, rec: Any) -> IdleWake:
        return self._idle_wake(rec.ts_ns, rec.tid, rec.tgid, rec.cpu, rec.state, rec.idle_ns,
                               rec.in_state_ns, rec.wake_to_run_ns)  # fmt: skip

    def _carried_wake(self, rec: Any) -> None:
        """The IdleWake that the carrier's off-CPU record `rec` holds (idle_state: the state
        plus one): woken at runnable_ns, switched in at end_ns on cpu_in."""
        self.deliver(
            self._idle_wake(rec.runnable_ns, rec.tid, rec.tgid, rec.cpu_in, rec.idle_state - 1,
                            rec.idle_ns, rec.in_state_ns, rec.end_ns - rec.runnable_ns)
        )  # fmt: skip

    def _idle_wake(self, wake_ns: int, tid: int, tgid: int, cpu: int, n: int, idle_ns: int,
                   in_state_ns: int, wake_to_run_ns: int) -> IdleWake:  # fmt: skip
        state = _state(self.states.get(cpu, DEFAULT_IDLE), n)
        return IdleWake(
            ts_ns=wake_ns,
            tid=tid,
            tgid=tgid,
            cpu=cpu,
            state=n,
            state_name=state.name,
            idle_ns=idle_ns,
            in_state_ns=in_state_ns,
            exit_latency_ns=state.exit_latency_ns,
            wake_to_run_ns=wake_to_run_ns,
        )

    def _read_words(self) -> tuple[dict[int, list[int]], int]:
        """Per CPU its residency words (idle_now.residency2), and the time just after the
        copy: every stretch the words show in progress had begun by then."""
        per_cpu = self.bpf["idle_now"][ct.c_uint(0)]
        read_ns = time.monotonic_ns()
        return {cpu: list(per_cpu[cpu].residency2) for cpu in self._cpus}, read_ns

    def sample(self, now_ns: int) -> Iterable[Event]:
        # Idle time over the probe's own reads, not the tick's time: the counters are read
        # later than that (the core's refresh and other probes' samples come first), and
        # what the CPUs idled meanwhile belongs to the next sample.
        events: list[Event] = []
        if self._ledger is not None:
            since_ns = self._ledger.since_ns
            words, read_ns = self._read_words()
            gains = self._ledger.take(words, read_ns)
            events += [
                CpuStats(
                    ts_ns=since_ns,
                    interval_ns=read_ns - since_ns,
                    cpu=cpu,
                    idle_ns=tuple((_state(self.states[cpu], n).name, ns) for n, ns in states),
                )
                for cpu, states in gains.items()
            ]
        return events

    def log2_maps(self) -> list[Log2Map]:
        return [self._hists] if self._hists is not None else []


SPECS = (
    ProbeSpec(
        name="cstate",
        summary="idle-state residency per CPU; wake-ups of watched threads onto idle CPUs",
        default_on=True,
        hooks=(
            Hook("tracepoint", "power:cpu_idle"),
            Hook("tracepoint", "sched:sched_switch"),
            Hook("tracepoint", "sched:sched_waking"),
        ),
        degrades="wake-up delays from idle states are not attributed",
        factory=CstateProbe,
        thresholds={"wake": 50_000},
    ),
)
