"""Doctor checks of the probes' hooks: for each registered probe, whether each tracepoint,
perf event, uprobe and USDT marker it needs is here (HOOK_CHECKS, one finder per hook kind),
whether the kernel lets one program serve many hooks (uprobe-multi links, raw tracepoint
cookies), and, for the record, the hooks gpujitter never uses (kprobes, fentry)."""

from __future__ import annotations

import ctypes
import gzip
import os
import platform
import re
import struct
import zlib
from collections.abc import Callable, Iterator

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.doctor.model import DoctorEnv, Result, check
from gpujitter.probes import tp_cookie, uprobe_multi
from gpujitter.probes.host import HostPaths, read_file
from gpujitter.probes.registry import Hook


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


def _library_fix(library: str) -> str:
    """The command that brings a traced library (libcuda comes with the NVIDIA driver)."""
    if "cuda" in library:
        return remedies.install_nvml() + " (libcuda comes with it; the probe attaches then)"
    return f"install the library of {library}  # the probe attaches once it is present"


HOOK_FIX: dict[str, Callable[[Hook], str]] = {
    "tracepoint": lambda h: (
        "none on this kernel (it lacks the tracepoint); "
        + remedies.mount_tracefs()
        + "  # if tracefs is not mounted"
    ),
    "perf_event": lambda h: (
        remedies.run_as_root() + "  # or " + remedies.sysctl("kernel.perf_event_paranoid", -1)
    ),
    "uprobe": lambda h: _library_fix(h.target.rpartition(":")[0]),
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


# Where one BPF program may serve many hooks, each attachment telling it which one it is on
# (docs/architecture.md): the kernel versions that brought them, what each spares.
SHARED_PROGRAMS = (
    ("uprobe-multi links", (6, 6), uprobe_multi.supported,
     "cuda, python_gc and malloc's precise mode attach one link a file, detached at once",
     "a uprobe per address, attached and detached one by one: libcuda's ~60 make a stop "
     "take seconds"),
    ("raw tracepoint cookies", (6, 10), tp_cookie.supported,
     "irq's vectors share one program pair",
     "irq compiles a program pair per vector (~0.05 CPU-s more at start)"),
)  # fmt: skip


@check
def check_shared_programs(env: DoctorEnv) -> Iterator[Result]:
    """The newer attachments the probes use where the kernel has them (asked of the kernel
    with --load, else told by its version): without them a probe falls back to a program
    per hook, which costs start and stop time, not what it sees."""
    ask = env.load and env.privileged()  # unprivileged, the kernel would refuse anyway
    version = env.kernel_version
    for name, since, supported, spared, otherwise in SHARED_PROGRAMS:
        if ask:
            has, how = supported(), "asked"
            source = "bpf(2): a do-nothing program offered to the kernel"
        else:
            has = version >= since
            how = f"kernel {'.'.join(map(str, version))}; --load asks"
            source = str(env.paths.proc / "sys/kernel/osrelease")
        said = f"yes ({how}): {spared}" if has else f"no ({how}): {otherwise}"
        yield Result(name, "info", said, source=source)


def kernel_config(paths: HostPaths) -> dict[str, str]:
    """/proc/config.gz as {'CONFIG_KPROBES': 'y', ...}; {} when the kernel does not expose it."""
    try:
        text = gzip.decompress(read_file(paths.proc / "config.gz")).decode(errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):  # absent, or a damaged copy
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
    from gpujitter.probes.base import captured_output, compile_blocked, first_error_line

    try:
        from bcc import BPF
    except Exception as exc:
        return f"bcc: {exc}"
    if (why := compile_blocked()) is not None:
        return why
    with captured_output() as stderr:
        try:
            BPF(text=b"KFUNC_PROBE(do_nanosleep) { return 0; }").cleanup()
        except Exception as exc:
            # libbpf says why on stderr ("bpf: Failed to load program: ..."); bcc's own
            # exception text is generic.
            said = [line for line in stderr().splitlines() if line.startswith("bpf:")]
            return said[0].removeprefix("bpf: ") if said else first_error_line(stderr(), str(exc))
    return None
