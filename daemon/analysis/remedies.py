"""The exact command for each fix, in one place: the node audit's findings and the
attribution engine's one-line remedies both come from here, so they never disagree.
Each attribution remedy is chosen so that it cannot make things worse where it is
applied: no competitor moved onto the job's CPUs, no memory bound to an emulated node."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpujitter.daemon.analysis.records import (
    AllocEvidence,
    FaultEvidence,
    GcEvidence,
    GilEvidence,
    IdleEvidence,
    IrqEvidence,
    TaskEvidence,
)
from gpujitter.probes.host import format_cpulist
from gpujitter.probes.topology import Topology

SYSCTL_FILE = "/etc/sysctl.d/90-gpujitter.conf"
JEMALLOC_CONF = "narenas:8,dirty_decay_ms:10000,muzzy_decay_ms:10000,background_thread:true"


def irq_affinity(irq: int, cpus: list[int] | tuple[int, ...]) -> str:
    return f"echo {format_cpulist(list(cpus))} > /proc/irq/{irq}/smp_affinity_list"


def irqbalance_off() -> str:
    return "systemctl disable --now irqbalance  # or set IRQBALANCE_BANNED_CPULIST"


def sysctl(key: str, value: int | str) -> str:
    return f"sysctl -w {key}={value} && echo '{key} = {value}' >> {SYSCTL_FILE}"


def swappiness(value: int = 10) -> str:
    return sysctl("vm.swappiness", value)


def swappiness_at_most(value: int = 10) -> str:
    """For an attribution, which does not know the node's setting: lower it only where it
    is higher (a node at 1 must not be raised to 10)."""
    return (
        f'[ "$(sysctl -n vm.swappiness)" -gt {value} ] && {sysctl("vm.swappiness", value)}'
        f"  # already <= {value}: the job is short of memory (RAM, its cgroup's memory limit)"
    )


def swap_off() -> str:
    return "swapoff -a  # and remove swap entries from /etc/fstab"


def thp(setting: str = "never", knob: str = "enabled") -> str:
    return f"echo {setting} > /sys/kernel/mm/transparent_hugepage/{knob}"


def numa_balancing_off() -> str:
    return sysctl("kernel.numa_balancing", 0)


def governor_performance() -> str:
    return "cpupower frequency-set -g performance"


def limit_idle_latency(max_exit_latency_us: int) -> str:
    """Disable idle states whose exit latency exceeds the bound (power cost)."""
    return f"cpupower idle-set -D {max_exit_latency_us}"


def gpu_persistence(gpu: int | str) -> str:
    """gpu: NVML index or PCI bus id (nvidia-smi -i takes both)."""
    return f"nvidia-smi -i {gpu} -pm 1"


def bind_process(
    pid: int, node: int, cpus: list[int] | tuple[int, ...], override: str | None = None
) -> str:
    """Move a running process's threads and memory to one node; for new processes launch
    them under `numactl --cpunodebind=N --membind=N`. Under a topology override the nodes
    are emulated: the CPUs are real, node N's memory is not, so only the CPUs move."""
    pin = f"taskset -acp {format_cpulist(list(cpus))} {pid}"
    if override is not None:
        return f"{pin}  # node {node} is emulated ({override}): its memory cannot be bound"
    return f"{pin} && migratepages {pid} all {node}"


def launch_bound(node: int) -> str:
    return f"numactl --cpunodebind={node} --membind={node} <command>"


def move_away(pid: int, cpus: list[int] | tuple[int, ...]) -> str:
    """Move a competing task off the GPU-feeding CPUs."""
    return f"taskset -acp {format_cpulist(list(cpus))} {pid}"


def memlock_unlimited(pid: int) -> str:
    return f"prlimit --pid {pid} --memlock=unlimited:unlimited  # and LimitMEMLOCK=infinity"


def allocator() -> str:
    return f"LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF={JEMALLOC_CONF} <command>"


def prefault() -> str:
    return "pre-fault and pin host buffers before the loop (pin_memory=True, mlock)"


def keep_free_page_reporting_off() -> str:
    """The hypervisor takes back what the guest frees (virtio-balloon free page reporting)."""
    return (
        prefault() + "; on the hypervisor, turn free page reporting off for GPU VMs "
        "(libvirt: <memballoon model='virtio' freePageReporting='off'/>)"
    )


def damon_off(kdamond: str) -> str:
    return f"echo off > /sys/kernel/mm/damon/admin/kdamonds/{kdamond}/state"


def damon_reclaim_off() -> str:
    return "echo N > /sys/module/damon_reclaim/parameters/enabled"


def thp_no_direct_compaction() -> str:
    """Faults slow enough to be huge-page allocation and compaction: keep huge pages but
    take compaction off the fault path (disabling THP would multiply the fault count)."""
    return prefault() + "; " + thp("never", "defrag")


def page_cache_warm() -> str:
    """File-backed major faults: the pages were not cached when the feeding thread read them."""
    return (
        "cat <dataset and model files> > /dev/null before the run (or vmtouch -t), "
        "or keep them on local NVMe"
    )


def enable_probes(probes: list[str] | tuple[str, ...]) -> str:
    return f"probes {', '.join(probes)} were not running: see gpujitter doctor"


def host_work_hint() -> str:
    return (
        "the feeding thread was busy on CPU: overlap host work with GPU work "
        "(prefetch, more DataLoader workers, pinned async copies, CUDA graphs)"
    )


_BLOCKED_HINTS = {
    "futex": "waited on a lock or queue (futex): the producer feeding it is late; "
    "add DataLoader workers or prefetch",
    "nanosleep": "slept on the feeding path (nanosleep): remove the sleep",
    "clock_nanosleep": "slept on the feeding path (clock_nanosleep): remove the sleep",
    "ioctl": "waited in a driver call (ioctl): check GPU persistence mode and driver waits",
}
_WAIT_SYSCALLS = ("poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "recvfrom")


def blocked_hint(syscall: str, state: str) -> str:
    """What to look at for off-CPU time that no other cause explains."""
    if syscall in _BLOCKED_HINTS:
        return _BLOCKED_HINTS[syscall]
    if syscall in _WAIT_SYSCALLS:
        return f"waited for data on a socket or pipe ({syscall}): the producer is late"
    if state == "uninterruptible":
        where = f" ({syscall})" if syscall else ""
        return f"waited on I/O{where}: keep inputs in page cache or on local NVMe"
    where = f" in {syscall}" if syscall else ""
    return f"blocked{where}: the thread that wakes it is not watched; watch its process too"


def io_wait(device: str, op: str, device_node: int, gpu_node: int) -> str:
    """The feeding thread slept on block I/O: take the I/O off its path, or make it hit RAM.
    device_node/gpu_node: -1 when unknown."""
    if op == "write":
        fix = (
            f"it waited on writes to {device}: write checkpoints and logs from another "
            "thread or process (async checkpointing), not from the training loop"
        )
    else:
        fix = (
            f"it waited on reads from {device}: read ahead of use off the critical path "
            "(DataLoader num_workers, prefetch_factor), warm the page cache first "
            "(vmtouch -t FILES), or stage the data in RAM (/dev/shm) or on local NVMe"
        )
    if device_node >= 0 and gpu_node >= 0 and device_node != gpu_node:
        fix += f"; {device} is on NUMA node {device_node}, the GPU on node {gpu_node}"
    return fix


def jemalloc_conf() -> str:
    return f"MALLOC_CONF={JEMALLOC_CONF} <command>"


def tcmalloc_keep_freed() -> str:
    """tcmalloc returns freed memory to the OS at TCMALLOC_RELEASE_RATE; 0 keeps it."""
    return "TCMALLOC_RELEASE_RATE=0 <command>  # keep freed memory instead of unmapping it"


def haltpoll() -> str:
    """KVM guests without a cpuidle driver: poll briefly before HLT instead of exiting."""
    return "modprobe cpuidle-haltpoll"


def clocksource(name: str) -> str:
    return f"echo {name} > /sys/devices/system/clocksource/clocksource0/current_clocksource"


# Fixes for `gpujitter doctor`: what profiling itself needs.


def mount_tracefs() -> str:
    return "mount -t tracefs tracefs /sys/kernel/tracing"


def install_bcc() -> str:
    return "apt-get install -y python3-bpfcc  # and a venv made with --system-site-packages"


def install_headers(release: str) -> str:
    return f"apt-get install -y linux-headers-{release}"


def link_headers(release: str, build: str, source: str) -> str:
    """The fallback when no headers package matches the running kernel (see doctor.md)."""
    return (
        f"ln -sfn {build} /lib/modules/{release}/build && "
        f"ln -sfn {source} /lib/modules/{release}/source"
    )


def run_as_root() -> str:
    return "sudo gpujitter ...  # or grant CAP_BPF,CAP_PERFMON (AmbientCapabilities= in the unit)"


def memlock_limit() -> str:
    return "ulimit -l unlimited  # LimitMEMLOCK=infinity in the unit"


def open_files_limit() -> str:
    return "ulimit -n 65536  # LimitNOFILE=65536 in the unit"


def memory_limit() -> str:
    return (
        "give it 512 MiB or more: MemoryHigh=512M and MemoryMax=1G in the unit (as shipped), "
        "or the container's memory limit"
    )


def install_nvml() -> str:
    return "apt-get install -y nvidia-driver  # on a node with NVIDIA GPUs; none needed otherwise"


def install_pynvml() -> str:
    return "pip install nvidia-ml-py"


# Remedies for the attribution engine's causes (daemon/analysis/engine/causes.py): each takes the
# part's top evidence and what the event stream says about the job, never the live host,
# so a replayed trace gives the same lines.


@dataclass(frozen=True, slots=True)
class RemedyContext:
    """What a remedy needs to name exact CPUs and processes."""

    topology: Topology
    gpu_node: int | None
    tgid: int  # the critical thread's process (0 when unknown)
    feeding_cpus: tuple[int, ...]  # CPUs the critical thread ran or waited on in the gap
    probes_off: tuple[str, ...]
    job_tids: frozenset[int] = frozenset()  # the feeding processes' threads in the stream
    job_cpus: tuple[int, ...] = ()  # CPUs those threads ran or waited on up to the gap's end
    others_cpus: tuple[int, ...] = ()  # the same of the other GPUs' processes

    def gpu_cpus(self) -> list[int]:
        if self.gpu_node is None:
            return self.topology.cpus
        return self.topology.cpus_of(self.gpu_node)

    def job(self) -> set[int]:
        return set(self.job_cpus) | set(self.feeding_cpus)

    def home_cpus(self) -> list[int]:
        """Where the job belongs: its GPU's node, else the nodes it ran on."""
        if self.gpu_node is not None:
            return self.topology.cpus_of(self.gpu_node)
        nodes = {self.topology.node_of(c) for c in self.job()}
        return [c for c in self.topology.cpus if self.topology.node_of(c) in nodes]

    def busy(self) -> set[int]:
        """The CPUs other work must not be moved onto: the job's, and the other GPUs'
        processes' (moved there, it would stall their GPUs instead)."""
        return self.job() | set(self.others_cpus)

    def free_of_job(self, pool: list[int] | None = None) -> list[int]:
        busy = self.busy()
        return [c for c in (self.topology.cpus if pool is None else pool) if c not in busy]


def bind_to_gpu(ctx: RemedyContext) -> str | None:
    """The feeding process onto its GPU's node (unknown node: no command)."""
    if ctx.gpu_node is None or not ctx.tgid:
        return None
    override = str(ctx.topology.override) if ctx.topology.override else None
    return bind_process(ctx.tgid, ctx.gpu_node, ctx.gpu_cpus(), override)


def keep_job_off(ctx: RemedyContext, cpus: tuple[int, ...]) -> str | None:
    """Move the feeding process off CPUs whose load cannot be moved (softirqs raised
    there, per-CPU kernel threads), within the CPUs it belongs on."""
    home = [c for c in ctx.home_cpus() if c not in cpus]
    return move_away(ctx.tgid, home) if home and ctx.tgid else None


def isolate(tid: int, ctx: RemedyContext) -> str:
    """No CPU is free of the job: lower the competitor, or carve CPUs out for the job."""
    return (
        f"renice -n 19 -p {tid}  # no CPU is free of the job"
        + (" and the other GPUs' processes" if set(ctx.others_cpus) - ctx.job() else "")
        + f" ({format_cpulist(sorted(ctx.busy()))})"
        ": or pin the job to fewer CPUs and keep other work off them "
        "(systemctl set-property --runtime system.slice AllowedCPUs=<the other CPUs>, "
        "and user.slice)"
    )


def _irq_affinity_off_job(
    irq: int, node: int | None, seen: tuple[int, ...], ctx: RemedyContext
) -> str | None:
    """An IRQ's CPUs: its own node's (the GPU's when the device's is unknown), none of the
    job's and none it was seen on; where every CPU runs the job, at least off the feeding
    thread's and its own."""
    pool = ctx.topology.cpus if node is None else ctx.topology.cpus_of(node)
    cpus = [c for c in ctx.free_of_job(pool) if c not in seen]
    cpus = cpus or [c for c in ctx.free_of_job() if c not in seen]
    if cpus:
        return irq_affinity(irq, cpus)
    avoid = set(seen) | set(ctx.feeding_cpus)
    cpus = [c for c in pool if c not in avoid] or [c for c in ctx.topology.cpus if c not in avoid]
    if not cpus:
        return None
    return irq_affinity(irq, cpus) + "  # every CPU runs the job: this spares the feeding thread's"


_VECTOR_HINTS = {
    "LOC": "local timer ticks: boot with nohz_full=<feeding CPUs> to stop them there",
    "TLB": "TLB shootdowns: another thread of the process unmaps memory (see alloc_stall: "
    + allocator()
    + ")",
}


def _vector_hint(name: str) -> str:
    return _VECTOR_HINTS.get(
        name,
        f"{name} interrupts follow the work on a CPU, not a device: moving the job takes them "
        "along; look at what signals its CPUs",
    )


def irq(top: IrqEvidence, ctx: RemedyContext) -> str | None:
    if top.irq_kind == "hardirq":
        node = top.device_node if top.device_node >= 0 else ctx.gpu_node
        return _irq_affinity_off_job(top.irq, node, top.cpus, ctx)
    if top.irq_kind == "softirq":
        # Raised where their hard IRQ or the work ran: move the feeding threads instead.
        return keep_job_off(ctx, top.cpus)
    return _vector_hint(top.name)


# Kernel threads bound to one CPU (taskset cannot move them); irq/N-name threads follow
# their IRQ's affinity.
_PER_CPU_KTHREAD = re.compile(
    r"(ksoftirqd|migration|cpuhp|rcuc|rcuop|idle_inject|watchdog|kworker)/\d"
)
_IRQ_THREAD = re.compile(r"irq/(\d+)-")


def runq_wait(top: TaskEvidence, ctx: RemedyContext) -> str | None:
    """The task that ran while a feeding thread waited: moved to CPUs that none of the job's
    threads use, never onto them."""
    if top.after_migration:
        bound = bind_to_gpu(ctx)
        if bound:
            return bound
    if top.tid <= 0:
        return None
    if top.own:
        return (
            f"gpujitter's own thread {top.tid} ran instead (self-inflicted): check that its "
            "threads run SCHED_BATCH niced (`gpujitter doctor --load`, `ps -L -o "
            "tid,cls,ni,psr -p PID`) and leave it a CPU the job may not use"
        )
    if top.tid in ctx.job_tids:
        return (
            f"the job's own thread {top.tid} ({top.comm}) ran instead: it has more runnable "
            "threads than CPUs; run fewer (OMP_NUM_THREADS, torch.set_num_threads, DataLoader "
            "workers) or give it more CPUs"
        )
    irq_thread = _IRQ_THREAD.match(top.comm)
    if irq_thread:
        return _irq_affinity_off_job(int(irq_thread[1]), ctx.gpu_node, top.cpus, ctx)
    if _PER_CPU_KTHREAD.match(top.comm):
        return keep_job_off(ctx, top.cpus)
    spare = [c for c in ctx.free_of_job() if c not in top.cpus]
    pid = top.tgid or top.tid  # taskset -a moves all of its process's threads
    return move_away(pid, spare) if spare else isolate(pid, ctx)


# Faults slower than this on average are huge-page allocations (zeroing 2 MiB, compaction),
# not 4 KiB first touches (a few us each).
SLOW_MINOR_FAULT_NS = 20_000


def minor_faults(top: FaultEvidence) -> str:
    if top.count > 0 and top.ns // top.count >= SLOW_MINOR_FAULT_NS:
        return thp_no_direct_compaction()
    return prefault()


def idle_wake(top: IdleEvidence, ctx: RemedyContext) -> str:
    if top.exit_latency_ns < 0:
        return (
            haltpoll() + f"  # {top.state_name}: the kernel does not know its exit latency "
            "(no cpuidle driver), so no state can be limited by latency; "
            "a KVM guest polls before HLT"
        )
    if top.exit_latency_ns == 0:
        return (
            f"the CPU was in {top.state_name}, which has no exit latency: the delay is the "
            "wake-up path, not an idle state (see runq_wait and irq on that CPU)"
        )
    # cpupower idle-set -D N disables the states whose exit latency is N us or more.
    return limit_idle_latency(max(1, top.exit_latency_ns // 1000))


def gc_pause(top: GcEvidence) -> str:
    """The feeding thread ran CPython's cyclic garbage collector inside the gap: take the
    collections off the step's critical path."""
    full = top.generation == 2 or top.generation < 0
    what = "full (generation 2) collections" if top.generation == 2 else "GC collections"
    fix = (
        f"{what} ran in the feeding thread: call gc.freeze() once the model and data "
        "structures are built (long-lived objects leave the collector's scans), "
    )
    if full:
        fix += (
            "and collect on your schedule: gc.disable() then gc.collect(2) every N steps "
            "at a step boundary (the same step on every rank)"
        )
    else:
        fix += (
            f"and collect generation {top.generation} less often: raise its threshold "
            "(gc.set_threshold(50_000, 50, 100)), or gc.disable() and gc.collect(1) at "
            "step boundaries"
        )
    return fix


def gil_wait(top: GilEvidence) -> str:
    """The feeding thread waited for the GIL another Python thread of its process held:
    take that thread's Python work off the GIL, or out of the process."""
    who = (
        f"{top.holder_comm or 'thread'} (tid {top.holder_tid})"
        if top.holder_tid
        else "another thread"
    )
    doing = f", {top.holder_cause.replace('_', ' ')} there," if top.holder_cause else ""
    return (
        f"the feeding thread waited for the GIL that {who} held{doing}: move that thread's "
        "pure-Python work out of the process (a DataLoader worker, multiprocessing), have "
        "its C extensions release the GIL around long calls (Py_BEGIN_ALLOW_THREADS, "
        "Cython's nogil), or run fewer Python threads beside the feeding one"
    )


def alloc_stall(top: AllocEvidence) -> str:
    if top.allocator == "jemalloc":
        return jemalloc_conf()
    if top.allocator == "tcmalloc":
        return tcmalloc_keep_freed()
    return allocator()
