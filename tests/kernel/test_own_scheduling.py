"""`gpujitter run` schedules itself below what it watches, on this kernel: every thread of the
daemon runs SCHED_BATCH at one nice level, as /proc says, and with the watched process
pinned to CPU 0 the daemon's threads keep off CPU 0 while another CPU is allowed; its
status record says where it runs and counts self-inflicted gaps."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from gpujitter.daemon.service.own_scheduling import KEEP_UP_LEVELS
from tests.kernel.test_daemon import GPUJITTER, drain, read_stream

POLICY_NAMES = {0: "normal", 3: "batch", 5: "idle"}


def policy_and_nice(pid: int, tid: str) -> tuple[str, int]:
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # stat(5): field 3 onwards
    return POLICY_NAMES.get(int(fields[38]), fields[38]), int(fields[16])


def test_daemon_threads_run_below_and_beside_a_pinned_watched_process(tmp_path: Path) -> None:
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.fail("needs CPUs 0 and 1 (the CI machine has two)")
    watched = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(120)
    (tmp_path / "empty.toml").touch()
    sock_path = tmp_path / "gj.sock"
    daemon = subprocess.Popen(
        [str(GPUJITTER), "run", "--quiet", "--no-nvml", "--pid", str(watched.pid),
         "--socket", str(sock_path), "--probes", "sched", "--config", str(tmp_path / "empty.toml")],
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
    )  # fmt: skip
    try:
        assert notify.recv(4096).startswith(b"READY=1")
        time.sleep(2.5)  # the watched set arrived; a tick moved the threads
        tids = os.listdir(f"/proc/{daemon.pid}/task")
        policies = {tid: policy_and_nice(daemon.pid, tid) for tid in tids}
        cpus = {tid: os.sched_getaffinity(int(tid)) for tid in tids}
        sock, stream = read_stream(sock_path, time.monotonic() + 30)
        time.sleep(1.5)
        drain(sock, stream, bytearray())
    finally:
        daemon.send_signal(signal.SIGTERM)
        watched.kill()
        watched.wait()
    assert daemon.wait(timeout=60) == 0
    # one policy and level for every thread (they share the GIL), the stream's included
    assert set(policies.values()) == {("batch", KEEP_UP_LEVELS[0])}, policies
    rest = os.sched_getaffinity(0) - {0}
    assert all(c == rest for c in cpus.values()), cpus
    status = next(r for r in stream if r["type"] == "daemon.status")
    assert status["own_cpus"] == sorted(rest) and status["self_inflicted"] == 0
