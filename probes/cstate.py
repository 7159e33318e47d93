"""cstate: per-CPU idle states and the wake-ups of watched threads onto idle CPUs. Traced
through power:cpu_idle, sched_switch and sched_waking (see cstate.bpf.c for the in-kernel side
and its cost). Wake-ups onto an idle CPU whose wake->run latency exceeds the `wake` threshold
stream as IdleWake (state, how long the CPU idled, the state's exit latency from cpuidle
sysfs); every CPU's idle residency per state arrives once a second as CpuStats, the
wake->run histograms per state as Log2Hist.

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
from gpujitter.probes.log2 import Log2Map
from gpujitter.probes.registry import Hook, ProbeSpec
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


class CstateProbe(BpfProbe):
    bpf_file = "cstate.bpf.c"
    rings = ("idle_wakes",)
    constants = CONSTANTS

    def __init__(self, spec: ProbeSpec) -> None:
        super().__init__(spec)
        self.paths = HostPaths()
        self.states: dict[int, dict[int, IdleState]] = {}
        self._cpus: list[int] = []
        self._last_ns = 0
        self._last: dict[tuple[int, int], int] = {}  # (cpu, state) -> residency reported
        self._hists: Log2Map | None = None
        self.carrier = 0  # the carrier's part number in this probe's module; 0: none

    def carried(self, bundle: Bundle) -> frozenset[str]:
        self.carrier = bundle.carrier(CARRIER, CARRIED)
        return frozenset(CARRIED) if self.carrier else frozenset()

    def attach(self, ctx: ProbeContext) -> None:
        self.bpf["carried"][ct.c_uint(0)] = ct.c_uint(self.carrier)

    def close(self) -> None:
        if self.bpf is not None and self.carrier:
            # the carrier's programs stop running this probe's share before its maps go
            self.bpf["carried"][ct.c_uint(0)] = ct.c_uint(0)
        super().close()

    def start(self, ctx: ProbeContext) -> None:
        self._cpus = ctx.topology.cpus
        self.states = idle_states(self.paths, self._cpus)
        super().start(ctx)
        names = [_state(self.states[self._cpus[0]], n).name for n in range(IDLE_STATES)]
        self._hists = Log2Map(
            self.bpf["wake_log2"], [f"wake_to_run.{n}" for n in [*names, "busy"]], self.name
        )
        self._last_ns = time.monotonic_ns()
        self._last = self._residency(self._last_ns)

    def decode(self, ring: str, rec: Any) -> IdleWake:
        state = _state(self.states.get(rec.cpu, DEFAULT_IDLE), rec.state)
        return IdleWake(
            ts_ns=rec.ts_ns,
            tid=rec.tid,
            tgid=rec.tgid,
            cpu=rec.cpu,
            state=rec.state,
            state_name=state.name,
            idle_ns=rec.idle_ns,
            in_state_ns=rec.in_state_ns,
            exit_latency_ns=state.exit_latency_ns,
            wake_to_run_ns=rec.wake_to_run_ns,
        )

    def _residency(self, now_ns: int) -> dict[tuple[int, int], int]:
        """(cpu, state) -> idle ns since load, the idle interval in progress included."""
        out: dict[tuple[int, int], int] = {}
        for key, per_cpu in self.bpf["residency_ns"].items_lookup_batch():
            for cpu in self._cpus:
                if per_cpu[cpu]:
                    out[cpu, int(key)] = per_cpu[cpu]
        for cpu, c in enumerate(self.bpf["idle_now"][ct.c_uint(0)]):
            if c.in_idle and now_ns > c.entry_ns and cpu in self.states:
                key = (cpu, min(c.state, IDLE_STATES - 1))
                out[key] = out.get(key, 0) + now_ns - c.entry_ns
        return out

    def sample(self, now_ns: int) -> Iterable[Event]:
        interval = now_ns - self._last_ns
        idle: dict[int, list[tuple[str, int]]] = {cpu: [] for cpu in self._cpus}
        for (cpu, state), ns in sorted(self._residency(now_ns).items()):
            last = self._last.get((cpu, state), 0)
            # The interval in progress is read apart from the totals: never go backwards.
            if ns > last:
                idle[cpu].append((_state(self.states[cpu], state).name, ns - last))
                self._last[cpu, state] = ns
        events: list[Event] = [
            CpuStats(ts_ns=self._last_ns, interval_ns=interval, cpu=cpu, idle_ns=tuple(states))
            for cpu, states in idle.items()
        ]
        if self._hists is not None:
            events += self._hists.delta(now_ns, interval)
        self._last_ns = now_ns
        return events


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
