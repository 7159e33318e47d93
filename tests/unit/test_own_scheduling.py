"""gpujitter's own scheduling (daemon/service/own_scheduling.py), applied in a child process (it
would renice the test runner): each thread's policy by its role, read back from /proc; the CPUs
kept clear for a watched process; never pinned to nothing; announced when threads change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujitter.daemon.service.own_scheduling import (
    KEEP_UP_LEVELS,
    LATE_NS,
    QUIET_NS,
    OwnScheduling,
    in_slices,
    thread_policies,
)

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from gpujitter.daemon.service.own_scheduling import OwnScheduling, thread_policies
    from pathlib import Path
    own = OwnScheduling()
    first = own.tend(time.monotonic_ns())
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="gpujitter-stream")
    t.start()
    second = own.tend(time.monotonic_ns())
    third = own.tend(time.monotonic_ns())
    args = sys.argv[1:]
    feeders = [int(a.removeprefix('feeder=')) for a in args if a.startswith('feeder=')]
    cpus = sorted(own.keep_off([int(a) for a in args if a.isdigit()], feeders))
    policies = thread_policies(Path("/proc"), os.getpid())
    own.keep_up(5, time.monotonic_ns())  # a tick that lost 5 events
    print(json.dumps({
        "main": threading.get_native_id(), "stream": t.native_id,
        "announced": [list(first.tids), list(second.tids), third is None],
        "policies": policies,
        "after_loss": thread_policies(Path("/proc"), os.getpid()),
        "cpus": cpus,
        "affinity": [sorted(os.sched_getaffinity(int(tid)))
                     for tid in os.listdir("/proc/self/task")],
        "notes": own.notes,
    }))
    stop.set()
    """
)


def run_child(*watched: int | str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, watched)], capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    return json.loads(out.stdout)


def test_every_thread_gets_one_policy_and_level_and_new_threads_are_announced() -> None:
    """One level for all: the threads share the GIL, and one held back below the others
    (the stream's, once SCHED_IDLE) held the main loop seconds while it held the GIL."""
    got = run_child()
    policies = {int(tid): tuple(p) for tid, p in got["policies"].items()}
    assert policies[got["main"]] == policies[got["stream"]] == ("batch", KEEP_UP_LEVELS[0])
    first, second, unchanged = got["announced"]
    assert first == [got["main"]] and second == sorted([got["main"], got["stream"]])
    assert unchanged and got["notes"][-1] == (
        "the daemon's threads now at nice 5 (5 events lost in the last tick)"
    )
    after = {int(tid): tuple(p) for tid, p in got["after_loss"].items()}
    if os.geteuid() == 0:  # raising priority back needs privilege (the unit's LimitNICE=)
        assert after[got["main"]] == after[got["stream"]] == ("batch", 5)
        assert len(got["notes"]) == 1
    else:
        assert got["notes"][0].startswith(f"cannot set thread {got['main']} to nice 5")


def test_losing_events_steps_the_keeping_up_threads_towards_nice_0_and_quiet_back() -> None:
    own = OwnScheduling()  # no thread tended: only the level moves
    levels = []
    for t_s, lost in ((1, 0), (2, 3), (3, 3), (4, 9), (5, 12), (6, 12), (65, 12), (126, 12)):
        own.keep_up(lost, t_s * 1_000_000_000)
        levels.append(own.nice)
    assert levels == [10, 5, 5, 0, 0, 0, 5, 10]
    assert own.notes[0].endswith("nice 5 (3 events lost in the last tick)")
    assert own.notes[-1].endswith("nice 10 (no events lost and no tick late for a minute)")
    assert QUIET_NS == 60_000_000_000


def test_a_late_tick_steps_up_like_a_loss_and_a_quiet_minute_needs_both() -> None:
    """A main loop starved by other load (a hog, a flood of clients) shows as late ticks
    before anything is lost: its analysis and its watchdog pings wait. A tick LATE_NS late
    steps up; one a little late (a busy second) does not; late ticks keep it from stepping
    back down."""
    own = OwnScheduling()
    s = 1_000_000_000
    levels = []
    for t_s, late_ns in ((1, 0), (2, LATE_NS - 1), (4, LATE_NS), (7, 2 * LATE_NS), (62, LATE_NS),
                         (121, 0), (123, 0), (184, 0)):  # fmt: skip
        own.keep_up(0, t_s * s, late_ns)
        levels.append(own.nice)
    assert levels == [10, 10, 5, 0, 0, 0, 5, 10]
    assert own.notes[0].endswith("nice 5 (the main loop's tick came 1.0 s late)")


@pytest.fixture
def pinned_to_cpu0():
    if len(os.sched_getaffinity(0)) < 2 or 0 not in os.sched_getaffinity(0):
        pytest.fail("needs CPU 0 and another")
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    yield proc.pid
    proc.kill()
    proc.wait()


def test_it_keeps_off_the_cpus_a_watched_process_may_use(pinned_to_cpu0: int) -> None:
    got = run_child(pinned_to_cpu0)
    rest = sorted(os.sched_getaffinity(0) - {0})
    assert got["cpus"] == rest
    assert all(a == rest for a in got["affinity"]), got["affinity"]


def test_it_never_pins_to_nothing() -> None:
    everywhere = subprocess.Popen(["sleep", "60"])  # may run on every CPU
    try:
        got = run_child(everywhere.pid)
    finally:
        everywhere.kill()
        everywhere.wait()
    assert got["cpus"] == sorted(os.sched_getaffinity(0))
    assert run_child(2**22 + 7)["cpus"] == sorted(os.sched_getaffinity(0))  # a gone process


def test_where_the_job_may_run_everywhere_it_keeps_off_the_feeding_threads_cpus(
    pinned_to_cpu0: int,
) -> None:
    """A job whose helpers may run on every CPU (a forked child, a pool) left the daemon on
    the feeding thread's own CPU: the feeder's waits behind it were self-inflicted gaps."""
    everywhere = subprocess.Popen(["sleep", "60"])  # the watched job's unpinned helper
    try:
        got = run_child(everywhere.pid, f"feeder={pinned_to_cpu0}")
        unpinned = run_child(everywhere.pid, f"feeder={everywhere.pid}")
        gone = run_child(everywhere.pid, f"feeder={2**22 + 7}")
    finally:
        everywhere.kill()
        everywhere.wait()
    rest = sorted(os.sched_getaffinity(0) - {0})
    assert got["cpus"] == rest
    assert all(a == rest for a in got["affinity"]), got["affinity"]
    assert unpinned["cpus"] == gone["cpus"] == sorted(os.sched_getaffinity(0))  # never nothing


def test_slices_give_every_item() -> None:
    assert list(in_slices(range(1000), slice_ns=0)) == list(range(1000))


def test_policies_are_read_from_stat_with_odd_names(tmp_path: Path) -> None:
    # A comm with spaces and parentheses: fields are counted after the last ")".
    stat = "42 (a) b (c) S " + " ".join(str(n) for n in range(4, 53)) + "\n"
    fields = stat.split(") ", 2)[-1].split()
    fields[16], fields[38] = "10", "3"  # nice (field 19), policy (field 41): batch
    task = tmp_path / "42" / "task" / "43"
    task.mkdir(parents=True)
    (task / "stat").write_text("42 (a) b (c) " + " ".join(fields) + "\n")
    assert thread_policies(tmp_path, 42) == {43: ("batch", 10)}


RESTORING = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from gpujitter.daemon.service.own_scheduling import OwnScheduling
    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    own = OwnScheduling()
    own.tend(time.monotonic_ns())
    during = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    own.restore()
    after = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    child = subprocess.run([sys.executable, "-c",
        "import os; print(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))"],
        capture_output=True, text=True, check=True).stdout.split()
    print(json.dumps({"before": before, "during": during, "after": after,
                      "child": [int(x) for x in child]}))
    """
)


def test_a_bounded_job_gives_its_process_back_as_it_was() -> None:
    """A drill inside a longer process (a test session, a bench) restores the scheduling it
    gave the process's threads, so that the feeding loops and helpers it starts next do not
    inherit nice 10 and SCHED_BATCH (they lost 90 % of a shared CPU to a nice-0 task)."""
    out = json.loads(subprocess.run([sys.executable, "-c", RESTORING], capture_output=True,
                                    text=True, timeout=60, check=True).stdout)  # fmt: skip
    assert out["during"] != out["before"]
    assert out["after"] == out["before"] and out["child"] == out["before"]


SHARED = textwrap.dedent(
    """
    import json, os, threading, time
    from gpujitter.daemon.service.own_scheduling import OwnScheduling
    from gpujitter.daemon.service.runtime import ListSource, Runtime
    from gpujitter.probes.topology import load_topology

    def now(tid):
        return [os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid),
                sorted(os.sched_getaffinity(tid))]

    main = threading.get_native_id()
    before = now(main)
    starting, release = threading.Event(), threading.Event()
    seen = {}

    class Slow(ListSource):  # a source whose start hangs (probes compiling on a busy CPU)
        def start(self, emit, handed=None):
            seen["runtime_tid"] = threading.get_native_id()
            seen["runtime"] = now(seen["runtime_tid"])
            starting.set()
            release.wait()
            super().start(emit, handed)

    own = OwnScheduling(shared=True)
    rt = Runtime(Slow([], live=True), load_topology(), own=own, signals=False)
    t = threading.Thread(target=rt.run, name="gpujitter-runtime", daemon=True)
    t.start()
    starting.wait(30)
    # The caller gives up here (a test's timeout): nothing of its own was changed.
    seen["main"] = now(main)
    seen["announced"] = sorted(own._seen)
    print(json.dumps({"before": before, "main_tid": main, **seen}))
    """
)


def test_a_runtime_sharing_its_process_tends_only_the_threads_it_started() -> None:
    """A drill or the TUI runs the runtime on a thread of a process that was there before it:
    the caller's threads keep their scheduling even when it gives up before the runtime
    ends (a test timed out while the probes compiled was left at nice 10 batch on the busy
    CPU, and every drill it started after that starved); the runtime's thread is tended and
    all of them are announced, since a wait behind any is a wait behind gpujitter."""
    out = json.loads(subprocess.run([sys.executable, "-c", SHARED], capture_output=True,
                                    text=True, timeout=60, check=True).stdout)  # fmt: skip
    assert out["main"] == out["before"]
    assert out["runtime"][:2] == [os.SCHED_BATCH, KEEP_UP_LEVELS[0]]
    assert out["main_tid"] in out["announced"] and out["runtime_tid"] in out["announced"]


def test_a_slice_starts_with_the_first_item_not_with_the_wait_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The runtime's batch waits up to 100 ms for its first event: that wait is no work, and
    # giving the CPU away after it cost a sched_yield per batch (the live daemon's ~20/s).
    import time

    yields: list[int] = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))

    def waited() -> Iterator[int]:
        time.sleep(0.03)
        yield from range(3)

    assert list(in_slices(waited(), slice_ns=20_000_000)) == [0, 1, 2]
    assert yields == []
