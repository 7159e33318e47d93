"""The exact command for each fix, in one place: the node audit's findings and the
attribution engine's one-line remedies both come from here, so they never disagree."""

from __future__ import annotations

from gpujitter.probes.host import format_cpulist

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


def bind_process(pid: int, node: int, cpus: list[int] | tuple[int, ...]) -> str:
    """Move a running process's threads and memory to one node; for new processes launch
    them under `numactl --cpunodebind=N --membind=N`."""
    return f"taskset -acp {format_cpulist(list(cpus))} {pid} && migratepages {pid} all {node}"


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
    return "pre-fault and pin host buffers (pin_memory=True, mlock); " + thp("never")


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


def irqbalance_ban(cpus: list[int] | tuple[int, ...]) -> str:
    """Keep irqbalance running but away from the GPU-feeding CPUs."""
    return (
        f"echo 'IRQBALANCE_BANNED_CPULIST={format_cpulist(list(cpus))}' >> /etc/default/irqbalance"
        " && systemctl restart irqbalance"
    )


def jemalloc_conf() -> str:
    return f"MALLOC_CONF={JEMALLOC_CONF} <command>"


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


def install_nvml() -> str:
    return "apt-get install -y nvidia-driver  # on a node with NVIDIA GPUs; none needed otherwise"


def install_pynvml() -> str:
    return "pip install nvidia-ml-py"
