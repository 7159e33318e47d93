"""Doctor checks of what the node gives the daemon: a locked-memory limit BPF maps fit in,
a memory cgroup limit a start fits under, descriptors enough for its probes, NVML and its
GPUs, a clocksource read in the vDSO, and a topology that loads."""

from __future__ import annotations

from collections.abc import Iterator

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.doctor.model import DoctorEnv, Result, check
from gpujitter.daemon.drill import system as drill_system
from gpujitter.errors import GpujitterError
from gpujitter.probes.base import memory_short, open_files_needed
from gpujitter.probes.host import memory_cgroup, read_text
from gpujitter.probes.nvml import NvmlUnavailable
from gpujitter.probes.topology import load_topology, read_cpu_nodes, read_gpus_sysfs, read_pci

MEMCG_BPF_KERNEL = (5, 11)  # BPF memory charged to the memory cgroup, not RLIMIT_MEMLOCK


@check
def check_memlock(env: DoctorEnv) -> Iterator[Result]:
    path = env.paths.proc / "self/limits"
    soft = _limit(read_text(path) or "", "Max locked memory")
    shown = "unlimited" if soft is None else f"{soft // 1024} KiB"
    if env.kernel_version >= MEMCG_BPF_KERNEL:
        yield Result(
            "memlock",
            "pass",
            f"RLIMIT_MEMLOCK {shown}; BPF maps are charged to the memory cgroup on this kernel",
            source=str(path),
        )
    elif soft is None or soft >= 64 << 20:
        yield Result("memlock", "pass", f"RLIMIT_MEMLOCK {shown}", source=str(path))
    else:
        yield Result(
            "memlock",
            "warn",
            f"RLIMIT_MEMLOCK {shown}: BPF maps count against it before 5.11 and may not load",
            fix=remedies.memlock_limit(),
            source=str(path),
        )


@check
def check_memory_limit(env: DoctorEnv) -> Iterator[Result]:
    # This process's memory cgroup: the daemon's where doctor runs as it does (the same
    # container, `systemd-run -p MemoryMax=...`), a shell's otherwise.
    where = str(env.paths.proc / "self/cgroup")
    group = memory_cgroup(env.paths)
    if group is None:
        yield Result("memory limit", "info",
                     "not checked: this process's memory cgroup could not be found (no cgroup "
                     "file system mounted, or /proc/self/mountinfo unreadable)",
                     source=where)  # fmt: skip
        return
    limit = group.limit(env.paths)
    short = memory_short(limit)
    if limit is None:
        yield Result("memory limit", "pass", f"no memory limit on {group.path} or above it",
                     source=where)  # fmt: skip
    elif short is None:
        # the cgroup that sets it: this process's own or one above it
        shown = f"{limit.setting} {limit.bytes >> 20} MiB ({limit.path.parent})"
        yield Result("memory limit", "pass", shown, source=str(limit.path))
    else:
        yield Result(
            "memory limit", "warn", short, fix=remedies.memory_limit(), source=str(limit.path)
        )


@check
def check_open_files(env: DoctorEnv) -> Iterator[Result]:
    # The daemon raises its soft limit to the hard one; under what it may take, a compile
    # stops (libbcc crashed outright, short of descriptors).
    path = env.paths.proc / "self/limits"
    hard = _limit(read_text(path) or "", "Max open files", column=1)
    need = open_files_needed()
    if hard is None or hard >= need:
        shown = "unlimited" if hard is None else str(hard)
        yield Result("open files", "pass", f"RLIMIT_NOFILE up to {shown}", source=str(path))
    else:
        yield Result(
            "open files",
            "fail",
            f"RLIMIT_NOFILE {hard}: the probes may take {need} descriptors on this node",
            fix=remedies.open_files_limit(),
            source=str(path),
        )


def _limit(limits: str, name: str, column: int = 0) -> int | None:
    """One /proc/PID/limits row's soft limit (column 1: its hard limit) in its unit; None
    for unlimited."""
    for line in limits.splitlines():
        if line.startswith(name):
            value = line[len(name) :].split()[column]
            return None if value == "unlimited" else int(value)
    return None


@check
def check_nvml(env: DoctorEnv) -> Iterator[Result]:
    try:
        session = env.open_nvml()
    except ImportError:
        yield Result(
            "nvml",
            "warn",
            "pynvml is not installed: GPU idle gaps are not measured",
            fix=remedies.install_pynvml(),
        )
        return
    except NvmlUnavailable as err:
        on_pci = read_gpus_sysfs(env.paths, read_pci(env.paths))
        seen = (
            f"{len(on_pci)} NVIDIA GPU(s) on PCI but {err}"
            if on_pci
            else f"no NVIDIA GPU on PCI ({err})"
        )
        yield Result(
            "nvml",
            "warn",
            f"{seen}: GPU idle gaps are not measured (host probes still run)",
            fix=remedies.install_nvml(),
        )
        return
    try:
        driver = session.driver_version() or "unknown"
        gpus = session.gpus(max(read_cpu_nodes(env.paths)) + 1)
    finally:
        session.close()
    if not gpus:
        yield Result(
            "nvml",
            "warn",
            f"NVIDIA driver {driver} but no GPU visible: GPU idle gaps are not measured",
            fix="nvidia-smi -L  # check the GPUs the driver sees",
        )
        return
    names = ", ".join(f"{g.index}: {g.name} at {g.pci_bus_id}" for g in gpus)
    yield Result("nvml", "pass", f"driver {driver}, {len(gpus)} GPU(s): {names}")


@check
def check_clocksource(env: DoctorEnv) -> Iterator[Result]:
    base = env.paths.sys / "devices/system/clocksource/clocksource0"
    current = read_text(base / "current_clocksource") or "unknown"
    available = (read_text(base / "available_clocksource") or "").split()
    src = str(base / "current_clocksource")
    others = f" (available: {' '.join(available)})"
    if current == "tsc":
        yield Result("clocksource", "pass", f"tsc{others}", source=src)
    elif current in ("kvm-clock", "hyperv_clocksource_tsc_page", "arch_sys_counter"):
        yield Result(
            "clocksource",
            "pass",
            f"{current}: paravirtual or architected clock, read in the vDSO{others}",
            source=src,
        )
    else:
        better = "tsc" if "tsc" in available else None
        yield Result(
            "clocksource",
            "warn",
            f"{current}: every clock read is a system call, timestamps cost more{others}",
            fix=remedies.clocksource(better) if better else "boot with a TSC-capable clocksource",
            source=src,
        )


@check
def check_topology(env: DoctorEnv) -> Iterator[Result]:
    try:
        topo = load_topology(env.paths, env.override, nvml=False)
    except GpujitterError as err:
        yield Result("topology", "fail", str(err), fix="fix or drop --topology-override")
        return
    idle = topo.idle
    idle_text = (
        "no cpuidle driver (default HLT idle)"
        if idle is None or idle.driver is None
        else f"cpuidle {idle.driver}"
    )
    parts = [
        f"{len(topo.nodes)} node(s)",
        f"{len(topo.cpus)} CPUs",
        f"{len(topo.gpus)} GPU(s) on PCI",
        f"{len(topo.irqs)} IRQs",
        idle_text,
    ]
    if topo.override:
        parts.append(f"OVERRIDE {topo.override} in force: NUMA nodes are emulated")
    parts += filter(None, [topo.unknown_gpu_note()])
    yield Result("topology", "pass", ", ".join(parts))


@check
def check_drill_leftovers(env: DoctorEnv) -> Iterator[Result]:
    """What a drill killed outright left changed on the node (a swap file on, a sysctl, a
    cgroup): only shown where there is some."""
    tmp = env.paths.var / "tmp"
    for pid, changes in drill_system.killed_leftovers(tmp):
        yield Result(
            "drill leftovers",
            "warn",
            f"a killed drill (pid {pid}) left: {'; '.join(changes)}",
            fix="sudo gpujitter drill clean --duration 5s  (a drill first puts back what a "
            "killed one left)",
            source=str(tmp),
        )
