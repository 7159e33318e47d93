"""Which processes a per-file probe (cuda, python_gc, python_stacks) looks at for the files
it attaches to, against real processes: with every process watched, each is looked at for
late_load_ns after it started, one found at the first scan counting from its own start (a
job started with the daemon that loads libcuda a second later is not given up on)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from gpujitter.probes.host import HostPaths
from gpujitter.probes.mapped_scan import MappedScan
from gpujitter.probes.procfs import process_age_ns

S = 1_000_000_000


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_process_age_is_read_to_the_tick(sleeper: subprocess.Popen[bytes]) -> None:
    time.sleep(0.3)
    age = process_age_ns(HostPaths(), sleeper.pid)
    assert age is not None and 0.2 * S <= age <= 5 * S  # ticks of 10 ms, a busy VM
    assert process_age_ns(HostPaths(), 1) > age  # type: ignore[operator]
    assert process_age_ns(HostPaths(), 4_194_304) is None  # past pid_max: no such process


def test_a_young_process_found_at_the_first_scan_is_looked_at_again(
    sleeper: subprocess.Popen[bytes],
) -> None:
    scan = MappedScan(late_load_ns=60 * S)
    now = time.monotonic_ns()
    assert sleeper.pid in scan.due(None, now)
    assert sleeper.pid in scan.due(None, now + S)  # it may load libcuda at any moment
    assert 1 not in scan.due(None, now + S)  # init, running since boot: looked at once
    assert sleeper.pid in scan.due(None, now + 61 * S)  # its window is up: a last look
    assert sleeper.pid not in scan.due(None, now + 62 * S)


def test_a_process_older_than_the_window_at_the_first_scan_is_looked_at_once(
    sleeper: subprocess.Popen[bytes],
) -> None:
    time.sleep(0.5)
    scan = MappedScan(late_load_ns=S // 5)
    now = time.monotonic_ns()
    assert sleeper.pid in scan.due(None, now)
    assert sleeper.pid not in scan.due(None, now + S // 10)


def test_a_process_that_appears_later_counts_from_when_it_was_seen() -> None:
    scan = MappedScan(late_load_ns=S // 5)
    scan.due(None, time.monotonic_ns())
    proc = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.5)  # older than the window, but new to the scan
        now = time.monotonic_ns()
        assert proc.pid in scan.due(None, now)
        assert proc.pid in scan.due(None, now + S // 10)
        assert proc.pid in scan.due(None, now + S // 2)  # the window is up: a last look
        assert proc.pid not in scan.due(None, now + S)
    finally:
        proc.kill()
        proc.wait()


def test_a_watched_process_is_looked_at_until_done_and_again_after_pid_reuse(
    sleeper: subprocess.Popen[bytes],
) -> None:
    scan = MappedScan(late_load_ns=S // 5)
    now = time.monotonic_ns()
    for later in (0, S, 100 * S):  # a named process: no window
        assert scan.due([sleeper.pid], now + later) == [sleeper.pid]
    scan.done(sleeper.pid)
    assert scan.due([sleeper.pid], now + 101 * S) == []
    sleeper.kill()
    sleeper.wait()
    assert scan.forget_exited() == [sleeper.pid]
    assert scan.due([sleeper.pid], now + 102 * S) == [sleeper.pid]  # a new process there
