"""`gpujitter gaps`: detect GPU idle gaps live (libcuda uprobes + NVML samples through the
daemon's gap detector) and print each one as it is decided; or replay a saved event stream
through the same detector."""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from gpujitter.cli.command import Command
from gpujitter.cli.gpus import add_nvml_source_args, nvml_backend, save_recording
from gpujitter.cli.options import add_watch_args, watch_from_args
from gpujitter.cli.output import print_ndjson
from gpujitter.cli.probe import _stop_on_signals
from gpujitter.daemon.gaps import UNKNOWN_GPU, GapConfig, GapDetector
from gpujitter.daemon.recordings import TRACE, open_recording
from gpujitter.daemon.records import Attribution, GpuGap
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import clock_ref, format_wall
from gpujitter.probes.events import ClockRef, Event, ProbeStatus, to_record
from gpujitter.text import printable
from gpujitter.units import format_ns, parse_duration_ns


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-d", "--duration", metavar="TIME", help="stop after TIME (e.g. 30s)")
    p.add_argument(
        "--min-gap",
        default="5ms",
        metavar="TIME",
        help="report idle gaps at least this long (default 5ms)",
    )
    p.add_argument(
        "--quiet-stretch",
        default="1ms",
        metavar="TIME",
        help="the tracer reports launches after a quiet stretch this long (default 1ms)",
    )
    p.add_argument(
        "--sync-block",
        default="1ms",
        metavar="TIME",
        help="the tracer reports synchronisations blocked this long (default 1ms)",
    )
    p.add_argument(
        "--libcuda",
        action="append",
        default=[],
        metavar="PATH",
        help="trace this libcuda file instead of looking for the driver's (repeatable)",
    )
    p.add_argument("--no-nvml", action="store_true", help="host-side evidence only")
    p.add_argument(
        "--save-events",
        type=Path,
        metavar="FILE",
        help="write every input event to FILE (NDJSON) for --replay-events",
    )
    p.add_argument(
        "--replay-events",
        type=Path,
        metavar="FILE",
        help="run the detector over events saved with --save-events instead of live probes",
    )
    add_watch_args(p)
    add_nvml_source_args(p)


class Printer:
    """Gaps (and probe health changes) as text lines or NDJSON records."""

    def __init__(self, as_json: bool, ref: ClockRef | None) -> None:
        self.as_json = as_json
        self.ref = ref
        self.gaps = 0
        self._states: dict[str, str] = {}

    def gap(self, gap: GpuGap) -> None:
        self.gaps += 1
        if self.as_json:
            print_ndjson(to_record(gap))
            return
        gpu = "?" if gap.gpu == UNKNOWN_GPU else str(gap.gpu)
        threads = f"  tid {gap.tid_before}->{gap.tid_after}" if gap.tid_after else ""
        print(
            f"{self._when(gap.ts_ns)}  GPU {gpu}  idle {format_ns(gap.dur_ns):>9}"
            f"  {'+'.join(gap.sources):<15} ±{format_ns(gap.resolution_ns):<7}"
            f" conf {gap.confidence:.2f}  pids {' '.join(map(str, gap.tgids)) or '-'}{threads}",
            flush=True,
        )

    def _when(self, ts_ns: int) -> str:
        """Wall time, or seconds since boot for a recording without a clock (a log)."""
        return format_wall(self.ref, ts_ns) if self.ref else f"t={ts_ns / 1e9:.6f}s"

    def status(self, st: ProbeStatus) -> None:
        key = f"{st.state}:{st.reason}"
        if self._states.get(st.probe) == key:
            return
        self._states[st.probe] = key
        if self.as_json:
            print_ndjson(to_record(st))
        else:
            reason = f": {st.reason}" if st.reason else ""
            print(printable(f"# {st.probe}: {st.state}{reason}"), file=sys.stderr, flush=True)


def detector_from_args(args: argparse.Namespace) -> GapDetector:
    return GapDetector(GapConfig(min_gap_ns=parse_duration_ns(args.min_gap, "ms")))


def replay(args: argparse.Namespace, out: Printer) -> int:
    """The detector over any recording's events; an attribution log's gaps as it logged them
    (it holds no events to detect from)."""
    try:
        rec = open_recording([args.replay_events])
    except GpujitterError as err:
        raise GpujitterError(f"--replay-events: {err}") from None
    if rec.kind != TRACE and not args.json:
        print(printable(f"# reading {rec.what}"), file=sys.stderr)
    out.ref = rec.header.clock if rec.wall_clock else None
    if rec.analysed:
        for ev in rec:
            if isinstance(ev, Attribution):
                out.gap(ev.gap)
        return 0
    detector = detector_from_args(args)
    for ev in rec:
        for gap in detector.feed(ev):
            out.gap(gap)
    for gap in detector.flush():
        out.gap(gap)
    return 0


def start_nvml(args: argparse.Namespace, emit: Callable[[Event], Any]) -> tuple[Any, Any]:
    """(a GpuSampler, its NVML backend), or (None, None) with an 'unavailable' status."""
    from gpujitter.probes.gpu import GpuSampler
    from gpujitter.probes.nvml import NvmlUnavailable, open_nvml

    if args.no_nvml:
        return None, None
    backend = nvml_backend(args)
    try:
        nvml = open_nvml(backend)
    except NvmlUnavailable as err:
        now = time.monotonic_ns()
        emit(ProbeStatus(ts_ns=now, probe="nvml", state="unavailable", reason=str(err)))
        return None, None
    return GpuSampler(nvml, emit, cpu_count=os.cpu_count() or 1), backend


def run(args: argparse.Namespace) -> int:
    ref = clock_ref()
    out = Printer(args.json, ref)
    if args.replay_events is not None:
        return replay(args, out)
    from gpujitter.probes.gpu import SamplerThread
    from gpujitter.probes.runner import ProbeThread
    from gpujitter.probes.topology import load_topology

    duration_ns = parse_duration_ns(args.duration, "s") if args.duration else None
    thresholds = {
        "cuda": {
            "quiet": parse_duration_ns(args.quiet_stretch, "ms"),
            "sync": parse_duration_ns(args.sync_block, "ms"),
        }
    }
    detector = detector_from_args(args)
    events: queue.Queue[Event] = queue.Queue()
    sink: IO[bytes] | None = open(args.save_events, "wb") if args.save_events else None  # noqa: SIM115
    if sink is not None:  # the wall clock, for the readers of the file (docs/postmortem.md)
        sink.write(orjson.dumps(to_record(ref)) + b"\n")
    sampler, backend = start_nvml(args, events.put)
    watch = watch_from_args(args)
    if sampler is not None:
        watch.gpu_processes = sampler.gpu_processes
    if not args.json:
        print(printable(f"# gaps >= {args.min_gap}; watching {watch.describe()}"), file=sys.stderr)

    def handle(ev: Event) -> None:
        if sink is not None:
            sink.write(orjson.dumps(to_record(ev)) + b"\n")
        if isinstance(ev, ProbeStatus):
            out.status(ev)
        for gap in detector.feed(ev):
            out.gap(gap)

    stop = _stop_on_signals()
    options = {"cuda": {"libcuda": args.libcuda}} if args.libcuda else {}
    try:
        with (
            SamplerThread(sampler) if sampler is not None else contextlib.nullcontext(),
            ProbeThread(
                ["cuda"],
                topology=load_topology(),
                watch=watch,
                emit=events.put,
                thresholds=thresholds,
                options=options,
            ),
        ):
            start = time.monotonic_ns()
            while not stop() and (duration_ns is None or time.monotonic_ns() - start < duration_ns):
                try:
                    handle(events.get(timeout=0.1))
                except queue.Empty:
                    continue
        while not events.empty():
            handle(events.get())
        for gap in detector.flush():
            out.gap(gap)
    finally:
        if sink is not None:
            sink.close()
        if sampler is not None:
            sampler.nvml.close()
            save_recording(args, backend)
    if not args.json:
        print(f"# {out.gaps} gaps", file=sys.stderr)
    return 0


COMMAND = Command(
    name="gaps",
    summary="detect GPU idle gaps live (libcuda uprobes + NVML samples)",
    description="""
        Trace the libcuda calls of the watched processes (uprobes) and read each GPU's NVML
        power and utilisation samples, and print every idle gap as it is decided: GPU,
        start, length, the evidence that placed it (cuda: a host-side launch gap, µs;
        power: 20 ms samples; util: 200 ms duty cycle), its resolution and confidence, the
        processes feeding the GPU and the threads that launched last before and first
        after it. Time a process spends blocked in a synchronisation is GPU time, not a
        gap. With no process chosen, every process is watched. --save-events keeps the
        input so that --replay-events gives the same gaps later (the detector is a pure
        function of the event stream).
    """,
    examples="""
        # idle gaps of 5 ms or more on this node's GPUs, for a minute
        gpujitter gaps --duration 60s
        # gaps of 20 ms or more of one training job, as NDJSON
        gpujitter gaps --pid 4121 --min-gap 20ms --json
        # keep the evidence, and look at it again later
        gpujitter gaps --comm 'python*' --save-events run.ndjson
        gpujitter gaps --replay-events run.ndjson --min-gap 10ms
    """,
    add_arguments=add_arguments,
    run=run,
)
