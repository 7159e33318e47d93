"""`gpujitter record`: run the probes and write every event they emit into a trace file (or a
rotating directory of them) for `gpujitter report` and `gpujitter trace` to read later."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import Counter
from pathlib import Path

from gpujitter.cli.command import Command
from gpujitter.cli.gpus import add_nvml_source_args, nvml_backend, save_recording
from gpujitter.cli.options import (
    duration_arg_ns,
    parse_thresholds,
    path_arg,
    topology_from_args,
    watch_from_args,
)
from gpujitter.cli.output import print_json
from gpujitter.cli.probe import add_arguments as add_probe_arguments
from gpujitter.cli.probe import exit_status, precise_options
from gpujitter.daemon.service.config import check_parent, load_config
from gpujitter.daemon.service.own_scheduling import KEEP_UP_LEVELS, OwnScheduling
from gpujitter.daemon.service.runtime import EventSource, LiveSource, Runtime, Sink
from gpujitter.daemon.service.service import analysis_settings, trace_header
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.daemon.sinks.adapters import CaptureSink
from gpujitter.daemon.sinks.capture import TraceCapture
from gpujitter.daemon.sinks.rotation import Rotation
from gpujitter.errors import GpujitterError
from gpujitter.probes import registry
from gpujitter.probes.events import Event, ProbeStatus
from gpujitter.text import printable
from gpujitter.units import format_bytes, format_ns, parse_duration_ns, parse_size_bytes

# Without a terminal (a log, a pipe), progress is one line this often rather than every second.
PROGRESS_PLAIN_EVERY_NS = 10_000_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        required=True,
        type=path_arg,
        metavar="TRACE",
        help="trace file to write (must not exist); with rotation, a directory",
    )
    add_probe_arguments(p)
    p.add_argument("--no-nvml", action="store_true", help="do not sample the GPUs through NVML")
    p.add_argument(
        "--no-gpu-processes",
        action="store_true",
        help="do not watch every process NVML lists on a GPU (as `run --no-gpu-processes`)",
    )
    add_nvml_source_args(p)
    g = p.add_argument_group("rotation (writes a directory of traces, each complete)")
    g.add_argument("--rotate-size", metavar="SIZE", help="start a new file at SIZE (e.g. 100M)")
    g.add_argument("--rotate-age", metavar="TIME", help="start a new file every TIME (e.g. 1h)")
    g.add_argument("--keep-files", type=int, default=0, metavar="N",
                   help="keep at most N files in the directory, earlier recordings' counted: "
                   "the oldest are removed")  # fmt: skip
    g.add_argument("--keep-size", metavar="SIZE",
                   help="keep at most SIZE of files in all, likewise")  # fmt: skip


def rotation_from_args(args: argparse.Namespace) -> Rotation | None:
    """The rotation the options ask for; None without --rotate-size or --rotate-age. A value
    given is parsed even when empty (`--rotate-age ''` is a mistake, not "no rotation")."""
    size, age, keep_size = args.rotate_size, args.rotate_age, args.keep_size
    if size is None and age is None:
        if args.keep_files or keep_size is not None:
            raise GpujitterError("--keep-files/--keep-size need --rotate-size or --rotate-age")
        return None
    return Rotation(
        max_bytes=parse_size_bytes(size) if size is not None else 0,
        max_age_ns=parse_duration_ns(age, "s") if age is not None else 0,
        keep_files=args.keep_files,
        keep_bytes=parse_size_bytes(keep_size) if keep_size is not None else 0,
    )


def run(args: argparse.Namespace, source: EventSource | None = None) -> int:
    """Capture what the live probes deliver (or `source`: a stretch of events
    already in hand)."""
    names = registry.select(args.probes)
    overrides = parse_thresholds(args.threshold)
    rotation = rotation_from_args(args)
    duration_ns = duration_arg_ns(args)
    out: Path = args.output
    try:
        if rotation is None and out.exists():
            raise GpujitterError(f"{out} exists; remove it or choose another name")
        if rotation is not None and out.exists() and not out.is_dir():
            raise GpujitterError(f"{out}: rotation writes a directory, and this is a file")
        check_parent(out)
    except ValueError as err:
        raise GpujitterError(f"--output {out}: {err}") from None
    except OSError as err:  # a name too long, a folder on the way this user may not search
        raise GpujitterError(f"--output {out}: {err.strerror}") from None
    topology, watch = topology_from_args(args), watch_from_args(args)
    # The node's settings as the daemon reads them: the same gap length and kept idle floors
    # in the header, so that `report` reads this trace as it would a `run --record` one.
    config = load_config(None)
    backend = nvml_backend(args)
    # The daemon's live probes (probes, libcuda tracer, NVML sampler, the processes NVML
    # lists on a GPU), scheduled as the daemon schedules itself (compiling at nice 0, then
    # below the watched threads), its threads announced in the trace (meta.self): `report`
    # marks waits behind this process as self-inflicted.
    source = source or LiveSource(
        names, topology=topology, watch=watch, thresholds=overrides,
        options=precise_options(args, names),
        nvml=False if args.no_nvml else (backend if backend is not None else True),
        gpu_processes=not args.no_gpu_processes,
    )  # fmt: skip
    tally = _Tally(args.quiet, out)

    def sinks(runtime: Runtime) -> list[Sink]:
        assert runtime.pipeline is not None
        header = trace_header(topology, names, overrides, watch, runtime.pipeline.config)
        tally.capture = TraceCapture(out, header, rotation)
        tally.runtime = runtime
        return [CaptureSink(tally.capture), tally]

    runtime = Runtime(
        source, topology, sinks=sinks,
        analysis=lambda src: analysis_settings(config, src, _say)[0],
        duration_ns=duration_ns,
        own=OwnScheduling(level=len(KEEP_UP_LEVELS) - 1),
        say=_say,
    )  # fmt: skip
    # Analysed only for the settings: what the pipeline finds is not recorded (the
    # trace holds the evidence; `report` analyses it).
    runtime.run()
    save_recording(args, backend)

    capture, statuses, counts = tally.capture, tally.statuses, tally.counts
    assert capture is not None
    kept = [str(p) for p in capture.files if p not in capture.removed]
    summary = {
        "output": str(out),
        "files": kept,
        "removed": [str(p) for p in capture.removed],
        "events": capture.events,
        "bytes": capture.bytes,
        "lost": tally.lost(),
        "dropped": runtime.queue.dropped,
        "duration_s": round((time.monotonic_ns() - runtime.start_ns) / 1e9, 3),
        "kinds": dict(sorted(counts.items())),
        "probes": {name: dataclasses.asdict(s) for name, s in statuses.items()},
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"recorded {capture.events} events ({format_bytes(capture.bytes)}) into "
            f"{printable(str(out))}"
            + (f" ({len(kept)} files)" if rotation is not None else "")
            + f"; {summary['lost']} lost"
            + (
                f"; removed the oldest {len(capture.removed)} file(s) there (earlier "
                "recordings' count too) to keep within --keep-files/--keep-size"
                if capture.removed
                else ""
            ),
            file=sys.stderr,
        )
        for s in statuses.values():
            print(printable(f"  probe {s.probe}: {s.state} {s.reason}".rstrip()), file=sys.stderr)
    return exit_status(statuses)


def _say(text: str) -> None:
    print(printable(f"# {text}"), file=sys.stderr, flush=True)


class _Tally(Sink):
    """What was recorded, by kind, and each probe's last health; progress on stderr: one
    refreshed line on a terminal, else a line every PROGRESS_PLAIN_EVERY_NS."""

    def __init__(self, quiet: bool, out: Path) -> None:
        self.counts: Counter[str] = Counter()
        self.statuses: dict[str, ProbeStatus] = {}
        self.capture: TraceCapture | None = None
        self.runtime: Runtime | None = None
        self.progress = _Progress(quiet)
        self.out = out

    def event(self, ev: Event) -> None:
        if isinstance(ev, ProbeStatus):
            self.statuses[ev.probe] = ev
        self.counts[ev.KIND] += 1

    def lost(self) -> int:
        dropped = self.runtime.queue.dropped if self.runtime else 0
        return sum(s.lost_kernel for s in self.statuses.values()) + dropped

    def tick(self, now_ns: int, status: DaemonStatus) -> None:
        if self.capture is not None and self.runtime is not None:
            r = self.capture
            self.progress.show(self.out, now_ns - self.runtime.start_ns, r.events, r.bytes,
                               self.lost())  # fmt: skip

    def close(self) -> None:
        self.progress.done()


class _Progress:
    """Events, bytes and losses on stderr: one refreshed line on a terminal, else a line every
    PROGRESS_PLAIN_EVERY_NS."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.every_ns = 1_000_000_000 if self.tty else PROGRESS_PLAIN_EVERY_NS
        self.last_ns = 0

    def show(self, out: Path, elapsed_ns: int, events: int, size: int, lost: int) -> None:
        if self.quiet or elapsed_ns - self.last_ns < self.every_ns:
            return
        self.last_ns = elapsed_ns
        line = (
            f"recording {out}: {format_ns(elapsed_ns)}, {events} events, "
            f"{format_bytes(size)}, {lost} lost"
        )
        print(
            f"\r{line}\x1b[K" if self.tty else line, end="" if self.tty else "\n", file=sys.stderr
        )

    def done(self) -> None:
        if self.tty and not self.quiet and self.last_ns:
            print(file=sys.stderr)


COMMAND = Command(
    name="record",
    summary="record what the probes see into a trace file, for later analysis",
    description="""
        Attach the probes (the default set, or the PROBEs named) and the NVML sampler,
        following the processes NVML lists on a GPU, and write every event they emit, with
        their health reports, into TRACE (the evidence `gpujitter run --record` keeps, so
        `gpujitter report` reads both alike): a checksummed, append-only file whose header
        records this node's topology, the clock reference, the probes, thresholds and the
        analysis settings of this node's daemon (gaps.min_gap and the idle floors kept in
        state.dir, from /etc/gpujitter/gpujitter.toml and GPUJITTER_* variables)
        (docs/trace-format.md). Ctrl-C or SIGTERM stops cleanly. With --rotate-size or
        --rotate-age, TRACE is a directory of complete traces that `gpujitter report` and
        `gpujitter trace` read as one, and --keep-files/--keep-size bound what it holds.
        Progress (events, bytes, lost) goes to stderr; --json prints a summary at the end.
        Exits 1 when none of the probes could run (the trace then holds only the NVML side).
    """,
    examples="""
        # one minute of the default probes into one file
        gpujitter record -o node.gjtrace --duration 60s
        # a long recording of one job, 100 MiB per file, at most 2 GiB kept
        gpujitter record -o traces/ --comm 'python*' --rotate-size 100M --keep-size 2G
        # what was recorded
        gpujitter trace node.gjtrace
    """,
    add_arguments=add_arguments,
    run=run,
)
