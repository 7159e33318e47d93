"""`gpujitter probe`: stream what the named probes see, live, so a person can watch each
probe work (and a script can consume it with --json)."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable

from gpujitter.cli.command import Command
from gpujitter.cli.options import (
    add_threshold_arg,
    add_topology_args,
    add_watch_args,
    parse_thresholds,
    topology_from_args,
    watch_from_args,
)
from gpujitter.cli.output import print_ndjson, table
from gpujitter.probes import registry
from gpujitter.probes.clock import clock_ref, format_wall
from gpujitter.probes.events import ClockRef, Event, ProbeStatus, to_record
from gpujitter.units import format_ns, parse_duration_ns


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="probes to run (default: every probe that is on by default); "
        "see `gpujitter doctor` for the list",
    )
    p.add_argument("-d", "--duration", metavar="TIME", help="stop after TIME (e.g. 10s)")
    add_threshold_arg(p)
    p.add_argument("--quiet", action="store_true", help="print only the summary at the end")
    add_watch_args(p)
    add_topology_args(p)


def run(args: argparse.Namespace) -> int:
    from gpujitter.probes.runner import ProbeThread

    names = args.sources or registry.default_names()
    for name in names:
        registry.get(name)
    duration_ns = parse_duration_ns(args.duration, "s") if args.duration else None
    ref = clock_ref()
    counts: Counter[str] = Counter()
    statuses: dict[str, ProbeStatus] = {}

    def emit(ev: Event) -> bool:
        if isinstance(ev, ProbeStatus):
            previous = statuses.get(ev.probe)
            statuses[ev.probe] = ev
            if previous is not None and previous.state == ev.state:
                return True
        counts[ev.KIND] += 1
        if args.quiet:
            return True
        if args.json:
            print_ndjson(to_record(ev))
        else:
            print(describe(ev, ref), flush=True)
        return True

    watch = watch_from_args(args)
    if not args.json:
        print(f"# probes: {', '.join(names)}; watching {watch.describe()}", file=sys.stderr)
    stop = _stop_on_signals()
    with ProbeThread(
        names,
        topology=topology_from_args(args),
        watch=watch,
        emit=emit,
        thresholds=parse_thresholds(args.threshold),
    ):
        start = time.monotonic_ns()
        while not stop() and (duration_ns is None or time.monotonic_ns() - start < duration_ns):
            time.sleep(0.1)
    summary = {
        "probes": {name: dataclasses.asdict(s) for name, s in statuses.items()},
        "events": dict(counts),
    }
    if args.json:
        print_ndjson({"type": "summary", **summary})
    else:
        print(
            table(
                ["PROBE", "STATE", "EVENTS", "LOST(BPF)", "LOST(PY)", "REASON"],
                [
                    (s.probe, s.state, s.events, s.lost_kernel, s.lost_user, s.reason)
                    for s in statuses.values()
                ],
            ),
            file=sys.stderr,
        )
    unavailable = [s for s in statuses.values() if s.state == "unavailable"]
    return 1 if unavailable and len(unavailable) == len(statuses) else 0


def describe(ev: Event, ref: ClockRef) -> str:
    """One line per event: wall time, kind, then fields; *_ns durations in human units."""
    parts = [format_wall(ref, ev.ts_ns), ev.KIND]
    for f in dataclasses.fields(ev):
        if f.name == "ts_ns":
            continue
        value = getattr(ev, f.name)
        if f.name.endswith("_ns") and not f.name.startswith("end") and isinstance(value, int):
            parts.append(f"{f.name[:-3]}={format_ns(value)}")
        elif f.name == "end_ns":
            parts.append(f"dur={format_ns(value - ev.ts_ns)}")
        elif value not in ("", (), None):
            parts.append(f"{f.name}={value}")
    return " ".join(parts)


def _stop_on_signals() -> Callable[[], bool]:
    stopped: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        stopped.append(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: bool(stopped)


COMMAND = Command(
    name="probe",
    summary="stream what the host-jitter probes see, live",
    description="""
        Attach the named probes (sched, irq, faults, swap, cstate, malloc) and print their
        events as they arrive: one line each, or NDJSON with --json. With no process chosen,
        every process is watched (thresholds keep the rate down). Ends with a summary per
        probe: state, events delivered, records lost in the kernel and in Python.
    """,
    examples="""
        # what the default probes see on this node, for 10 seconds
        gpujitter probe --duration 10s
        # off-CPU and run-queue waits over 1 ms of one process, as NDJSON
        gpujitter probe sched --pid 4121 -t sched.offcpu=1ms --json
        # allocator system calls of every python process
        gpujitter probe malloc --comm 'python*'
    """,
    add_arguments=add_arguments,
    run=run,
)
