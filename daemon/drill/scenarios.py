"""The drill scenarios: for each, the cause its injection is, how the loop measures that
cause's time (the truth), the probes it needs to be seen, and the drill's side of the
set-up (system state and helper processes, always restored) around the feeding thread's
side (injectors.py). One registry; `gpujitter drill --help` lists it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujitter.daemon.analysis.records import AllocEvidence, Evidence
from gpujitter.daemon.drill import system
from gpujitter.daemon.drill.helpers import child_env
from gpujitter.errors import GpujitterError
from gpujitter.probes.host import HostPaths, format_cpulist
from gpujitter.probes.procfs import task_ids
from gpujitter.probes.topology import UNKNOWN_GPU_KEY, Topology

MB = 1 << 20
# The readahead drill's disk: read-ahead windows of WINDOW_KB, read at READ_BPS.
WINDOW_KB = 512
READ_BPS = 32 * MB


@dataclass
class Stage:
    """What a scenario's set-up decides: where the feeder runs, its parameters, system
    state (entered into `stack`, so restored in reverse order however the drill ends),
    helper processes, probe thresholds and a topology override."""

    stack: contextlib.ExitStack
    work: Path  # the drill's scratch folder (on disk, not tmpfs)
    topology: Topology  # the node's real topology
    backend: str
    stalls: int
    stall_ms: float
    feeder_cpu: int = -1
    params: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    thresholds: dict[str, dict[str, int]] = field(default_factory=dict)
    override: Path | None = None
    pass_fds: list[int] = field(default_factory=list)  # the feeder's ends of helper pipes
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.feeder_cpu < 0:
            self.feeder_cpu = max(self.topology.cpus)

    @property
    def other_cpus(self) -> list[int]:
        """Where the drill itself and helpers that must not disturb the feeder run."""
        return [c for c in self.topology.cpus if c != self.feeder_cpu] or [self.feeder_cpu]

    def helper_tids(self) -> set[int]:
        """The threads of the helpers still running (read while they are)."""
        tids: set[int] = set()
        for proc in self.helpers:
            tids |= set(task_ids(HostPaths(), proc.pid))
        return tids

    def enter(self, cm: contextlib.AbstractContextManager[Any]) -> Any:
        return self.stack.enter_context(cm)

    def helper(self, role: str, *args: str) -> None:
        """Start a helper (helpers.py) woken by the feeder through a pipe; the feeder gets
        the write end as params["trigger_fd"]. It ends when the drill closes its end."""
        read, write = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "gpujitter.daemon.drill.helpers", role, str(read), *args],
            pass_fds=(read,),
            env=child_env(),
        )
        os.close(read)
        self.helpers.append(proc)
        self.stack.callback(_stop, proc, write)
        self.params["trigger_fd"] = write
        self.pass_fds.append(write)


def _stop(proc: subprocess.Popen[bytes], write_fd: int) -> None:
    os.close(write_fd)  # the helper sees the end of its pipe and exits
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    cause: str  # the cause the injection is ("" for the control)
    truth: str  # what the loop measures as that cause's time
    needs: tuple[str, ...]  # probes without which the cause cannot be seen
    stage: Callable[[Stage], None] = lambda stage: None
    duration_s: float = 20.0  # default run length
    truth_holds_waits: bool = True  # the loop's measure includes time it waited to run
    prefeed: bool = False  # the loop keeps the GPU busy before the probes attach
    # Which evidence of the cause the injection makes (None: all of it); the rest is the
    # loop's own work that outside load pushed into a stall's gap (drill/score.py).
    injected: Callable[[Evidence], bool] | None = None


def _munmaps(e: Evidence) -> bool:
    """The malloc scenario's injection: the munmaps of its pool (its mmaps refill the pool
    while the GPU is busy, between stalls)."""
    return isinstance(e, AllocEvidence) and e.call == "munmap"


def _swap(stage: Stage) -> None:
    limit = 64 * MB
    # What the stalls will read back, with room: at 10 us a swap-in, 0.4 MB per stall ms.
    swapped = max(128 * MB, int(stage.stalls * stage.stall_ms * 0.4 * MB))
    stage.enter(system.sysctl("vm.page-cluster", "0"))
    stage.enter(system.swap_file(stage.work / "swap", swapped + 2 * limit))
    group = stage.enter(system.memory_cgroup(f"gpujitter-drill-{os.getpid()}", limit))
    stage.params.update(cgroup=str(group), buffer_bytes=swapped + limit)
    stage.notes.append(
        f"swap: a {(swapped + 2 * limit) // MB} MiB swap file, the feeder in memory cgroup "
        f"{group.name} capped at {limit // MB} MiB under a {(swapped + limit) // MB} MiB "
        "buffer; vm.page-cluster=0 (one swap-in per page, no read-ahead)"
    )


def _data_file(stage: Stage) -> Path:
    size = max(64 * MB, int(stage.stall_ms * 0.4 * MB))
    path = stage.work / "data"
    if not path.exists():
        system.write_file(path, size)
    return path


def _filefaults(stage: Stage) -> None:
    stage.params["file"] = str(_data_file(stage))


def _readahead(stage: Stage) -> None:
    # The development VM's virtio disk reads at 1.5-2 GB/s from its host's cache: there a
    # read-ahead window is a few ms of waiting, and copying it out costs more on CPU.
    # Throttled to a network volume's speed, the waits are most of the stall, as for a
    # data loader on slow storage. The throttle (blk-throttle) lets a slice's worth of
    # bytes through at once (100 ms on a rotational queue: 3.2 MiB here, a few ms of
    # copying) and holds the read that exceeds it to the slice's end: a stall runs on to
    # about 100 ms whatever its length, in waits of whole windows (small ones, so that
    # one window never holds it over several slices).
    data = _data_file(stage)
    disk = system.whole_disk(data)
    stage.params["file"] = str(data)
    stage.params["chunk_bytes"] = WINDOW_KB * 1024
    stage.enter(system.read_ahead_kb(disk, WINDOW_KB))
    group = stage.enter(system.read_throttle(f"gpujitter-drill-{os.getpid()}", disk, READ_BPS))
    if group is None:
        stage.notes.append(
            f"readahead: no block-I/O cgroup controller: the disk {disk} reads at full speed, "
            "and a fast disk makes the stall mostly on-CPU copying"
        )
        return
    stage.params["cgroup"] = str(group)
    stage.notes.append(
        f"readahead: the feeder in cgroup {group.name}, reads from disk {disk} throttled "
        f"to {READ_BPS // MB} MiB/s, read-ahead {WINDOW_KB} KiB; the file's page cache "
        "dropped at every step"
    )


def _contention(stage: Stage) -> None:
    if system.realtime_allowed():
        stage.helper("hog", str(stage.feeder_cpu), "fifo")
        stage.notes.append(f"contention: a SCHED_FIFO hog on CPU {stage.feeder_cpu}, the feeder's")
    else:
        stage.helper("hog", str(stage.feeder_cpu), "nice")
        stage.notes.append(
            f"contention: SCHED_FIFO is refused here (no real-time budget in this cgroup): "
            f"a nice -20 hog on CPU {stage.feeder_cpu}, the feeder's, which leaves the "
            "feeder about 1 % of the CPU"
        )


# The sync-contention hog lands this long before the queue drains (a step's 10 ms of work
# were enqueued just before: the feeder is asleep in the synchronisation by then).
SYNC_HOG_LEAD_MS = 3.0


def _stub_hog(stage: Stage, name: str, *span_ms: str) -> str:
    """The hog of the drills whose truth is the stub's drain (stub backend only), on the
    feeder's CPU; its policy."""
    if stage.backend != "stub":
        raise GpujitterError(
            f"the {name} drill needs --backend stub: the truth is when the GPU's "
            "queue drains, which only the stub libcuda knows"
        )
    policy = "fifo" if system.realtime_allowed() else "nice"
    stage.helper("hog", str(stage.feeder_cpu), policy, *span_ms)
    return policy


def _hog_in_sync(stage: Stage, name: str, waits: str) -> None:
    policy = _stub_hog(stage, name, str(stage.stall_ms + SYNC_HOG_LEAD_MS))
    stage.notes.append(
        f"{name}: a {policy} hog on CPU {stage.feeder_cpu}, the feeder's, from "
        f"{SYNC_HOG_LEAD_MS:g} ms before the queue drains while the feeder {waits} in "
        "cuStreamSynchronize, until the stall's end"
    )


def _sync_contention(stage: Stage) -> None:
    _hog_in_sync(stage, "sync-contention", "sleeps")


def _sync_spin(stage: Stage) -> None:
    # The stub's synchronisation spins (CUDA's default): no wake-up marks the drain.
    stage.params["stub_sync"] = "spin"
    _hog_in_sync(stage, "sync-spin", "spins")


def _sync_late(stage: Stage) -> None:
    # The H200 real job's miss: the hog, woken just before the sync is called, preempts the
    # thread outside any CUDA call with the step's work queued; PyTorch's sync spins.
    stage.params["stub_sync"] = "spin"
    policy = _stub_hog(stage, "sync-late")
    stage.notes.append(
        f"sync-late: a {policy} hog on CPU {stage.feeder_cpu}, the feeder's, woken by the "
        "feeder once the step's work is queued, before it calls cuStreamSynchronize (the "
        "stub's spinning mode), until the stall's end: the sync, reached then, returns at once"
    )


def _irq(stage: Stage) -> None:
    data = _data_file(stage)
    irq, name = system.disk_irq(data)
    if not stage.enter(system.irq_affinity(irq, [stage.feeder_cpu])):
        stage.feeder_cpu = system.effective_cpus(irq)[0]
        stage.notes.append(
            f"irq: IRQ {irq} ({name}) is managed (its affinity cannot be set: EPERM); the "
            f"feeder runs on CPU {stage.feeder_cpu}, where the kernel sends it"
        )
    else:
        stage.notes.append(f"irq: IRQ {irq} ({name}) routed to CPU {stage.feeder_cpu}")
    stage.helper("io", str(data), "4", format_cpulist(stage.other_cpus))


def _migrate(stage: Stage) -> None:
    cpus = stage.topology.cpus
    if len(cpus) < 2:
        raise GpujitterError("the migrate drill needs at least 2 CPUs")
    half = len(cpus) // 2
    near, far = cpus[:half], cpus[half:]
    # The stub GPU has no PCI address (no NVML: its gaps are on GPU -1): the override
    # places it by the key for a GPU without a bus id.
    buses = [f'"{g.bus_id}"' for g in stage.topology.gpus if g.bus_id]
    if stage.backend == "stub":
        buses.append(UNKNOWN_GPU_KEY)
    gpus = "".join(f"{bus} = 0\n" for bus in buses)
    stage.override = stage.work / "topology.toml"
    stage.override.write_text(
        f'[nodes]\n0 = "{format_cpulist(near)}"\n1 = "{format_cpulist(far)}"\n[gpus]\n{gpus}'
    )
    stage.feeder_cpu = near[-1]
    stage.params["remote_cpu"] = far[-1]
    stage.notes.append(
        f"migrate: topology override: node 0 = CPUs {format_cpulist(near)} with the GPU, "
        f"node 1 = CPUs {format_cpulist(far)}; the feeder works on CPU {near[-1]} and is "
        f"moved to CPU {far[-1]} for each stall"
    )


def _cstate(stage: Stage) -> None:
    stage.params["sleep_us"] = 50
    # Every wake-up onto an idle CPU, not only those slower than the default 50 us; every
    # sleep as an off-CPU interval, not only those of 5 ms or more (else the engine has
    # only the thread's on-CPU total to spread over the stall).
    stage.thresholds["cstate"] = {"wake": 1_000}
    stage.thresholds["sched"] = {"offcpu": 20_000}
    idle = stage.topology.idle
    if idle is not None and idle.driver is None:
        stage.notes.append(
            "cstate: no cpuidle driver here: CPUs idle in the kernel's default routine "
            "(HLT), whose exit latency the kernel does not know"
        )


def _loader(stage: Stage) -> None:
    stage.params["worker_cpus"] = stage.other_cpus
    stage.notes.append(
        f"loader: the feeder forks a worker process (watched: a child of a watched process) "
        f"that computes each batch on CPUs {format_cpulist(stage.other_cpus)}; the feeder "
        "waits on a queue an intermediate thread fills from the worker's result queue"
    )


def _gil(stage: Stage) -> None:
    stage.params["holder_cpus"] = stage.other_cpus
    stage.notes.append(
        f"gil: a Python thread of the feeder (gj-drill-gil) holds the GIL in a pure-Python "
        f"loop on CPUs {format_cpulist(stage.other_cpus)} while the feeder does small I/O"
    )


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("swap", "real swap-ins (swap file, memory-cgroup limit) in the feeding thread",
                 "swap_in", "the stall", ("swap",), _swap),
        Scenario("faults", "a minor-fault storm: first touch of a fresh mapping of in-memory pages",
                 "minor_faults", "the stall less what the probe's storm rule leaves untimed",
                 ("faults",)),
        Scenario("filefaults", "major faults: a file mapped after dropping its page cache, read",
                 "major_fault", "the stall", ("faults",), _filefaults),
        Scenario("readahead", "a sequential read of a file after dropping its page cache",
                 "io_wait", "the stall's blocked time (schedstat)", ("sched",), _readahead),
        Scenario("migrate", "moved to a CPU of another (emulated) NUMA node and working there",
                 "remote_oncpu", "the time on the remote CPU", ("sched",), _migrate),
        Scenario("irq", "the disk's interrupts on the feeding CPU while it works",
                 "irq", "time stolen from the spinning loop", ("irq",), _irq,
                 truth_holds_waits=False),
        Scenario("contention", "a SCHED_FIFO (else nice -20) hog takes the feeding thread's CPU",
                 "runq_wait", "the stall", ("sched",), _contention),
        Scenario("sync-contention", "a hog takes the feeding CPU while the thread waits in a sync",
                 "runq_wait", "drain to the sync's return", ("sched",), _sync_contention),
        Scenario("sync-spin", "a hog preempts the feeding thread spinning in a sync",
                 "runq_wait", "drain to the sync's return", ("sched",), _sync_spin),
        Scenario("sync-late", "a hog preempts the feeding thread before it reaches its sync",
                 "runq_wait", "drain to the sync's return", ("sched",), _sync_late),
        Scenario("cstate", "short sleeps that wake the feeding thread onto an idle CPU",
                 "idle_wake", "the wake-ups' lateness", ("cstate",), _cstate),
        Scenario("malloc", "munmap of large touched blocks in the critical path",
                 "alloc_stall", "the munmaps less run-queue waits (schedstat)", ("malloc",),
                 truth_holds_waits=False, injected=_munmaps),
        Scenario("gc", "full CPython GC collections over a large heap in the step",
                 "gc_pause", "the collections (gc.callbacks)", ("python_gc",)),
        Scenario("gil", "a background Python thread holds the GIL while the feeder does I/O",
                 "gil_wait", "the feeder's GIL-releasing calls (timed by itself)",
                 ("python_gil",), _gil),
        Scenario("compute", "a CPU-bound host step", "host_work", "the stall", ("sched",)),
        Scenario("pyhot", "a pure-Python function running the whole stall in the step",
                 "host_work", "the stall", ("sched", "python_stacks")),
        Scenario("loader", "a data-loader worker process computes the batch the feeder waits for",
                 "host_work", "the worker's CPU time computing", ("sched",), _loader,
                 truth_holds_waits=False),
        Scenario("clean", "the control: no injection", "", "", (), duration_s=60.0),
        Scenario("attach-busy", "the control, with the probes attached to a loop already busy",
                 "", "", (), prefeed=True),
    )
}  # fmt: skip


def get(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise GpujitterError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]
