"""`gpujitter run` end to end on this kernel: a feeding loop on the stub libcuda pauses at
known times; the daemon must tell systemd it is ready once its probes are attached, log an
attribution per pause, stream the same over its socket, record the raw events, and
`gpujitter report` on that recording must give exactly the attributions it logged live."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.drill.build import build_stub
from gpujitter.daemon.service.config import load_config
from gpujitter.daemon.service.service import Console, Daemon
from gpujitter.daemon.sinks.jsonlog import rfc3339
from gpujitter.probes.clock import format_wall
from gpujitter.probes.events import ClockRef
from gpujitter.probes.nvml_session import NvmlPlayback
from tests.kernel.test_cuda import FEED, SLACK_NS, quiet_spans
from tests.unit.test_nvml_errors import NO_DRIVER

GPUJITTER = Path(sys.executable).with_name("gpujitter")
PAUSES_MS = (40, 80, 60)


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stubcuda"))


def schedule() -> list[Any]:
    ops: list[Any] = [["call", "cuLaunchKernel", 1, 1]]
    for pause in PAUSES_MS:
        ops += [
            ["call", "cuLaunchKernel", 200, 25],
            ["call", "cuStreamSynchronize", 0, 1],
            ["pause", pause],
        ]
    return [*ops, ["call", "cuLaunchKernel", 1, 1]]


def read_stream(path: Path, deadline: float) -> tuple[socket.socket, list[dict[str, Any]]]:
    while True:
        try:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(path))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            assert time.monotonic() < deadline, "the daemon's socket never appeared"
            time.sleep(0.1)
    sock.settimeout(0.5)
    return sock, []


def drain(sock: socket.socket, into: list[dict[str, Any]], buf: bytearray) -> bool:
    """Read what the daemon sent so far; False once it closed the connection."""
    open_ = True
    try:
        while chunk := sock.recv(1 << 16):
            buf += chunk
        open_ = False
    except TimeoutError:
        pass
    *lines, rest = bytes(buf).split(b"\n")
    buf[:] = rest
    into += [json.loads(line) for line in lines]
    return open_


def records(line: dict[str, Any]) -> dict[str, Any]:
    """A log line's record: without what the log adds to each line (its schema, the wall
    time of the record's start)."""
    return {k: v for k, v in line.items() if k not in ("schema", "time")}


def test_run_logs_streams_records_and_report_matches(stub: Path, tmp_path: Path) -> None:
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(60)
    feeder = subprocess.Popen(
        [sys.executable, *FEED, str(stub), json.dumps(schedule())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    log, trace, sock_path = tmp_path / "attr.jsonl", tmp_path / "traces", tmp_path / "gj.sock"
    (tmp_path / "empty.toml").touch()  # no /etc/gpujitter/gpujitter.toml of this node
    daemon = subprocess.Popen(
        [str(GPUJITTER), "run", "--json", "--no-nvml", "--pid", str(feeder.pid),
         "--log", str(log), "--record", str(trace), "--socket", str(sock_path),
         "--probes", "malloc,cuda", "--config", str(tmp_path / "empty.toml")],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
    )  # fmt: skip
    try:
        ready = notify.recv(4096).decode().split("\n")
        assert ready[0] == "READY=1"
        assert "probes attached: malloc, cuda" in ready[1]  # READY only once attached
        sock, stream = read_stream(sock_path, time.monotonic() + 30)
        buf = bytearray()
        drain(sock, stream, buf)
        assert stream[0]["type"] == "hello" and stream[1]["type"] == "snapshot"
        hello_clock = ClockRef(**{k: stream[0]["clock"][k] for k in ("ts_ns", "realtime_ns")})
        assert feeder.stdin is not None and feeder.stdout is not None
        feeder.stdin.write("go\n")
        feeder.stdin.flush()
        truth = json.loads(feeder.stdout.readline())
        assert feeder.wait(timeout=30) == 0
        time.sleep(1.5)  # a status tick or two
    finally:
        daemon.send_signal(signal.SIGTERM)
    # What the daemon decides while stopping still reaches connected clients.
    while drain(sock, stream, buf):
        pass
    out, _ = daemon.communicate(timeout=60)
    assert daemon.returncode == 0
    # Each tick says the live status (STATUS=, what `systemctl status` shows) before it.
    said = []
    while not said or said[-1].startswith(b"STATUS="):
        said.append(notify.recv(4096))
    assert said[-1] == b"STOPPING=1" and len(said) >= 2 and b"gaps attributed" in said[0]
    notify.close()

    printed = [json.loads(line) for line in out.splitlines()]
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    pauses = quiet_spans(truth)
    assert len(logged) == len(pauses)
    for attr, (t0, t1) in zip(logged, pauses, strict=True):
        assert attr["schema"] == "gpujitter.attribution/1"
        assert t0 - SLACK_NS <= attr["ts_ns"] <= t0
        assert t1 <= attr["end_ns"] <= t1 + SLACK_NS
        assert sum(p["ns"] for p in attr["parts"]) == attr["end_ns"] - attr["ts_ns"]
        assert attr["tgids"] == [feeder.pid]
        assert attr["time"] == rfc3339(hello_clock, attr["ts_ns"]).decode()  # the run's clock
    # `run --json` prints the log's lines less their schema
    assert printed == [{k: v for k, v in a.items() if k != "schema"} for a in logged]

    kinds = [r["type"] for r in stream]
    assert "daemon.status" in kinds and "meta.probe" in kinds
    assert len([r for r in stream if r["type"] == "gpu.gap"]) == len(pauses)
    streamed = [r for r in stream if r["type"] == "gpu.attribution"]
    assert streamed == [records(a) for a in logged]
    status = next(r for r in stream if r["type"] == "daemon.status")
    assert status["rss_bytes"] > 0 and status["clients"] == 1

    report = subprocess.run(
        [str(GPUJITTER), "report", "--json", str(trace)], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    replayed = json.loads(report.stdout)["attributions"]
    assert replayed == [records(a) for a in logged]


# CLOCK_REALTIME as one process reads it, moved by the ns in the file GJ_CLOCK_SHIFT names
# (an int64, read through a shared mapping at each call): a wall clock set for the daemon
# alone, not for the node (the other tests, the test's own clock).
CLOCK_SHIFT = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *shift;

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc != 0 || id != CLOCK_REALTIME)
        return rc;
    if (!shift) {
        int fd = open(getenv("GJ_CLOCK_SHIFT"), O_RDONLY);
        void *map = mmap(NULL, sizeof(*shift), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (map == MAP_FAILED)
            return rc;
        shift = map;
    }
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + *shift;
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    return 0;
}
"""
SHIFT_NS = 5_000_000_000


def test_a_wall_clock_set_during_the_run_is_followed(stub: Path, tmp_path: Path) -> None:
    """The daemon's wall clock is set +5 s after its start (as an NTP step after a boot
    sets it): the run says so, sends the new reference on the stream (and in the snapshot
    of a client that connects later), and the console's lines, the log's `time` and
    `report` on the recording all give the gaps after it by the new clock, not the 5 s
    earlier times of the one the run started with."""
    (tmp_path / "shift.c").write_text(CLOCK_SHIFT)
    shim = tmp_path / "shift.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shift.c"),
                    "-ldl"], check=True)  # fmt: skip
    shift = tmp_path / "shift"
    shift.write_bytes(struct.pack("<q", 0))
    feeder = subprocess.Popen(
        [sys.executable, *FEED, str(stub), json.dumps(schedule())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    log, trace, sock_path = tmp_path / "attr.jsonl", tmp_path / "traces", tmp_path / "gj.sock"
    (tmp_path / "empty.toml").touch()
    daemon = subprocess.Popen(
        [str(GPUJITTER), "run", "--no-nvml", "--pid", str(feeder.pid), "--log", str(log),
         "--record", str(trace), "--socket", str(sock_path), "--probes", "malloc,cuda",
         "--config", str(tmp_path / "empty.toml")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "LD_PRELOAD": str(shim), "GJ_CLOCK_SHIFT": str(shift)},
    )  # fmt: skip
    try:
        sock, stream = read_stream(sock_path, time.monotonic() + 60)
        buf = bytearray()
        while len(stream) < 2:
            drain(sock, stream, buf)
        hello = stream[0]["clock"]
        with open(shift, "r+b") as f:  # the clock set, as a step sets it
            os.pwrite(f.fileno(), struct.pack("<q", SHIFT_NS), 0)
        deadline = time.monotonic() + 10
        while not any(r["type"] == "meta.clock" for r in stream):
            assert time.monotonic() < deadline, "no meta.clock on the stream"
            drain(sock, stream, buf)
        stepped = next(r for r in stream if r["type"] == "meta.clock")
        late, late_stream = read_stream(sock_path, time.monotonic() + 10)
        while len(late_stream) < 2:
            drain(late, late_stream, bytearray())
        late.close()
        assert feeder.stdin is not None and feeder.stdout is not None
        feeder.stdin.write("go\n")
        feeder.stdin.flush()
        feeder.stdout.readline()
        assert feeder.wait(timeout=30) == 0
        time.sleep(3.5)  # past the engine's lateness: every pause attributed
    finally:
        daemon.send_signal(signal.SIGTERM)
    sock.close()
    out, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, err
    moved = (stepped["realtime_ns"] - stepped["ts_ns"]) - (hello["realtime_ns"] - hello["ts_ns"])
    assert abs(moved - SHIFT_NS) < 1_000_000
    assert "# clock: the wall clock was set +5.000 s" in err, err
    assert late_stream[1]["clock"] == stepped  # a client connecting later is told too
    clock = ClockRef(ts_ns=stepped["ts_ns"], realtime_ns=stepped["realtime_ns"])
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(logged) == len(PAUSES_MS)
    whens = [format_wall(clock, a["ts_ns"])[:-3] for a in logged]
    assert [a["time"] for a in logged] == [rfc3339(clock, a["ts_ns"]).decode() for a in logged]
    printed = out.splitlines()
    assert len(printed) == len(PAUSES_MS)
    assert all(f" at {when}: " in line for when, line in zip(whens, printed, strict=True))
    report = subprocess.run([str(GPUJITTER), "report", str(trace)], capture_output=True,
                            text=True, check=True)  # fmt: skip
    assert all(f" at {when}: " in report.stdout for when in whens), report.stdout
    page = tmp_path / "report.html"
    subprocess.run([str(GPUJITTER), "report", str(trace), "--html", str(page)],
                   capture_output=True, check=True)  # fmt: skip
    assert all(f" at {when}: " in page.read_text() for when in whens)


def test_a_node_without_nvml_is_said_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run` on a node without NVML said only `probes attached: ...` (gaps and record say
    it, and so did the daemon's status): its gaps then come from libcuda alone. NVML's
    answers are those of a node with no driver (recorded), so a GPU node says it too."""
    (tmp_path / "empty.toml").touch()  # no /etc/gpujitter/gpujitter.toml of this node
    config = load_config(tmp_path / "empty.toml", environ={"GPUJITTER_STATE_DIR": str(tmp_path)},
                         flags={"log.path": ("--log", ""), "socket.path": ("--socket", ""),
                                "probes.enable": ("--probes", "sched")})  # fmt: skip
    console = Console(io.StringIO(), as_json=False)
    Daemon(config, console=console, nvml=NvmlPlayback(NO_DRIVER), duration_ns=500_000_000).run()
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith("# probes attached: sched;"), said
    assert said[1] == (
        "# probe nvml unavailable: NVML library (libnvidia-ml.so.1) not found: no NVIDIA "
        "driver on this node"
    )
