"""Per-CPU interrupt and idle figures from the kernel's own counters, for what shows CPUs (the
TUI's embedded mode) when the irq or cstate probe cannot run (no root, no bcc, a refused
hook): /proc/stat (irq and softirq time per CPU, in clock ticks; its one reader),
/proc/interrupts and /proc/softirqs (handler counts per CPU), and cpuidle sysfs (residency
per idle state, in µs), or /proc/stat's idle time when there is no cpuidle driver. One read
of each file per second; coarser than the probes (tick resolution, counts without
durations) and said so in the probe line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gpujitter.probes.events import CpuStats, to_record
from gpujitter.probes.host import HostPaths, read_text
from gpujitter.probes.interrupts import read_table
from gpujitter.probes.topology import Topology, idle_residency_ns

TOP_IRQS = 5


def _tick_ns() -> int:
    return 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class _Counters:
    irq_ns: dict[int, int] = field(default_factory=dict)
    softirq_ns: dict[int, int] = field(default_factory=dict)
    idle_ns: dict[int, dict[str, int]] = field(default_factory=dict)
    # (cpu, name) -> (count, remote: the IRQ's device sits on another node than the CPU)
    handlers: dict[tuple[int, str], tuple[int, bool]] = field(default_factory=dict)


class ProcCpuSampler:
    """`sample(now_ns)` gives one cpu.stats record per CPU covering the time since the previous call
    (none on the first call, which only takes the baseline). `irq` and `idle` choose which
    halves to fill: the probes' halves are better when they run."""

    def __init__(
        self,
        topology: Topology,
        paths: HostPaths | None = None,
        *,
        irq: bool = True,
        idle: bool = True,
    ) -> None:
        self.topology = topology
        self.paths = paths or HostPaths()
        self.irq = irq
        self.idle = idle
        self._tick_ns = _tick_ns()
        self._last: _Counters | None = None
        self._last_ns = 0

    def sample(self, now_ns: int) -> list[dict[str, Any]]:
        current = self._read()
        last, last_ns = self._last, self._last_ns
        self._last, self._last_ns = current, now_ns
        if last is None or now_ns <= last_ns:
            return []
        out = []
        for cpu in sorted(current.irq_ns):
            idle: tuple[tuple[str, int], ...] = ()
            if self.idle:
                before = last.idle_ns.get(cpu, {})
                idle = tuple(
                    (name, max(0, ns - before.get(name, 0)))
                    for name, ns in current.idle_ns.get(cpu, {}).items()
                )
            hard = soft = 0
            top: tuple[tuple[str, int, int], ...] = ()
            remote: tuple[tuple[str, int, int], ...] = ()
            if self.irq:
                hard = max(0, current.irq_ns[cpu] - last.irq_ns.get(cpu, 0))
                soft = max(0, current.softirq_ns.get(cpu, 0) - last.softirq_ns.get(cpu, 0))
                rows = sorted(self._handler_deltas(cpu, last, current), key=lambda r: -r[1])
                top = tuple((name, 0, n) for name, n, _ in rows[:TOP_IRQS])
                remote = tuple((name, 0, n) for name, n, far in rows if far)
            rec = to_record(
                CpuStats(
                    ts_ns=last_ns,
                    interval_ns=now_ns - last_ns,
                    cpu=cpu,
                    hardirq_ns=hard,
                    softirq_ns=soft,
                    idle_ns=idle,
                    top_irqs=top,
                )
            )
            # The irq probe's field for hard IRQs handled off their device's node.
            rec["remote_irqs"] = remote
            out.append(rec)
        return out

    @staticmethod
    def _handler_deltas(
        cpu: int, last: _Counters, now: _Counters
    ) -> Iterator[tuple[str, int, bool]]:
        for (c, name), (count, far) in now.handlers.items():
            if c != cpu:
                continue
            delta = count - last.handlers.get((c, name), (0, False))[0]
            if delta > 0:
                yield name, delta, far

    # -- readers --------------------------------------------------------------------

    def _read(self) -> _Counters:
        c = _Counters()
        self._read_stat(c)
        if self.irq:
            self._read_interrupts(c)
            self._read_softirqs(c)
        if self.idle:
            self._read_cpuidle(c)
        return c

    def _read_stat(self, c: _Counters) -> None:
        for line in (read_text(self.paths.proc / "stat") or "").splitlines():
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            fields = line.split()
            cpu = int(fields[0][3:])
            ticks = [int(v) for v in fields[1:]]
            # user nice system idle iowait irq softirq ...
            c.irq_ns[cpu] = ticks[5] * self._tick_ns
            c.softirq_ns[cpu] = ticks[6] * self._tick_ns
            c.idle_ns[cpu] = {"idle": (ticks[3] + ticks[4]) * self._tick_ns}

    def _read_interrupts(self, c: _Counters) -> None:
        for row in read_table(self.paths, "interrupts").values():
            if row.numbered:
                name = row.name or f"irq{row.label}"  # its handlers ("ACPI:Ged")
                device_node = self.topology.irq_node.get(int(row.label), -1)
            else:
                name, device_node = row.label, -1  # LOC, RES, TLB...: vectors, no device
            for cpu, count in row.per_cpu.items():
                far = device_node >= 0 and device_node != self.topology.node_of(cpu)
                c.handlers[(cpu, name)] = (count, far)

    def _read_softirqs(self, c: _Counters) -> None:
        for row in read_table(self.paths, "softirqs").values():
            for cpu, count in row.per_cpu.items():
                c.handlers[(cpu, row.label)] = (count, False)

    def _read_cpuidle(self, c: _Counters) -> None:
        base = self.paths.sys / "devices/system/cpu"
        for cpu in c.idle_ns:
            residency = idle_residency_ns(base / f"cpu{cpu}/cpuidle")
            if residency:  # a cpuidle driver: its states replace /proc/stat's idle time
                c.idle_ns[cpu] = residency
