"""System state the drills change, each as a context manager that puts it back however the
block ends (failure, SIGINT): sysctls, a swap file, a memory cgroup with a limit, an
IRQ's affinity, this process's CPU affinity, a disk read throttle. Also finding the IRQ that
disk I/O raises and the disk under a file.

A drill killed outright (SIGKILL, the OOM killer) puts nothing back: each change is written
down first, in an undo log in the drill's work folder (undo_log), and the next drill puts
back what a dead one left (recover_killed)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from gpujitter.errors import GpujitterError
from gpujitter.probes.host import HostPaths, format_cpulist, parse_cpulist, read_text
from gpujitter.probes.interrupts import read_table
from gpujitter.probes.procfs import parse_swaps

MEMCG_V1 = Path("/sys/fs/cgroup/memory")
CPU_V1 = Path("/sys/fs/cgroup/cpu")
BLKIO_V1 = Path("/sys/fs/cgroup/blkio")
CGROUP_V2 = Path("/sys/fs/cgroup")
_CGROUP_ROOTS = (MEMCG_V1, CPU_V1, BLKIO_V1, CGROUP_V2)
PAGE = os.sysconf("SC_PAGE_SIZE")
UNDO_LOG = "undo.jsonl"
# What an undo log may name, and nothing else: it is read by root from a folder under a
# world-writable directory, so a change is put back only where it is one a drill makes
_WRITABLE = re.compile(
    r"/proc/sys/[a-z0-9_]+(/[a-z0-9_-]+)+|/proc/irq/\d+/smp_affinity_list"
    r"|/sys/dev/block/\d+:\d+/queue/read_ahead_kb"
)
_GROUP = re.compile(r"gpujitter-drill-\d+")

# The undo log of the drill running in this process (undo_log), None outside one
_undo: TextIO | None = None


@contextlib.contextmanager
def undo_log(folder: Path) -> Iterator[None]:
    """For the block, every change below is written down in folder/undo.jsonl before it is
    made, after a first line with this process's pid, and the log is held locked (flock):
    the kernel drops the lock when the process ends, however it ends, so a log that can be
    locked is a dead drill's (recover_killed)."""
    global _undo
    fd = os.open(folder / UNDO_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        _undo = log
        try:
            _will(pid=os.getpid())
            yield
        finally:
            _undo = None


def _will(**change: str | int) -> None:
    """A change about to be made, in the undo log (if a drill keeps one): out of this
    process before the change is made, as a kill may come right after."""
    if _undo is not None:
        _undo.write(json.dumps(change) + "\n")
        _undo.flush()


def recover_killed(root: Path) -> list[str]:
    """Put back what drills that died without cleaning up (their work folders under root)
    left changed, most recent change first, and remove their folders; a change that cannot
    be put back stays in its log for the next drill. What was put back, what could not be
    and what was left alone, one line each."""
    notes: list[str] = []
    for folder, log, head, changes in _dead_logs(root, fcntl.LOCK_EX, notes):
        who = f"a killed drill (pid {head['pid']})"
        left = []
        for i in range(len(changes) - 1, -1, -1):
            try:
                done = _undo_one(changes[i], folder)
            except (OSError, GpujitterError) as err:
                left = changes[: i + 1]
                notes.append(f"{who} left {_what(changes[i])}: could not put it back "
                             f"({getattr(err, 'strerror', None) or err})")  # fmt: skip
                break
            if done:
                notes.append(f"{who} left {done}")
        if left:  # kept for the next drill, without what was put back
            log.seek(0)
            log.truncate()
            log.write("".join(json.dumps(c) + "\n" for c in [head, *left]))
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return notes


def killed_leftovers(root: Path) -> list[tuple[int, list[str]]]:
    """What drills that died without cleaning up left changed (pid, changes), looked at
    only: the next drill puts it back (recover_killed)."""
    return [(head["pid"], [_what(c) for c in reversed(changes)])
            for _, _, head, changes in _dead_logs(root, fcntl.LOCK_SH, []) if changes]  # fmt: skip


def _dead_logs(
    root: Path, lock: int, notes: list[str]
) -> Iterator[tuple[Path, TextIO, dict[str, Any], list[dict[str, str]]]]:
    """Each dead drill's folder under root, its log (open, locked with `lock` while the
    caller has it), the log's head and its changes. Only folders and logs of ours that no
    one else may write; a log that cannot be read as one is named in `notes`, left alone."""
    for folder in sorted(root.glob("gpujitter-drill-*")):
        path = folder / UNDO_LOG
        if not _root_only(folder, stat.S_ISDIR) or not _root_only(path, stat.S_ISREG):
            continue  # not a folder of a drill's (an older drill's has no log)
        with open(path, "r+" if lock == fcntl.LOCK_EX else "r") as log:
            try:
                fcntl.flock(log, lock | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # that drill runs, or another drill is putting it back
            head, changes, bad = _read_log(log.read())
            if bad:
                notes.append(f"{path}: {bad}; left alone")
                continue
            yield folder, log, head, changes


def _root_only(path: Path, kind: Any) -> bool:
    """path is of that kind itself (not a link to one), ours (root's, as drills run), and no
    one else's to write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return kind(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _read_log(text: str) -> tuple[dict[str, Any], list[dict[str, str]], str]:
    """The log's head and changes, or why it is not a log to act on. A last line cut short
    (the drill killed while it wrote) was a change not yet made: dropped."""
    lines = text.splitlines()
    records = []
    for n, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except ValueError:
            if n == len(lines) - 1 and n > 0:
                break
            return {}, [], f"line {n + 1} is not JSON"
    if (
        not records
        or not isinstance(records[0], dict)
        or not isinstance(records[0].get("pid"), int)
    ):
        return {}, [], "no drill named in its first line"
    for n, change in enumerate(records[1:], 2):
        if not _known(change):
            return {}, [], f"line {n} is not a change a drill makes"
    return records[0], records[1:], ""


def _known(change: Any) -> bool:
    if not isinstance(change, dict) or not all(isinstance(v, str) for v in change.values()):
        return False
    if change.keys() == {"write", "value"}:
        return bool(_WRITABLE.fullmatch(change["write"])) and ".." not in change["write"]
    if change.keys() == {"cgroup"}:
        group = Path(change["cgroup"])
        return group.parent in _CGROUP_ROOTS and bool(_GROUP.fullmatch(group.name))
    return change.keys() == {"swap"}


def _what(change: dict[str, str]) -> str:
    (kind,) = (k for k in ("write", "swap", "cgroup") if k in change)
    return {"write": "{} changed", "swap": "swap file {}", "cgroup": "cgroup {}"}[kind].format(
        change[kind]
    )


def _undo_one(change: dict[str, str], folder: Path) -> str:
    """One change put back; what it was, or "" where there was nothing left to do."""
    if "write" in change:
        path = Path(change["write"])
        if path.exists() and path.read_text().strip() != change["value"]:
            path.write_text(change["value"])
            return f"{path} changed: put back to {change['value']}"
    elif "swap" in change:
        path = Path(change["swap"])
        if path.parent != folder:
            raise GpujitterError("not in the drill's folder")
        swaps = parse_swaps(read_text(HostPaths().proc / "swaps") or "")
        if any(s.path == str(path) for s in swaps):
            _run(["swapoff", str(path)])
            return f"swap file {path} on: swapped off"
    elif "cgroup" in change:
        group = Path(change["cgroup"])
        if group.is_dir():
            _rmdir(group)  # its tasks died with the drill
            return f"cgroup {group}: removed"
    return ""


def _rmdir(group: Path) -> None:
    """Remove a cgroup: rmdir fails while the kernel still releases its last task."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    group.rmdir()


@contextlib.contextmanager
def sysctl(name: str, value: str) -> Iterator[None]:
    """Set /proc/sys/<name> (dots or slashes) for the block, then put the old value back."""
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    _will(write=str(path), value=old)
    path.write_text(value)
    try:
        yield
    finally:
        path.write_text(old)


def realtime_allowed() -> bool:
    """Whether a process started here may take SCHED_FIFO: a cgroup-v1 CPU controller with
    no real-time budget (cpu.rt_runtime_us 0, as in many containers) refuses it even to
    root. Asked in a forked child, so that this process keeps its own policy."""
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except OSError:
            os._exit(1)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise GpujitterError(f"{' '.join(cmd)}: {why}")


@contextlib.contextmanager
def swap_file(path: Path, size_bytes: int) -> Iterator[Path]:
    """A swap file, on for the block; swapped off and removed afterwards, even on failure."""
    _will(swap=str(path))
    try:
        _run(["fallocate", "-l", str(size_bytes), str(path)])
        path.chmod(0o600)
        _run(["mkswap", str(path)])
        _run(["swapon", str(path)])
        yield path
    finally:
        swaps = parse_swaps(read_text(HostPaths().proc / "swaps") or "")
        if any(s.path == str(path) for s in swaps):
            _run(["swapoff", str(path)])
        path.unlink(missing_ok=True)


def _cgroup_root(v1: Path, controller: str) -> Path | None:
    """Where groups of a controller go: its cgroup-v1 hierarchy where mounted, else the v2
    root when the controller is enabled for its children; None when neither."""
    if (v1 / "cgroup.procs").is_file():
        return v1
    if controller in (read_text(CGROUP_V2 / "cgroup.subtree_control") or "").split():
        return CGROUP_V2
    return None


@contextlib.contextmanager
def _cgroup(root: Path, name: str, settings: dict[str, str]) -> Iterator[Path]:
    """A cgroup `name` under `root` with `settings` (file -> value) written in order. On
    exit its remaining processes are moved back to the root cgroup and the directory is
    removed."""
    group = root / name
    _will(cgroup=str(group))
    group.mkdir()
    try:
        for setting, value in settings.items():
            (group / setting).write_text(value)
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (root / "cgroup.procs").write_text(pid)
        _rmdir(group)


@contextlib.contextmanager
def memory_cgroup(name: str, limit_bytes: int) -> Iterator[Path]:
    """A memory cgroup limited to limit_bytes: cgroup v1's memory controller where it is
    mounted, else a cgroup-v2 group (memory.max)."""
    root = _cgroup_root(MEMCG_V1, "memory")
    if root is None:
        raise GpujitterError(
            f"no memory cgroup controller: neither {MEMCG_V1} (v1) nor memory in "
            f"{CGROUP_V2}/cgroup.subtree_control (v2)"
        )
    setting = "memory.limit_in_bytes" if root == MEMCG_V1 else "memory.max"
    with _cgroup(root, name, {setting: str(limit_bytes)}) as group:
        yield group


@contextlib.contextmanager
def cpu_cgroup(
    name: str, weight: int, quota_us: int = 0, period_us: int = 100_000
) -> Iterator[Path]:
    """A CPU cgroup at systemd's CPUWeight `weight` (1-10000, default 100), with a CFS quota
    of quota_us per period_us where given: cgroup v1's cpu controller where mounted
    (cpu.shares = weight * 1024 / 100, systemd's mapping), else a cgroup-v2 group
    (cpu.weight, cpu.max)."""
    root = _cgroup_root(CPU_V1, "cpu")
    if root is None:
        raise GpujitterError(
            f"no CPU cgroup controller: neither {CPU_V1} (v1) nor cpu in "
            f"{CGROUP_V2}/cgroup.subtree_control (v2)"
        )
    if root == CPU_V1:
        settings = {"cpu.shares": str(weight * 1024 // 100)}
        if quota_us:
            settings |= {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}
    else:
        settings = {"cpu.weight": str(weight)}
        if quota_us:
            settings["cpu.max"] = f"{quota_us} {period_us}"
    with _cgroup(root, name, settings) as group:
        yield group


@contextlib.contextmanager
def read_throttle(name: str, dev: str, bps: int) -> Iterator[Path | None]:
    """A cgroup whose processes read from disk `dev` (MAJ:MIN of a whole disk) at most at
    bps bytes/s: cgroup v1's blkio throttle where mounted, else cgroup v2's io.max. Yields
    None (and changes nothing) where neither controller is there."""
    root = _cgroup_root(BLKIO_V1, "io")
    if root is None:
        yield None
        return
    if root == BLKIO_V1:
        setting, value = "blkio.throttle.read_bps_device", f"{dev} {bps}"
    else:
        setting, value = "io.max", f"{dev} rbps={bps}"
    with _cgroup(root, name, {setting: value}) as group:
        yield group


@contextlib.contextmanager
def read_ahead_kb(disk: str, kb: int) -> Iterator[None]:
    """The read-ahead window of a disk (MAJ:MIN) set for the block, then put back."""
    path = Path(f"/sys/dev/block/{disk}/queue/read_ahead_kb")
    old = path.read_text().strip()
    _will(write=str(path), value=old)
    path.write_text(str(kb))
    try:
        yield
    finally:
        path.write_text(old)


def whole_disk(path: Path) -> str:
    """MAJ:MIN of the disk a file lives on (a partition's parent): the device its block
    requests go to."""
    dev = os.stat(path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve()
    if (sysfs / "partition").exists():
        sysfs = sysfs.parent
    return (sysfs / "dev").read_text().strip()


@contextlib.contextmanager
def irq_affinity(irq: int, cpus: list[int]) -> Iterator[bool]:
    """Route IRQ `irq` to `cpus` for the block, then restore its affinity. Yields False
    (and changes nothing) where the kernel refuses: managed IRQs (blk-mq and NVMe queues)
    answer EPERM, and their effective CPU is the kernel's choice."""
    path = Path(f"/proc/irq/{irq}/smp_affinity_list")
    old = path.read_text().strip()
    _will(write=str(path), value=old)
    try:
        path.write_text(format_cpulist(cpus))
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        path.write_text(old)


def effective_cpus(irq: int) -> list[int]:
    return parse_cpulist(Path(f"/proc/irq/{irq}/effective_affinity_list").read_text())


@contextlib.contextmanager
def own_affinity(cpus: list[int]) -> Iterator[None]:
    """This process (threads it starts from now on included) on `cpus` for the block."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


@contextlib.contextmanager
def interrupted_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the block as SIGINT does (KeyboardInterrupt), so that every
    context above restores what it changed; a second signal while that runs is ignored."""
    caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.getsignal(s) for s in caught}

    def stop(signum: int, frame: object) -> None:
        for s in caught:
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt

    for s in caught:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def write_file(path: Path, size_bytes: int) -> Path:
    """A file of real data blocks (not sparse, not unwritten extents, which read as zeros
    without I/O), synced, so that reading it past the page cache goes to the disk."""
    chunk = bytes(range(256)) * (1 << 12)  # 1 MiB
    with open(path, "wb") as f:
        for _ in range(size_bytes // len(chunk)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return path


def direct_reads(path: Path, count: int) -> None:
    """`count` page-sized O_DIRECT reads of `path` (the page cache bypassed: each one is a
    request to the disk and, when it completes, an interrupt)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, PAGE)  # page-aligned, as O_DIRECT wants
    try:
        pages = max(1, os.fstat(fd).st_size // PAGE)
        for i in range(count):
            os.preadv(fd, [buf], (i * 7919 % pages) * PAGE)
    finally:
        buf.close()
        os.close(fd)


def disk_irq(path: Path, paths: HostPaths | None = None) -> tuple[int, str]:
    """The IRQ that reads of `path`'s disk raise, found by doing some and seeing which
    IRQ's count rose most: names differ by driver and hypervisor (virtio1-req.0 on PCI,
    virtio0 on virtio-mmio, nvme0q3), the count does not."""
    paths = paths or HostPaths()
    before = read_table(paths)
    direct_reads(path, 512)
    after = read_table(paths)
    rises = {
        int(label): row.total - (before[label].total if label in before else 0)
        for label, row in after.items()
        if row.numbered
    }
    irq = max(rises, key=lambda n: rises[n], default=-1)
    if irq < 0 or rises[irq] < 100:
        raise GpujitterError(f"no IRQ fired for 512 direct reads of {path}: is it on a disk?")
    return irq, (after[str(irq)].words or ("?",))[-1]
