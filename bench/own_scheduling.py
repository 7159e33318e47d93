"""What the daemon's own scheduling (SCHED_BATCH nice 10 drain and analysis, SCHED_IDLE
writers: daemon/service/own_scheduling.py) costs it in events on a saturated node: `gpujitter run`
watches a loop of mmap/munmap calls (the malloc probe at threshold 0 streams each) at a
steady rate, once on a quiet node and once with a nice-0 spinner on every CPU; the final
daemon.status says what was delivered and lost, measured from READY (start-up, compiling the
probes at nice 10, is timed apart). Root, bcc.

    .venv/bin/python -m bench.own_scheduling --seconds 20 --rate 5000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

GPUJITTER = Path(sys.executable).with_name("gpujitter")
LOAD = """
import mmap, sys, time
rate = int(sys.argv[1]); batch = max(1, rate // 100)
while True:
    t = time.monotonic()
    for _ in range(batch):
        mmap.mmap(-1, 1 << 16).close()
    time.sleep(max(0.0, 0.01 - (time.monotonic() - t)))
"""


def statuses(sock_path: Path, seconds: float) -> list[dict[str, Any]]:
    """The daemon.status records of the stream until the daemon closes it."""
    deadline = time.monotonic() + 60
    while True:
        try:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(str(sock_path))
            break
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise SystemExit("the daemon's socket never appeared") from None
            time.sleep(0.1)
    sock.settimeout(seconds + 60)
    buf = b""
    while chunk := sock.recv(1 << 16):
        buf += chunk
    sock.close()
    recs = [json.loads(line) for line in buf.splitlines() if line]
    return [r for r in recs if r.get("type") == "daemon.status"]


def run_once(seconds: float, rate: int, spinners: int) -> dict[str, Any]:
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)]
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(rate)])
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "gj.toml"
        conf.write_text('[probes]\nthresholds = { "malloc.syscall" = 0 }\n')
        sock = Path(tmp) / "gj.sock"
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(Path(tmp) / "notify"))
        notify.settimeout(600)
        started = time.monotonic()
        daemon = subprocess.Popen(
            [str(GPUJITTER), "run", "--quiet", "--no-nvml", "--pid", str(load.pid),
             "--probes", "malloc,sched", "--socket", str(sock), "--config", str(conf)],
            stderr=subprocess.DEVNULL,
            env={**os.environ, "NOTIFY_SOCKET": str(Path(tmp) / "notify")},
        )  # fmt: skip
        try:
            got: list[list[dict[str, Any]]] = []
            while not notify.recv(4096).startswith(b"READY=1"):
                pass
            ready_s = time.monotonic() - started  # compiling the probes at nice 10
            reader = threading.Thread(target=lambda: got.append(statuses(sock, seconds)))
            reader.start()
            time.sleep(seconds)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=120)
            reader.join(timeout=60)
            notify.close()
            for p in [load, *spin]:
                p.kill()
                p.wait()
    last = got[0][-1] if got and got[0] else {}
    cost = last.get("probe_cost", {})
    return {
        "spinners": spinners,
        "ready_s": round(ready_s, 1),
        "events": sum(p.get("events", 0) for p in cost.values()),
        "lost_kernel": last.get("lost_kernel"),
        "lost_user": last.get("lost_user"),
        "engine_dropped": last.get("engine_dropped"),
        "cpu_percent_last": last.get("cpu_percent"),
        "own_cpus": last.get("own_cpus"),
        "own_nice": last.get("own_nice"),
        "self_inflicted": last.get("self_inflicted"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=int, default=5000, help="mmap+munmap pairs per second")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cpus = os.cpu_count() or 1
    rows = [run_once(args.seconds, args.rate, n) for n in (0, cpus)]
    for row in rows:
        print(json.dumps(row))
    if args.json:
        args.json.write_text(json.dumps({"seconds": args.seconds, "rate": args.rate,
                                         "runs": rows}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
