"""Events into user space at a set rate, and every one accounted for (issue 12): a fresh
`gpujitter run` watches a generator that makes brk(2) calls at a steady rate with the malloc
probe's syscall threshold at 0, so each call is one streamed record; the check is
generated = received + lost in the kernel + dropped in Python, each counted on its own.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.event_rate [--rate 100000]
        [--seconds 10] [--probes LIST] [--json] [--out FILE]

generated: the generator's own count (a C loop that makes no other system call while it
runs). received: its `AllocSyscall` records in the daemon's trace (what reached the main
loop). lost in the kernel: the malloc probe's ring-buffer reserve failures (`lost_kernel`);
dropped in Python: its records the full event queue refused (`lost_user`), both from the
probe's last status in the trace, taken two ticks after the generator ended. Root, bcc, gcc.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.startstop import add_daemon_args, compile_bytecode, cpu_s, say, start_daemon
from gpujitter.daemon.sinks.trace import TraceSet
from gpujitter.probes.events import AllocSyscall, ProbeStatus

# brk(0) changes nothing and is one of the allocator calls the malloc probe times.
GENERATOR = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    long rate = atol(argv[1]), total = (long)(rate * atof(argv[2])), done = 0;
    char line[16];
    struct timespec step = {0, 500000};
    printf("ready\n"); /* stdio's buffers exist before the window: no allocation in it */
    fflush(stdout);
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    double start = now_s();
    while (done < total) {
        long due = (long)((now_s() - start) * rate);
        for (; done < due && done < total; done++)
            syscall(SYS_brk, 0);
        if (done < total)
            nanosleep(&step, NULL);
    }
    printf("%ld %.6f\n", done, now_s() - start);
    fflush(stdout);
    return 0;
}
"""


def build_generator(where: Path) -> Path:
    src, exe = where / "brk_storm.c", where / "brk_storm"
    src.write_text(GENERATOR)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def start_generator(exe: Path, rate: int, seconds: float) -> subprocess.Popen[str]:
    """The generator, waiting (its loader and stdio done) for a line on stdin to begin."""
    gen = subprocess.Popen([str(exe), str(rate), str(seconds)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert gen.stdout is not None
    if gen.stdout.readline().strip() != "ready":
        raise RuntimeError("the generator did not start")
    return gen


def run_generator(gen: subprocess.Popen[str]) -> tuple[int, float]:
    """Let it run; (calls made, seconds it took)."""
    out, _ = gen.communicate("go\n")
    done, took_s = out.split()
    return int(done), float(took_s)


def account(generated: int, tgid: int, events: list[Any]) -> dict[str, Any]:
    """The conservation check over a recorded stream: generated against received + the
    malloc probe's counted losses (its last status)."""
    mine = [e for e in events if isinstance(e, AllocSyscall) and e.tgid == tgid]
    received = sum(1 for e in mine if e.syscall == "brk")
    status = [e for e in events if isinstance(e, ProbeStatus) and e.probe == "malloc"][-1]
    return {
        "generated": generated,
        "received": received,
        "lost_kernel": status.lost_kernel,
        "dropped_python": status.lost_user,
        "probe_events": status.events,  # delivered by the probe, dropped ones included
        "unaccounted": generated - received - status.lost_kernel - status.lost_user,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    compile_bytecode()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        gen = start_generator(build_generator(tmp), args.rate, args.seconds)
        trace = tmp / "trace"
        flags = ["--no-nvml", "--quiet", "--log", "", "--record", str(trace)]
        flags += ["--threshold", "malloc.syscall=0"]
        flags += ["--probes", args.probes] if args.probes else []
        daemon, ready_s = start_daemon(tmp, gen.pid, flags)
        try:
            cpu_before = cpu_s(daemon.pid)
            generated, took_s = run_generator(gen)
            cpu_storm = cpu_s(daemon.pid) - cpu_before
            time.sleep(2.5)  # two status ticks: the last one counts every record
            daemon.send_signal(signal.SIGTERM)
            _, status, _ = os.wait4(daemon.pid, 0)
            daemon.returncode = os.waitstatus_to_exitcode(status)
        finally:
            if daemon.returncode is None:
                daemon.kill()
                daemon.wait()
            if gen.poll() is None:
                gen.kill()
                gen.wait()
        events = list(TraceSet([trace]))
    return {
        **account(generated, gen.pid, events),
        "rate_asked_per_s": args.rate,
        "rate_made_per_s": generated / took_s,
        "seconds": took_s,
        "daemon_cpu_s_during": cpu_storm,
        "ready_s": ready_s,
        "exit_status": daemon.returncode,
    }


def report(r: dict[str, Any]) -> str:
    return (
        f"{r['generated']} events in {r['seconds']:.1f} s ({r['rate_made_per_s']:.0f}/s, "
        f"asked {r['rate_asked_per_s']}/s): received {r['received']}, lost in the kernel "
        f"{r['lost_kernel']}, dropped in Python {r['dropped_python']}: "
        f"{r['unaccounted']} unaccounted (target 0); daemon CPU "
        f"{r['daemon_cpu_s_during'] / r['seconds']:.0%} of a CPU; exit {r['exit_status']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=100_000, help="events per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    add_daemon_args(parser)
    args = parser.parse_args(argv)
    result = measure(args)
    say(args, result, report(result))
    return 0 if result["unaccounted"] == 0 and result["exit_status"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
