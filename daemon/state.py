"""What the daemon knows right now, for clients that connect late and for its own status:
the latest health of each probe, the latest figures of each CPU, the recent gaps and
attributions, where each watched thread last ran. Fed every event and every finding; it
also decides which records the stream carries (the summaries, not the raw probe events)."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from typing import Any

from gpujitter.daemon.records import Attribution, GpuGap
from gpujitter.probes.events import (
    CpuStats,
    Event,
    GpuProcesses,
    Migration,
    OffCpu,
    ProbeStatus,
    ProcExit,
    to_record,
)
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.topology import Topology

# What the stream carries live (docs/schema.md "Socket messages"); raw probe events stay in
# the daemon (a trace keeps them).
STREAMED = frozenset(
    {"gpu.gap", "gpu.attribution", "cpu.stats", "meta.probe", "gpu.sample", "gpu.procs",
     "meta.watch"}
)  # fmt: skip
RECENT = 200  # gaps and attributions kept for the snapshot
MAX_THREADS = 4096  # watched threads whose placement is kept


class NodeState:
    def __init__(self, topology: Topology, gpus: list[GpuInfo] | None = None) -> None:
        self.topology = topology
        self.gpus = gpus or []
        self.probes: dict[str, ProbeStatus] = {}
        # The irq and cstate probes each send their half of a CPU's figures (interrupt time;
        # idle residency): the latest of each half is kept.
        self.cpus: dict[tuple[int, str], CpuStats] = {}
        self.procs: dict[int, GpuProcesses] = {}
        self.gaps: deque[GpuGap] = deque(maxlen=RECENT)
        self.attributions: deque[Attribution] = deque(maxlen=RECENT)
        self.threads: dict[int, tuple[int, str, int]] = {}  # tid -> (tgid, comm, cpu)
        self.events = 0

    def observe(self, ev: Event) -> None:
        self.events += 1
        if isinstance(ev, ProbeStatus):
            self.probes[ev.probe] = ev
        elif isinstance(ev, CpuStats):
            self.cpus[(ev.cpu, "idle" if ev.idle_ns else "irq")] = ev
        elif isinstance(ev, GpuGap):
            self.gaps.append(ev)
        elif isinstance(ev, Attribution):
            self.attributions.append(ev)
        elif isinstance(ev, GpuProcesses):
            self.procs[ev.gpu] = ev
        elif isinstance(ev, OffCpu):
            self._place(ev.tid, ev.tgid, ev.comm, ev.cpu_in)
        elif isinstance(ev, Migration):
            self._place(ev.tid, ev.tgid, ev.comm, ev.dst_cpu)
        elif isinstance(ev, ProcExit):
            for tid in [t for t, (tgid, _, _) in self.threads.items() if tgid == ev.tgid]:
                del self.threads[tid]

    def _place(self, tid: int, tgid: int, comm: str, cpu: int) -> None:
        if tid not in self.threads and len(self.threads) >= MAX_THREADS:
            self.threads.pop(next(iter(self.threads)))  # the longest-known thread goes
        previous = self.threads.get(tid)
        self.threads[tid] = (tgid, comm or (previous[1] if previous else ""), cpu)

    @staticmethod
    def streamed(ev: Event) -> bool:
        return ev.KIND in STREAMED

    @staticmethod
    def tgids_of(ev: Event) -> tuple[int, ...] | None:
        """The processes a streamed record concerns (for per-user filtering); None for
        node-wide records."""
        if isinstance(ev, (GpuGap, Attribution)):
            return ev.tgids
        if isinstance(ev, GpuProcesses):
            return ev.pids
        return None

    def gpu_records(self) -> list[dict[str, Any]]:
        return [
            {"index": g.index, "name": g.name, "pci_bus_id": g.pci_bus_id,
             "numa_node": self.topology.gpu_node.get(g.pci_bus_id, g.numa_node),
             "local_cpus": list(g.local_cpus)}
            for g in self.gpus
        ]  # fmt: skip

    def status(self, now_ns: int, **own: Any) -> dict[str, Any]:
        """The daemon.status record: `own` carries the daemon's footprint and counters."""
        threads = [
            {"tid": tid, "tgid": tgid, "comm": comm, "cpu": cpu,
             "node": self.topology.node_of(cpu)}
            for tid, (tgid, comm, cpu) in sorted(self.threads.items())
        ]  # fmt: skip
        return {"type": "daemon.status", "ts_ns": now_ns, **own, "threads": threads}

    def snapshot(self, now_ns: int, status: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "snapshot",
            "ts_ns": now_ns,
            "probes": [to_record(s) for s in self.probes.values()],
            "gpus": self.gpu_records(),
            "gaps": [to_record(g) for g in self.gaps],
            "attributions": [to_record(a) for a in self.attributions],
            "cpus": [to_record(c) for _, c in sorted(self.cpus.items())],
            "procs": [to_record(p) for _, p in sorted(self.procs.items())],
            "status": status,
        }

    def probe_summary(self) -> dict[str, dict[str, Any]]:
        return {name: asdict(s) for name, s in self.probes.items()}
