"""Why every thread of the daemon runs at one scheduling level (docs/architecture.md, "The
daemon's own scheduling"): a Python thread held below the others, busy, and preempted while
it holds the GIL stops them all until it runs again. A loop (SCHED_BATCH nice 10, the daemon's
main loop) sleeps 10 ms at a time beside a busy Python thread set SCHED_IDLE, batch nice 19 or
batch nice 10 (the loop's own level); all of it on one CPU that other tasks keep busy. Prints
the loop's worst extra delay per setting. Root, for nothing; run it with hogs on the CPU:

    for i in 1 2 3 4; do taskset -c 1 sh -c 'while :; do :; done' & done
    taskset -c 1 .venv/bin/python -m bench.gil_inversion --rounds 3
    pkill -f "while :; do :; done"
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

SETTINGS = {"idle": None, "batch19": 19, "same": 10}  # the busy thread's policy/nice
LOOP_NICE = 10


def worst_delay_ms(setting: str, seconds: float) -> float:
    """The loop's worst lateness (ms) over `seconds` beside a busy thread at `setting`."""
    end = time.monotonic() + seconds

    def busy() -> None:
        nice = SETTINGS[setting]
        if nice is None:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        while time.monotonic() < end:
            sum(range(2000))  # Python bytecode: holds the GIL until asked for it

    thread = threading.Thread(target=busy)
    thread.start()
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOOP_NICE)
    worst, last = 0.0, time.monotonic()
    while last < end:
        time.sleep(0.01)
        now = time.monotonic()
        worst, last = max(worst, now - last - 0.01), now
    thread.join()
    return worst * 1000


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.gil_inversion", description=__doc__)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    # Each measurement in a process of its own (forked while this one has no other thread):
    # the loop's level is set for good, and every setting starts from the same place.
    out: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for _ in range(args.rounds):
        for setting in SETTINGS:
            r, w = os.pipe()
            if (pid := os.fork()) == 0:
                os.close(r)
                os.write(w, str(worst_delay_ms(setting, args.seconds)).encode())
                os._exit(0)
            os.close(w)
            out[setting].append(round(float(os.read(r, 64)), 1))
            os.close(r)
            os.waitpid(pid, 0)
    print(json.dumps({"worst_extra_delay_ms": out}))


if __name__ == "__main__":
    main()
