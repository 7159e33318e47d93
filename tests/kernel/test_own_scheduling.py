"""`gpujitter run` schedules itself below what it watches, on this kernel: every thread of the
daemon runs SCHED_BATCH at one nice level, as /proc says, and with the watched process
pinned to CPU 0 the daemon's threads keep off CPU 0 while another CPU is allowed (off the
feeding thread's CPU when the job has a helper free to run anywhere); its status record says
where it runs and counts self-inflicted gaps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujitter.daemon.drill.build import build_stub
from gpujitter.daemon.service.own_scheduling import KEEP_UP_LEVELS
from tests.kernel.test_cuda import FEED
from tests.kernel.test_daemon import GPUJITTER, drain, read_stream

POLICY_NAMES = {0: "normal", 3: "batch", 5: "idle"}


def policy_and_nice(pid: int, tid: str) -> tuple[str, int]:
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # stat(5): field 3 onwards
    return POLICY_NAMES.get(int(fields[38]), fields[38]), int(fields[16])


@contextlib.contextmanager
def daemon_watching(tmp_path: Path, probes: str, *pids: int) -> Iterator[subprocess.Popen[bytes]]:
    """`gpujitter run` watching `pids`, from READY until the block ends; then stopped,
    and its exit asserted clean."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(120)
    (tmp_path / "empty.toml").touch()
    watch = [arg for pid in pids for arg in ("--pid", str(pid))]
    daemon = subprocess.Popen(
        [str(GPUJITTER), "run", "--quiet", "--no-nvml", *watch, "--socket",
         str(tmp_path / "gj.sock"), "--probes", probes, "--config", str(tmp_path / "empty.toml")],
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
    )  # fmt: skip
    try:
        assert notify.recv(4096).startswith(b"READY=1")
        yield daemon
    finally:
        daemon.send_signal(signal.SIGTERM)
        notify.close()
    assert daemon.wait(timeout=60) == 0


def where_it_runs(daemon: subprocess.Popen[bytes], sock_path: Path) -> tuple[dict, list]:
    """Each thread's CPUs, then the stream's records over a tick or so."""
    cpus = {tid: os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{daemon.pid}/task")}
    sock, stream = read_stream(sock_path, time.monotonic() + 30)
    time.sleep(1.5)
    drain(sock, stream, bytearray())
    return cpus, stream


def test_daemon_threads_run_below_and_beside_a_pinned_watched_process(tmp_path: Path) -> None:
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.fail("needs CPUs 0 and 1 (the CI machine has two)")
    watched = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    try:
        with daemon_watching(tmp_path, "sched", watched.pid) as daemon:
            time.sleep(2.5)  # the watched set arrived; a tick moved the threads
            tids = os.listdir(f"/proc/{daemon.pid}/task")
            policies = {tid: policy_and_nice(daemon.pid, tid) for tid in tids}
            cpus, stream = where_it_runs(daemon, tmp_path / "gj.sock")
    finally:
        watched.kill()
        watched.wait()
    # one policy and level for every thread (they share the GIL), the stream's included
    assert set(policies.values()) == {("batch", KEEP_UP_LEVELS[0])}, policies
    rest = os.sched_getaffinity(0) - {0}
    assert all(c == rest for c in cpus.values()), cpus
    status = next(r for r in stream if r["type"] == "daemon.status")
    assert status["own_cpus"] == sorted(rest) and status["self_inflicted"] == 0


def test_beside_a_helper_free_to_run_anywhere_it_keeps_off_the_feeders_cpu(
    tmp_path: Path,
) -> None:
    """Every CPU may run some thread of the watched job (its helper is unpinned): the daemon
    ran anywhere, the feeding thread's CPU too, and the feeder's waits behind it were
    self-inflicted gaps (a churning child beside a feeder pinned to CPU 1: 107 in 10 minutes
    on 2 CPUs). It keeps off the CPUs of the threads that call CUDA then."""
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.fail("needs CPUs 0 and 1 (the CI machine has two)")
    (tmp_path / "stubcuda").mkdir()
    stub = build_stub(tmp_path / "stubcuda")
    calls = [["call", "cuLaunchKernel", 1, 1], ["pause", 50]] * 120  # ~6 s of feeding
    feeder = subprocess.Popen(
        [sys.executable, *FEED, str(stub), json.dumps(calls)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {1}),
    )  # fmt: skip
    helper = subprocess.Popen(["sleep", "300"])  # may run on every CPU
    try:
        with daemon_watching(tmp_path, "cuda", feeder.pid, helper.pid) as daemon:
            tids = os.listdir(f"/proc/{daemon.pid}/task")
            before = {os.sched_getaffinity(int(tid)) == os.sched_getaffinity(0) for tid in tids}
            assert feeder.stdin is not None
            feeder.stdin.write("go\n")
            feeder.stdin.flush()
            time.sleep(3)  # calls traced, a tick moved the threads
            cpus, stream = where_it_runs(daemon, tmp_path / "gj.sock")
    finally:
        for proc in (feeder, helper):
            proc.kill()
            proc.wait()
    assert before == {True}  # no CPU clear of the job until a thread called CUDA
    rest = os.sched_getaffinity(0) - {1}
    assert all(c == rest for c in cpus.values()), cpus
    status = [r for r in stream if r["type"] == "daemon.status"][-1]
    assert status["own_cpus"] == sorted(rest)
