"""`gpujitter doctor`: can profiling run on this node, and if not, the exact fix.

Checks live one family per module (FAMILIES: kernel, access, hooks, host, load), each a
function registered into CHECKS (model.py) that reads the host through HostPaths and yields
one Result per line: pass, warn (profiling runs with less), fail (profiling cannot run) or
info. Probe hooks come from the probe registry, so a probe added there is checked here
without a change. `--load` goes further and really loads the core BPF module and every probe
for a moment, and asks a daemon running on the node for its own account.
"""

from __future__ import annotations

import dataclasses
import errno

# The check families; each module registers its checks into CHECKS as it is imported.
from gpujitter.daemon.checks.doctor import access, hooks, host, kernel, load
from gpujitter.daemon.checks.doctor.model import CHECKS, Check, DoctorEnv, Result, Status

__all__ = ["CHECKS", "Check", "DoctorEnv", "Result", "Status", "can_profile", "run_checks"]

# The order the families print in; within one, its checks keep the order of its module.
FAMILIES = (kernel, access, hooks, host, load)
CHECKS.sort(key=lambda fn: [f.__name__ for f in FAMILIES].index(fn.__module__))

# Files the checks read, as record_tree patterns (tests/fixtures/hosts/record.py, which adds
# the tracefs formats of every registered tracepoint hook).
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


def run_checks(env: DoctorEnv) -> list[Result]:
    """Every check's lines; a check that cannot read what it needs (e.g. tracefs, which only
    root may list) fails with that reason instead of stopping the others."""
    results: list[Result] = []
    sources = _sources(env)
    for fn in CHECKS:
        name = fn.__name__.removeprefix("check_")
        try:
            for result in fn(env):
                if not result.source:  # a check that reads one place says it itself
                    result = dataclasses.replace(
                        result, source=sources.get(result.check.partition(" ")[0], "")
                    )
                results.append(result)
                name = result.check
        except OSError as err:
            fix = "run `sudo gpujitter doctor`" if err.errno in (errno.EACCES, errno.EPERM) else ""
            why = f"{err.strerror}: {err.filename}" if err.filename else str(err)
            results.append(Result(name, "fail", f"could not be checked: {why}", fix=fix))
    return results


def _sources(env: DoctorEnv) -> dict[str, str]:
    """Where the checks that read several places read them (--json's `source`), by the
    first word of their line."""
    p = env.paths
    hooks = f"{p.tracefs / 'events'}, perf_event_open(2), the traced libraries' symbols"
    topology = f"{p.sys / 'devices/system/node'}, {p.sys / 'bus/pci/devices'}, {p.proc / 'irq'}"
    return {
        "kernel": str(p.proc / "sys/kernel/osrelease"),
        "bcc": "import bcc (python3-bpfcc)",
        "probe": hooks,
        "probes": hooks,
        "fentry": str(p.sys / "kernel/btf/vmlinux"),
        "nvml": f"NVML (libnvidia-ml.so.1), {p.sys / 'bus/pci/devices'}",
        "topology": topology + (f", {env.override}" if env.override else ""),
        "load": "this process: the core module and each probe loaded (--load)",
    }


def can_profile(results: list[Result]) -> bool:
    return not any(r.status == "fail" for r in results)
