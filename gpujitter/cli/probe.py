"""`gpujitter probe`: stream what the named probes see, live, so a person can watch each
probe work (and a script can consume it with --json)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpujitter.cli.command import Command
from gpujitter.cli.options import (
    add_threshold_arg,
    add_topology_args,
    add_watch_args,
    duration_arg_ns,
    parse_thresholds,
    topology_from_args,
    watch_from_args,
)
from gpujitter.cli.output import print_ndjson, table
from gpujitter.daemon.service.config import parse_value
from gpujitter.daemon.service.runtime import LiveSource, Runtime, Sink
from gpujitter.errors import GpujitterError
from gpujitter.probes import registry
from gpujitter.probes.clock import clock_ref, format_wall
from gpujitter.probes.events import CORE_PROBE, ClockRef, Event, ProbeStatus, to_record
from gpujitter.probes.host import HostPaths
from gpujitter.probes.malloc_precise import MAX_WINDOW_NS
from gpujitter.probes.watch import WatchSpec
from gpujitter.text import printable
from gpujitter.units import format_ns, parse_duration_ns


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "probes",
        nargs="*",
        metavar="PROBE",
        help="probes to run, as names or comma-separated (default: every probe that is on "
        "by default; +NAME adds one to that set); see `gpujitter doctor` for the list",
    )
    p.add_argument("-d", "--duration", metavar="TIME", help="stop after TIME (e.g. 10s)")
    add_threshold_arg(p)
    p.add_argument("--quiet", action="store_true", help="print only the summary at the end")
    precise = p.add_argument_group("malloc precise mode (uprobes on the allocator, opt-in)")
    precise.add_argument(
        "--precise",
        type=int,
        action="append",
        default=[],
        metavar="PID",
        help="time every allocator call of PID (repeatable); costs microseconds per call, "
        "so it ends by itself after --window",
    )
    precise.add_argument(
        "--window",
        metavar="TIME",
        help="how long --precise stays attached (default 30s, at most 1h)",
    )
    add_watch_args(p)
    add_topology_args(p)


def run(args: argparse.Namespace) -> int:
    names = registry.select(args.probes)
    options = precise_options(args, names)
    duration_ns = duration_arg_ns(args)
    shown = _Shown(args, clock_ref())
    # Every option is checked before the first line is printed: a mistake is one line.
    watch, thresholds = watch_from_args(args), parse_thresholds(args.threshold)
    topology = topology_from_args(args)
    if args.precise and watch.all:
        watch = WatchSpec(pids=set(args.precise))
    if not args.json:
        print(
            printable(f"# probes: {', '.join(names)}; watching {watch.describe()}"), file=sys.stderr
        )
    for line in watch.unwatchable(HostPaths()):  # a warning: in --json too (stdout is the data)
        print(printable(f"# {line}"), file=sys.stderr)
    # The kernel probes alone (no NVML, no GPU processes), every event shown, none analysed.
    source = LiveSource(names, topology=topology, watch=watch, thresholds=thresholds,
                        options=options, nvml=False, gpu_processes=False)  # fmt: skip
    Runtime(source, topology, sinks=[shown], duration_ns=duration_ns).run()
    statuses = shown.statuses
    summary = {
        "probes": {name: dataclasses.asdict(s) for name, s in statuses.items()},
        "events": dict(shown.counts),
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
    return exit_status(statuses)


def exit_status(statuses: Mapping[str, ProbeStatus]) -> int:
    """1 when none of the probes could run, from their last statuses: the core's
    (CORE_PROBE), which runs with any set, is no probe here."""
    probes = [s for s in statuses.values() if s.probe != CORE_PROBE]
    unavailable = [s for s in probes if s.state == "unavailable"]
    return 1 if unavailable and len(unavailable) == len(probes) else 0


class _Shown(Sink):
    """Each event as a line (or NDJSON), a probe's health only when it changed; the counts
    by kind and each probe's last health for the summary."""

    def __init__(self, args: argparse.Namespace, ref: ClockRef) -> None:
        self.args = args
        self.ref = ref
        self.counts: Counter[str] = Counter()
        self.statuses: dict[str, ProbeStatus] = {}

    def event(self, ev: Event) -> None:
        if isinstance(ev, ClockRef):
            self.ref = ev  # the wall clock was set: the events after it by its new time
        elif isinstance(ev, ProbeStatus):
            previous = self.statuses.get(ev.probe)
            self.statuses[ev.probe] = ev
            if previous is not None and (previous.state, previous.reason) == (ev.state, ev.reason):
                return
        self.counts[ev.KIND] += 1
        if self.args.quiet:
            return
        if self.args.json:
            print_ndjson(to_record(ev))
        else:
            print(describe(ev, self.ref), flush=True)


def precise_options(args: argparse.Namespace, names: list[str]) -> dict[str, dict[str, Any]]:
    """ProbeContext.options for --precise/--window (checked here, so mistakes are one line)."""
    if not args.precise:
        if args.window is not None:  # else silently nothing: the user meant a precise window
            raise GpujitterError("--window is how long --precise stays attached: add --precise PID")
        return {}
    if "malloc" not in names:
        raise GpujitterError("--precise is a mode of the malloc probe: add `malloc` to PROBE")
    parse_value("watch.pids", args.precise, "flag --precise")  # 1..pid_max, as --pid
    options: dict[str, Any] = {"precise_pids": args.precise}
    if args.window is not None:  # else the probe's own default (malloc.DEFAULT_WINDOW_NS)
        window_ns = parse_duration_ns(args.window, "s")
        if not 0 < window_ns <= MAX_WINDOW_NS:
            raise GpujitterError(f"--window {args.window}: want a time above 0 and at most 1h")
        options["precise_window_ns"] = window_ns
    return {"malloc": options}


# Fields other than ts_ns/end_ns that hold a CLOCK_MONOTONIC time, not a duration.
TIMESTAMPS = frozenset({"runnable_ns"})


def describe(ev: Event, ref: ClockRef) -> str:
    """One line per event: wall time, kind, then fields; *_ns durations in human units."""
    parts = [format_wall(ref, ev.ts_ns), ev.KIND]
    for f in dataclasses.fields(ev):
        if f.name == "ts_ns":
            continue
        value = getattr(ev, f.name)
        if f.name == "end_ns":
            parts.append(f"dur={format_ns(value - ev.ts_ns)}")
        elif f.name in TIMESTAMPS:  # a point in time: shown after the event's start
            parts.append(f"{f.name[:-3]}=+{format_ns(value - ev.ts_ns)}")
        elif f.name.endswith("_ns") and isinstance(value, int):
            parts.append(f"{f.name[:-3]}={format_ns(value)}")
        elif f.name.endswith("_irqs") and value:
            # (name, ns, count) rows: name:time/count
            rows = ",".join(f"{name}:{format_ns(ns)}/{n}" for name, ns, n in value)
            parts.append(f"{f.name}={rows}")
        elif value not in ("", (), None):
            parts.append(f"{f.name}={value}")
    return printable(" ".join(parts))  # names (comm, filename, IRQs) are other processes'


COMMAND = Command(
    name="probe",
    summary="stream what the host-jitter probes see, live",
    description="""
        Attach the named probes (all that run by default when none is named; `gpujitter
        doctor` lists them) and print their events as they arrive: one line each, or NDJSON
        with --json. With no process chosen, every process is watched (thresholds keep the
        rate down). Ends with a summary per probe: state, events delivered, records lost in
        the kernel and in Python. Exits 1 when none of the probes could run.
    """,
    examples="""
        # what the default probes see on this node, for 10 seconds
        gpujitter probe --duration 10s
        # off-CPU and run-queue waits over 1 ms of one process, as NDJSON
        gpujitter probe sched --pid 4121 -t sched.offcpu=1ms --json
        # allocator system calls of every python process
        gpujitter probe malloc --comm 'python*'
        # interrupt time per CPU and IRQ time stolen from one process, for a minute
        gpujitter probe irq --pid 4121 --duration 1m
        # every allocator call of one process slower than 50us, for 30 seconds (uprobes)
        gpujitter probe malloc --precise 4121 --window 30s -t malloc.call=50us
    """,
    add_arguments=add_arguments,
    run=run,
)
