"""`gpujitter run`: the daemon, a configuration of the runtime (daemon/service/runtime.py). The live
probes (eBPF probes, libcuda tracer, NVML sampler) feed one queue; the main thread takes each
event, captures it (trace, when asked), feeds the pipeline (gaps, then attributions) and
publishes what the stream carries; attributions go to the JSON-lines log and the console.
Once a second: health, footprint, watchdog.

Signals: SIGTERM/SIGINT stop cleanly (pending gaps are attributed, files closed);
SIGHUP (or SIGUSR1) reopens the log and starts a new trace file (logrotate); other stray
signals are ignored, each said once. sd_notify: READY only once the probes are attached,
WATCHDOG from the main loop, RELOADING/READY around SIGHUP.

Nothing the main thread writes to can stop it: the console has a writer thread of its own,
the stream and sd_notify sockets are non-blocking, and the file sinks drop and count what a
failing disk refuses (daemon/sinks/diskfull.py) instead of raising.

The daemon's own threads run below the watched ones and off their CPUs where others are
allowed (daemon/service/own_scheduling.py); a gap in which a watched thread waited behind one
of them is counted as self-inflicted (`self_inflicted` in daemon.status, the metrics, the journal).

Each GPU's proven idle power is kept in the state directory (daemon/service/idle_floors.py): read at
start, into the analysis settings the trace header carries; written when the detector
proves a new one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import queue
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gpujitter import __version__
from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.analysis.describe import one_line
from gpujitter.daemon.analysis.engine import EngineConfig
from gpujitter.daemon.analysis.gaps import GapConfig
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.checks.audit import slow_fault_notes
from gpujitter.daemon.service.config import (
    Config,
    check_node,
    probe_names,
    thresholds_by_probe,
)
from gpujitter.daemon.service.head_start import settle_compile
from gpujitter.daemon.service.idle_floors import FILE_NAME, IdleFloorStore
from gpujitter.daemon.service.own_scheduling import KEEP_UP_LEVELS, OwnScheduling
from gpujitter.daemon.service.runtime import EventSource, LiveSource, Runtime, Sink
from gpujitter.daemon.service.sdnotify import Notifier
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.daemon.sinks.adapters import (
    CaptureSink,
    ConsoleSink,
    LogSink,
    MetricsSink,
    StreamSink,
)
from gpujitter.daemon.sinks.capture import TraceCapture
from gpujitter.daemon.sinks.jsonlog import JsonLog, rfc3339
from gpujitter.daemon.sinks.metrics import DaemonMetrics
from gpujitter.daemon.sinks.rotation import Rotation
from gpujitter.daemon.sinks.stream import StreamServer
from gpujitter.daemon.sinks.trace import TraceHeader
from gpujitter.probes import registry
from gpujitter.probes.base import memory_short
from gpujitter.probes.clock import clock_ref
from gpujitter.probes.events import CORE_PROBE, ClockRef, Event, ProbeStatus, WatchChange, to_record
from gpujitter.probes.host import HostPaths, memory_limit
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec, unreadable_where
from gpujitter.text import dumps, inert_json, printable

_IDLE = "\0idle"  # _LineWriter's own: no line of the console is this


class _LineWriter:
    """Lines to one stream, written by a thread of its own: a stream that stops taking them
    stops only this thread. Past `QUEUE_LINES` waiting lines, lines are dropped and counted,
    and the count is said (on stderr) once writing works again.

    Where the stream has a file descriptor, the thread writes to a copy of it of its own, a
    pipe's atomic size at a time and only once poll() says it may: a reader that never
    reads (`gpujitter run --json | stuck`) never blocks it inside the stream's buffer, whose
    lock the main thread's last flush and the interpreter's exit would then wait on for
    ever (the soak's SIGTERM took 60 s and a SIGKILL), and close() can end it."""

    QUEUE_LINES = 1000
    POLL_S = 0.1

    def __init__(
        self, stream: TextIO, name: str, on_gone: Callable[[], None] | None = None
    ) -> None:
        self.stream = stream
        self.dropped = 0
        self.on_gone = on_gone  # called once when the reader is gone (EPIPE): it writes no more
        self._lines: queue.Queue[str | None] = queue.Queue(self.QUEUE_LINES)
        self._fd = _own_copy(stream)
        self.is_pipe = self._fd >= 0 and stat.S_ISFIFO(os.fstat(self._fd).st_mode)
        self._encoding = getattr(stream, "encoding", None) or "utf-8"
        # a character its encoding lacks is escaped, as the CLI's streams do (_standard_streams)
        errors = getattr(stream, "errors", None)
        self._errors = errors if errors not in (None, "strict") else "backslashreplace"
        self._given_up = threading.Event()
        self._poller = select.poll()
        if self._fd >= 0:
            self._poller.register(self._fd, select.POLLOUT)
        self._thread = threading.Thread(target=self._write, name=name, daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        try:
            self._lines.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _write(self) -> None:
        said = 0
        try:
            while (line := self._next_line()) is not None:
                if line is _IDLE:  # nothing to write for a while: is the reader still there?
                    if self._reader_gone():
                        self._gone()
                        return
                    continue
                if self.dropped > said:
                    with contextlib.suppress(OSError, ValueError):
                        print(f"# {self.dropped - said} console lines dropped (output blocked)",
                              file=sys.stderr, flush=True)  # fmt: skip
                    said = self.dropped
                try:
                    if self._fd < 0:
                        self.stream.write(line + "\n")
                        self.stream.flush()
                    elif not self._write_fd((line + "\n").encode(self._encoding, self._errors)):
                        return
                except BrokenPipeError:
                    self._gone()
                    return
                except (OSError, ValueError):
                    pass
        finally:
            if self._fd >= 0:
                os.close(self._fd)

    def _next_line(self) -> str | None:
        """The next line, None at close, or _IDLE after a second without one (only where a
        reader's going is acted on: the notes' writer need not wake each second)."""
        try:
            return self._lines.get(timeout=1.0 if self.on_gone is not None else None)
        except queue.Empty:
            return _IDLE

    def _gone(self) -> None:
        if self.on_gone is not None:
            self.on_gone()

    def _reader_gone(self) -> bool:
        """Whether a pipe's reader closed its end (POLLERR), seen without a write: a daemon
        with no attribution to print would otherwise never learn it (`run --json | head`)."""
        return self._fd >= 0 and any(ev & select.POLLERR for _, ev in self._poller.poll(0))

    def _write_fd(self, data: bytes) -> bool:
        """All of `data`, unless close() gives up on the reader first (False)."""
        view = memoryview(data)
        while view:
            if self._given_up.is_set():
                return False
            if self._poller.poll(self.POLL_S * 1000):
                view = view[os.write(self._fd, view[: select.PIPE_BUF]) :]
        return True

    def close(self, deadline_s: float) -> None:
        """Write what waits until `deadline_s`, or until a 50 ms wait writes nothing (the
        reader is stuck: waiting longer only delays the stop); then the thread is told to
        give up what it still holds."""
        with contextlib.suppress(queue.Full):
            self._lines.put_nowait(None)
        while self._thread.is_alive() and (left := deadline_s - time.monotonic()) > 0:
            waiting = self._lines.qsize()
            self._thread.join(min(left, 0.05))
            if waiting and self._lines.qsize() >= waiting:
                break
        self._given_up.set()
        # It sees that within a poll: ended here, its fd closed with it, not at some later
        # moment of the process (a test's descriptor guard saw it close in the next test).
        self._thread.join(2 * self.POLL_S)


def _own_copy(stream: TextIO) -> int:
    """A copy of the fd `stream` writes to (during a compile's capture, the copy of the
    real one it writes through: probes/base.py), or -1 where it has none (a test's)."""
    try:
        stream.flush()
        target = getattr(stream, "target_fd", None)
        return os.dup(target() if target is not None else stream.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return -1


class Console:
    """Where the daemon's own lines go: attributions on `out` (one line each, or NDJSON led
    by the wall `time` as the log's lines are; none when `quiet`), notes for the operator on
    stderr. Each stream has a writer thread of its own (_LineWriter), so a terminal or pipe
    that stops reading never stops the main loop, and a stuck `out` never silences the notes
    (the journal)."""

    def __init__(
        self, out: TextIO, as_json: bool, *, clock: ClockRef | None = None, quiet: bool = False
    ) -> None:
        self.out = out
        self.as_json = as_json
        self.clock = clock  # the runtime's, once it runs (ConsoleSink): None prints no wall time
        self.quiet = quiet
        self._out = _LineWriter(out, "gpujitter-console", on_gone=self._out_gone)
        self._err = _LineWriter(sys.stderr, "gpujitter-notes")

    def attribution(self, attr: Attribution) -> None:
        if self.quiet:
            return
        if self.as_json:
            clock = self.clock  # one read: the runtime's thread may replace it meanwhile
            wall = {"time": rfc3339(clock, attr.ts_ns).decode()} if clock is not None else {}
            self._out.put(inert_json(dumps({**wall, **to_record(attr)})).decode())
        else:
            self._out.put(one_line(attr, self.clock))

    def note(self, text: str) -> None:
        """A line for the operator (the journal under systemd)."""
        self._err.put(f"# {printable(text)}")

    def _out_gone(self) -> None:
        """Standard output's reader went away. At the end of a pipeline (`gpujitter run
        --json | head -1`) the daemon stops, as any command there does: it ran on, printing
        to nobody, until killed. Anywhere else (the journal's socket) it keeps watching: the
        log and the socket still have its attributions."""
        if self._out.is_pipe:
            self.note("standard output's reader is gone (broken pipe): stopping")
            os.kill(os.getpid(), signal.SIGTERM)  # the stop every signal takes: all flushed
        else:
            self.note("standard output is gone (broken pipe): attributions go on to the log "
                      "and the socket only")  # fmt: skip

    def close(self, timeout_s: float = 0.3) -> None:
        """Write what waits, within `timeout_s` in all (a stuck terminal cannot hold up the
        stop: its lines are lost, as they would have been anyway)."""
        deadline = time.monotonic() + timeout_s
        self._err.close(deadline)
        self._out.close(deadline)


def watch_of(config: Config) -> WatchSpec:
    spec = WatchSpec(
        pids=set(config["watch.pids"]),
        comms=list(config["watch.comms"]),
        cgroups=[Path(c) for c in config["watch.cgroups"]],
        pods=list(config["watch.pods"]),
        slurm_jobs=list(config["watch.slurm_jobs"]),
    )
    # Nothing named and no GPU processes to follow: watch everything (thresholds keep the
    # rate down), so a daemon on a node without GPUs still shows its jitter.
    spec.all = not (spec.selects_any() or config["watch.gpu_processes"])
    return spec


class Daemon:
    """`gpujitter run`: the runtime (daemon/service/runtime.py) over the live probes, or
    over `source` when given (a recording, a test's events), analysing every event, with the log,
    trace capture, stream, metrics and console sinks the settings ask for."""

    def __init__(
        self,
        config: Config,
        *,
        console: Console | None = None,
        nvml: bool | Any = True,
        duration_ns: int | None = None,
        environ: dict[str, str] | None = None,
        source: EventSource | None = None,
    ) -> None:
        # Everything the settings name is checked before the probes are compiled and
        # attached (a minute on a small node): a mistake is one line at once.
        check_node(config, starting=True)
        self.config = config
        self.console = console
        self.nvml = nvml
        self.duration_ns = duration_ns
        self.names = probe_names(config)
        self.thresholds = thresholds_by_probe(config["probes.thresholds"])
        self.watch = watch_of(config)
        override = config["topology.override"] or None
        if source is None:
            # Said while the compile started ahead runs, before its peak: not after a start
            # that the limit stalled or killed.
            short = memory_short(memory_limit(HostPaths()))
            if short is not None:
                self._say(f"memory: {short}; {remedies.memory_limit()}")
        if nvml is not False:
            # NVML's first session (the topology's; its memory stays after the shutdown)
            # opens after the probes' compile, not beside it, off the start's peak.
            settle_compile()
        # --no-nvml: none for the topology either (its GPUs from sysfs).
        self.topology: Topology = load_topology(
            override=override, nvml=False if nvml is False else None
        )
        self.notifier = Notifier(environ)
        self.metrics = DaemonMetrics()
        self.source = source or LiveSource(
            self.names,
            topology=self.topology,
            watch=self.watch,
            thresholds=self.thresholds,
            nvml=nvml,
            gpu_processes=config["watch.gpu_processes"],
        )
        # Starting (compiling the probes: seconds of CPU, once) at nice 0: at nice 10 on a
        # saturated node two probes took 56 s, the full set would outlast the start timeout.
        self.own = OwnScheduling(level=len(KEEP_UP_LEVELS) - 1)
        self.floors: IdleFloorStore | None = None
        self.runtime = Runtime(
            self.source,
            self.topology,
            sinks=self._sinks,
            analysis=self._analysis,
            duration_ns=duration_ns,
            own=self.own,
            notifier=self.notifier,
            reload=True,
            say=self._say,
        )

    def _say(self, text: str) -> None:
        """One line for the operator (the journal under systemd)."""
        if self.console is not None:
            self.console.note(text)
        else:
            print(f"# {text}", file=sys.stderr, flush=True)

    def run(self, ready: Callable[[], None] | None = None) -> int:
        """Run until stopped; `ready` is called once the probes are attached."""
        # A watchdog abort (SIGABRT) leaves a stack in the journal (the process's own
        # stderr, fd 2, whatever sys.stderr was replaced with).
        faulthandler.enable(2)

        def attached(runtime: Runtime) -> None:
            running = [s.probe for s in self.source.statuses
                       if s.state in ("running", "degraded")]  # fmt: skip
            summary = (
                f"probes attached: {', '.join(running) or 'none'}; watching {self.watch.describe()}"
            )
            # What the kernel refused is a source this daemon does not see: said at once,
            # not only in the status records (a unit's journal shows nothing else).
            said = [f"probe {s.probe} unavailable: {s.reason}"
                    for s in self.source.statuses if s.state == "unavailable"]  # fmt: skip
            said += self.watch.unwatchable(HostPaths())
            # Faults this node makes slow at random read as host work: said once, here.
            said += slow_fault_notes(HostPaths(), self.topology)
            if self.console:
                self.console.note(summary)
            for line in said:
                self._say(line)
            self.notifier.ready(summary)
            if ready is not None:
                ready()

        try:
            self.runtime.run(attached)
        finally:
            if self.console is not None:
                self.console.close()
        return 0

    def _analysis(self, source: EventSource) -> AnalysisConfig:
        analysis, self.floors = analysis_settings(self.config, source, self._say)
        return analysis

    def _sinks(self, runtime: Runtime) -> list[Sink]:
        cfg = self.config
        sinks: list[Sink] = []
        files: list[str] = []
        if cfg["record.path"]:
            assert runtime.pipeline is not None
            header = trace_header(self.topology, self.names, self.thresholds, self.watch,
                                  runtime.pipeline.config)  # fmt: skip
            rotation = Rotation(max_bytes=cfg["record.max_bytes"], keep_files=cfg["record.keep"])
            sinks.append(CaptureSink(TraceCapture(cfg["record.path"], header, rotation,
                                                    say=self._say)))  # fmt: skip
            files.append("trace")
        if cfg["log.path"]:
            rotation = Rotation(max_bytes=cfg["log.max_bytes"], keep_files=cfg["log.keep"])
            sinks.append(LogSink(JsonLog(cfg["log.path"], rotation, say=self._say)))
            files.append("log")
        if cfg["socket.path"]:
            # built here: the stream's thread only copies it (a clock set later is the
            # snapshot's `clock`, and a meta.clock record to the clients connected)
            hello = self._hello(runtime.clock or clock_ref())  # (a test's recorded source)
            stream = StreamServer(
                Path(cfg["socket.path"]),
                hello=lambda: dict(hello),
                snapshot=lambda: [runtime.state.snapshot(time.monotonic_ns(), runtime.status())],
                queue_limit=cfg["socket.queue"],
                mode=cfg["socket.mode"],
                group=cfg["socket.group"],
            ).start()
            sinks.append(StreamSink(stream, runtime.state))
            files.append("stream")
        if cfg["metrics.listen"]:
            # Only where they are served: nothing else reads them, and keeping them is a
            # call per probe status and finding (a reload reopens files, not the listener).
            self.metrics.serve(cfg["metrics.listen"])
            sinks.append(MetricsSink(self.metrics, tuple(files)))
        if self.console is not None:
            sinks.append(ConsoleSink(self.console))
        sinks.append(_Keeper(self))  # last: closes first, while the others still write
        return sinks

    def _hello(self, clock: ClockRef) -> dict[str, Any]:
        return {
            "version": __version__,
            "host": socket.gethostname(),
            "kernel": os.uname().release,
            "pid": os.getpid(),
            "clock": to_record(clock),
            "topology": self.topology.to_record(),
            "probes": self.names,
        }

    def keep_floors(self) -> None:
        pipeline = self.runtime.pipeline
        if self.floors is None or pipeline is None:
            return
        try:
            self.floors.save(pipeline.detector.idle_floors())
        except OSError as err:
            self._say(f"cannot keep GPU idle floors in {self.floors.path}: {err.strerror}; "
                      "not trying again")  # fmt: skip
            self.floors = None


class _Keeper(Sink):
    """What the daemon keeps: the GPUs' idle floors each tick and at the stop, and the count
    of what it made, said in the journal at the stop: a reader reconciles the log with it
    (every attribution made is a log line or counted in log_dropped); and what its watch
    cannot follow, said in the journal: a --pid that exited, /proc or a watched cgroup that
    cannot be read."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self._gone: set[int] = set()  # the --pid processes said to have exited
        self._unreadable = ""  # why the core cannot read /proc, as last said ("": it can)

    def wants(self, kind: type[Event]) -> bool:
        return issubclass(kind, (WatchChange, ProbeStatus))

    def event(self, ev: Event) -> None:
        if isinstance(ev, ProbeStatus):
            self._core(ev)
            return
        # A --pid process that exits leaves the set for good (probes/watch.py resolve): said
        # once, or a daemon watching nothing would look like one watching a quiet job.
        assert isinstance(ev, WatchChange)
        for pid in sorted(self.daemon.watch.pids.intersection(ev.removed) - self._gone):
            self._gone.add(pid)
            self.daemon._say(f"watch: pid {pid} exited; a process given its id later is not "
                             "watched")  # fmt: skip

    def _core(self, ev: ProbeStatus) -> None:
        """The core's trouble reading /proc or a watched cgroup (out of file descriptors),
        said when it starts and when it ends: meanwhile the watched set stays as it was, not
        followed."""
        if ev.probe != CORE_PROBE or ev.reason == self._unreadable:
            return
        if ev.reason:
            self.daemon._say(f"watch: {ev.reason}")
        else:
            where = unreadable_where(self._unreadable)
            self.daemon._say(f"watch: {where} read again: the watched set follows it again")
        self._unreadable = ev.reason

    def tick(self, now_ns: int, status: DaemonStatus) -> None:
        self.daemon.keep_floors()

    def close(self) -> None:
        self.daemon.keep_floors()
        status = self.daemon.runtime.status()
        self.daemon._say(f"stopped: {status.attributions} attributions made, "
                         f"{status.log_dropped} of them dropped by the log, "
                         f"{status.self_inflicted} self-inflicted")  # fmt: skip


def analysis_settings(
    config: Config, source: EventSource, say: Callable[[str], None]
) -> tuple[AnalysisConfig, IdleFloorStore | None]:
    """The pipeline's settings for a run on this node: the configured gap length, the GPUs'
    bus ids, and the idle floors an earlier daemon proved (with the store that keeps them).
    `run` and `record` both take them, so a trace of either replays alike."""
    floors: dict[int, float] = {}
    store = None
    state_dir = config["state.dir"]
    if state_dir and source.gpus:
        store = IdleFloorStore(Path(state_dir) / FILE_NAME, source.gpus)
        floors, note = store.load()
        if note:
            say(note)
    analysis = AnalysisConfig(
        gaps=GapConfig(min_gap_ns=config["gaps.min_gap"]),
        engine=EngineConfig(gpu_bus_ids=source.gpu_bus_ids()),
        idle_floors_w=floors,
    )
    return analysis, store


def trace_header(
    topology: Topology,
    names: list[str],
    thresholds: dict[str, dict[str, int]],
    watch: WatchSpec,
    analysis: AnalysisConfig,
) -> TraceHeader:
    """A trace's header: this node, the probes with every threshold in force (the registry's
    defaults under the ones given), what is watched and the analysis settings."""
    in_force = {n: {**registry.get(n).thresholds, **thresholds.get(n, {})} for n in names}
    return TraceHeader.now(topology, names, in_force, watch.describe(),
                           analysis=analysis.to_record())  # fmt: skip
