"""What native frames would cost (issue 14 item 3, not built): a CPU-clock perf event on every
CPU at --freq Hz with a BPF program that returns at once for a thread not watched and takes
the user stack (frame pointers, bpf_get_stackid) of a watched one, measured as root beside a
child that runs a C extension (`hash`: hashlib's sha256 over 10 MB, GIL released) or pure
Python (`py`). Reports the program's runs per second and ns per run (kernel bpf_stats), its
share of one CPU, the watched thread's samples, their stack depths and leaf functions (bcc's
symboliser, with the user-space CPU per distinct stack it took).

    flock /tmp/gpujitter-kernel.lock /usr/bin/python3 -m bench.native_ip_cost hash
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROGRAM = r"""
#include <uapi/linux/bpf_perf_event.h>
BPF_HASH(watched, u32, u8, 1024);
BPF_STACK_TRACE(stacks, 1024);
BPF_HASH(counts, int, u64, 1024);
int on_sample(struct bpf_perf_event_data *ctx) {
    u32 tid = bpf_get_current_pid_tgid();
    if (!watched.lookup(&tid))
        return 0;
    int id = stacks.get_stackid(&ctx->regs, BPF_F_USER_STACK);
    counts.increment(id);
    return 0;
}
"""
WORK = {
    "hash": 'import hashlib\nwhile True:\n    hashlib.sha256(b"x" * 10_000_000).digest()\n',
    "py": "def spin():\n    while True:\n        pass\nspin()\n",
}
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def run_stats(fd: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) of the program, from its fdinfo."""
    fields = dict(
        line.split(":\t", 1)
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
        if ":\t" in line
    )
    return int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0))


def main() -> int:
    from bcc import BPF, PerfSWConfig, PerfType  # here: the module loads without bcc

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("work", choices=sorted(WORK))
    parser.add_argument("--freq", type=int, default=99)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    child = subprocess.Popen([sys.executable, "-c", WORK[args.work]])
    was = STATS.read_text().strip()
    try:
        bpf = BPF(text=PROGRAM)
        bpf["watched"][ctypes.c_uint32(child.pid)] = ctypes.c_uint8(1)
        bpf.attach_perf_event(
            ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK,
            fn_name="on_sample", sample_freq=args.freq,
        )  # fmt: skip
        STATS.write_text("1")
        fd = bpf.funcs[b"on_sample"].fd  # bcc keys its programs by bytes
        ns0, runs0 = run_stats(fd)
        t0 = time.monotonic_ns()
        time.sleep(args.seconds)
        ns1, runs1 = run_stats(fd)
        elapsed_s = (time.monotonic_ns() - t0) / 1e9
        hits = {k.value: v.value for k, v in bpf["counts"].items()}
        depths: dict[int, int] = {}
        leaves: dict[str, int] = {}
        cpu0 = time.thread_time_ns()
        stacks = [sid for sid in hits if sid >= 0]
        for sid in stacks:
            frames = list(bpf["stacks"].walk(sid))
            depths[len(frames)] = depths.get(len(frames), 0) + hits[sid]
            leaf = bpf.sym(frames[0], child.pid, show_module=True).decode(errors="replace")
            leaves[leaf] = leaves.get(leaf, 0) + hits[sid]
        sym_us = (time.thread_time_ns() - cpu0) / 1e3 / max(1, len(stacks))
    finally:
        STATS.write_text(was)
        child.kill()
        child.wait()
    taken = sum(hits.values())
    result: dict[str, Any] = {
        "work": args.work,
        "freq_hz": args.freq,
        "runs_per_s": round((runs1 - runs0) / elapsed_s),
        "ns_per_run": round((ns1 - ns0) / max(1, runs1 - runs0)),
        "cpu_share": round((ns1 - ns0) / elapsed_s / 1e9, 6),
        "watched_samples_per_s": round(taken / elapsed_s, 1),
        "stack_failed": sum(n for sid, n in hits.items() if sid < 0),
        "depth_samples": dict(sorted(depths.items())),
        "leaf_samples": dict(sorted(leaves.items(), key=lambda kv: -kv[1])[:8]),
        "symbolise_us_per_stack": round(sym_us, 1),
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
