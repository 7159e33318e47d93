"""Readers of /proc files, one per file: a process's maps (which files it maps, and where),
its task folder (its threads), a task's stat (its state, nice and policy), and the swap
devices. Every probe, check and drill that needs one of them reads it here (status and comm:
host.py; interrupts: interrupts.py); HostPaths makes them run on recorded trees.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpujitter.probes.host import HostPaths, read_file, unescape_octal

DELETED = " (deleted)"  # what maps appends to a file unlinked since it was mapped
# What reading a process's /proc files fails with once it has ended: its folder is gone
# (ENOENT), or it went while the file was read (ESRCH). Any other failure (out of file
# descriptors: EMFILE, ENFILE) says nothing of the process.
GONE = frozenset({errno.ENOENT, errno.ESRCH})


@dataclass(frozen=True, slots=True)
class Mapping:
    """One line of /proc/PID/maps: [start, end) of the process's memory, mapped with `perms`
    ("r-xp") from `offset` of `path` ("" when anonymous, "[heap]" and the like for the
    kernel's own)."""

    start: int
    end: int
    perms: str
    offset: int
    path: str

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def executable(self) -> bool:
        return "x" in self.perms

    @property
    def writable(self) -> bool:
        return "w" in self.perms

    @property
    def file(self) -> bool:
        """Mapped from a file that still exists under its path."""
        return self.path.startswith("/") and not self.path.endswith(DELETED)

    def holds(self, offset: int) -> bool:
        """Whether the file offset is mapped here."""
        return self.offset <= offset < self.offset + self.size

    def address_of(self, offset: int) -> int:
        """The address at which file offset `offset` (one this mapping holds) lies."""
        return self.start + offset - self.offset


def parse_maps(text: str) -> list[Mapping]:
    """A /proc/PID/maps text as its mappings, in address order; malformed lines skipped.
    Lines end at "\n" only (a file name may hold any other line break, \f or U+2028), and a
    newline in a name is the kernel's "\\012"."""
    out = []
    for line in text.split("\n"):
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        lo, _, hi = fields[0].partition("-")
        try:
            path = fields[5].replace("\\012", "\n") if len(fields) == 6 else ""
            out.append(Mapping(int(lo, 16), int(hi, 16), fields[1], int(fields[2], 16), path))
        except ValueError:
            continue
    return out


def read_maps(paths: HostPaths, pid: int | str, containing: str = "") -> list[Mapping]:
    """/proc/PID/maps of process `pid` ("self" for this one), only its lines holding
    `containing` when given; OSError when it cannot be read (the process exited, or is
    another user's). Paths are decoded as the file system's names are (os.fsdecode): a
    mapped file whose name is not UTF-8 keeps its bytes, and opening the path opens it."""
    text = os.fsdecode(read_file(paths.proc / str(pid) / "maps"))
    if containing:
        text = "\n".join(line for line in text.split("\n") if containing in line)
    return parse_maps(text)


def read_mapped_files(
    paths: HostPaths, pid: int | str, *, executable: bool = False, containing: str = ""
) -> list[str]:
    """The files process `pid` maps (executable: those it maps code from; containing: those
    whose path holds that text), each once, in address order; OSError when its maps cannot
    be read (exited: FileNotFoundError; another user's: PermissionError), for a reader that
    must not take "not readable" for "maps nothing". A scan for one library parses only the
    lines that can name it: a process that never maps it is read again every second, and a
    libtorch process's maps run to thousands of lines (585 cost 2 ms parsed whole here)."""
    maps = read_maps(paths, pid, containing)
    return list(
        dict.fromkeys(
            m.path
            for m in maps
            if m.file and (m.executable or not executable) and containing in m.path
        )
    )


def mapped_files(
    paths: HostPaths, pid: int | str, *, executable: bool = False, containing: str = ""
) -> list[str]:
    """read_mapped_files, [] when the maps cannot be read: for the probes, which attach to
    what they can read and try again later."""
    try:
        return read_mapped_files(paths, pid, executable=executable, containing=containing)
    except OSError:
        return []


def in_root(paths: HostPaths, pid: int, path: str) -> str:
    """A path as process `pid` sees it (inside its container), as this process can open it:
    through /proc/PID/root."""
    return str(paths.proc / str(pid) / "root") + path if path.startswith("/") else path


@dataclass(frozen=True, slots=True)
class Swap:
    """One active swap device or file, as /proc/swaps lists it."""

    path: str
    kind: str  # "partition", "file"
    size_kib: int
    used_kib: int
    priority: int


def parse_swaps(text: str) -> list[Swap]:
    """A /proc/swaps text (a header line, then one row per device) as its devices; rows that
    do not read are skipped. The kernel writes a space in a path as \\040 (octal escapes)."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        try:
            size, used, priority = (int(f) for f in fields[2:5])
        except ValueError:
            continue
        if len(fields) == 5:
            path = unescape_octal(fields[0])
            out.append(Swap(path, fields[1], size, used, priority))
    return out


def task_ids(paths: HostPaths, pid: int | str) -> list[int]:
    """The thread ids of process `pid` (its task folder), ascending; [] when it is gone or
    cannot be read."""
    try:
        return listed_task_ids(paths, pid)
    except OSError:
        return []


def listed_task_ids(paths: HostPaths, pid: int | str) -> list[int]:
    """task_ids, [] only where the process has ended (GONE): OSError for any other failure,
    which says nothing of its threads."""
    try:
        return sorted(int(t) for t in os.listdir(f"{paths.proc}/{pid}/task") if t.isdigit())
    except OSError as err:
        if err.errno in GONE:
            return []
        raise


def thread_count(paths: HostPaths, pid: int | str) -> int:
    """How many threads process `pid` has, from one stat of its task folder (procfs counts
    them into its link count, past the two of any folder); -1 when it is gone."""
    try:
        return os.stat(f"{paths.proc}/{pid}/task").st_nlink - 2
    except OSError:
        return -1


def task_state(stat: bytes) -> str:
    """Field 3 of a task's stat (R running or runnable, S, D, ...), "" when cut short: the
    one field read at sampling rate, so cut from the bytes without splitting the rest."""
    end = stat.rfind(b")")
    return stat[end + 2 : end + 3].decode(errors="replace")


def task_stat_fields(text: str | bytes) -> list[str]:
    """The fields of a /proc/PID/task/TID/stat text after "pid (comm) ": [0] is stat's field
    3 (state), [16] field 19 (nice), [38] field 41 (policy). The name may hold spaces and
    parentheses, so it is cut at the last ')'."""
    raw = text.decode(errors="replace") if isinstance(text, bytes) else text
    return raw[raw.rindex(")") + 2 :].split()


def read_while_alive(path: str | Path) -> bytes | None:
    """A process's /proc file (read_file), None where the process has ended (GONE); OSError
    for any other failure, which a caller must not take for the process's end."""
    try:
        return read_file(path)
    except OSError as err:
        if err.errno in GONE:
            return None
        raise


def process_start(paths: HostPaths, pid: int | str, *, zombie: bool = True) -> int | None:
    """When `pid` started, in clock ticks since boot (stat's field 22): with its id, what
    names one process, since ids are reused. None where it cannot be read (gone), or, unless
    `zombie`, where it has exited and only waits for its parent to reap it."""
    try:
        return read_process_start(paths, pid, zombie=zombie)
    except OSError:
        return None


def read_process_start(paths: HostPaths, pid: int | str, *, zombie: bool = True) -> int | None:
    """process_start, whose None says the process has ended (or is not one): OSError where its
    stat could not be read for another reason (read_while_alive)."""
    raw = read_while_alive(paths.proc / str(pid) / "stat")
    try:
        fields = task_stat_fields(raw or b"")
        return None if not zombie and fields[0] == "Z" else int(fields[19])
    except (ValueError, IndexError):
        return None


def process_age_ns(paths: HostPaths, pid: int | str) -> int | None:
    """How long ago `pid` started, to the clock tick (process_start, against CLOCK_BOOTTIME:
    the kernel's own clocks, unmoved by a change of the wall clock); None where it cannot be
    read."""
    if (start_ticks := process_start(paths, pid)) is None:
        return None
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return max(time.clock_gettime_ns(time.CLOCK_BOOTTIME) - start_ticks * tick_ns, 0)


PF_KTHREAD = 0x00200000  # include/linux/sched.h


def is_kernel_thread(paths: HostPaths, pid: int) -> bool:
    """Whether `pid` is a kernel thread (stat's field 9, flags, has PF_KTHREAD): no user
    memory, no executable, no GPU; False where it cannot be read."""
    try:
        fields = task_stat_fields(read_file(paths.proc / str(pid) / "stat"))
        return bool(int(fields[6]) & PF_KTHREAD)
    except (OSError, ValueError, IndexError):
        return False


def alive(paths: HostPaths, pid: int) -> bool:
    """Whether process (or thread) `pid` still exists."""
    return os.path.exists(paths.proc / str(pid))
