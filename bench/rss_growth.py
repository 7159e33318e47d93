"""What the daemon's resident memory does after READY beside a running job: `gpujitter run`
watching --pid from a fresh start (empty configuration, no recording), its resident size,
anonymous and file-backed, every --every seconds for --seconds, and which mappings grew
from READY to the end (/proc/PID/smaps by mapping). The steady target (≤ 150 MB) is about
the plateau, not the seconds after READY that bench.startstop measures.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.rss_growth --pid PID
        [--seconds 150] [--every 10] [--no-nvml] [--json]
    tools/gpu_session.sh . .gpu/bcc.tar.xz rssgrowth     # beside the H200 training job
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.startstop import smaps_by_mapping, start_daemon, status_mb


def resident_mb(pid: int) -> dict[str, float]:
    """Resident size of a process, all, anonymous and file-backed, in MB."""
    mb = status_mb(pid, "VmRSS", "RssAnon", "RssFile")
    return {"rss": mb["VmRSS"], "anon": mb["RssAnon"], "file": mb["RssFile"]}


def measure(pid: int, seconds: float, every: float, nvml: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        tmp = Path(work)
        flags = ["--log", str(tmp / "attr.jsonl"), *([] if nvml else ["--no-nvml"])]
        daemon, ready_s = start_daemon(tmp, pid, flags)
        try:
            start = time.monotonic()
            first = smaps_by_mapping(daemon.pid)
            samples = []
            while True:
                t = time.monotonic() - start
                samples.append({"after_ready_s": round(t, 1), **resident_mb(daemon.pid)})
                if t >= seconds:
                    break
                time.sleep(min(every, seconds - t))
            last = smaps_by_mapping(daemon.pid)
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
        finally:
            if daemon.returncode is None:
                daemon.kill()
                daemon.wait()
    grew = sorted(((last[k] - first.get(k, 0)) / 1024, k) for k in last)[::-1]
    return {
        "ready_s": ready_s,
        "samples": samples,
        "grew_mb_by_mapping": {k: round(mb, 1) for mb, k in grew[:8] if mb >= 0.1},
        "exit_status": daemon.returncode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pid", type=int, required=True, help="the job to watch")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--no-nvml", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.pid, args.seconds, args.every, not args.no_nvml)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"READY after {result['ready_s']:.2f} s; exit status {result['exit_status']}")
    for s in result["samples"]:
        print(f"{s['after_ready_s']:7.1f} s  RSS {s['rss']:6.1f} MB  "
              f"(anonymous {s['anon']:6.1f}, files {s['file']:5.1f})")  # fmt: skip
    print("grew from READY:", ", ".join(f"{k} +{mb} MB" for k, mb in
                                       result["grew_mb_by_mapping"].items()))  # fmt: skip


if __name__ == "__main__":
    main()
