"""What every doctor check shares: the host it reads (DoctorEnv), the line it yields
(Result) and the registry (CHECKS) that the family modules register their checks into."""

from __future__ import annotations

import platform
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpujitter.probes import registry
from gpujitter.probes.host import (
    CAP_BPF,
    CAP_PERFMON,
    CAP_SYS_ADMIN,
    HostPaths,
    capabilities,
    read_text,
    status_fields,
)
from gpujitter.probes.nvml import Nvml, open_nvml
from gpujitter.probes.registry import ProbeSpec

Status = Literal["pass", "warn", "fail", "info"]


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
    # The running daemon's stream socket, asked for its own account under --load (None: not
    # asked).
    socket: Path | None = None
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


def kernel_version(release: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", release)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
