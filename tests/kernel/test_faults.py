"""faults probe: a first-touch storm must come out as minor faults of the touching thread,
and reading a file whose page cache was dropped as major file faults, one per page read;
unwatched processes and faults under the thresholds must not reach user space."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpujitter.probes.events import Event, FaultStats, MajorFault, MinorFaults
from gpujitter.probes.faults import FaultProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from tests.kernel.conftest import Recorded
from tests.kernel.memory import PAGE, Workload, run_all, spawn

__all__ = ["spawn"]  # the fixture, used by name

# Touch `pages` fresh anonymous pages (4 KiB each: no transparent huge pages) with memset.
FIRST_TOUCH = """
import ctypes, mmap
size = int(sys.argv[1]) * mmap.PAGESIZE
m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
buf = (ctypes.c_char * size).from_buffer(m)
def body():
    ctypes.memset(buf, 1, size)
report(body)
"""

# Read one byte of each page of a file through a mapping, after dropping its page cache.
# MADV_RANDOM turns off read-ahead and fault-around: every page is its own major fault.
READ_MAPPED = """
import mmap, os
path, pages = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
m = mmap.mmap(fd, pages * mmap.PAGESIZE, prot=mmap.PROT_READ)
m.madvise(mmap.MADV_RANDOM)
base = next(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if path in line)
def body():
    sum(m[i * mmap.PAGESIZE] for i in range(pages))
    return base
report(body)
"""


def observe(
    names: Sequence[str],
    load: Callable[[], Any],
    *,
    watch: WatchSpec,
    thresholds: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[Recorded, dict[str, list[int]]]:
    """Run `load` with the probes attached, polling meanwhile; then drain the ring, take
    one last sample (the counters up to the end) and the fault-time histograms."""
    events: list[Event] = []
    with ProbeSet(
        names,
        topology=load_topology(),
        watch=watch,
        emit=events.append,
        thresholds=thresholds,
    ) as probes:
        statuses = probes.start()
        assert [s for s in statuses if s.state != "running"] == []
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(load)
            while not done.done():
                probes.poll()
                time.sleep(0.02)
            done.result()
        probes.poll()
        probes.tick(time.monotonic_ns())
        fault_probe = next(p for p in probes.probes if isinstance(p, FaultProbe))
        histograms = fault_probe.histograms()
    return Recorded(events, statuses), histograms


def totals(rec: Recorded, tid: int) -> dict[str, int]:
    """Sum of one thread's FaultStats over the run, by field."""
    out: dict[str, int] = {}
    for s in rec.of(FaultStats, tid=tid):
        for name in FaultStats.__dataclass_fields__:
            if name.endswith(("_count", "_ns")) and name not in ("ts_ns", "interval_ns"):
                out[name] = out.get(name, 0) + getattr(s, name)
    return out


def test_first_touch_storm_is_minor_faults_of_the_touching_thread(
    spawn: Callable[..., Workload],
) -> None:
    pages = 20_000
    watched = spawn(FIRST_TOUCH, str(pages))
    other = spawn(FIRST_TOUCH, str(pages))
    rec, hist = observe(
        ["faults"],
        run_all(watched, other),
        watch=WatchSpec(pids={watched.pid}),
        thresholds={"faults": {"minor": 200_000, "minor_window": 1_000_000_000}},
    )

    counted = totals(rec, watched.pid)
    # Every page touched faulted once; the probe counts the whole watched run, so it sees at
    # least the storm and at most what the thread's own counter says.
    assert watched.report["minflt"] >= pages
    assert pages <= counted["minor_count"] <= watched.report["minflt"] + 200
    # The storm is all fault time (memset of fresh pages) while the thread is on CPU: its
    # faults' spacing times it. Faults outside it (the interpreter's own) are counted, not
    # timed, and so are the few of a window's end and around each preemption.
    cpu_ns, wall_ns = watched.report["cpu_ns"], watched.report["body_ns"]
    assert 0.8 * cpu_ns <= counted["minor_ns"] <= wall_ns * 1.05
    # The storm's pages are anonymous; the interpreter's own may fault back in from disk
    # where the suite's other tests let the page cache go, before its body or after it
    assert counted["swap_count"] == 0
    assert counted["file_count"] <= watched.major_faults_at_most(), counted
    # (a preemption mid-storm leaves the faults since the last read untimed too)
    assert counted["untimed_count"] <= counted["minor_count"] - pages + 0.05 * pages
    # only one thread was watched: the histogram holds its timed faults
    assert pages * 0.95 <= sum(hist["minor"]) <= counted["minor_count"]

    windows = rec.of(MinorFaults, tid=watched.pid)
    assert windows, "a 20k-page storm must fill windows of 200 us of fault time"
    for w in windows:
        assert w.tgid == watched.pid and w.count > 0
        assert w.total_ns >= 200_000
        assert w.ts_ns < w.end_ns
        assert w.total_ns <= w.end_ns - w.ts_ns
    assert all(a.end_ns <= b.ts_ns for a, b in itertools.pairwise(windows))
    # Windows are streamed whole: together they hold all the storm's faults but the last
    # window's, which stays under the threshold.
    streamed = sum(w.count for w in windows)
    assert pages * 0.9 <= streamed <= counted["minor_count"]

    assert rec.of(MinorFaults, tgid=other.pid) == []
    assert rec.of(FaultStats, tgid=other.pid) == []
    assert rec.status("faults").state == "running"
    assert rec.status("faults").lost_kernel == 0


def test_minor_threshold_keeps_windows_in_the_kernel(spawn: Callable[..., Workload]) -> None:
    touch = spawn(FIRST_TOUCH, "5000")
    rec, _ = observe(
        ["faults"],
        touch.run,
        watch=WatchSpec(pids={touch.pid}),
        thresholds={"faults": {"minor": 10_000_000_000}},
    )
    assert rec.of(MinorFaults, tid=touch.pid) == []
    assert totals(rec, touch.pid)["minor_count"] >= 5000


# Let the kernel write `pages` fresh pages (read() from /dev/zero into an untouched mapping):
# the faults are taken in kernel mode, on user memory.
KERNEL_WRITES = """
import mmap, os
pages = int(sys.argv[1])
m = mmap.mmap(-1, pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
fd = os.open("/dev/zero", os.O_RDONLY)
report(lambda: os.readv(fd, [m]))
"""


def test_faults_taken_by_the_kernel_on_user_memory_are_counted(
    spawn: Callable[..., Workload],
) -> None:
    pages = 2000
    reader = spawn(KERNEL_WRITES, str(pages))
    rec, _ = observe(["faults"], reader.run, watch=WatchSpec(pids={reader.pid}))
    assert reader.report["result"] == pages * PAGE
    counted = totals(rec, reader.pid)
    assert pages <= counted["minor_count"] <= reader.report["minflt"] + 200
    cpu_ns, wall_ns = reader.report["cpu_ns"], reader.report["body_ns"]
    assert 0.8 * cpu_ns <= counted["minor_ns"] <= wall_ns * 1.05


def file_of_pages(path: Path, pages: int) -> Path:
    """A file of `pages` pages on disk, written back so its page cache can be dropped."""
    with path.open("wb") as f:
        f.write(os.urandom(pages * PAGE))
        f.flush()
        os.fsync(f.fileno())
    return path


def read_dropped_file(
    spawn: Callable[..., Workload],
    tmp_path: Path,
    pages: int,
    names: Sequence[str],
    thresholds: Mapping[str, Mapping[str, int]],
) -> tuple[Workload, Recorded, dict[str, list[int]]]:
    """A watched process reads every page of a fresh file whose page cache it dropped."""
    data = file_of_pages(tmp_path / "data", pages)
    reader = spawn(READ_MAPPED, str(data), str(pages))
    watch = WatchSpec(pids={reader.pid})
    rec, hist = observe(names, reader.run, watch=watch, thresholds=thresholds)
    assert reader.report["majflt"] == pages  # the kernel agrees that each read was major
    return reader, rec, hist


def own_file_faults(reader: Workload, pages: int) -> int:
    """How many file faults a reader of `pages` may take besides its reads: the interpreter's
    own pages read back from disk (before or after its body) where the page cache let them
    go, as its own count says."""
    return reader.major_faults_at_most() - pages


def test_reading_a_dropped_file_through_a_mapping_is_one_major_file_fault_per_page(
    spawn: Callable[..., Workload], tmp_path: Path
) -> None:
    pages = 300
    thresholds = {"faults": {"major": 0}, "swap": {"swapin": 0}}
    reader, rec, hist = read_dropped_file(spawn, tmp_path, pages, ["faults", "swap"], thresholds)

    majors = rec.of(MajorFault, tid=reader.pid)
    assert {m.kind for m in majors} == {"file"}
    base = reader.report["result"]
    reads = [m for m in majors if base <= m.address < base + pages * PAGE]
    assert sorted((m.address - base) // PAGE for m in reads) == list(range(pages))
    assert len(majors) - pages <= own_file_faults(reader, pages), majors
    assert all(m.dur_ns > 0 for m in majors)
    assert {m.comm for m in majors} == {Path(sys.executable).name[:15]}
    counted = totals(rec, reader.pid)
    assert counted["file_count"] == len(majors)
    assert counted["file_ns"] == sum(m.dur_ns for m in majors)
    assert counted["swap_count"] == counted["unclassified_count"] == 0
    assert sum(hist["file"]) == len(majors)
    assert rec.status("faults").events == len(majors) + len(rec.of(MinorFaults))
    assert rec.status("swap").events == 0


def test_major_threshold_keeps_fast_faults_in_the_kernel(
    spawn: Callable[..., Workload], tmp_path: Path
) -> None:
    thresholds = {"faults": {"major": 10_000_000_000}}
    reader, rec, _ = read_dropped_file(spawn, tmp_path, 100, ["faults"], thresholds)
    assert rec.of(MajorFault) == []
    assert 100 <= totals(rec, reader.pid)["file_count"] <= 100 + own_file_faults(reader, 100)


def test_swap_alone_streams_no_file_faults_but_counts_them(
    spawn: Callable[..., Workload], tmp_path: Path
) -> None:
    reader, rec, _ = read_dropped_file(spawn, tmp_path, 100, ["swap"], {"swap": {"swapin": 0}})
    assert rec.of(MajorFault) == rec.of(MinorFaults) == []
    assert 100 <= totals(rec, reader.pid)["file_count"] <= 100 + own_file_faults(reader, 100)
    assert rec.status("swap").state == "running"


def test_probe_command_shows_faults_and_swap_working(spawn: Callable[..., Workload]) -> None:
    touch = spawn(FIRST_TOUCH, "20000")
    command = ["probe", "faults", "swap", "--json", "--pid", str(touch.pid), "--duration", "4s"]
    cli = subprocess.Popen(
        [sys.executable, "-m", "gpujitter", *command, "-t", "faults.minor=100us"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert cli.stdout is not None
    records = []
    while not {"faults", "swap"} <= {r.get("probe") for r in records}:  # both attached
        records.append(json.loads(cli.stdout.readline()))
    touch.run()
    out, _ = cli.communicate(timeout=60)
    records += [json.loads(line) for line in out.splitlines()]
    summary = records[-1]
    assert summary["type"] == "summary"
    assert {name: p["state"] for name, p in summary["probes"].items()} == {
        "core": "running",  # the core module, its cost and losses said as a probe's
        "faults": "running",
        "swap": "running",
    }
    kinds = {r["type"] for r in records if r.get("tid") == touch.pid}
    assert {"fault.minor", "fault.stats"} <= kinds
