"""`gpujitter doctor`: can profiling run on this node, and if not, the exact fix.

Each check is a function in CHECKS (a registry, in the order they print) that reads the host
through HostPaths and yields one Result per line: pass, warn (profiling runs with less), fail
(profiling cannot run) or info. Probe hooks come from the probe registry, so a probe added
there is checked here without a change. `--load` goes further and really loads the core BPF
module and every probe for a moment.
"""

from __future__ import annotations

import ctypes
import errno
import gzip
import os
import platform
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.service.own_scheduling import OwnScheduling, thread_policies
from gpujitter.errors import GpujitterError
from gpujitter.probes import registry
from gpujitter.probes.events import ProbeStatus
from gpujitter.probes.host import (
    CAP_BPF,
    CAP_PERFMON,
    CAP_SYS_ADMIN,
    HostPaths,
    capabilities,
    read_int,
    read_text,
    status_fields,
)
from gpujitter.probes.nvml import Nvml, NvmlUnavailable, open_nvml
from gpujitter.probes.registry import Hook, ProbeSpec
from gpujitter.probes.topology import load_topology, read_cpu_nodes, read_gpus_sysfs, read_pci

Status = Literal["pass", "warn", "fail", "info"]

# Files the checks read, as record_tree patterns (tests/fixtures/hosts/); tree_patterns()
# adds the tracefs formats of every registered tracepoint hook.
TREE = (
    "proc/sys/kernel/{osrelease,perf_event_paranoid}",
    "proc/mounts",
    "proc/self/{status,limits}",
    "proc/config.gz",
    "sys/kernel/btf/vmlinux",
    "sys/kernel/security/lockdown",
    "sys/kernel/tracing/{uprobe_events,kprobe_events}",
    "sys/bus/event_source/devices/*/type",
    "sys/devices/system/clocksource/clocksource0/{current_clocksource,available_clocksource}",
)

RINGBUF_KERNEL = (5, 8)  # BPF ring buffers, which every probe streams through
MEMCG_BPF_KERNEL = (5, 11)  # BPF memory charged to the memory cgroup, not RLIMIT_MEMLOCK

# Capability bits (linux/capability.h).


@dataclass(frozen=True, slots=True)
class Result:
    check: str  # short name, e.g. "tracefs", "probe malloc"
    status: Status
    detail: str  # what was found, one line
    fix: str = ""  # the exact command when status is warn or fail
    source: str = ""  # the file or interface the finding comes from


@dataclass(slots=True)
class DoctorEnv:
    """What the checks read: the host tree (recorded trees in tests), and NVML."""

    paths: HostPaths = field(default_factory=HostPaths)
    override: Path | None = None
    load: bool = False  # really load the core module and every probe (--load)
    load_s: float = 0.5  # how long each loaded probe set runs
    open_nvml: Callable[[], Nvml] = open_nvml  # the NVML boundary: tests replay recordings
    specs: Callable[[], dict[str, ProbeSpec]] = registry.specs  # the probes whose hooks count

    @property
    def release(self) -> str:
        return read_text(self.paths.proc / "sys/kernel/osrelease") or platform.release()

    @property
    def kernel_version(self) -> tuple[int, int]:
        return kernel_version(self.release)

    def privileged(self) -> str | None:
        """How this process may load tracing BPF programs ("root", "CAP_BPF+CAP_PERFMON"),
        None when it may not."""
        caps = capabilities(self.paths)
        if CAP_SYS_ADMIN in caps:
            uid = status_fields(self.paths, "self").get("Uid", "").split()
            return "root" if uid[:1] == ["0"] else "CAP_SYS_ADMIN"
        if {CAP_BPF, CAP_PERFMON} <= caps:
            return "CAP_BPF+CAP_PERFMON"
        return None


Check = Callable[[DoctorEnv], Iterable[Result]]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    CHECKS.append(fn)
    return fn


def run_checks(env: DoctorEnv) -> list[Result]:
    """Every check's lines; a check that cannot read what it needs (e.g. tracefs, which only
    root may list) fails with that reason instead of stopping the others."""
    results: list[Result] = []
    for fn in CHECKS:
        name = fn.__name__.removeprefix("check_")
        try:
            for result in fn(env):
                results.append(result)
                name = result.check
        except OSError as err:
            fix = "run `sudo gpujitter doctor`" if err.errno in (errno.EACCES, errno.EPERM) else ""
            why = f"{err.strerror}: {err.filename}" if err.filename else str(err)
            results.append(Result(name, "fail", f"could not be checked: {why}", fix=fix))
    return results


def tree_patterns() -> tuple[str, ...]:
    formats = {
        "sys/kernel/tracing/events/{}/{}/format".format(*h.target.split(":", 1))
        for spec in registry.specs().values()
        for h in spec.hooks
        if h.kind == "tracepoint"
    }
    return TREE + tuple(sorted(formats))


def can_profile(results: list[Result]) -> bool:
    return not any(r.status == "fail" for r in results)


def kernel_version(release: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# ---------------------------------------------------------------------------------------
# The checks, in the order doctor prints them.


@check
def check_kernel(env: DoctorEnv) -> Iterator[Result]:
    release = env.release
    need = ".".join(map(str, RINGBUF_KERNEL))
    if env.kernel_version >= RINGBUF_KERNEL:
        yield Result("kernel", "pass", f"{release} (BPF ring buffer needs >= {need})")
    else:
        yield Result(
            "kernel",
            "fail",
            f"{release}: the probes stream through BPF ring buffers, which need >= {need}",
            fix=f"boot a kernel >= {need}",
        )


@check
def check_btf(env: DoctorEnv) -> Iterator[Result]:
    btf = env.paths.sys / "kernel/btf/vmlinux"
    if btf.exists():
        size = btf.stat().st_size
        yield Result("btf", "pass", f"kernel BTF present ({size // 1024} KiB)", source=str(btf))
    else:
        yield Result(
            "btf",
            "warn",
            "no kernel BTF: probes still run (tracepoint layouts come from tracefs), but bcc "
            "cannot check kernel types against this kernel",
            fix="boot a kernel built with CONFIG_DEBUG_INFO_BTF=y",
            source=str(btf),
        )


@check
def check_tracefs(env: DoctorEnv) -> Iterator[Result]:
    mounts = read_text(env.paths.proc / "mounts") or ""
    points = [line.split()[1] for line in mounts.splitlines() if line.split()[:1] == ["tracefs"]]
    if "/sys/kernel/tracing" in points and (env.paths.tracefs / "events").is_dir():
        yield Result(
            "tracefs",
            "pass",
            "mounted at /sys/kernel/tracing",
            source=str(env.paths.proc / "mounts"),
        )
    else:
        where = f" (mounted only at {', '.join(points)})" if points else ""
        yield Result(
            "tracefs",
            "fail",
            f"tracefs not mounted at /sys/kernel/tracing{where}: no tracepoint can attach",
            fix=remedies.mount_tracefs(),
            source=str(env.paths.proc / "mounts"),
        )


@check
def check_bcc(env: DoctorEnv) -> Iterator[Result]:
    try:
        import bcc
    except Exception as err:  # ImportError, or OSError when libbcc.so itself will not load
        yield Result(
            "bcc",
            "fail",
            f"cannot import bcc: {err}",
            fix=remedies.install_bcc(),
        )
        return
    version = getattr(bcc, "__version__", "unknown version")
    yield Result("bcc", "pass", f"bcc {version} ({Path(bcc.__file__).parent})")


@check
def check_headers(env: DoctorEnv) -> Iterator[Result]:
    release = env.release
    moddir = env.paths.modules / release
    build, source = moddir / "build", moddir / "source"
    have = (build / "Makefile").exists()
    uts = _headers_release(build) if have else None
    if not have:
        candidates = sorted(env.paths.src.glob("linux-headers-*-amd64"))
        if candidates:
            base = str(candidates[-1])
            fix = remedies.link_headers(release, base, base.removesuffix("-amd64") + "-common")
        else:
            fix = remedies.install_headers(release)
        yield Result(
            "headers",
            "fail",
            f"no kernel headers at {build}: bcc cannot compile any probe",
            fix=fix,
            source=str(build),
        )
    elif not (source.exists() or (build / "include/linux").is_dir()):
        yield Result(
            "headers",
            "fail",
            f"{build} is there but {source} is missing (Debian splits headers in two)",
            fix=remedies.link_headers(
                release,
                os.path.realpath(build),
                os.path.realpath(build).removesuffix("-amd64") + "-common",
            ),
            source=str(source),
        )
    elif uts == release:
        yield Result("headers", "pass", f"matching headers for {release}", source=str(build))
    else:
        yield Result(
            "headers",
            "warn",
            f"fallback headers {uts or 'of unknown version'} linked for {release}: "
            "tracepoints, uprobes and perf events compile and run (tracepoint layouts come from "
            "tracefs); kernel struct layouts from these headers are another kernel's and "
            "must never be read",
            fix=remedies.install_headers(release) + "  # when a matching package exists",
            source=os.path.realpath(build),
        )


def _headers_release(build: Path) -> str | None:
    text = read_text(build / "include/generated/utsrelease.h") or ""
    match = re.search(r'UTS_RELEASE\s+"([^"]+)"', text)
    return match.group(1) if match else read_text(build / "include/config/kernel.release")


@check
def check_privileges(env: DoctorEnv) -> Iterator[Result]:
    how = env.privileged()
    src = str(env.paths.proc / "self/status")
    if how:
        yield Result("privileges", "pass", f"{how}: may load tracing BPF programs", source=src)
    else:
        yield Result(
            "privileges",
            "fail",
            "neither root nor CAP_BPF+CAP_PERFMON: tracing BPF programs cannot be loaded",
            fix=remedies.run_as_root(),
            source=src,
        )


@check
def check_perf_paranoid(env: DoctorEnv) -> Iterator[Result]:
    path = env.paths.proc / "sys/kernel/perf_event_paranoid"
    value = read_int(path)
    exempt = CAP_PERFMON in capabilities(env.paths) or CAP_SYS_ADMIN in capabilities(env.paths)
    if value is None:
        yield Result("perf_event_paranoid", "warn", "not readable", source=str(path))
    elif value <= -1 or exempt:
        why = " (CAP_PERFMON is not bound by it)" if exempt and value > -1 else ""
        yield Result("perf_event_paranoid", "pass", f"{value}{why}", source=str(path))
    else:
        yield Result(
            "perf_event_paranoid",
            "fail",
            f"{value} without CAP_PERFMON: system-wide perf events are refused",
            fix=remedies.sysctl("kernel.perf_event_paranoid", -1),
            source=str(path),
        )


@check
def check_lockdown(env: DoctorEnv) -> Iterator[Result]:
    path = env.paths.sys / "kernel/security/lockdown"
    mode = re.search(r"\[(\w+)\]", read_text(path) or "")
    if mode is None:
        yield Result("lockdown", "pass", "no kernel lockdown in force", source=str(path))
    elif mode.group(1) == "confidentiality":
        yield Result(
            "lockdown",
            "fail",
            "lockdown=confidentiality: BPF may not read kernel memory",
            fix="boot with lockdown=integrity (or none); with Secure Boot, see mokutil",
            source=str(path),
        )
    else:
        yield Result("lockdown", "pass", f"lockdown={mode.group(1)}", source=str(path))


@check
def check_probe_hooks(env: DoctorEnv) -> Iterator[Result]:
    """One line per registered probe: are the kernel hooks it needs there?"""
    runnable = 0
    for spec in env.specs().values():
        missing = [(h, why) for h in spec.hooks if (why := hook_problem(env, h)) is not None]
        required = [(h, why) for h, why in missing if not h.optional]
        hooks = f"{len(spec.hooks)} hooks"
        if not missing:
            runnable += 1
            off = (
                ""
                if spec.default_on
                else f"; off by default ({spec.off_reason}; --probes +{spec.name} runs it)"
            )
            yield Result(f"probe {spec.name}", "pass", f"{hooks} available{off}")
        elif not required:
            runnable += 1
            h, why = missing[0]
            yield Result(
                f"probe {spec.name}",
                "warn",
                f"runs degraded: optional {h} {why} ({len(missing)} of {hooks} missing)",
                fix=HOOK_FIX[h.kind](h),
            )
        else:
            h, why = required[0]
            yield Result(
                f"probe {spec.name}",
                "warn",
                f"unavailable: {h} {why} ({len(required)} required hook(s) missing); "
                f"without it {spec.degrades}",
                fix=HOOK_FIX[h.kind](h),
            )
    if runnable == 0:
        yield Result(
            "probes",
            "fail",
            "no registered probe can attach on this kernel",
            fix=remedies.mount_tracefs(),
        )


def hook_problem(env: DoctorEnv, hook: Hook) -> str | None:
    """Why `hook` cannot attach here, or None when it can."""
    return HOOK_CHECKS[hook.kind](env, hook.target)


def _tracepoint_problem(env: DoctorEnv, target: str) -> str | None:
    category, _, name = target.partition(":")
    fmt = env.paths.tracefs / "events" / category / name / "format"
    if not (env.paths.tracefs / "events").is_dir():
        return "cannot be checked: tracefs is not mounted"
    return None if fmt.exists() else f"is not in {env.paths.tracefs / 'events'}"


# perf's names for software and hardware events (perf list), to perf_event_attr config.
PERF_TYPES = {"hardware": 0, "software": 1}
PERF_EVENTS = {
    "software": {
        "cpu-clock": 0,
        "task-clock": 1,
        "page-faults": 2,
        "faults": 2,
        "context-switches": 3,
        "cs": 3,
        "cpu-migrations": 4,
        "migrations": 4,
        "page-faults-min": 5,
        "minor-faults": 5,
        "page-faults-maj": 6,
        "major-faults": 6,
        "alignment-faults": 7,
        "emulation-faults": 8,
        "dummy": 9,
        "bpf-output": 10,
        "cgroup-switches": 11,
    },
    "hardware": {
        "cpu-cycles": 0,
        "cycles": 0,
        "instructions": 1,
        "cache-references": 2,
        "cache-misses": 3,
        "branch-instructions": 4,
        "branches": 4,
        "branch-misses": 5,
        "bus-cycles": 6,
        "ref-cycles": 9,
    },
}


def _perf_problem(env: DoctorEnv, target: str) -> str | None:
    family, _, name = target.partition(":")
    name = (
        name.lower().replace("_", "-").removeprefix("perf-count-sw-").removeprefix("perf-count-hw-")
    )
    config = PERF_EVENTS.get(family, {}).get(name)
    if config is None:
        return "is not a perf event gpujitter knows (see docs/doctor.md)"
    err = perf_event_probe(PERF_TYPES[family], config)
    return None if err is None else f"was refused by perf_event_open: {err}"


def perf_event_probe(type_: int, config: int) -> str | None:
    """Open (disabled) and close one system-wide counter on CPU 0, as a BPF perf-event probe
    does; None when the kernel accepts it, else the error."""
    syscall_nr = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
    if syscall_nr is None:
        return f"unknown perf_event_open number on {platform.machine()}"
    # struct perf_event_attr, PERF_ATTR_SIZE_VER0 (64 bytes); flags bit 0 = disabled.
    attr = struct.pack("IIQQQQQIIQ", type_, 64, config, 0, 0, 0, 1, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(syscall_nr, buf, -1, 0, -1, 8)  # pid -1, cpu 0, no group, CLOEXEC
    if fd < 0:
        return os.strerror(ctypes.get_errno())
    os.close(fd)
    return None


def _uprobe_problem(env: DoctorEnv, target: str) -> str | None:
    if (
        not (env.paths.sys / "bus/event_source/devices/uprobe").is_dir()
        and not (env.paths.tracefs / "uprobe_events").exists()
    ):
        return "cannot attach: this kernel has no uprobe support (CONFIG_UPROBE_EVENTS)"
    library, _, symbol = target.rpartition(":")
    try:
        from bcc import BPF
    except Exception:
        return "cannot be resolved without bcc"
    module = library if "/" in library else re.sub(r"^lib|\.so.*$", "", library)
    try:
        BPF._check_path_symbol(module.encode(), symbol.encode(), None, -1)
    except Exception:
        if "/" not in library and BPF.find_library(module.encode()) is None:
            return f"cannot attach: library {library} is not installed"
        return f"cannot attach: {library} has no symbol {symbol}"
    return None


def _usdt_problem(env: DoctorEnv, target: str) -> str | None:
    """A runtime's marker: judged in the node's own interpreter (jobs may run another; the
    probe's status names each one it meets)."""
    from gpujitter.probes.python_gc import interpreter_hooks, kernel_has_ref_ctr, node_interpreter

    pmu = env.paths.sys / "bus/event_source/devices/uprobe"
    if not pmu.is_dir() and not (env.paths.tracefs / "uprobe_events").exists():
        return "cannot attach: this kernel has no uprobe support (CONFIG_UPROBE_EVENTS)"
    interpreter = node_interpreter()
    hooks = interpreter_hooks(interpreter, kernel_has_ref_ctr(pmu))
    if hooks.via not in ("usdt", "symbol"):
        return f"cannot attach in {interpreter}: {hooks.why}"
    return None


HOOK_CHECKS: dict[str, Callable[[DoctorEnv, str], str | None]] = {
    "tracepoint": _tracepoint_problem,
    "perf_event": _perf_problem,
    "uprobe": _uprobe_problem,
    "usdt": _usdt_problem,
}

HOOK_FIX: dict[str, Callable[[Hook], str]] = {
    "tracepoint": lambda h: (
        "none on this kernel (it lacks the tracepoint); "
        + remedies.mount_tracefs()
        + "  # if tracefs is not mounted"
    ),
    "perf_event": lambda h: (
        remedies.run_as_root() + "  # or " + remedies.sysctl("kernel.perf_event_paranoid", -1)
    ),
    "uprobe": lambda h: (
        f"install the library of {h.target.rpartition(':')[0]}  # the probe "
        "attaches once it is present"
    ),
    "usdt": lambda h: (
        "run the job on a CPython built --with-dtrace (Debian's and Ubuntu's python3.X are)"
        "  # or keep a gc_collect_main symbol: GC pauses otherwise show as host work"
    ),
}


@check
def check_unused_hooks(env: DoctorEnv) -> Iterator[Result]:
    """kprobes and fentry/fexit: reported for the record; gpujitter never uses them."""
    kprobes = (env.paths.sys / "bus/event_source/devices/kprobe").is_dir() or (
        env.paths.tracefs / "kprobe_events"
    ).exists()
    config = kernel_config(env.paths)
    said = f" (CONFIG_KPROBES={config.get('CONFIG_KPROBES', 'n')})" if config else ""
    yield Result(
        "kprobes",
        "info",
        ("available" if kprobes else f"absent{said}") + "; gpujitter does not use them",
        source=str(env.paths.sys / "bus/event_source/devices"),
    )
    if env.load:
        problem = _try_fentry()
        state = "available" if problem is None else f"refused ({problem})"
    else:
        btf = "BTF present" if (env.paths.sys / "kernel/btf/vmlinux").exists() else "no BTF"
        state = f"not tried ({btf}; --load tries one)"
    yield Result("fentry", "info", f"{state}; gpujitter does not use fentry/fexit")


def kernel_config(paths: HostPaths) -> dict[str, str]:
    """/proc/config.gz as {'CONFIG_KPROBES': 'y', ...}; {} when the kernel does not expose it."""
    try:
        text = gzip.decompress((paths.proc / "config.gz").read_bytes()).decode()
    except (OSError, EOFError, gzip.BadGzipFile):
        return {}
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("CONFIG_"):
            out[key] = value
        elif line.startswith("# CONFIG_") and line.endswith(" is not set"):
            out[line[2:].split()[0]] = "n"
    return out


def _try_fentry() -> str | None:
    from gpujitter.probes.base import captured_output, first_error_line

    try:
        from bcc import BPF
    except Exception as exc:
        return f"bcc: {exc}"
    with captured_output() as stderr:
        try:
            BPF(text=b"KFUNC_PROBE(do_nanosleep) { return 0; }").cleanup()
        except Exception as exc:
            # libbpf says why on stderr ("bpf: Failed to load program: ..."); bcc's own
            # exception text is generic.
            said = [line for line in stderr().splitlines() if line.startswith("bpf:")]
            return said[0].removeprefix("bpf: ") if said else first_error_line(stderr(), str(exc))
    return None


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


def _limit(limits: str, name: str) -> int | None:
    """The soft limit of one /proc/PID/limits row in its unit; None for unlimited."""
    for line in limits.splitlines():
        if line.startswith(name):
            soft = line[len(name) :].split()[0]
            return None if soft == "unlimited" else int(soft)
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


def cost_text(st: ProbeStatus) -> str:
    """A probe's measured BPF cost in one phrase (an idle node's: its own background)."""
    if st.bpf_ns_per_s < 0:
        return "BPF cost not measured (statistics refused, or no BPF programs)"
    per_run = st.bpf_ns_per_s / st.bpf_runs_per_s if st.bpf_runs_per_s > 0 else 0
    return (
        f"BPF {st.bpf_runs_per_s} runs/s, {per_run:.0f} ns/run, "
        f"{st.bpf_ns_per_s / 1e7:.3f}% of a CPU ({st.cost_from}), "
        f"{st.events} events, {st.lost_kernel + st.lost_user} lost"
    )


@check
def check_load(env: DoctorEnv) -> Iterator[Result]:
    """--load: the core module and every registered probe, really loaded for a moment."""
    if not env.load:
        return
    from gpujitter.probes.runner import ProbeSet
    from gpujitter.probes.watch import WatchSpec

    topo = load_topology(env.paths, env.override, nvml=False)
    names = list(env.specs())
    seen: list[Any] = []
    try:
        with ProbeSet(
            names,
            topology=topo,
            watch=WatchSpec(pids={os.getpid()}),
            emit=seen.append,
            paths=env.paths,
        ) as probes:
            started = time.monotonic()
            probes.start()
            probes.run(lambda: time.monotonic() - started > env.load_s)
            probes.measure_cost(time.monotonic_ns())
            statuses = [p.status(time.monotonic_ns()) for p in probes.probes]
    except (GpujitterError, ImportError) as err:
        yield Result("load core", "fail", str(err), fix=remedies.run_as_root())
        return
    yield Result("load core", "pass", "core BPF module (watched set, CPU->node map) loaded")
    yield own_scheduling_result(env)
    for st in statuses:
        if st.state in ("running", "degraded"):
            status: Status = "pass" if st.state == "running" else "warn"
            text = f"{st.state} {st.reason}".strip() + f"; {cost_text(st)}"
            yield Result(f"load {st.probe}", status, text)
        else:
            spec = env.specs()[st.probe]
            yield Result(
                f"load {st.probe}",
                "warn",
                f"{st.state}: {st.reason}; without it {spec.degrades}",
                fix="gpujitter doctor  # the hook lines above say what is missing",
            )


def own_scheduling_result(env: DoctorEnv) -> Result:
    """--load: the daemon's own scheduling, applied to this process's threads and read back
    (a container's seccomp filter or a policy module may refuse it)."""
    own = OwnScheduling(env.paths.proc)
    own.tend(time.monotonic_ns())
    got = thread_policies(env.paths.proc, own.pid)
    wanted = {"batch", "idle"}
    src = f"{env.paths.proc}/PID/task/TID/stat"
    seen = ", ".join(sorted({f"{p} nice {n}" if p != "idle" else p for p, n in got.values()}))
    if own.notes or not got or any(p not in wanted for p, _ in got.values()):
        why = "; ".join(own.notes) or f"threads run {seen or 'unread'}"
        return Result("own scheduling", "warn",
                      f"{why}: the daemon's threads may delay the watched ones "
                      "(self-inflicted gaps, counted in daemon.status self_inflicted)",
                      fix="allow sched_setscheduler and setpriority to the daemon "
                          "(seccomp profile, container runtime)", source=src)  # fmt: skip
    return Result("own scheduling", "pass",
                  f"threads run {seen} (below the watched threads; waits behind them are "
                  "counted as self-inflicted gaps)", source=src)  # fmt: skip
