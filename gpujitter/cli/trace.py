"""`gpujitter trace`: what a trace holds (header, events per kind, time span) and what damage
a reader finds in it, for people checking a recording and for scripts (--json)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from gpujitter.cli.command import Command
from gpujitter.cli.options import add_traces_arg
from gpujitter.cli.output import print_json, table
from gpujitter.cli.progress import Progress
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.offline.recordings import TRACE, Recording, open_recording
from gpujitter.daemon.sinks.trace import TraceHeader, TraceReader
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import Clocks, format_wall
from gpujitter.probes.events import ClockRef, Event
from gpujitter.text import printable
from gpujitter.units import format_bytes, format_ns


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_traces_arg(p)


def _span(first: int | None, last: int | None, ev: Event) -> tuple[int | None, int | None]:
    """The span so far, widened to ev (events come in no strict order). What times nothing
    takes no part: the clock's pairing (an events file's meta.clock, taken before the
    recording, a trace's in its header) and records that carry 0 (an events file's
    meta.watch)."""
    ts_ns = ev.ts_ns
    if not ts_ns or isinstance(ev, ClockRef):
        return first, last
    if first is None or last is None:
        return ts_ns, ts_ns
    return min(first, ts_ns), max(last, ts_ns)


def _span_text(clocks: Clocks, first: int, last: int) -> str:
    """The first and the last event's wall time, each by the clock of its time."""
    return (
        f"{format_wall(clocks.at(first), first, date=True)} .. {format_wall(clocks.at(last), last)}"
    )


def inspect(path: Path, progress: Progress, before: int = 0) -> tuple[dict[str, Any], Clocks]:
    """One file's header, counts and damage, and its wall clock's references; corruption is
    reported, not raised. before: the bytes of the files read before it (progress)."""
    kinds: Counter[str] = Counter()
    first = last = None
    with TraceReader(path) as reader:
        clocks = Clocks(reader.header.clock)
        for ev in progress.events(reader, lambda: before + reader.offset):
            kinds[ev.KIND] += 1
            first, last = _span(first, last, ev)
            if type(ev) is ClockRef:
                clocks.add(ev)
        header = reader.header
        damage = reader.damage_notes()
        try:  # what report and export would refuse the trace for
            AnalysisConfig.from_record(header.analysis)
        except GpujitterError as err:
            damage.append(f"{err} (report and export refuse it)")
        return {
            "path": str(path),
            "bytes": path.stat().st_size,
            "format": ".".join(map(str, reader.format_version)),
            "header": header.to_record(),
            "events": reader.records,
            "kinds": dict(sorted(kinds.items())),
            "first_ns": first,
            "last_ns": last,
            "clock_set": clocks.notes,
            "damage": damage,
            "readable": not reader.damaged,
        }, clocks


def inspect_other(rec: Recording) -> tuple[dict[str, Any], Clocks]:
    """An events file, an attribution log or run --json's output: its events per kind, span and
    damage, and its wall clock's references."""
    kinds: Counter[str] = Counter()
    first = last = None
    error = None
    clocks = rec.clocks()
    try:
        with Progress(rec.size) as progress:
            for ev in progress.events(rec, rec.position):
                if type(ev) is ClockRef:
                    clocks.add(ev)
                    if rec.analysed:  # a log's clock is read from its lines' `time`: no record
                        continue
                kinds[ev.KIND] += 1
                first, last = _span(first, last, ev)
    except GpujitterError as err:
        error = str(err)
    return {
        "paths": [str(p) for p in rec.paths],
        "format": rec.kind,
        "events": sum(kinds.values()),
        "kinds": dict(sorted(kinds.items())),
        "first_ns": first,
        "last_ns": last,
        "clock_set": clocks.notes,
        "damage": rec.damage + ([error] if error else []),
        "readable": error is None and not rec.corrupt,
    }, clocks


def run(args: argparse.Namespace) -> int:
    rec = open_recording(args.traces)
    if rec.kind != TRACE:
        return run_other(rec, args.json)
    traces = rec.traces
    assert traces is not None  # a trace recording's
    files: list[dict[str, Any]] = []
    clocks: list[Clocks] = []
    read = 0
    with Progress(rec.size) as progress:
        for path in traces.paths:
            f, c = inspect(path, progress, read)
            files.append(f)
            clocks.append(c)
            read += f["bytes"]
    kinds: Counter[str] = Counter()
    for f in files:
        kinds.update(f["kinds"])
    unreadable = [{"path": str(p), "damage": [why]} for p, why in traces.unreadable]
    result = {
        "files": files,
        "unreadable": unreadable,
        "events": sum(f["events"] for f in files),
        "kinds": dict(sorted(kinds.items())),
        "damaged": sum(1 for f in files if f["damage"]) + len(unreadable),
    }
    if args.json:
        print_json(result)
    else:
        for f, header, c in zip(files, traces.headers, clocks, strict=True):
            print(describe(f, header, c))
        for path, why in traces.unreadable:
            print(f"{printable(str(path))}\n  damage: {printable(why)} (left out)")
        if len(files) + len(unreadable) > 1:
            print(f"total: {len(files)} files, {result['events']} events")
            if len(boots := traces.boots()) > 1:  # each a timeline of its own (report reads so)
                print(printable(f"boots: {len(boots)}, " + "; ".join(
                    f"{b.headers[0].boot_id[:8] or 'no boot id'}: {len(b.paths)} file(s)"
                    for b in boots)))  # fmt: skip
            print(table(["KIND", "EVENTS"], sorted(kinds.items())))
    return 0 if all(f["readable"] for f in files) and not unreadable else 1


def run_other(rec: Recording, as_json: bool) -> int:
    f, clocks = inspect_other(rec)
    if as_json:
        print_json(f)
        return 0 if f["readable"] else 1
    span = "none"
    if f["first_ns"] is not None:
        span = (
            _span_text(clocks, f["first_ns"], f["last_ns"])
            if rec.wall_clock
            else f"t={f['first_ns']}ns .. t={f['last_ns']}ns"
        ) + f" ({format_ns(f['last_ns'] - f['first_ns'])})"
    lines = [
        f"{', '.join(f['paths'])}  ({rec.what}: no header, so no host, probes or topology)",
        f"  events {span}",
        *(f"  {note}" for note in f["clock_set"]),
        kinds_line(f),
        *([f"  damage: {d}" for d in f["damage"]] or ["  damage: none"]),
    ]
    print("\n".join(printable(line) for line in lines))
    return 0 if f["readable"] else 1


def kinds_line(f: dict[str, Any]) -> str:
    return f"  {f['events']} events: " + (
        ", ".join(f"{k} {n}" for k, n in f["kinds"].items()) or "none"
    )


def describe(f: dict[str, Any], header: TraceHeader, clocks: Clocks) -> str:
    h = f["header"]
    topo = header.topology
    span = ""
    if f["first_ns"] is not None:
        span = (
            f"{_span_text(clocks, f['first_ns'], f['last_ns'])} "
            f"({format_ns(f['last_ns'] - f['first_ns'])})"
        )
    thresholds = "; ".join(
        f"{p} " + ", ".join(f"{k}={format_ns(v)}" for k, v in t.items())
        for p, t in h["thresholds"].items()
        if t
    )
    lines = [
        f"{f['path']}  ({format_bytes(f['bytes'])}, format {f['format']}, "
        f"schema {h['schema'][0]}.{h['schema'][1]}, gpujitter {h['gpujitter']})",
        f"  host {h['host']}, kernel {h['kernel']}, session {h['session']} segment {h['segment']}"
        + (f", boot {header.boot_id}" if header.boot_id else ""),
        f"  started {format_wall(header.clock, header.start_ns, date=True)}; "
        f"events {span or 'none'}",
        *(f"  {note}" for note in f["clock_set"]),
        f"  probes {', '.join(h['probes']) or 'none'}"
        + (f" (thresholds: {thresholds})" if thresholds else "")
        + f"; watching {h['watch'] or 'unknown'}",
        f"  topology: {len(topo.cpus)} CPUs on {len(topo.nodes)} node(s)"
        + (f", override {topo.override}" if topo.override else "")
        + (f"; {topo.unknown_gpu_note()}" if topo.unknown_gpu_note() else ""),
        kinds_line(f),
    ]
    damage = [d.removeprefix(f"{f['path']}: ") for d in f["damage"]]
    lines += [f"  damage: {d}" for d in damage] or ["  damage: none"]
    # Every field comes from the file, which may come from anywhere: each line inert.
    return "\n".join(printable(line) for line in lines)


COMMAND = Command(
    name="trace",
    summary="show what a trace holds and whether it is damaged",
    description="""
        Read trace files (from `gpujitter record` or the daemon's --record) and print each
        one's header (host, kernel, probes, thresholds, topology), its events per kind and
        time span, and any damage: a torn last record (the writer stopped mid-write) and
        records of kinds this version does not know are tolerated and listed; corruption
        elsewhere is listed and makes the exit status 1.
    """,
    examples="""
        # one recording
        gpujitter trace node.gjtrace
        # a rotated recording (a directory), as JSON
        gpujitter trace traces/ --json
    """,
    add_arguments=add_arguments,
    run=run,
)
