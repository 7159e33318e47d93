"""What the daemon knows right now, for clients that connect late and for its own status:
the latest health of each probe, the latest figures of each CPU, the recent gaps and
attributions, where each watched thread last ran. Fed every event and every finding; it
also decides which records the stream carries (the summaries, not the raw probe events).

The main thread feeds it; the stream's thread reads it (a client's first snapshot). A lock
guards every structure: readers copy what they need under it and build records after, so
the feeding thread waits at most for a copy."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.service.status import DaemonStatus, ProbeCost, WatchedThread
from gpujitter.probes.events import (
    ClockRef,
    CpuStats,
    Event,
    GpuProcesses,
    Migration,
    OffCpu,
    ProbeStatus,
    ProcExit,
    ThreadExit,
    to_record,
)
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.topology import Topology

# What the stream carries live (docs/schema.md "Socket messages"); raw probe events stay in
# the daemon (a trace keeps them).
STREAMED = frozenset(
    {"gpu.gap", "gpu.attribution", "cpu.stats", "meta.probe", "gpu.sample", "gpu.procs",
     "meta.watch", "meta.clock"}
)  # fmt: skip
RECENT = 200  # gaps and attributions kept for the snapshot
MAX_THREADS = 4096  # watched threads whose placement is kept
GONE_CHECKS = 256  # threads asked about per forget_gone (a /proc stat each, ~3 µs)


class NodeState:
    def __init__(self, topology: Topology, gpus: list[GpuInfo] | None = None) -> None:
        self.topology = topology
        self.gpus = gpus or []
        self._lock = threading.Lock()
        self.probes: dict[str, ProbeStatus] = {}
        # The wall clock's reference since it was set during the run (None: as the hello's).
        self.clock: ClockRef | None = None
        # The irq and cstate probes each send their half of a CPU's figures (interrupt time;
        # idle residency): the latest of each half is kept.
        self.cpus: dict[tuple[int, str], CpuStats] = {}
        self.procs: dict[int, GpuProcesses] = {}
        self.gaps: deque[GpuGap] = deque(maxlen=RECENT)
        self.attributions: deque[Attribution] = deque(maxlen=RECENT)
        self.threads: dict[int, tuple[int, str, int]] = {}  # tid -> (tgid, comm, cpu)
        self._tids: dict[int, set[int]] = {}  # tgid -> its tids in `threads`
        # When recently ended threads and processes ended: the probes' rings are read one
        # after another, so an event of a thread can arrive after its exit and must not
        # bring it back. Bounded; a reused id counts again from after its exit.
        self._ended: dict[tuple[str, int], int] = {}
        self.events = 0

    def observe(self, ev: Event) -> None:
        # The count is the runtime thread's alone (it writes and reads it); the lock guards
        # what the stream's thread reads too, and is taken only by the events that change it
        # (a third of them on the H200: a lock per event is ~0.1-0.3 µs).
        self.events += 1
        keep = _KEEPERS.get(type(ev))
        if keep is not None:
            with self._lock:
                keep(self, ev)

    def _probe(self, ev: ProbeStatus) -> None:
        self.probes[ev.probe] = ev

    def _cpu(self, ev: CpuStats) -> None:
        self.cpus[(ev.cpu, "idle" if ev.idle_ns else "irq")] = ev

    def _procs(self, ev: GpuProcesses) -> None:
        self.procs[ev.gpu] = ev

    def _off_cpu(self, ev: OffCpu) -> None:
        self._place(ev.ts_ns, ev.tid, ev.tgid, ev.comm, ev.cpu_in)

    def _migration(self, ev: Migration) -> None:
        self._place(ev.ts_ns, ev.tid, ev.tgid, ev.comm, ev.dst_cpu)

    def _thread_exit(self, ev: ThreadExit) -> None:
        self._end(("tid", ev.tid), ev.ts_ns)
        self._forget(ev.tid)

    def _proc_exit(self, ev: ProcExit) -> None:
        self._end(("tgid", ev.tgid), ev.ts_ns)
        for tid in list(self._tids.get(ev.tgid, ())):
            self._forget(tid)

    def _place(self, ts_ns: int, tid: int, tgid: int, comm: str, cpu: int) -> None:
        if self._ended and ts_ns <= max(
            self._ended.get(("tid", tid), -1), self._ended.get(("tgid", tgid), -1)
        ):
            return  # news of a thread that has ended since
        if tid not in self.threads and len(self.threads) >= MAX_THREADS:
            self._forget(next(iter(self.threads)))  # the thread placed longest ago goes
        previous = self.threads.pop(tid, None)  # re-entered: the order is of last placement
        if previous is not None and previous[0] != tgid:
            self._tids_discard(previous[0], tid)  # the id now names a thread of another process
            previous = None
        self.threads[tid] = (tgid, comm or (previous[1] if previous else ""), cpu)
        self._tids.setdefault(tgid, set()).add(tid)

    def forget_gone(self, alive: Callable[[int], bool], budget: int = GONE_CHECKS) -> int:
        """Threads placed longest ago that are gone, forgotten (how many): an exit is
        streamed only for a process in the watched set, so with every process watched (no
        set) nothing else takes an exited thread out, and thousands of short-lived ones
        filled `threads`, each daemon.status with them (250 KB a second to every client).
        At most `budget` are asked about; those alive go to the back, so that the next call
        asks about others. The live daemon calls it once a tick (`alive`: /proc/TID)."""
        with self._lock:
            oldest = list(itertools.islice(self.threads, budget))
        gone = [tid for tid in oldest if not alive(tid)]
        with self._lock:
            for tid in oldest:
                known = self.threads.pop(tid, None)
                if known is not None and tid not in gone:
                    self.threads[tid] = known
                elif known is not None:
                    self._tids_discard(known[0], tid)
        return len(gone)

    def _forget(self, tid: int) -> None:
        known = self.threads.pop(tid, None)
        if known is not None:
            self._tids_discard(known[0], tid)

    def _tids_discard(self, tgid: int, tid: int) -> None:
        if (tids := self._tids.get(tgid)) is not None:
            tids.discard(tid)
            if not tids:
                del self._tids[tgid]

    def _end(self, key: tuple[str, int], ts_ns: int) -> None:
        self._ended.pop(key, None)
        self._ended[key] = ts_ns
        if len(self._ended) > MAX_THREADS:
            self._ended.pop(next(iter(self._ended)))

    def lost(self) -> tuple[int, int]:
        """Events the probes lost since start: (in the kernel, in Python)."""
        with self._lock:
            probes = list(self.probes.values())
        return sum(p.lost_kernel for p in probes), sum(p.lost_user for p in probes)

    def probe_cost(self) -> dict[str, ProbeCost]:
        """Per probe, what it costs and delivers (daemon.status's probe_cost)."""
        with self._lock:
            probes = list(self.probes.values())
        return {
            p.probe: ProbeCost(
                state=p.state,
                bpf_ns_per_s=p.bpf_ns_per_s,
                bpf_runs_per_s=p.bpf_runs_per_s,
                cost_from=p.cost_from,
                events=p.events,
                lost_kernel=p.lost_kernel,
                lost_user=p.lost_user,
            )
            for p in probes
        }

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

    def status(self, now_ns: int, **own: Any) -> DaemonStatus:
        """The daemon.status record: `own` carries the daemon's footprint and counters."""
        with self._lock:
            placed = sorted(self.threads.items())
        threads = tuple(
            WatchedThread(tid, tgid, comm, cpu, self.topology.node_of(cpu))
            for tid, (tgid, comm, cpu) in placed
        )
        return DaemonStatus(ts_ns=now_ns, **own, threads=threads)

    def snapshot(self, now_ns: int, status: DaemonStatus) -> dict[str, Any]:
        # The records are frozen: copies of the containers are enough.
        with self._lock:
            probes = list(self.probes.values())
            gaps = list(self.gaps)
            attributions = list(self.attributions)
            cpus = sorted(self.cpus.items())
            procs = sorted(self.procs.items())
            clock = self.clock
        return {
            "type": "snapshot",
            "ts_ns": now_ns,
            "probes": [to_record(s) for s in probes],
            "gpus": self.gpu_records(),
            "gaps": [to_record(g) for g in gaps],
            "attributions": [to_record(a) for a in attributions],
            "cpus": [to_record(c) for _, c in cpus],
            "procs": [to_record(p) for _, p in procs],
            "status": status.to_record(),
        } | ({"clock": to_record(clock)} if clock is not None else {})


# What each kind of record changes in the state, by its exact type (a lookup per event
# instead of a chain of isinstance tests; the kinds have no subclasses). Other kinds are
# only counted.
_KEEPERS: dict[type[Event], Callable[[NodeState, Any], None]] = {
    ProbeStatus: NodeState._probe,
    CpuStats: NodeState._cpu,
    GpuGap: lambda state, ev: state.gaps.append(ev),
    Attribution: lambda state, ev: state.attributions.append(ev),
    GpuProcesses: NodeState._procs,
    OffCpu: NodeState._off_cpu,
    Migration: NodeState._migration,
    ThreadExit: NodeState._thread_exit,
    ProcExit: NodeState._proc_exit,
    ClockRef: lambda state, ev: setattr(state, "clock", ev),
}
