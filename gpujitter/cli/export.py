"""`gpujitter export`: a recording as a timeline for Perfetto's UI or chrome://tracing, with
the GPU gaps and their causes over the feeding threads' evidence, optionally merged with a
PyTorch profiler trace of the same run (daemon/offline/timeline.py)."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import stat
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gpujitter.cli.command import Command
from gpujitter.cli.options import STDOUT, add_traces_arg, path_arg
from gpujitter.cli.output import print_json
from gpujitter.cli.progress import Progress
from gpujitter.errors import GpujitterError
from gpujitter.files import mode_of, read_regular
from gpujitter.text import printable


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_traces_arg(p)
    p.add_argument(
        "-o", "--output", required=True, metavar="FILE",
        help="the timeline to write, a new file (one that exists is refused: a recording "
             "named by mistake stays whole) or a pipe or device (Chrome trace JSON; gzipped "
             "when FILE ends in .gz; - for standard output, the summary then on standard "
             "error)",
    )  # fmt: skip
    p.add_argument(
        "--merge", type=path_arg, metavar="PROFILER_TRACE",
        help="a PyTorch profiler (Kineto) trace of the same run, put on the same clock",
    )  # fmt: skip


# Far past a profiler trace of a long run (they run to hundreds of MB); a larger file, or one
# that decompresses to more, is not one, and all of it is held to be parsed.
MAX_PROFILER_BYTES = 1 << 30
# Parsed, a JSON value costs ~50-100 bytes however short its text: `{},` 31 times its size
# (3 bytes of text per dict), a real profiler trace 3.3 times (21 bytes per value, the
# H200's). Values are counted by their separators (commas in strings too) before the parse,
# and capped at twice what a real trace of MAX_PROFILER_BYTES holds (traces with denser
# values, or many commas in names, stay in), so that no input costs more than a few times
# the memory of the largest real one.
MAX_PROFILER_VALUES = MAX_PROFILER_BYTES // 10


def _load_profiler(path: Path) -> Any:
    raw = read_regular(path, "--merge", MAX_PROFILER_BYTES, "not a profiler trace")
    try:
        if raw[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                raw = f.read(MAX_PROFILER_BYTES + 1)  # a gzip bomb stops here
            if len(raw) > MAX_PROFILER_BYTES:
                raise GpujitterError(f"--merge {path}: decompresses to more than "
                                     f"{MAX_PROFILER_BYTES >> 30} GiB; not a profiler "
                                     "trace")  # fmt: skip
        if raw.count(b",") > MAX_PROFILER_VALUES:
            raise GpujitterError(f"--merge {path}: more than {MAX_PROFILER_VALUES:,} JSON "
                                 "values; larger than any profiler trace of one run "
                                 "(shorten the profiler's schedule)")  # fmt: skip
        return orjson.loads(raw)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise GpujitterError(f"--merge {path}: {getattr(err, 'strerror', None) or err}") from None
    except orjson.JSONDecodeError:
        raise GpujitterError(f"--merge {path}: not JSON (want a Chrome trace)") from None


@contextlib.contextmanager
def _created(name: str) -> Iterator[BinaryIO | gzip.GzipFile]:
    """The timeline's output: a new file (never a file that exists: a recording given as -o
    by mistake stays whole), removed again when the export fails; a pipe or a device
    (/dev/null, a shell's process substitution) written through; or standard output."""
    if name == STDOUT:
        # left open: what fails there (a full disk, a closed descriptor, a reader that left)
        # is main()'s to tell, as for every command's output
        yield sys.stdout.buffer
        return
    if not name:
        raise GpujitterError("-o: an empty file name")
    path = Path(name)
    try:
        if (mode := mode_of(path)) and not stat.S_ISREG(mode):
            if stat.S_ISDIR(mode):
                raise GpujitterError(f"{path} is a directory")
            raw, made = open(path, "wb"), False  # noqa: SIM115 (closed below) a pipe, a device
        else:  # O_EXCL: a file that exists is refused, one made meanwhile too
            raw, made = open(path, "xb"), True  # noqa: SIM115 (closed below)
    except FileExistsError:
        raise GpujitterError(f"{path} exists; remove it or choose another name") from None
    except OSError as err:
        raise GpujitterError(f"cannot create {path}: {err.strerror}") from None
    try:
        with raw:
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=raw, mode="wb") as packed:
                    yield packed
            else:
                yield raw
    except BaseException as err:
        if made:
            path.unlink(missing_ok=True)  # ours: never leave half a timeline behind
        if isinstance(err, OSError) and err.filename is None:  # the file's disk, size limit
            raise GpujitterError(f"{path}: {err.strerror}") from None
        raise


def run(args: argparse.Namespace) -> int:
    from gpujitter.daemon.analysis.pipeline import AnalysisConfig
    from gpujitter.daemon.offline.recordings import open_recording
    from gpujitter.daemon.offline.timeline import (
        export,
        profiler_clock,
        profiler_events,
        steps_in_profile,
    )

    traces = open_recording(args.traces)
    if traces.analysed:
        raise GpujitterError(
            f"{traces.what} holds no events to draw (threads, samples): export a trace or "
            "an events file"
        )
    header = traces.header
    clock, extra, profiler = None, [], {}
    wall = traces.clocks()  # given the recording's references as the export reads them
    if args.merge:
        profiler = _load_profiler(args.merge)
        extra = profiler_events(profiler)
        clock = profiler_clock(profiler, wall)
    with _created(args.output) as out, Progress(traces.size) as progress:
        writer = export(progress.events(traces, traces.position), out, header.topology,
                        AnalysisConfig.from_record(header.analysis), clock, extra)  # fmt: skip
        if args.output == STDOUT:  # all of it out (or failed) before the summary
            out.flush()
    # With a profiler's trace, the timeline is on the wall clock: each setting of it during
    # the recording moved the times after it, said as report says it, and one within the
    # profiler's span may leave the two apart there.
    said = wall.notes + steps_in_profile(wall, profiler, extra) if args.merge else []
    # with the timeline on standard output, what tells of it goes beside it
    report = sys.stderr if args.output == STDOUT else sys.stdout
    summary = {"output": str(args.output), "gaps": writer.gaps, "slices": writer.slices,
               "merged_events": len(extra), "clock": said, "damage": traces.damage}  # fmt: skip
    if args.json:
        print_json(summary, report)
    else:
        merged = f", {len(extra)} profiler events merged" if args.merge else ""
        where = "standard output" if args.output == STDOUT else args.output
        # the name and the damage notes quote what the user and the files gave: shown inert
        print(printable(f"{where}: {writer.gaps} gaps, {writer.slices} slices{merged}; "
                        "open it in https://ui.perfetto.dev or chrome://tracing"),
              file=report)  # fmt: skip
        for note in said:
            print(printable(note), file=report)
        for note in traces.damage:
            print(printable(f"damage: {note}"), file=report)
    return 0


COMMAND = Command(
    name="export",
    summary="a recording as a timeline for Perfetto or chrome://tracing",
    description="""
        Replay recorded traces through the daemon's own gap detection and attribution and
        write a Chrome trace-event JSON timeline: a track per GPU (NVML utilisation and
        power, each idle gap with its causes as child slices) and a track per watched
        thread (off-CPU time, run-queue waits with the task that ran instead, faults, IRQ
        time, allocator and CUDA calls). Perfetto's UI and chrome://tracing open it.
        --merge adds a PyTorch profiler trace of the same run on the same clock, so that
        a gap sits under the training step that suffered it.
    """,
    examples="""
        # a recording as a timeline
        gpujitter export /var/lib/gpujitter/traces -o run.json
        # beside the PyTorch profiler's trace of the same run, compressed
        gpujitter export run.gjtrace --merge trace.pt.trace.json -o merged.json.gz
        # to standard output, e.g. compressed by another tool
        gpujitter export run.gjtrace -o - | zstd > run.json.zst
    """,
    add_arguments=add_arguments,
    run=run,
    writes_files=True,
)
