"""The daemon's CPU cgroup against a watched job in a cgroup beside it, as systemd installs
them: `gpujitter run` (its defaults) in a cgroup of its own under the unit's quota (100 % of
a CPU over 10 ms periods) at each CPU weight asked for, watching bench.job_model in a sibling
cgroup of weight 100 (with --spinners busy loops there too: a saturated node). Each weight's
rounds alternate beside one run of the job; per round, the gaps gpujitter made itself (the
attributions with self time, and that time) and what it lost. Root, bcc, a CPU controller
(cgroup v1's, or v2's).

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.own_cgroup --weights 100,10
        [--rounds 2] [--seconds 40] [--spinners 2] [--json out.json]

Why: the unit's CPUQuota= puts the daemon in a CPU cgroup of its own, and inside one the
nice level of its threads only ranks them among themselves; the cgroup's weight is what
ranks it against a job beside it (systemd/gpujitter.service, CPUWeight=).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpujitter.daemon.drill.system import cpu_cgroup
from gpujitter.daemon.sinks.stream import first_records

GPUJITTER = Path(sys.executable).with_name("gpujitter")
QUOTA_US, PERIOD_US = 10_000, 10_000  # the unit's CPUQuota=100% over CPUQuotaPeriodSec=10ms


def joining(d: Path) -> Any:
    """A preexec_fn that puts the child in cgroup `d` before it runs anything."""
    return lambda: (d / "cgroup.procs").write_text(str(os.getpid()))


def one_round(job: int, d: Path, weight: int, seconds: float, tmp: Path) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(dir=tmp))  # the round's own log, socket and notify socket
    log, sock = tmp / "log.jsonl", tmp / "sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp / "notify"))
    notify.settimeout(120)
    daemon = subprocess.Popen(
        [str(GPUJITTER), "run", "--quiet", "-p", str(job), "--log", str(log), "--socket",
         str(sock)],
        env={**os.environ, "NOTIFY_SOCKET": notify.getsockname()},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=joining(d),
    )  # fmt: skip
    try:
        while not notify.recv(4096).startswith(b"READY=1"):
            pass
        time.sleep(seconds)
        status = first_records(sock, ["snapshot"], 5.0).get("snapshot", {}).get("status") or {}
    finally:
        daemon.send_signal(signal.SIGINT)
        daemon.wait(timeout=60)
        notify.close()
    gaps = [json.loads(line) for line in log.read_bytes().splitlines() if line.strip()]
    own = [g["self_ns"] for g in gaps if g.get("self_ns", 0) > 0]
    return {
        "weight": weight,
        "attributions": len(gaps),
        "status_attributions": status.get("attributions"),  # the engine's own count
        "status_self_inflicted": status.get("self_inflicted"),
        "self_inflicted": len(own),
        "self_ms": sum(own) / 1e6,
        "self_ms_median": statistics.median(own) / 1e6 if own else 0.0,
        "events": sum(p.get("events", 0) for p in (status.get("probe_cost") or {}).values()),
        "lost_kernel": status.get("lost_kernel"),
        "lost_user": status.get("lost_user"),
        "cpu_percent_last": status.get("cpu_percent"),
    }


def measure(weights: list[int], rounds: int, seconds: float, spinners: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        job_cg = stack.enter_context(cpu_cgroup(f"gj-bench-job-{os.getpid()}", 100))
        own = {
            w: stack.enter_context(
                cpu_cgroup(f"gj-bench-daemon{w}-{os.getpid()}", w, QUOTA_US, PERIOD_US)
            )
            for w in weights
        }
        job = subprocess.Popen(
            [sys.executable, "-m", "bench.job_model", "--threads", "30", "--workers", "6",
             "--seconds", "36000"],  # killed at the end: starts under load take long
            stdout=subprocess.PIPE, text=True, preexec_fn=joining(job_cg), start_new_session=True,
        )  # fmt: skip
        spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 preexec_fn=joining(job_cg)) for _ in range(spinners)]  # fmt: skip
        try:
            assert job.stdout is not None
            pid = int(job.stdout.readline().split()[0])
            time.sleep(5)  # its workers forked, its loop going
            for r in range(rounds):
                for w in weights if r % 2 == 0 else weights[::-1]:
                    out.append(one_round(pid, own[w], w, seconds, tmp))
                    print(json.dumps(out[-1]), file=sys.stderr, flush=True)
        finally:
            for p in spin:
                p.kill()
                p.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return {"seconds": seconds, "spinners": spinners, "rounds": out}


def report(res: dict[str, Any]) -> str:
    lines = [
        f"{res['seconds']:.0f} s rounds, {res['spinners']} spinners beside the job",
        "weight  attributions  self-inflicted  self ms (median)  events  lost kernel/user",
    ]
    for r in res["rounds"]:
        lines.append(f"{r['weight']:6}  {r['attributions']:12}  {r['self_inflicted']:14}  "
                     f"{r['self_ms']:7.0f} ({r['self_ms_median']:.1f})  {r['events']:6}  "
                     f"{r['lost_kernel']} / {r['lost_user']}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default="100,10", help="the daemon cgroup's CPUWeight values")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each weight")
    ap.add_argument("--seconds", type=float, default=40.0, help="a round's window after READY")
    ap.add_argument("--spinners", type=int, default=0, help="busy loops in the job's cgroup")
    ap.add_argument("--json", type=Path, help="write the results here too")
    a = ap.parse_args(argv)
    res = measure([int(w) for w in a.weights.split(",")], a.rounds, a.seconds, a.spinners)
    print(report(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
