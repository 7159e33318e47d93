"""Where the host's /proc, /sys, /etc and /lib/modules are: injectable, so every reader runs on
recorded trees in tests (the way psutil's PROCFS_PATH and node_exporter's --path.sysfs do;
tests/fixtures/hosts/record.py records them), plus the small parsers those readers share (CPU
lists, sysfs choices, PCI addresses) and the readers of a process's status and name."""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpujitter.text import decode_name

# A PCI address as sysfs spells it: domain:bus:device.function.
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# How /proc/swaps and /proc/PID/mountinfo write a space, a tab, a newline or a backslash in
# a path: \040, \011, \012, \134.
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape_octal(text: str) -> str:
    """A path as /proc/swaps or /proc/PID/mountinfo writes it, its octal escapes undone."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), text)


@dataclass(frozen=True, slots=True)
class HostPaths:
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    etc: Path = Path("/etc")
    modules: Path = Path("/lib/modules")  # kernel headers links (build, source) per release
    src: Path = Path("/usr/src")  # installed kernel headers trees
    run: Path = Path("/run")  # container runtimes' state (containerd tasks)
    var: Path = Path("/var")  # container runtimes' stores (CRI-O, Docker)

    @classmethod
    def under(cls, root: str | Path) -> HostPaths:
        """A recorded tree laid out as root/proc, root/sys, root/etc, root/lib/modules,
        root/usr/src, root/run and root/var."""
        root = Path(root)
        return cls(
            proc=root / "proc",
            sys=root / "sys",
            etc=root / "etc",
            modules=root / "lib/modules",
            src=root / "usr/src",
            run=root / "run",
            var=root / "var",
        )

    @property
    def live(self) -> bool:
        return self.proc == Path("/proc")

    @property
    def tracefs(self) -> Path:
        return self.sys / "kernel/tracing"


def read_text(path: Path) -> str | None:
    """A sysfs/procfs file's text without its trailing newline, None when absent or unreadable."""
    raw = read_raw(path)
    try:
        return None if raw is None else raw.decode().rstrip("\n")
    except UnicodeDecodeError:
        return None


def read_foreign(path: Path) -> str | None:
    """A procfs file whose text another process chose (its environment, the names of the
    files it maps), bytes that are not UTF-8 read as U+FFFD: one such byte no longer hides
    the whole file, as read_text's strict decoding does. None when absent or unreadable."""
    raw = read_raw(str(path))
    return None if raw is None else raw.decode(errors="replace")


def read_name(path: Path) -> str | None:
    """A process's name file (/proc/PID/comm) decoded as the probes decode comm
    (gpujitter.text.decode_name), so both name a process alike; None when absent."""
    raw = read_raw(path)
    if raw is None:
        return None
    return decode_name(raw[:-1] if raw.endswith(b"\n") else raw)


def decimal(text: str, digits: int = 20) -> int | None:
    """Text of ASCII digits (at most `digits` of them: 20 holds any u64) as a number, else
    None: str.isdigit/isdecimal also take '²' or '٣', and int() refuses past 4300 digits."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= digits else None


def read_int(path: Path) -> int | None:
    """A file holding one integer (decimal, or hex with 0x), None when absent or not a number."""
    text = read_text(path)
    try:
        return None if text is None else int(text.strip(), 0)
    except ValueError:
        return None


# Past any kernel's CPU count (NR_CPUS is at most 8192): a list naming higher CPUs is not a
# node's, and a range to 4e9 would be built before anything refused it.
MAX_CPU = 1 << 16


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]; empty text -> []; ValueError for a
    malformed list or a CPU number past MAX_CPU."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if not 0 <= first <= last < MAX_CPU:
            raise ValueError(f"CPU range {part!r} out of bounds (0-{MAX_CPU - 1}, low to high)")
        cpus.extend(range(first, last + 1))
    return cpus


def cpus_in(text: str) -> tuple[int, ...]:
    """A cpulist read from the system (a /proc or /sys file, a status field) as CPU numbers;
    () when malformed."""
    try:
        return tuple(parse_cpulist(text))
    except ValueError:
        return ()


def read_cpulist(path: Path) -> tuple[int, ...]:
    """A cpulist file as CPU numbers; () when absent or malformed."""
    return cpus_in(read_text(path) or "")


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


def selected_choice(text: str | None) -> str | None:
    """The bracketed word of a sysfs choice file: 'always [madvise] never' -> 'madvise'."""
    match = re.search(r"\[([^\]]+)\]", text or "")
    return match.group(1) if match else None


def pci_address_of(path: Path) -> str | None:
    """The PCI device a sysfs device path (link) sits under: the last PCI address among the
    components of its resolved path (a NIC's `device` link may point at a virtio or USB child
    of the PCI function); None for virtual and non-PCI devices."""
    try:
        resolved = Path(os.path.realpath(path))
    except OSError:
        return None
    if not resolved.exists():
        return None
    found = [part for part in resolved.parts if PCI_ADDRESS.match(part)]
    return found[-1] if found else None


def numa_node(text: str | None) -> int | None:
    """A sysfs numa_node value: the node, or None where the kernel says -1 (unknown)."""
    try:
        node = int((text or "").strip())
    except ValueError:
        return None
    return node if node >= 0 else None


def proc_pids(paths: HostPaths) -> list[int]:
    """Process ids under /proc, ascending; [] when /proc cannot be listed."""
    try:
        return listed_pids(paths)
    except OSError:
        return []


def listed_pids(paths: HostPaths) -> list[int]:
    """proc_pids, OSError when /proc cannot be listed (out of file descriptors): for a caller
    that must not take that for a node without processes."""
    return sorted(int(n) for n in os.listdir(paths.proc) if n.isdigit())


# Past any procfs or sysfs file (a process's maps with 100k mappings is ~10 MiB): what reads
# longer is no such file (a recorded host tree's link to /dev/zero), unreadable.
MAX_RAW_BYTES = 64 << 20


def read_file(path: str | Path) -> bytes:
    """A procfs or sysfs file's bytes through the raw system calls (a path joined as a string
    and an os.open cost a third of a pathlib read, ~95 µs against ~30 here, and some of
    these files are read for every watched thread each second); OSError when it cannot be
    read. Opened non-blocking: a FIFO in a recorded host tree (`--root`) reads as empty at
    once, where its open waited for a writer for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        size = len(chunks[0])
        while chunks[-1]:  # procfs hands a file over a page or so at a time
            if size > MAX_RAW_BYTES:
                raise OSError(errno.EFBIG, "longer than any procfs or sysfs file")
            chunks.append(os.read(fd, 65536))
            size += len(chunks[-1])
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_raw(path: str | Path) -> bytes | None:
    """read_file, None when the file cannot be read."""
    try:
        return read_file(path)
    except OSError:
        return None


def boot_id(paths: HostPaths) -> str:
    """This boot's id (/proc/sys/kernel/random/boot_id, a UUID the kernel draws at each
    boot): what tells a recording's boots apart, their monotonic clocks each beginning at
    zero. "" where it cannot be read."""
    return (read_text(paths.proc / "sys/kernel/random/boot_id") or "").strip()


def status_fields(paths: HostPaths, pid: int | str) -> dict[str, str]:
    """/proc/PID/status as {'Name': 'python3', 'Cpus_allowed_list': '0-3', ...}; {} when it
    cannot be read. A name's invalid bytes read as U+FFFD: the kernel takes any name, and
    the other fields must still read."""
    raw = read_raw(f"{paths.proc}/{pid}/status")
    return {} if raw is None else parse_status(raw)


def parse_status(raw: bytes) -> dict[str, str]:
    """A /proc/PID/status file's bytes as status_fields gives them."""
    text = raw.decode(errors="replace")
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key] = value.strip()
    return fields


CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


def capabilities(paths: HostPaths) -> set[int]:
    """This process's effective capabilities (bit numbers, as in linux/capability.h)."""
    mask = int(status_fields(paths, "self").get("CapEff", "0") or "0", 16)
    return {bit for bit in range(64) if mask >> bit & 1}


def can_load_bpf(paths: HostPaths) -> bool:
    """Whether this process holds what loading the probes takes (CAP_BPF with CAP_PERFMON,
    or CAP_SYS_ADMIN, as root has)."""
    caps = capabilities(paths)
    return CAP_SYS_ADMIN in caps or {CAP_BPF, CAP_PERFMON} <= caps


# A value at or above this reads as no limit: cgroup v1 writes "unlimited" as PAGE_COUNTER_MAX
# pages in bytes (9223372036854771712 with 4 KiB pages).
_NO_MEMORY_LIMIT = 1 << 60


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """The tightest memory limit a process runs under, and the file that sets it."""

    bytes: int
    setting: str  # memory.max, memory.high (cgroup v2) or memory.limit_in_bytes (v1)
    path: Path


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    """A process's memory cgroup directory, and the limit files its hierarchy has."""

    path: Path
    settings: tuple[str, ...]  # memory.max and memory.high (v2), memory.limit_in_bytes (v1)

    def limit(self, paths: HostPaths) -> MemoryLimit | None:
        """The tightest of the limits on this cgroup and on every cgroup above it (a
        parent's limit binds its children); None where there is none."""
        found: MemoryLimit | None = None
        for group in (self.path, *self.path.parents):
            for setting in self.settings:
                text = read_text(group / setting)
                value = int(text) if text and text.isdigit() else None
                if value is None or value >= _NO_MEMORY_LIMIT:
                    continue
                if found is None or value < found.bytes:
                    found = MemoryLimit(value, setting, group / setting)
            if group == paths.sys / "fs/cgroup" or not (group / "cgroup.procs").exists():
                break
        return found


def memory_cgroup(paths: HostPaths, pid: int | str = "self") -> MemoryCgroup | None:
    """A process's memory cgroup: cgroup v1's memory hierarchy where one is mounted, else the
    v2 hierarchy; None where it cannot be told (no cgroup file system mounted, /proc/PID/cgroup
    or mountinfo unreadable)."""
    mount = _memory_mount(paths, pid)
    return None if mount is None else MemoryCgroup(*mount)


def memory_limit(paths: HostPaths, pid: int | str = "self") -> MemoryLimit | None:
    """The tightest memory limit a process runs under (MemoryCgroup.limit); None where there
    is none, or nothing can be read (memory_cgroup tells which)."""
    group = memory_cgroup(paths, pid)
    return None if group is None else group.limit(paths)


def _memory_mount(paths: HostPaths, pid: int | str) -> tuple[Path, tuple[str, ...]] | None:
    """The process's memory cgroup directory and the limit files to read there: cgroup v1's
    memory hierarchy where one is mounted, else the v2 hierarchy (/proc/PID/cgroup names the
    group, /proc/PID/mountinfo where its hierarchy is mounted and from which root)."""
    groups = read_text(paths.proc / f"{pid}/cgroup") or ""
    mounts = read_text(paths.proc / f"{pid}/mountinfo") or ""
    v1 = v2 = None
    for line in groups.splitlines():
        _, controllers, group = [*line.split(":", 2), "", ""][:3]
        if "memory" in controllers.split(","):
            v1 = group
        elif not controllers and line.startswith("0:"):
            v2 = group
    for line in mounts.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if not after:
            continue
        fstype, options = after[0], (after[2] if len(after) > 2 else "")
        root, point = unescape_octal(fields[3]), unescape_octal(fields[4])
        if v1 is not None and fstype == "cgroup" and "memory" in options.split(","):
            return _under(paths, point, root, v1), ("memory.limit_in_bytes",)
        if v1 is None and v2 is not None and fstype == "cgroup2":
            return _under(paths, point, root, v2), ("memory.max", "memory.high")
    return None


def _under(paths: HostPaths, point: str, root: str, group: str) -> Path:
    """A cgroup's directory: its path relative to the mount's root, under the mount point (in
    the recorded tree's sys where paths are not the live ones). A group outside the mount's
    root (another cgroup namespace) is the mount point itself."""
    base = Path(point)
    if not paths.live and base.is_relative_to("/sys"):
        base = paths.sys / base.relative_to("/sys")
    inside = group == root or group.startswith(root.rstrip("/") + "/")
    rel = os.path.relpath(group, root) if inside else "."
    return base if rel == "." else base / rel
