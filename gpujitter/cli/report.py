"""`gpujitter report`: the post-mortem. Replays recorded traces through the daemon's own
pipeline (gap detection, then attribution, with the settings recorded in the trace header),
and summarises per GPU and per cause, with the top gaps and their breakdown."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import stat
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TextIO

from gpujitter.cli.command import Command
from gpujitter.cli.options import STDOUT, add_traces_arg, count
from gpujitter.cli.output import json_bytes, table
from gpujitter.cli.progress import Progress
from gpujitter.daemon.analysis.describe import gpu_name, one_line
from gpujitter.daemon.analysis.engine.causes import cause_label
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, Pipeline
from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.offline.longest import Longest
from gpujitter.daemon.offline.recordings import TRACE, Boot, Recording, open_recording
from gpujitter.daemon.sinks.trace import TraceHeader, file_identity
from gpujitter.errors import GpujitterError
from gpujitter.files import open_regular
from gpujitter.probes.clock import Clocks, format_wall, wall_time
from gpujitter.probes.events import ClockRef, Event, to_record
from gpujitter.probes.topology import Topology
from gpujitter.text import printable
from gpujitter.units import format_ns, parse_duration_ns

if TYPE_CHECKING:
    from gpujitter.daemon.offline.html_report import Page

_OFFSET = re.compile(r"^\+(.+)$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_traces_arg(p)
    p.add_argument(
        "--from",
        dest="start",
        metavar="WHEN",
        help="only gaps starting at or after WHEN: HH:MM:SS[.fff] (local, on the "
        "recording's first day), an ISO 8601 date and time (2026-12-01T08:34:19Z, with an "
        "offset or Z; local without), or +OFFSET from the recording's start (+90s)",
    )
    p.add_argument("--to", dest="end", metavar="WHEN", help="only gaps starting before WHEN")
    p.add_argument("--gpu", type=int, action="append", default=[],
                   help="only this GPU (repeatable)")  # fmt: skip
    p.add_argument("--html", metavar="FILE",
                   help="also write the report as one self-contained HTML page (charts "
                   "of idle time by cause, gap durations, culprits, fixes); - for standard "
                   "output, the report then on standard error. An existing file is replaced "
                   "only if it is such a page")  # fmt: skip
    p.add_argument("--top", type=count, default=10, metavar="N",
                   help="show the N longest gaps with their breakdown (default 10)")  # fmt: skip


@dataclass(frozen=True, slots=True)
class When:
    """A user's point in time: ns of the wall clock (`wall`), or of the recording's monotonic
    clock (+OFFSET). A record is set against a wall time by the clock of its own time, the
    one its time is printed by: a clock set during the run moves both alike."""

    ns: int
    wall: bool

    def of(self, clocks: Clocks, mono_ns: int) -> int:
        """A record's time on this point's clock."""
        return clocks.wall_ns(mono_ns) if self.wall else mono_ns


def parse_when(text: str, rec: Recording) -> When:
    """A user's point in time, on the clock it names."""
    header = rec.header
    m = _OFFSET.match(text.strip())
    if m:
        return When(header.start_ns + parse_duration_ns(m.group(1), "s"), wall=False)
    if not rec.wall_clock:
        raise GpujitterError(f"{rec.what} has no wall clock: give times as +OFFSET (e.g. +90s)")
    start = wall_time(header.clock, header.start_ns)
    if start is None:
        raise GpujitterError(
            f"{rec.what}'s wall clock is out of range (damaged?): give times as +OFFSET"
        )
    parsed = _clock_time(text.strip(), start)
    if parsed is None:
        raise GpujitterError(
            f"bad time {text!r}: want HH:MM:SS[.fff], an ISO 8601 date and time "
            "(2026-12-01T08:34:19Z, '2026-12-01 08:34:19') or +OFFSET (e.g. +90s)"
        )
    if parsed.tzinfo is None:  # local time, as the report prints it
        parsed = parsed.replace(tzinfo=start.tzinfo)
    return When(round(parsed.timestamp() * 1e9), wall=True)


def chart_end(when: When | None, seen_ns: int) -> int:
    """Where the page's charts begin or end: at an offset given, a point of the monotonic
    clock; else at the first or the last event in the range (a wall time may be no one
    point of it: the clock set around it shows some times twice, or none)."""
    return when.ns if when is not None and not when.wall else seen_ns


def _clock_time(text: str, start: datetime) -> datetime | None:
    """HH:MM:SS[.fff] on the recording's first day, or an ISO 8601 date and time."""
    for fmt in ("%H:%M:%S.%f", "%H:%M:%S"):
        try:
            t = datetime.strptime(text, fmt)
        except ValueError:
            continue
        return t.replace(year=start.year, month=start.month, day=start.day)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def override_line(topo: Topology) -> str:
    """The header line naming the override in force and what it placed; "" without one."""
    if not topo.override:
        return ""
    return "; ".join(
        filter(None, [f"topology override in force: {topo.override}", topo.unknown_gpu_note()])
    )


def may_replace(path: Path) -> None:
    """--html's file, checked before the work: a page this command wrote (the report run
    again) is replaced, and so is an empty file; anything else there, a recording or a
    document named by mistake, is refused, not lost. What is no file (a pipe, a terminal,
    /dev/null) is written through; a link is judged by what it points at."""
    from gpujitter.daemon.offline.html_report import is_report_page

    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise GpujitterError(f"--html {path}: is a directory")
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return
        with open_regular(path, "--html") as f:
            head = f.read(256)
    except FileNotFoundError:
        return
    except OSError as err:  # a name too long, a folder this user may not search
        raise GpujitterError(f"--html {path}: {err.strerror}") from None
    if not is_report_page(head):
        raise GpujitterError(
            f"--html {path} exists and is no gpujitter report page; remove it or choose "
            "another name"
        )


def write_html(
    path: Path | None,
    page: Page,
    header: TraceHeader,
    traces: Recording,
    start_ns: int,
    end_ns: int,
    boots: int = 1,
) -> None:
    from gpujitter.daemon.offline.html_report import TITLE

    watching = f"; watching {header.watch or 'everything'}" if traces.kind == TRACE else ""
    meta = [
        reading_line(traces) + watching,
        *([] if traces.wall_clock else ["no wall clock in it: times are since the node booted"]),
        *filter(None, [override_line(header.topology)]),
        *page.clocks.notes,
        *([f"the node restarted during the recording: this page is its first boot's, of "
           f"{boots} (the text report and --json give each); name each boot's files on "
           "their own for a page of it"] if boots > 1 else []),
        *(f"damage: {note}" for note in traces.damage),
    ]  # fmt: skip
    text = page.render(title=f"{TITLE}{header.host}", meta=meta,
                       start_ns=start_ns, end_ns=end_ns)  # fmt: skip
    if path is None:  # standard output: what fails there is main()'s to tell, as for any output
        sys.stdout.flush()
        sys.stdout.buffer.write(text.encode("utf-8"))  # the page says it is UTF-8
        return
    # A file is written beside it and renamed over it: a full disk or an interrupt leaves the
    # page that was there (or none), never a truncated one. Anything else (/dev/stdout, a
    # pipe, a link) is written through as it is, never replaced.
    whole = not path.is_symlink() and (path.is_file() or not path.exists())
    tmp = path.with_name(f".{path.name}.tmp") if whole else path
    try:
        tmp.write_text(text, encoding="utf-8")
        if whole:
            if path.exists():  # the page it replaces keeps its permissions
                os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
            os.replace(tmp, path)
    except BaseException as err:  # a full disk, or an interrupt or SIGTERM midway
        if whole:
            with contextlib.suppress(OSError):  # not ours to remove if a directory
                tmp.unlink()
        if not isinstance(err, OSError):
            raise
        # the file beside it may be what failed (a directory that takes no new file)
        beside = f" (writing {tmp.name} beside it)" if whole and tmp != path else ""
        raise GpujitterError(f"--html {path}: {err.strerror}{beside}") from None


def _page(clocks: Clocks, top: int) -> Page:
    from gpujitter.daemon.offline.html_report import Page

    return Page(clocks, top)


class Summary:
    """Per GPU its gaps, idle time and time by cause, and the `top` longest gaps, taken in
    one attribution at a time: the text report holds these, never every attribution (a
    day's recording of a busy node has hundreds of thousands, ~3 KB each)."""

    def __init__(self, top: int) -> None:
        self.per_gpu: dict[int, dict[str, Any]] = defaultdict(
            lambda: {"gaps": 0, "idle_ns": 0, "causes": Counter()}
        )
        self.longest: Longest[Attribution] = Longest(top, lambda a: a)

    @property
    def attributed(self) -> int:
        return self.longest.added

    def add(self, a: Attribution) -> None:
        s = self.per_gpu[a.gpu]
        s["gaps"] += 1
        s["idle_ns"] += a.dur_ns
        for part in a.parts:
            s["causes"][part.cause] += part.ns
        self.longest.add(a)

    def by_gpu(self) -> dict[int, dict[str, Any]]:
        return {
            gpu: {**s, "causes": dict(s["causes"].most_common())}
            for gpu, s in sorted(self.per_gpu.items())
        }


class JsonSpool:
    """`report --json`'s attributions, each encoded as it comes (as it will sit in the
    document) and written aside, then copied out after the document's head: the summary
    comes first, and is known only at the end."""

    def __init__(self) -> None:
        # A file, not memory: the attributions' JSON is the output's size (83 MB for a 172 MB
        # trace, gigabytes for a day of a busy node), which is what the report must not hold.
        # Anonymous, so gone when closed or when the process ends, however it ends; in
        # TMPDIR, else /tmp. Opened before the reading, so a directory that takes no file
        # fails at once, not after half an hour.
        try:
            self._file: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115  # __exit__
        except OSError as err:
            raise _spool_error(err) from None
        self.count = 0

    def __enter__(self) -> JsonSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        # Closing writes what is still buffered: on a full disk that fails again, and would
        # hide the error said (as standard output's); the file goes all the same.
        with contextlib.suppress(OSError):
            self._file.close()

    def add(self, a: Attribution) -> None:
        item = json_bytes(to_record(a), depth=2)  # in "attributions", in the document
        try:
            self._file.write((b",\n    " if self.count else b"\n    ") + item)
        except OSError as err:  # a full disk, a quota: the temporary file's, not the output's
            raise _spool_error(err) from None
        self.count += 1

    def print_document(self, members: dict[str, Any], stream: TextIO) -> None:
        """The document of `members` and then "attributions", the list of those added, as
        print_json writes it: its head, then the spooled attributions copied in chunks."""
        head = json_bytes({**members, "attributions": []})
        assert head.endswith(b"[]\n}")
        try:
            self._file.seek(0)  # (what is still buffered is written first: it may fail)
        except OSError as err:
            raise _spool_error(err) from None
        stream.flush()  # what was printed before comes first
        out = stream.buffer  # what fails there is main()'s to tell, as for any output
        if not self.count:
            out.write(head + b"\n")
        else:
            out.write(head[: -len(b"]\n}")])
            while chunk := self._read():
                out.write(chunk)
            out.write(b"\n  ]\n}\n")
        stream.flush()

    def _read(self) -> bytes:
        try:
            return self._file.read(1 << 20)
        except OSError as err:
            raise _spool_error(err) from None


def _spool_error(err: OSError) -> GpujitterError:
    # main() would take an OSError without a file name for standard output's
    where = f" in {tempfile.tempdir}" if tempfile.tempdir else ""
    return GpujitterError(
        f"--json: the attributions' temporary file{where}: {err.strerror or err} "
        "(TMPDIR names another directory)"
    )


def late_note(pipeline: Pipeline) -> list[str]:
    """What the engine took too late to attribute with, said: records out of time order by
    more than its lateness (hand-edited, or recordings of one node overlapping in time read
    one after the other) left the gaps they fell in attributed without them, in silence."""
    late = pipeline.engine.stats().late_events
    if not late:
        return []
    after = format_ns(pipeline.config.engine.lateness_ns)
    return [f"{late} events came over {after} after later ones (out of time order, "
            "recordings of one node that overlap in time, or a restart of it between files): "
            "the gaps they fell in were attributed without them"]  # fmt: skip


def reading_line(rec: Recording) -> str:
    """What is being read, as the first line of a report says it."""
    header = rec.header
    if rec.kind != TRACE:
        return f"{rec.what}: {', '.join(map(str, rec.paths))}"
    return (
        f"{header.host} ({header.kernel}), recorded from "
        f"{format_wall(header.clock, header.start_ns, date=True)}; {len(rec.paths)} file(s); "
        f"probes: {', '.join(header.probes)}"
    )


def run(args: argparse.Namespace) -> int:
    if args.html == "":  # the page was asked for, and would go nowhere
        raise GpujitterError("--html: an empty file name")
    traces = open_recording(args.traces)
    html = None if args.html in (None, STDOUT) else Path(args.html)
    if html and file_identity(html) in {file_identity(p) for p in traces.files}:
        raise GpujitterError(f"--html {args.html} is a recording being read; choose another name")
    if html:
        may_replace(html)
    header = traces.header
    start = parse_when(args.start, traces) if args.start is not None else None
    end = parse_when(args.end, traces) if args.end is not None else None
    # (a wall time and an offset are on two clocks: which comes first is known only as the
    # recording is read, and an empty range is said then)
    if start is not None and end is not None and start.wall == end.wall and end.ns <= start.ns:
        raise GpujitterError(f"--to {args.end} is not after --from {args.start}")
    reports: list[BootReport] = []
    seen_gpus: set[int] = set()
    span: list[int] = []  # first and last event time in the range, for the HTML charts
    page: Page | None = None

    with JsonSpool() if args.json else contextlib.nullcontext() as spool:
        with Progress(traces.size) as progress:
            for boot in traces.boots():
                # a later boot's monotonic clock is another: an offset is set against it by
                # the wall time it is on the first boot's clock
                first = reports[0].clocks if reports else None
                this = BootReport(boot, boot.clocks(), Summary(args.top),
                                  _on(start, first), _on(end, first))  # fmt: skip
                reports.append(this)
                if page is None and args.html:  # (the page is the first boot's clock's)
                    page = _page(this.clocks, args.top)
                _read_boot(this, traces, progress, args, seen_gpus, span, page, spool)
        several = len(reports) > 1
        traces.damage += [f"boot {r.boot.number}: {n}" if several else n
                          for r in reports for n in r.late]  # fmt: skip
        # with the page on standard output, the report goes beside it
        told = sys.stderr if args.html == STDOUT else sys.stdout
        if page is not None:
            first_ns, last_ns = span or [header.start_ns] * 2
            write_html(html, page, header, traces, chart_end(start, first_ns),
                       chart_end(end, last_ns), len(reports))  # fmt: skip
        if spool is not None:
            spool.print_document({
                "traces": [str(p) for p in traces.paths],
                "format": traces.kind,
                "host": header.host,
                "kernel": header.kernel,
                "start_wall_ns": header.start_wall_ns,
                "topology_override": header.topology.override,
                "topology_unknown_gpu_node": header.topology.unknown_gpu_node,
                "damage": traces.damage,
                "summary": {str(g): s for g, s in _over_all(reports).items()},
                **({"boots": [r.to_json() for r in reports]} if len(reports) > 1 else {}),
            }, told)  # fmt: skip
            return 0
    # A trace is a file from elsewhere: whatever it holds is shown inert (gpujitter.text).
    say = functools.partial(print, file=told)
    say(printable(reading_line(traces)))
    if header.topology.override:
        say(printable(override_line(header.topology)))
    if len(reports) > 1:
        say(f"the node restarted during the recording: {len(reports)} boots, each read "
            "through its own gap detection and attribution and shown by its own clock, "
            "oldest first; each boot's totals are its own")  # fmt: skip
    else:
        for note in reports[0].clocks.notes:  # what moved the times printed below
            say(printable(note))
    for note in traces.damage:
        say(f"damage: {printable(note)}")
    for r in reports:
        if len(reports) > 1:
            say(f"\n{r.boot.line(r.clocks)}")
            for note in r.clocks.notes:
                say(printable(note))
        _say_boot(r, say, traces)
    # said once, for the whole recording: a GPU named that no boot's gaps were on
    if not any(r.summary.attributed for r in reports) and (
        missing := sorted(set(args.gpu or ()) - seen_gpus)
    ):
        known = ", ".join(gpu_name(g) for g in sorted(seen_gpus)) or "none"
        say(f"{', '.join(gpu_name(g) for g in missing)}: not in this recording "
            f"(GPUs with gaps: {known})")  # fmt: skip
    return 0


@dataclass(slots=True)
class BootReport:
    """One boot's part of a report: its clock, its sums and longest gaps, its gaps counted,
    and --from/--to on its clock."""

    boot: Boot
    clocks: Clocks
    summary: Summary
    start: When | None
    end: When | None
    gaps: int = 0
    late: list[str] = field(default_factory=list)  # late_note's

    def in_range(self, mono_ns: int) -> bool:
        start, end, clocks = self.start, self.end, self.clocks
        return (start is None or start.of(clocks, mono_ns) >= start.ns) and (
            end is None or end.of(clocks, mono_ns) < end.ns
        )

    def to_json(self) -> dict[str, Any]:
        boot = self.boot
        first, last = boot.first_ns, boot.last_ns
        return {
            "boot": boot.number,
            "boot_id": boot.boot_id,
            "first_wall_ns": None if first is None else self.clocks.wall_ns(first),
            "last_wall_ns": None if last is None else self.clocks.wall_ns(last),
            "clock": self.clocks.notes,
            # its attributions: the next this many of the document's, in order
            "attributions": self.summary.attributed,
            "summary": {str(g): s for g, s in self.summary.by_gpu().items()},
        }


def _on(when: When | None, first: Clocks | None) -> When | None:
    """A point in time for a later boot (`first`: the first boot's clocks): an offset, on the
    first boot's monotonic clock, as the wall time it is there."""
    if when is None or when.wall or first is None:
        return when
    return When(first.wall_ns(when.ns), wall=True)


def _read_boot(
    r: BootReport,
    traces: Recording,
    progress: Progress,
    args: argparse.Namespace,
    seen_gpus: set[int],
    span: list[int],
    page: Page | None,
    spool: JsonSpool | None,
) -> None:
    """One boot's events through a pipeline of its own, into its report."""
    boot, clocks = r.boot, r.clocks
    later = boot.number > 1  # (the HTML page is the first boot's)

    def wanted(ev: GpuGap | Attribution) -> bool:
        return r.in_range(ev.ts_ns) and (not args.gpu or ev.gpu in args.gpu)

    def events() -> Iterator[Event]:
        for ev in progress.events(boot, boot.position):
            if type(ev) is ClockRef:
                clocks.add(ev)
            if r.in_range(t := ev.ts_ns) and not later:
                span[:] = [min(span[0], t), max(span[1], t)] if span else [t] * 2
            yield ev

    config = AnalysisConfig.from_record(boot.header.analysis)
    pipeline = None if traces.analysed else Pipeline(boot.header.topology, config)
    found = events() if pipeline is None else pipeline.run(events())
    for out in found:
        if isinstance(out, (GpuGap, Attribution)):
            seen_gpus.add(out.gpu)
        if isinstance(out, Attribution) and wanted(out):
            r.summary.add(out)
            if page is not None and not later:
                page.add(out)
            if spool is not None:
                spool.add(out)
        elif isinstance(out, GpuGap) and wanted(out):
            r.gaps += 1
    if pipeline is not None:
        r.late = late_note(pipeline)


def _over_all(reports: list[BootReport]) -> dict[int, dict[str, Any]]:
    """Per GPU its gaps, idle time and time by cause, over every boot."""
    if len(reports) == 1:
        return reports[0].summary.by_gpu()
    total = Summary(0)
    for r in reports:
        for gpu, s in r.summary.per_gpu.items():
            t = total.per_gpu[gpu]
            t["gaps"] += s["gaps"]
            t["idle_ns"] += s["idle_ns"]
            t["causes"].update(s["causes"])
    return total.by_gpu()


def _say_boot(r: BootReport, say: Callable[..., None], traces: Recording) -> None:
    """One boot's per-cause tables and longest gaps, by its clock."""
    summary, gaps = r.summary, r.gaps
    if not summary.attributed:
        say("no GPU idle gaps in this range" + (f" ({gaps} gaps, none attributed)" if gaps else ""))
        return
    for gpu, s in summary.by_gpu().items():
        say(f"\n{gpu_name(gpu)}: {s['gaps']} gaps, {format_ns(s['idle_ns'])} idle")
        rows = [
            (cause_label(cause), format_ns(ns), f"{100 * ns / max(s['idle_ns'], 1):.1f}%")
            for cause, ns in s["causes"].items()
        ]
        say(table(["CAUSE", "TIME", "SHARE"], rows))
    longest = summary.longest.items()
    say(f"\nlongest {len(longest)} gaps:")
    for a in longest:
        say(one_line(a, r.clocks.at(a.ts_ns) if traces.wall_clock else None))
        for remedy in a.remedies:
            say(f"    fix: {printable(remedy)}")


COMMAND = Command(
    name="report",
    summary="post-mortem: attribute the gaps of recorded traces",
    description="""
        Replay recorded traces (`gpujitter record`, `gpujitter run --record`) through the
        daemon's own gap detection and attribution, with the settings recorded in the
        trace, and summarise: per GPU, the gaps and where their time went by cause; then
        the longest gaps, each with its breakdown and the fix for its main cause. The
        attributions are exactly those the daemon logged live for the same recording.
        --json gives the summary and every attribution. A recording over a restart of
        the node is read boot by boot, each boot by its own clock (docs/postmortem.md).
    """,
    examples="""
        # everything in a rotated recording
        gpujitter report /var/lib/gpujitter/traces
        # as a page to look at (or to mail: it needs nothing else)
        gpujitter report /var/lib/gpujitter/traces --html report.html
        # the page to standard output (the text report then on standard error)
        gpujitter report run.gjtrace --html - | ssh web 'cat > /srv/gaps.html'
        # ten minutes of it, GPU 3 only, as JSON
        gpujitter report run.gjtrace --from 12:00:00 --to 12:10:00 --gpu 3 --json
        # the first 90 seconds after the recording started
        gpujitter report run.gjtrace --to +90s
    """,
    add_arguments=add_arguments,
    run=run,
    writes_files=True,
)
