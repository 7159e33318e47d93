"""`gpujitter gaps`: detect GPU idle gaps live (libcuda uprobes + NVML samples through the
daemon's gap detector) and print each one as it is decided; or replay a saved event stream
through the same detector."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import IO

from gpujitter.cli.command import Command
from gpujitter.cli.gpus import add_nvml_source_args, nvml_backend, save_recording
from gpujitter.cli.options import add_watch_args, duration_arg_ns, path_arg, watch_from_args
from gpujitter.cli.output import print_ndjson
from gpujitter.cli.progress import Progress
from gpujitter.daemon.analysis.gaps import UNKNOWN_GPU, GapConfig
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.offline.recordings import TRACE, Boot, open_recording
from gpujitter.daemon.service.config import parse_value
from gpujitter.daemon.service.runtime import ListSource, LiveSource, Runtime, Sink
from gpujitter.errors import GpujitterError
from gpujitter.files import can_create
from gpujitter.probes.clock import Clocks, clock_ref, format_wall
from gpujitter.probes.events import ClockRef, Event, ProbeStatus, to_record
from gpujitter.probes.host import HostPaths
from gpujitter.text import dumps, printable
from gpujitter.units import format_ns, with_unit


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-d", "--duration", metavar="TIME", help="stop after TIME (e.g. 30s)")
    p.add_argument(
        "--min-gap",
        default="5ms",
        metavar="TIME",
        help="report idle gaps at least this long (default 5ms, a bare number is in ms)",
    )
    p.add_argument(
        "--quiet-stretch",
        metavar="TIME",
        help="the tracer reports launches after a quiet stretch this long (default 1ms)",
    )
    p.add_argument(
        "--sync-block",
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
        type=path_arg,
        metavar="FILE",
        help="write every input event to a new FILE (NDJSON) for --replay-events",
    )
    p.add_argument(
        "--replay-events",
        type=path_arg,
        metavar="FILE",
        help="run the detector over events saved with --save-events instead of live probes",
    )
    add_watch_args(p)
    add_nvml_source_args(p)


class Printer:
    """Gaps (and probe health changes) as text lines or NDJSON records."""

    def __init__(self, as_json: bool, clocks: Clocks | None) -> None:
        self.as_json = as_json
        self.clocks = clocks  # None: a recording without a wall clock (an old log)
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
        """Wall time, or seconds since boot for a recording without a clock (an old log)."""
        return format_wall(self.clocks.at(ts_ns), ts_ns) if self.clocks else f"t={ts_ns / 1e9:.6f}s"

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


class _Shown(Sink):
    """The runtime's output for `gaps`: each gap decided; live, each probe health change;
    with `analysed` (an attribution log), the gaps as the log's attributions carry them."""

    def __init__(self, out: Printer, *, live: bool, analysed: bool = False) -> None:
        self.out = out
        self.live = live
        self.analysed = analysed

    def event(self, ev: Event) -> None:
        if self.live and isinstance(ev, ProbeStatus):
            self.out.status(ev)
        elif self.analysed and isinstance(ev, Attribution):
            self.out.gap(ev.gap)
        elif isinstance(ev, ClockRef) and self.out.clocks is not None:
            self.out.clocks.add(ev)  # the wall clock was set: the gaps after it by the new one

    def finding(self, found: Event) -> None:
        if isinstance(found, GpuGap):
            self.out.gap(found)


class SavedEvents(Sink):
    """Every input event as one NDJSON line (--save-events), after the wall clock that the
    readers of the file place them with (docs/postmortem.md). Its name is checked before
    the probes are made (a file that exists is refused, as every writer of recordings does)
    and the file made once they deliver: a start that fails leaves none behind."""

    def __init__(self, path: Path, ref: ClockRef) -> None:
        can_create(path, "--save-events")
        self.path = path
        self.ref = ref
        self.file: IO[bytes] | None = None

    def started(self, runtime: Runtime) -> None:
        try:
            self.file = open(self.path, "xb")  # noqa: SIM115 (closed with the runtime)
        except OSError as err:
            raise GpujitterError(f"--save-events {self.path}: {err.strerror}") from None
        self._write(self.ref)

    def event(self, ev: Event) -> None:
        self._write(ev)

    def _write(self, ev: Event) -> None:
        try:
            if self.file is not None:
                self.file.write(dumps(to_record(ev)) + b"\n")
        except OSError as err:  # its disk, not standard output
            raise GpujitterError(f"--save-events {self.path}: {err.strerror}") from None

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError as err:
                raise GpujitterError(f"--save-events {self.path}: {err.strerror}") from None


def analysis_from_args(args: argparse.Namespace) -> AnalysisConfig:
    """The detector's settings; --min-gap read as `run --min-gap` reads it (a bare number is
    ms), within the same bounds."""
    min_gap_ns = parse_value("gaps.min_gap", with_unit(args.min_gap, "ms"), "--min-gap")
    return AnalysisConfig(gaps=GapConfig(min_gap_ns=min_gap_ns))


def _tracer_time(value: str | None, flag: str, name: str) -> int:
    """--quiet-stretch, --sync-block: the cuda probe's threshold `name` (1 ms unless given),
    read as every threshold is (a bare number is ms here)."""
    given = f"cuda.{name}={with_unit('1ms' if value is None else value, 'ms')}"
    ((_, ns),) = parse_value("probes.thresholds", given, flag)
    return int(ns)


# Options that shape what live probes see or where their events go: a replay has none.
LIVE_ONLY = ("duration", "quiet_stretch", "sync_block", "libcuda", "save_events", "nvml_replay",
             "nvml_record", "pid", "comm", "cgroup", "pod", "slurm_job")  # fmt: skip


def _restart_said(out: Printer, boot: Boot) -> None:
    """Where a later boot's gaps begin: a line on standard error (the boots' spans are said
    at the end), or with --json a `recording.boot` record before its gaps."""
    if out.as_json:
        print_ndjson({"type": "recording.boot", "boot": boot.number, "boot_id": boot.boot_id,
                      "clock": to_record(boot.clock)})  # fmt: skip
        return
    which = boot.boot_id[:8] or "no boot id (a restart told by its times)"
    print(printable(f"# the node restarted: boot {boot.number}, {which}, its clock from "
                    f"{format_wall(boot.clock, boot.clock.ts_ns, date=True)}; the gaps below "
                    "are this boot's, through a detector of their own"),
          file=sys.stderr)  # fmt: skip


def replay(args: argparse.Namespace, out: Printer) -> int:
    """The detector over any recording's events; an attribution log's gaps as it logged them
    (it holds no events to detect from)."""
    analysis = analysis_from_args(args)  # a bad value said before the file is read
    try:
        rec = open_recording([args.replay_events])
    except GpujitterError as err:
        raise GpujitterError(f"--replay-events: {err}") from None
    if rec.kind != TRACE and not args.json:
        print(printable(f"# reading {rec.what}"), file=sys.stderr)
    boots: list[tuple[Boot, Clocks | None]] = []
    # on a terminal the gaps printed as they are found show how far it is: no line between
    with Progress(rec.size, shown=sys.stderr.isatty() and not sys.stdout.isatty()) as progress:
        for boot in rec.boots():  # each through its own detector, by its own clock
            out.clocks = boot.clocks() if rec.wall_clock else None
            boots.append((boot, out.clocks))
            if boot.number > 1:
                _restart_said(out, boot)
            Runtime(
                ListSource(progress.events(boot, boot.position), label=rec.what),
                boot.header.topology,
                sinks=[_Shown(out, live=False, analysed=rec.analysed)],
                analysis=None if rec.analysed else lambda _: analysis,
                signals=False,
            ).run()  # fmt: skip
            if out.clocks is not None and not args.json:  # what moved the times printed
                for note in out.clocks.notes:
                    print(printable(f"# {note}"), file=sys.stderr)
    if len(boots) > 1 and not args.json:
        for boot, clocks in boots:
            print(printable(f"# {boot.line(clocks or Clocks(boot.clock))}"), file=sys.stderr)
    for note in rec.damage:  # what the reading tolerated (a torn tail, skipped kinds)
        print(printable(f"damage: {note}"), file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    ref = clock_ref()
    out = Printer(args.json, Clocks(ref))
    if args.replay_events is not None:
        given = [f"--{name.replace('_', '-')}" for name in LIVE_ONLY if getattr(args, name)]
        if given:  # they would do nothing, without a word (--save-events: no file)
            raise GpujitterError(f"--replay-events reads saved events: {', '.join(given)} "
                                 "would do nothing with it")  # fmt: skip
        return replay(args, out)
    from gpujitter.probes.topology import load_topology

    duration_ns = duration_arg_ns(args)
    thresholds = {
        "cuda": {
            "quiet": _tracer_time(args.quiet_stretch, "--quiet-stretch", "quiet"),
            "sync": _tracer_time(args.sync_block, "--sync-block", "sync"),
        }
    }
    analysis = analysis_from_args(args)
    missing = [path for path in args.libcuda if not os.path.exists(path)]
    if missing:  # the tracer would only say "no libcuda attached yet"
        raise GpujitterError(f"--libcuda {missing[0]}: no such file")
    odd = [path for path in args.libcuda if not os.path.isfile(path)]
    if odd:  # a FIFO's open would wait for ever; a directory or a device is no library
        raise GpujitterError(f"--libcuda {odd[0]}: not a regular file")
    for path in args.libcuda:  # else it would wait, "degraded", for calls that never come
        _check_libcuda(path)
    backend = nvml_backend(args)  # None with --no-nvml (refused beside its options)
    watch, topology = watch_from_args(args), load_topology(nvml=False if args.no_nvml else None)
    saved = SavedEvents(args.save_events, ref) if args.save_events else None
    # The libcuda tracer and the NVML sampler of the daemon's live probes, following
    # the processes NVML lists on a GPU.
    source = LiveSource(
        ["cuda"],
        topology=topology,
        watch=watch,
        thresholds=thresholds,
        options={"cuda": {"libcuda": args.libcuda}} if args.libcuda else {},
        nvml=False if args.no_nvml else (backend if backend is not None else True),
        gpu_processes=True,
    )
    sinks: list[Sink] = [_Shown(out, live=True), *([saved] if saved else [])]

    def started(runtime: Runtime) -> None:
        if not args.json:
            print(printable(f"# gaps >= {args.min_gap}; watching {watch.describe()}"),
                  file=sys.stderr)  # fmt: skip
        for line in watch.unwatchable(HostPaths()):  # a warning: in --json too
            print(printable(f"# {line}"), file=sys.stderr)

    try:
        Runtime(source, topology, sinks=sinks, analysis=lambda _: analysis,
                duration_ns=duration_ns).run(started)  # fmt: skip
    finally:
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


def _check_libcuda(path: str) -> None:
    """GpujitterError unless `path` is an ELF file that exports the launch the tracer must
    hook (other files named by mistake: a script, a trace, the wrong library)."""
    from gpujitter.probes.cuda import FUNC_NAMES
    from gpujitter.probes.elf import ElfFile

    try:
        with ElfFile(path) as elf:
            exported = elf.exported_functions()
    except OSError as err:
        raise GpujitterError(f"--libcuda {path}: {err.strerror}") from None
    except ValueError as err:  # its message names the file
        raise GpujitterError(f"--libcuda {err}") from None
    if FUNC_NAMES[0] not in exported:
        raise GpujitterError(f"--libcuda {path}: exports no {FUNC_NAMES[0]}; not a libcuda")
