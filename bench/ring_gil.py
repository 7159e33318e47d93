"""What draining a ring buffer costs per record with the GIL let go for the call (bcc's
ring_buffer_consume: libbcc is a CDLL) and held for it (probes.base.consume_rings: a PyDLL
handle), with and without another Python thread busy (the daemon's analysis). A tracepoint
program writes a record per getppid(); each poll makes 400 records, then drains them once.
Prints the consuming thread's CPU per record and the busy thread's loops. Root (BPF):

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.ring_gil --rounds 3 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from gpujitter.probes.base import consume_rings

PROGRAM = r"""
struct rec { u64 ts; u32 pid; u32 pad; char comm[16]; u64 more[6]; };
BPF_RINGBUF_OUTPUT(records, 256);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    struct rec *e = records.ringbuf_reserve(sizeof(*e));
    if (!e)
        return 0;
    e->ts = bpf_ktime_get_ns();
    e->pid = bpf_get_current_pid_tgid();
    bpf_get_current_comm(e->comm, sizeof(e->comm));
    records.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
    return 0;
}
"""
RECORDS_PER_POLL = 400


def run(bpf: Any, held: bool, busy: bool, seconds: float) -> dict[str, Any]:
    delivered = 0

    def on_record(_ctx: Any, _data: int, _size: int) -> int:
        nonlocal delivered
        delivered += 1
        return 0

    bpf["records"].open_ring_buffer(on_record)
    stop = threading.Event()
    loops = 0

    def spin() -> None:
        nonlocal loops
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i
            loops += 1

    spinner = threading.Thread(target=spin) if busy else None
    if spinner:
        spinner.start()
    cpu_ns = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(RECORDS_PER_POLL):
            os.getppid()
        start = time.thread_time_ns()
        if held:
            consume_rings(bpf)
        else:
            bpf.ring_buffer_consume()
        cpu_ns += time.thread_time_ns() - start
        time.sleep(0.05)
    stop.set()
    if spinner:
        spinner.join()
    return {"gil": "held" if held else "let go", "busy_thread": busy, "records": delivered,
            "us_per_record": round(cpu_ns / max(1, delivered) / 1000, 3),
            "busy_loops": loops}  # fmt: skip


def main() -> None:
    from bcc import BPF

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        for busy in (True, False):
            for held in (False, True):  # a module per run: one ring buffer manager each
                bpf = BPF(text=PROGRAM)
                try:
                    rows.append(run(bpf, held, busy, args.seconds))
                finally:
                    bpf.cleanup()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"GIL {r['gil']:7} busy thread {'yes' if r['busy_thread'] else 'no ':3}  "
              f"{r['us_per_record']:6.2f} µs a record  ({r['records']} records, "
              f"busy thread {r['busy_loops']} loops)")  # fmt: skip


if __name__ == "__main__":
    main()
