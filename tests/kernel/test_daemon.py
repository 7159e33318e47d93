"""`gpujitter run` end to end on this kernel: a feeding loop on the stub libcuda pauses at
known times; the daemon must tell systemd it is ready once its probes are attached, log an
attribution per pause, stream the same over its socket, record the raw events, and
`gpujitter report` on that recording must give exactly the attributions it logged live."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.drill.build import build_stub
from tests.kernel.test_cuda import FEED, SLACK_NS, quiet_spans

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
    assert printed == [{k: v for k, v in a.items() if k != "schema"} for a in logged]

    kinds = [r["type"] for r in stream]
    assert "daemon.status" in kinds and "meta.probe" in kinds
    assert len([r for r in stream if r["type"] == "gpu.gap"]) == len(pauses)
    streamed = [r for r in stream if r["type"] == "gpu.attribution"]
    assert streamed == [{k: v for k, v in a.items() if k != "schema"} for a in logged]
    status = next(r for r in stream if r["type"] == "daemon.status")
    assert status["rss_bytes"] > 0 and status["clients"] == 1

    report = subprocess.run(
        [str(GPUJITTER), "report", "--json", str(trace)], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    replayed = json.loads(report.stdout)["attributions"]
    assert replayed == [{k: v for k, v in a.items() if k != "schema"} for a in logged]
