"""Where the host's /proc and /sys are: injectable, so every reader runs on recorded trees
in tests (the way psutil's PROCFS_PATH and node_exporter's --path.sysfs do)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class HostPaths:
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    etc: Path = Path("/etc")

    @classmethod
    def under(cls, root: str | Path) -> HostPaths:
        """A recorded tree laid out as root/proc, root/sys and root/etc."""
        root = Path(root)
        return cls(proc=root / "proc", sys=root / "sys", etc=root / "etc")

    @property
    def live(self) -> bool:
        return self.proc == Path("/proc")


def read_text(path: Path) -> str | None:
    """A sysfs/procfs file's text without its trailing newline, None when absent or unreadable."""
    try:
        return path.read_text().rstrip("\n")
    except OSError:
        return None


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; empty text -> []."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpulist(cpus: list[int] | set[int] | tuple[int, ...]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8': the form /proc/irq/N/smp_affinity_list and taskset accept."""
    ordered = sorted(set(cpus))
    spans: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        spans.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(spans)
