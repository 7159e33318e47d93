"""What an audit rule is and what it returns: findings with severity, the evidence they rest
on (the value read and the file it came from) and the exact remediation command."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpujitter.probes.host import HostPaths, read_file, read_text
from gpujitter.probes.topology import Topology

Severity = Literal["ok", "info", "warn", "critical"]
SEVERITIES: tuple[Severity, ...] = ("ok", "info", "warn", "critical")


@dataclass(frozen=True, slots=True)
class Reading:
    """What a finding rests on: one value read from the host (a finding's evidence; the
    attribution's evidence records are daemon/analysis/records.py's)."""

    file: str  # where the value was read (a path of the tree audited)
    value: str  # what was read there ("absent" when the file is not there)


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str  # "memory.swappiness"
    severity: Severity
    subject: str  # what the finding is about: "vm.swappiness", "IRQ 36 virtio1-req.0", "pid 7"
    message: str
    evidence: tuple[Reading, ...] = ()
    fix: str = (
        ""  # the exact command (daemon/analysis/remedies.py), empty when nothing is to be done
    )


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    comm: str
    gpus: tuple[str, ...]  # PCI bus ids of the GPUs it uses; () when not known
    found_by: Literal["nvml", "libcuda", "--pid"]


@dataclass(slots=True)
class AuditContext:
    paths: HostPaths
    topology: Topology
    processes: list[GpuProcess] = field(default_factory=list)
    max_exit_latency_us: int = 10  # idle states slower to leave than this are flagged

    def read(self, path: Path) -> tuple[str | None, Reading]:
        """A file's text and the evidence that says so."""
        text = read_text(path)
        return text, Reading(str(path), "absent" if text is None else text.strip())


def read_process_file(path: Path) -> str:
    """A /proc/PID file whose text another process chose (environ, numa_maps), invalid UTF-8
    read as U+FFFD; OSError when it cannot be read, so that a rule tells "not readable"
    (another user's process, to all but root) apart from "empty"."""
    return read_file(path).decode(errors="replace")


def why_unreadable(err: OSError) -> str:
    """Why a file could not be read, as findings say it; a permission refusal names its cure
    (another user's maps, environ and numa_maps are closed to all but root)."""
    why = err.strerror or type(err).__name__
    if err.errno not in (errno.EACCES, errno.EPERM):
        return why
    # Root refused too: a container's root short of CAP_SYS_PTRACE or CAP_DAC_READ_SEARCH.
    cure = (
        "refused to root here too (a container's capabilities)"
        if os.geteuid() == 0
        else "run as root"
    )
    return f"{why}: {cure}"


def not_readable(path: Path, err: OSError) -> Reading:
    return Reading(str(path), f"not readable: {why_unreadable(err)}")


Rule = Callable[[AuditContext], Iterable[Finding]]
RULES: dict[str, Rule] = {}


def rule(name: str) -> Callable[[Rule], Rule]:
    """Register an audit rule under `name` (family.rule); findings carry that name."""

    def register(fn: Rule) -> Rule:
        if name in RULES:
            raise ValueError(f"audit rule {name!r} registered twice")
        RULES[name] = fn
        return fn

    return register
