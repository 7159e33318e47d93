"""swap probe: real swap-ins. A process whose memory cgroup (v1) is capped below its working
set is swapped out to a swap file; touching its memory again reads it back, and the probe
must count those swap-ins as /proc/vmstat's pswpin does."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpujitter.probes.events import MajorFault, MinorFaults
from gpujitter.probes.watch import WatchSpec
from tests.kernel.memory import (
    MEMCG_V1,
    PAGE,
    Workload,
    memory_cgroup,
    spawn,
    swap_file,
    sysctl,
    vmstat,
)
from tests.kernel.test_faults import observe, totals

__all__ = ["spawn"]  # the fixture, used by name

# Fill `pages` anonymous pages, then read one byte of each again: under the cgroup's limit
# the first pass pushes the oldest pages out to swap and the second reads them back.
TOUCH_TWICE = """
import ctypes, mmap
pages = int(sys.argv[1])
m = mmap.mmap(-1, pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
def body():
    ctypes.memset((ctypes.c_char * len(m)).from_buffer(m), 1, len(m))
    return sum(m[i * mmap.PAGESIZE] for i in range(pages))
report(body)
"""

WORKING_SET_BYTES = 96 << 20
LIMIT_BYTES = 48 << 20


@pytest.fixture
def swapping_cgroup(tmp_path: Path) -> Iterator[Path]:
    """A swap file and a memory cgroup capped below the workload's working set, with swap
    read-ahead off (vm.page-cluster=0: one swap-in fault reads one page, as pswpin counts)."""
    with (
        sysctl("vm.page-cluster", "0"),
        swap_file(tmp_path / "swap", 2 * WORKING_SET_BYTES),
        memory_cgroup(f"gpujitter-test-{os.getpid()}", LIMIT_BYTES) as group,
    ):
        yield group


def test_swap_ins_are_counted_and_timed_like_pswpin(
    spawn: Callable[..., Workload], swapping_cgroup: Path
) -> None:
    toucher = spawn(TOUCH_TWICE, str(WORKING_SET_BYTES // PAGE))
    (swapping_cgroup / "cgroup.procs").write_text(str(toucher.pid))
    pswpin_before = vmstat("pswpin")
    rec, hist = observe(
        ["faults", "swap"],
        toucher.run,
        watch=WatchSpec(pids={toucher.pid}),
        thresholds={"faults": {"major": 0}, "swap": {"swapin": 0}},
    )
    pswpin = vmstat("pswpin") - pswpin_before

    counted = totals(rec, toucher.pid)
    swapins = rec.of(MajorFault, tid=toucher.pid, kind="swap")
    assert pswpin > 10_000, "the cgroup limit must force real swap-ins"
    assert abs(counted["swap_count"] - pswpin) <= 0.1 * pswpin
    # One event per swap-in, streamed once although both probes run, by the swap probe.
    assert len(swapins) == counted["swap_count"]
    assert len({(m.ts_ns, m.address) for m in swapins}) == len(swapins)
    assert rec.status("swap").events == len(swapins)
    # The faults probe streams the rest: the storm's minor faults, and the file faults of the
    # interpreter's own pages read back from disk where the page cache let them go (none on
    # a quiet machine), no more than the process counted for its life (its swap-ins among
    # them: a swap-in that reads a cluster of pages is one major fault, so pswpin and the
    # probe's swap count can exceed it, and the two do not subtract)
    files = rec.of(MajorFault, tid=toucher.pid, kind="file")
    assert len(files) == counted["file_count"] <= toucher.major_faults_at_most()
    assert rec.status("faults").events == len(rec.of(MinorFaults)) + len(files)
    assert all(m.dur_ns > 0 for m in swapins)
    assert counted["swap_ns"] == sum(m.dur_ns for m in swapins)
    assert sum(hist["swap"]) == counted["swap_count"]
    assert len(rec.of(MajorFault, kind="file")) == len(files)
    # Every major fault the kernel counted for the thread is a swap-in, a file fault or
    # unclassified.
    classes = ("swap_count", "file_count", "unclassified_count")
    assert sum(counted[c] for c in classes) >= toucher.report["majflt"]
    assert rec.status("swap").lost_kernel == 0


def test_swap_and_cgroup_are_given_back_when_a_test_fails(tmp_path: Path) -> None:
    page_cluster = Path("/proc/sys/vm/page-cluster")
    before = page_cluster.read_text()
    path, name = tmp_path / "swap", f"gpujitter-cleanup-{os.getpid()}"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with (
            pytest.raises(RuntimeError, match="test failed"),
            sysctl("vm.page-cluster", "0"),
            swap_file(path, 16 << 20),
            memory_cgroup(name, 16 << 20) as group,
        ):
            (group / "cgroup.procs").write_text(str(sleeper.pid))
            assert str(path) in Path("/proc/swaps").read_text()
            assert page_cluster.read_text().strip() == "0"
            raise RuntimeError("test failed")
        assert str(path) not in Path("/proc/swaps").read_text()
        assert not path.exists()
        assert not (MEMCG_V1 / name).exists()
        assert page_cluster.read_text() == before
        assert str(sleeper.pid) in (MEMCG_V1 / "cgroup.procs").read_text().split()
    finally:
        sleeper.kill()
        sleeper.wait()
