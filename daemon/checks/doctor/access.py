"""Doctor checks of what this process may do: load tracing BPF programs (root or
capabilities), open system-wide perf events, and read kernel memory under lockdown."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.doctor.model import DoctorEnv, Result, check
from gpujitter.probes.host import CAP_PERFMON, CAP_SYS_ADMIN, capabilities, read_int, read_text


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
