"""cuda probe on this kernel, for real: uprobes on a stub libcuda (gpujitter/daemon/drill: same
entry points, same prologue, a simulated GPU queue) that a feeding process has mapped. The
feeding loop injects host pauses and synchronisations; the probe must report the launch after
each pause with the pause's placement, never count time blocked in a sync as quiet, trace
every variant, and ignore processes it does not watch."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.drill.build import build_stub
from gpujitter.probes import uprobe_multi
from gpujitter.probes.cuda import COPY_SYNC, SYNC, TRACED, CudaProbe
from gpujitter.probes.events import CudaCall
from gpujitter.probes.watch import WatchSpec
from tests.kernel.conftest import Recorded, run_probes

FEED = ["-m", "gpujitter.daemon.drill.schedule"]  # the scripted feeding loop
MS = 1_000_000
# Host timestamps of the same instant seen by the feeding loop and by the probe differ by
# the Python call overhead around a libcuda call: tens of µs; 2 ms leaves room for a busy VM.
SLACK_NS = 2 * MS


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stubcuda"))


def feeder(stub: Path, schedule: list[Any]) -> tuple[subprocess.Popen[str], Callable[[], None]]:
    child = subprocess.Popen(
        [sys.executable, *FEED, str(stub), json.dumps(schedule)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def load() -> None:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        child.truth = json.loads(child.stdout.readline())  # type: ignore[attr-defined]
        assert child.wait(timeout=60) == 0

    return child, load


def trace(
    stub: Path,
    schedule: list[Any],
    *,
    quiet_ms: int = 20,
    sync_ms: int = 10,
    watch: WatchSpec | None = None,
    options: dict[str, dict[str, Any]] | None = None,
) -> tuple[subprocess.Popen[str], Recorded]:
    """Run the feeding loop under the cuda probe (watching the loop unless told otherwise)."""
    child, load = feeder(stub, schedule)
    rec = run_probes(
        ["cuda"],
        load,
        watch=watch or WatchSpec(pids={child.pid}),
        thresholds={"cuda": {"quiet": quiet_ms * MS, "sync": sync_ms * MS}},
        options=options,
    )
    return child, rec


def compiled(folder: Path, name: str, source: str) -> Path:
    """A feeder program in C (it loads the stub itself), built in `folder`."""
    (folder / f"{name}.c").write_text(source)
    exe = folder / name
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(folder / f"{name}.c"), "-ldl", "-lpthread"],
                   check=True)  # fmt: skip
    return exe


def quiet_spans(truth: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Each host pause by its tightest measured edges: the return of the call before it (its
    t1) to the entry of the call after it (its t0). The pause's own clock reads sit inside,
    apart from the calls by the loop's Python, which a busy machine stretched past 2 ms."""
    return [(truth[i - 1]["t1"], truth[i + 1]["t0"])
            for i, op in enumerate(truth) if op["op"] == "pause"]  # fmt: skip


def quiet_launches(events: list[Any], tgid: int) -> list[CudaCall]:
    return [e for e in events if isinstance(e, CudaCall) and e.tgid == tgid and e.api != "sync"]


def test_launch_after_a_host_pause_carries_the_pause(stub: Path) -> None:
    # Three steps of 40 launches of 250 µs each (10 ms of queued GPU work) ended by a stream
    # sync (blocked ~10 ms, which is GPU-busy time), then a host pause of 40/60/80 ms.
    schedule: list[Any] = []
    for pause_ms in (40, 60, 80):
        schedule += [
            ["call", "cuLaunchKernel", 250, 40],
            ["call", "cuStreamSynchronize", 0, 1],
            ["pause", pause_ms],
        ]
    schedule.append(["call", "cuLaunchKernel", 250, 1])
    child, rec = trace(stub, schedule, sync_ms=5)
    truth = child.truth  # type: ignore[attr-defined]
    pauses = quiet_spans(truth)
    syncs = [t for t in truth if t["op"] == "call" and t["func"] == "cuStreamSynchronize"]

    launches = quiet_launches(rec.events, child.pid)
    assert len(launches) == len(pauses)  # each pause, and no sync, read as quiet
    for ev, (t0, t1) in zip(launches, pauses, strict=True):
        start = ev.ts_ns - ev.after_idle_ns
        assert t0 - SLACK_NS <= start <= t0
        assert t1 <= ev.ts_ns <= t1 + SLACK_NS
        assert ev.func == "cuLaunchKernel" and ev.api == "launch"
        assert ev.prev_api == "sync"  # the quiet stretch began when the sync returned
        assert ev.tid == ev.prev_tid == child.pid

    blocked = [e for e in rec.of(CudaCall, tgid=child.pid) if e.api == "sync"]
    assert len(blocked) == len(syncs)
    for ev, sync in zip(blocked, syncs, strict=True):
        assert sync["t0"] <= ev.ts_ns and ev.ts_ns + ev.dur_ns <= sync["t1"]
        assert ev.dur_ns >= 5 * MS  # it waited for the queued ~10 ms of work
    assert rec.status("cuda").lost_kernel == 0
    assert rec.status("cuda").state == "running"


def test_every_traced_variant_is_seen_with_its_role(stub: Path) -> None:
    # Each entry point once after a 30 ms pause; synchronising ones wait for 30 ms of work.
    # (The very first launch of a process follows no activity, so it is never "after quiet".)
    schedule: list[Any] = [["call", "cuLaunchKernel", 1, 1]]
    for name, role in TRACED:
        if role == SYNC:
            schedule += [["call", "cuLaunchKernel", 30_000, 1], ["call", name, 0, 1]]
        else:
            schedule += [["pause", 30], ["call", name, 30_000 if role == COPY_SYNC else 1, 1]]
    child, rec = trace(stub, schedule)
    mine = rec.of(CudaCall, tgid=child.pid)
    seen_after_quiet = {e.func for e in mine if e.api != "sync"}
    seen_blocking = {e.func for e in mine if e.api == "sync"}
    for name, role in TRACED:
        if role == SYNC:
            assert name in seen_blocking, name
        else:
            assert name in seen_after_quiet, name
        if role == COPY_SYNC:
            assert name in seen_blocking, name  # a synchronous copy also blocks
    api = {e.func: e.api for e in mine if e.api != "sync"}
    assert api["cuGraphLaunch_ptsz"] == "graph"
    assert api["cuMemcpyHtoDAsync_v2_ptsz"] == "copy"
    assert api["cuLaunchKernelEx_ptsz"] == "launch"


def test_a_sync_in_another_thread_keeps_the_gpu_busy(stub: Path) -> None:
    # Thread B blocks in cuCtxSynchronize on 150 ms of queued work; meanwhile the main thread
    # pauses 60 ms and launches: the GPU was busy all along, so that launch is not after quiet.
    schedule = [
        ["call", "cuLaunchKernel", 150_000, 1],
        ["thread", [["call", "cuCtxSynchronize", 0, 1]]],
        ["pause", 60],
        ["call", "cuLaunchKernel_ptsz", 10, 1],
        ["join"],
    ]
    child, rec = trace(stub, schedule)
    mine = rec.of(CudaCall, tgid=child.pid)
    assert quiet_launches(mine, child.pid) == []
    (blocked,) = [e for e in mine if e.api == "sync"]
    assert blocked.func == "cuCtxSynchronize" and blocked.tid != child.pid
    assert blocked.dur_ns >= 100 * MS


def test_unwatched_processes_are_filtered_in_the_kernel(stub: Path) -> None:
    schedule = [["call", "cuLaunchKernel", 1, 10], ["pause", 40], ["call", "cuLaunchKernel", 1, 1]]
    child, rec = trace(
        stub, schedule, watch=WatchSpec(pids={1}), options={"cuda": {"libcuda": [str(stub)]}}
    )
    assert rec.of(CudaCall, tgid=child.pid) == []
    assert rec.status("cuda").state == "running"  # attached to the stub, filtered the calls


def test_a_sync_that_ends_a_quiet_stretch_is_reported_however_soon_it_returns(stub: Path) -> None:
    # Issue 11 (H200, `sync`): the thread queued work, was kept off its CPU before it reached
    # the sync, and the sync then returned at once. Here: 5 ms of work queued, a 40 ms host
    # pause, a sync that finds the queue drained (reported: it ends the stretch); another
    # pause and sync (not reported: that stretch began at a sync's return, nothing queued);
    # then a sync that blocks on 30 ms of work, reported with the short stretch before it.
    schedule = [
        ["call", "cuLaunchKernel", 5_000, 1],
        ["pause", 40],
        ["call", "cuCtxSynchronize_v2", 0, 1],
        ["pause", 40],
        ["call", "cuStreamSynchronize", 0, 1],
        ["call", "cuLaunchKernel", 30_000, 1],
        ["call", "cuStreamSynchronize", 0, 1],
    ]
    child, rec = trace(stub, schedule)
    truth = child.truth  # type: ignore[attr-defined]
    t0, t1 = quiet_spans(truth)[0]
    late, blocked = [e for e in rec.of(CudaCall, tgid=child.pid) if e.api == "sync"]
    assert late.func == "cuCtxSynchronize_v2" and late.dur_ns < 10 * MS  # under `sync`
    assert (late.prev_api, late.prev_tid) == ("launch", child.pid)
    assert t0 - SLACK_NS <= late.ts_ns - late.after_idle_ns <= t0
    assert t1 <= late.ts_ns <= t1 + SLACK_NS
    assert blocked.func == "cuStreamSynchronize" and blocked.dur_ns >= 20 * MS
    assert blocked.prev_api == "launch" and 0 < blocked.after_idle_ns < SLACK_NS
    assert quiet_launches(rec.events, child.pid) == []  # the launch followed a sync's return
    assert rec.status("cuda").lost_kernel == 0


# Python that maps nothing until told, then runs the scripted feeding loop (which loads the
# stub at once and waits for its own "go"): a framework's first CUDA call, a while after start.
LOADS_LATER = (
    "import runpy, sys; sys.stdin.readline(); "
    "runpy.run_module('gpujitter.daemon.drill.schedule', run_name='__main__')"
)


def test_a_job_started_before_the_probe_that_loads_libcuda_later_is_traced(stub: Path) -> None:
    """With every process watched (the daemon's default), a process already running at the
    probe's first scan used to be looked at that once: a job started with the daemon (a
    node's boot, a service restart) that reached its first CUDA call a second later was
    never traced. Its window counts from its own start now."""
    schedule = [["call", "cuLaunchKernel", 250, 5], ["pause", 60], ["call", "cuLaunchKernel", 1, 1]]
    child = subprocess.Popen(
        [sys.executable, "-c", LOADS_LATER, str(stub), json.dumps(schedule)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def load() -> None:
        assert child.stdin is not None and child.stdout is not None
        time.sleep(2.5)  # past the probe's first scan, which found the job without libcuda
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(2.5)  # it maps the stub now; the next scans find it there
        child.stdin.write("go\n")
        child.stdin.flush()
        json.loads(child.stdout.readline())
        assert child.wait(timeout=60) == 0

    try:
        rec = run_probes(
            ["cuda"], load, watch=WatchSpec(all=True), thresholds={"cuda": {"quiet": 20 * MS}}
        )
    finally:
        child.kill()
        child.wait()
    (launch,) = quiet_launches(rec.events, child.pid)
    assert launch.after_idle_ns >= 50 * MS  # the 60 ms pause
    assert rec.status("cuda").state == "running"


# A feeder whose second thread dies inside a synchronisation (SYS_exit from a signal handler:
# the thread ends, the process goes on), so that the sync's return never comes. It loads the
# stub and says "ready"; at "go" it queues 1.5 s of simulated GPU work, blocks a thread on it
# in cuStreamSynchronize and kills that thread 200 ms in, says the thread's id, waits 2.5 s
# (ticks of the probe pass), then launches, pauses 100 ms and launches again; at "end" it exits.
DIES_IN_SYNC = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
typedef int (*sync_t)(void *);
static sync_t stream_sync;
static volatile pid_t syncer;

static void die(int sig) { (void)sig; syscall(SYS_exit, 0); }

static void *sync_forever(void *arg)
{
    (void)arg;
    syncer = (pid_t)syscall(SYS_gettid);
    stream_sync(NULL);
    return NULL;
}

int main(int argc, char **argv)
{
    char line[16];
    if (argc != 2)
        return 2; /* usage: dies_in_sync LIBCUDA */
    void *lib = dlopen(argv[1], RTLD_NOW);
    launch_t launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    stream_sync = (sync_t)dlsym(lib, "cuStreamSynchronize");
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = die;
    sigaction(SIGUSR1, &sa, NULL);
    printf("ready\n");
    fflush(stdout);
    fgets(line, sizeof(line), stdin);
    launch(NULL, 1500000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    pthread_t t;
    pthread_create(&t, NULL, sync_forever, NULL);
    usleep(200000);
    pthread_kill(t, SIGUSR1);
    usleep(50000);
    printf("%d\n", (int)syncer);
    fflush(stdout);
    sleep(2);
    usleep(500000);
    launch(NULL, 10, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    usleep(100000);
    launch(NULL, 10, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    fgets(line, sizeof(line), stdin);
    return 0;
}
"""


def test_a_thread_that_dies_inside_a_sync_is_forgotten_at_its_exit(
    stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that ends inside a synchronisation would leave its process counted as
    synchronising (the GPU busy) for good. The kernel drops it at the thread's exit, so quiet
    stretches are reported again with no help from user space: here the probe's own
    forgetting (of processes, from the core's exit stream at each tick, or by a walk of its
    maps and /proc at the first tick and every 10 s) is turned off, and only recorded."""
    exe = compiled(tmp_path, "dies_in_sync", DIES_IN_SYNC)
    walks: list[float] = []
    forgotten: list[tuple[int, int]] = []

    def counted_walk(self: CudaProbe) -> None:
        walks.append(time.monotonic())

    def seen_forget(self: CudaProbe, exited: list[tuple[int, int]]) -> None:
        forgotten.extend(exited)

    monkeypatch.setattr(CudaProbe, "_forget_exited", counted_walk)
    monkeypatch.setattr(CudaProbe, "_forget", seen_forget)
    child = subprocess.Popen([str(exe), str(stub)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline() == "ready\n"  # the stub is mapped: the first scan finds it
    syncer = 0

    def load() -> None:
        nonlocal syncer
        assert child.stdin is not None and child.stdout is not None
        time.sleep(1.2)  # a tick: the libcuda in its maps attached
        child.stdin.write("go\n")
        child.stdin.flush()
        syncer = int(child.stdout.readline())
        time.sleep(3.0)  # the launches after the probe's ticks
        child.stdin.write("end\n")
        child.stdin.flush()
        assert child.wait(timeout=10) == 0
        time.sleep(1.5)  # a tick after the process's exit

    try:
        rec = run_probes(["cuda"], load, watch=WatchSpec(pids={child.pid}),
                         thresholds={"cuda": {"quiet": 20 * MS}})  # fmt: skip
    finally:
        child.kill()
        child.wait()
    assert syncer and syncer != child.pid
    launches = quiet_launches(rec.events, child.pid)
    # Both launches after the thread's death: the first after the ~2.7 s since the work was
    # queued, the second after the 100 ms pause. With the dead thread still counted inside
    # its sync, neither would be.
    assert len(launches) == 2
    assert launches[0].after_idle_ns >= 2000 * MS
    assert 90 * MS <= launches[1].after_idle_ns <= 100 * MS + SLACK_NS
    assert (child.pid, syncer) in forgotten and (child.pid, child.pid) in forgotten
    assert len(walks) == 1  # the first tick's: the exits came from the core's stream
    assert rec.status("cuda").lost_kernel == 0


# A feeder whose second thread calls cuStreamSynchronize on an empty queue without pause (each
# call returns at once) from before the probe attaches until "go"; then that thread queues
# 50 ms of work and waits for it, and the main thread launches, pauses 100 ms and launches.
SPINS_IN_SYNC = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
typedef int (*sync_t)(void *);
static launch_t launch;
static sync_t stream_sync;
static volatile int phase;

static void *spin(void *arg)
{
    (void)arg;
    while (phase == 0)
        stream_sync(NULL);
    while (phase == 1)
        usleep(1000);
    launch(NULL, 50000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    stream_sync(NULL);
    while (phase != 3)
        usleep(1000);
    return NULL;
}

int main(int argc, char **argv)
{
    char line[16];
    if (argc != 2)
        return 2; /* usage: spins_in_sync LIBCUDA */
    void *lib = dlopen(argv[1], RTLD_NOW);
    launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    stream_sync = (sync_t)dlsym(lib, "cuStreamSynchronize");
    pthread_t t;
    pthread_create(&t, NULL, spin, NULL);
    printf("ready\n");
    fflush(stdout);
    fgets(line, sizeof(line), stdin);
    phase = 1;
    usleep(20000);
    phase = 2;
    usleep(200000);
    launch(NULL, 1000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    usleep(100000);
    launch(NULL, 1000, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    printf("done\n");
    fflush(stdout);
    fgets(line, sizeof(line), stdin);
    phase = 3;
    pthread_join(t, NULL);
    return 0;
}
"""


def test_a_sync_in_progress_while_the_probes_attach_does_not_mute_the_process(
    stub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry and return probes of one library go in one after the other. A sync entered
    between them, if the entries went first, was seen going in and never coming out: its
    thread's every later sync counted as nested in it (none reported), its process as
    synchronising for good (no quiet stretch reported), the probe "running" with thousands
    of calls a second and no event. Here 300 ms pass between the two links while a thread
    syncs without pause: the thread's 50 ms sync and the main thread's 100 ms pause after it
    must still be reported."""
    exe = compiled(tmp_path, "spins_in_sync", SPINS_IN_SYNC)
    link = uprobe_multi.link
    linked: list[bool] = []

    def slow_link(*args: Any, **kwargs: Any) -> int:
        fd = link(*args, **kwargs)
        linked.append(kwargs["returns"])
        if len(linked) == 1:
            time.sleep(0.3)  # the other link comes 300 ms later
        return fd

    monkeypatch.setattr(uprobe_multi, "link", slow_link)
    child = subprocess.Popen([str(exe), str(stub)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline() == "ready\n"  # the stub mapped, the thread syncing

    def load() -> None:
        assert child.stdin is not None and child.stdout is not None
        time.sleep(2.0)  # ticks: the libcuda in its maps attached, the thread still syncing
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\n"
        child.stdin.write("end\n")
        child.stdin.flush()
        assert child.wait(timeout=10) == 0

    try:
        rec = run_probes(["cuda"], load, watch=WatchSpec(pids={child.pid}),
                         thresholds={"cuda": {"quiet": 20 * MS, "sync": 10 * MS}})  # fmt: skip
    finally:
        child.kill()
        child.wait()
    assert len(linked) == 2, linked  # linked mode: one link of entries, one of returns
    calls = [e for e in rec.events if isinstance(e, CudaCall) and e.tgid == child.pid]
    waits = [e for e in calls if e.api == "sync" and e.dur_ns >= 40 * MS]
    assert len(waits) == 1, calls  # the thread's 50 ms sync
    assert any(90 * MS <= e.after_idle_ns <= 100 * MS + SLACK_NS
               for e in quiet_launches(rec.events, child.pid)), calls  # fmt: skip
    assert rec.status("cuda").state == "running"
