"""`gpujitter run`: the daemon. Evidence sources (probes, libcuda tracer, NVML sampler) feed
one queue; the main thread takes each event, records it (trace, when asked), feeds the
pipeline (gaps, then attributions) and publishes what the stream carries; attributions go
to the JSON-lines log and the console. Once a second: health, footprint, watchdog.

Signals: SIGTERM/SIGINT stop cleanly (pending gaps are attributed, files closed);
SIGHUP reopens the log and starts a new trace file (logrotate). sd_notify: READY only once
the probes are attached, WATCHDOG from the main loop, RELOADING/READY around SIGHUP.

Nothing the main thread writes to can stop it: the console has a writer thread of its own,
the stream and sd_notify sockets are non-blocking, and the file sinks drop and count what a
failing disk refuses (daemon/diskfull.py) instead of raising.

The daemon's own threads run below the watched ones and off their CPUs where others are
allowed (daemon/own_scheduling.py); a gap in which a watched thread waited behind one of them
is counted as self-inflicted (`self_inflicted` in daemon.status, the metrics, the journal).

Each GPU's proven idle power is kept in the state directory (daemon/idle_floors.py): read at
start, into the analysis settings the trace header carries; written when the detector
proves a new one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import orjson
import psutil

from gpujitter import __version__
from gpujitter.daemon.config import Config, check_node, thresholds_by_probe
from gpujitter.daemon.describe import one_line
from gpujitter.daemon.gaps import GapConfig
from gpujitter.daemon.idle_floors import FILE_NAME, IdleFloorStore
from gpujitter.daemon.jsonlog import JsonLog
from gpujitter.daemon.metrics import DaemonMetrics
from gpujitter.daemon.own_scheduling import KEEP_UP_LEVELS, OwnScheduling, in_slices
from gpujitter.daemon.pipeline import AnalysisConfig, Pipeline
from gpujitter.daemon.recorder import EventQueue, TraceRecorder
from gpujitter.daemon.records import Attribution, GpuGap
from gpujitter.daemon.rotation import Rotation
from gpujitter.daemon.sdnotify import Notifier
from gpujitter.daemon.state import NodeState
from gpujitter.daemon.stream import StreamServer
from gpujitter.daemon.trace import TraceHeader
from gpujitter.probes import registry
from gpujitter.probes.clock import clock_ref
from gpujitter.probes.events import Event, ProbeStatus, WatchChange, to_record
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.sources import EvidenceSources
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.text import inert_json, printable

TICK_NS = 1_000_000_000
# The watched processes may pin their threads at any time: their CPUs are read again this
# often, besides whenever the watched set changes.
REPIN_NS = 10_000_000_000


class _LineWriter:
    """Lines to one stream, written by a thread of its own: a stream that stops taking them
    stops only this thread. Past `QUEUE_LINES` waiting lines, lines are dropped and counted,
    and the count is said (on stderr) once writing works again."""

    QUEUE_LINES = 1000

    def __init__(self, stream: TextIO, name: str) -> None:
        self.stream = stream
        self.dropped = 0
        self._lines: queue.Queue[str | None] = queue.Queue(self.QUEUE_LINES)
        self._thread = threading.Thread(target=self._write, name=name, daemon=True)
        self._thread.start()

    def put(self, line: str) -> None:
        try:
            self._lines.put_nowait(line)
        except queue.Full:
            self.dropped += 1

    def _write(self) -> None:
        said = 0
        while (line := self._lines.get()) is not None:
            with contextlib.suppress(OSError, ValueError):
                if self.dropped > said:
                    print(f"# {self.dropped - said} console lines dropped (output blocked)",
                          file=sys.stderr, flush=True)  # fmt: skip
                    said = self.dropped
                self.stream.write(line + "\n")
                self.stream.flush()

    def close(self, deadline_s: float) -> None:
        """Write what waits until `deadline_s`, or until a 50 ms wait writes nothing (the
        reader is stuck: waiting longer only delays the stop)."""
        with contextlib.suppress(queue.Full):
            self._lines.put_nowait(None)
        while self._thread.is_alive() and (left := deadline_s - time.monotonic()) > 0:
            waiting = self._lines.qsize()
            self._thread.join(min(left, 0.05))
            if waiting and self._lines.qsize() >= waiting:
                return


class Console:
    """Where the daemon's own lines go: attributions on `out` (one line each, or NDJSON;
    none when `quiet`), notes for the operator on stderr. Each stream has a writer thread of
    its own (_LineWriter), so a terminal or pipe that stops reading never stops the main
    loop, and a stuck `out` never silences the notes (the journal)."""

    def __init__(self, out: TextIO, as_json: bool, clock: Any, *, quiet: bool = False) -> None:
        self.out = out
        self.as_json = as_json
        self.clock = clock
        self.quiet = quiet
        self._out = _LineWriter(out, "gpujitter-console")
        self._err = _LineWriter(sys.stderr, "gpujitter-notes")

    def attribution(self, attr: Attribution) -> None:
        if self.quiet:
            return
        if self.as_json:
            self._out.put(inert_json(orjson.dumps(to_record(attr))).decode())
        else:
            self._out.put(one_line(attr, self.clock))

    def note(self, text: str) -> None:
        """A line for the operator (the journal under systemd)."""
        self._err.put(f"# {printable(text)}")

    def close(self, timeout_s: float = 0.3) -> None:
        """Write what waits, within `timeout_s` in all (a stuck terminal cannot hold up the
        stop: its lines are lost, as they would have been anyway)."""
        deadline = time.monotonic() + timeout_s
        self._err.close(deadline)
        self._out.close(deadline)


def status_line(status: dict[str, Any]) -> str:
    """What `systemctl status` shows while the daemon runs (sd_notify STATUS=), from the
    daemon.status record: is it seeing, finding, keeping up, writing."""
    parts = [
        f"{status['attributions']} gaps attributed",
        f"{status['events_per_s']:.0f} events/s",
        f"lost {status['lost_kernel'] + status['lost_user']}",
        f"self-inflicted {status['self_inflicted']}",
        f"{status['clients']} clients",
        f"cpu {status['cpu_percent']:.1f}%",
        f"rss {status['rss_bytes'] >> 20} MiB",
    ]
    for sink, failing, dropped in (("log", "log_failing", "log_dropped"),
                                   ("trace", "trace_failing", "trace_lost")):  # fmt: skip
        if status[failing]:
            parts.append(f"{sink} failing ({status[dropped]} dropped): {status[failing]}")
    return "; ".join(parts)


def probe_names(config: Config) -> list[str]:
    return registry.select(config["probes.enable"], config["probes.disable"])


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
    def __init__(
        self,
        config: Config,
        *,
        console: Console | None = None,
        nvml: bool | Any = True,
        duration_ns: int | None = None,
        environ: dict[str, str] | None = None,
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
        self.topology: Topology = load_topology(override=override)
        self.notifier = Notifier(environ)
        self.queue = EventQueue()
        self.metrics = DaemonMetrics()
        self.me = psutil.Process()
        self._stop = False
        self._ready = False  # READY sent: from then on a stop is clean and saves what waits
        self._reload = False
        self.log: JsonLog | None = None
        self.recorder: TraceRecorder | None = None
        self.stream: StreamServer | None = None
        self.attributions = 0  # made since start: each is logged or counted as dropped
        self.self_inflicted = 0  # of them, gaps a watched thread waited behind our threads
        self.self_inflicted_ns = 0
        # Starting (compiling the probes: seconds of CPU, once) at nice 0: at nice 10 on a
        # saturated node two probes took 56 s, the full set would outlast the start timeout.
        self.own = OwnScheduling(level=len(KEEP_UP_LEVELS) - 1)
        self._watched: set[int] = set()  # tgids, from the meta.watch changes seen
        self._repin_at = 0  # when to read the watched processes' CPUs again (0: at once)
        self.floors: IdleFloorStore | None = None

    # -- signals ----------------------------------------------------------------------

    def _on_stop(self, signum: int, frame: object) -> None:
        if not self._ready:
            # Still compiling and attaching probes (seconds): nothing has been attributed,
            # so nothing is lost by stopping at once, as the signal's default would.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self._stop = True

    def _on_hup(self, signum: int, frame: object) -> None:
        self._reload = True

    def _say(self, text: str) -> None:
        """One line for the operator (the journal under systemd)."""
        if self.console is not None:
            self.console.note(text)
        else:
            print(f"# {text}", file=sys.stderr, flush=True)

    # -- main -------------------------------------------------------------------------

    def run(self, ready: Callable[[], None] | None = None) -> int:
        """Run until stopped; `ready` is called once the probes are attached."""
        faulthandler.enable()  # a watchdog abort (SIGABRT) leaves a stack in the journal
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        # Before any thread starts: the probe thread (and its compiles) inherit the policy.
        self._tend_own(time.monotonic_ns())
        clock = clock_ref()
        sources = EvidenceSources(
            self.names,
            topology=self.topology,
            watch=self.watch,
            emit=self.queue.emit,
            thresholds=self.thresholds,
            nvml=self.nvml,
            gpu_processes=self.config["watch.gpu_processes"],
        )
        # Sinks close after the sources stopped and what they held was analysed.
        with contextlib.ExitStack() as sinks:
            with sources:
                analysis = AnalysisConfig(gaps=GapConfig(min_gap_ns=self.config["gaps.min_gap"]))
                analysis = replace(
                    analysis,
                    engine=replace(analysis.engine, gpu_bus_ids=sources.gpu_bus_ids()),
                    idle_floors_w=self._kept_floors(sources.gpus),
                )
                self.pipeline = Pipeline(self.topology, analysis)
                self.metrics.set_gpus(sources.gpus)
                self.state = NodeState(self.topology, sources.gpus)
                self._open_sinks(sinks, clock, analysis)
                self._tend_own(time.monotonic_ns())
                running = [s.probe for s in sources.statuses if s.state in ("running", "degraded")]
                summary = (
                    f"probes attached: {', '.join(running) or 'none'}; "
                    f"watching {self.watch.describe()}"
                )
                if self.console:
                    self.console.note(summary)
                self._ready = True
                self.own.step_to(0)
                self.notifier.ready(summary)
                if ready is not None:
                    ready()
                self._loop()
                self.notifier.stopping()
            self._drain()
            for out in self.pipeline.flush():
                self._finding(out)
            self._keep_floors()
            self._final_status()
        self.notifier.close()
        if self.console is not None:
            self.console.close()
        return 0

    def _kept_floors(self, gpus: list[GpuInfo]) -> dict[int, float]:
        state_dir = self.config["state.dir"]
        if not (state_dir and gpus):
            return {}
        self.floors = IdleFloorStore(Path(state_dir) / FILE_NAME, gpus)
        floors, note = self.floors.load()
        if note:
            self._say(note)
        return floors

    def _keep_floors(self) -> None:
        if self.floors is None:
            return
        try:
            self.floors.save(self.pipeline.detector.idle_floors())
        except OSError as err:
            self._say(f"cannot keep GPU idle floors in {self.floors.path}: {err.strerror}; "
                      "not trying again")  # fmt: skip
            self.floors = None

    def _open_sinks(
        self, stack: contextlib.ExitStack, clock: Any, analysis: AnalysisConfig
    ) -> None:
        cfg = self.config
        log_path = cfg["log.path"]
        if log_path:
            rotation = Rotation(max_bytes=cfg["log.max_bytes"], keep_files=cfg["log.keep"])
            self.log = JsonLog(log_path, rotation, say=self._say)
            stack.callback(self.log.close)
        if cfg["record.path"]:
            in_force = {n: {**registry.get(n).thresholds, **self.thresholds.get(n, {})}
                        for n in self.names}  # fmt: skip
            header = TraceHeader.now(self.topology, self.names, in_force, self.watch.describe(),
                                     analysis=analysis.to_record())  # fmt: skip
            rotation = Rotation(max_bytes=cfg["record.max_bytes"], keep_files=cfg["record.keep"])
            self.recorder = TraceRecorder(cfg["record.path"], header, rotation, say=self._say)
            stack.callback(self.recorder.close)
        if cfg["socket.path"]:
            hello = self._hello(clock)  # built here: the stream's thread only copies it
            self.stream = StreamServer(
                Path(cfg["socket.path"]),
                hello=lambda: dict(hello),
                snapshot=lambda: [self.state.snapshot(time.monotonic_ns(), self._status())],
                queue_limit=cfg["socket.queue"],
                mode=cfg["socket.mode"],
                group=cfg["socket.group"],
            ).start()
            stack.callback(self.stream.close)
        if cfg["metrics.listen"]:
            self.metrics.serve(cfg["metrics.listen"])

    def _hello(self, clock: Any) -> dict[str, Any]:
        return {
            "version": __version__,
            "host": socket.gethostname(),
            "kernel": os.uname().release,
            "pid": os.getpid(),
            "clock": to_record(clock),
            "topology": self.topology.to_record(),
            "probes": self.names,
        }

    def _loop(self) -> None:
        start = last_tick = time.monotonic_ns()
        self.me.cpu_percent()  # first call primes psutil's CPU measurement
        self._rss_bytes = self.me.memory_info().rss
        self._events_at_tick = 0
        while not self._stop:
            now = time.monotonic_ns()
            if self.duration_ns is not None and now - start >= self.duration_ns:
                break
            for ev in in_slices(self.queue.drain(timeout_s=0.1)):
                self._event(ev)
            if self._reload:
                self._reload = False
                self._reopen()
            now = time.monotonic_ns()
            if now - last_tick >= TICK_NS:
                self._tick(now, (now - last_tick) / 1e9)
                last_tick = now
            self.notifier.watchdog()

    def _drain(self) -> None:
        while batch := list(self.queue.drain()):
            for ev in in_slices(batch):
                self._event(ev)

    def _event(self, ev: Event) -> None:
        if self.recorder is not None:
            self.recorder.write(ev)
        self.state.observe(ev)
        if isinstance(ev, ProbeStatus):
            self.metrics.observe_probe(ev)
        elif isinstance(ev, WatchChange):
            self._watched.difference_update(ev.removed)
            self._watched.update(ev.added)
            self._repin_at = 0
        if self.stream is not None and self.state.streamed(ev):
            self.stream.publish(to_record(ev), self.state.tgids_of(ev))
        for out in self.pipeline.feed(ev):
            self._finding(out)

    def _finding(self, out: Event) -> None:
        self.state.observe(out)
        if self.stream is not None:
            self.stream.publish(to_record(out), self.state.tgids_of(out))
        if isinstance(out, GpuGap):
            self.metrics.observe_gap(out.gpu, out.dur_ns / 1e9)
        elif isinstance(out, Attribution):
            self.attributions += 1
            if out.self_inflicted:
                self.self_inflicted += 1
                self.self_inflicted_ns += out.self_ns
                self.metrics.observe_self_inflicted(out.gpu, out.self_ns / 1e9)
            self.metrics.observe_attribution(
                out.gpu, [(p.cause, p.ns / 1e9) for p in out.parts], out.workload
            )
            if self.log is not None:
                self.log.write(out)
            if self.console is not None:
                self.console.attribution(out)

    def _status(self) -> dict[str, Any]:
        """The daemon.status record; built on the main thread and on the stream's (a
        client's first snapshot): it reads only what is safe from both."""
        lost_kernel, lost_user = self.state.lost()
        return self.state.status(
            time.monotonic_ns(),
            cpu_percent=self._cpu_percent,
            rss_bytes=self._rss_bytes,
            events_per_s=self._events_per_s,
            lost_kernel=lost_kernel,
            lost_user=lost_user + self.queue.dropped,
            engine_dropped=self.queue.dropped,
            clients=self.stream.clients if self.stream else 0,
            client_dropped=self.stream.dropped_total if self.stream else 0,
            attributions=self.attributions,
            self_inflicted=self.self_inflicted,
            self_inflicted_ns=self.self_inflicted_ns,
            own_cpus=sorted(self.own.cpus),
            own_nice=self.own.nice,
            log_dropped=self.log.failures.dropped_total if self.log else 0,
            log_failing=self.log.failures.reason if self.log else "",
            trace_lost=self.recorder.failures.dropped_total if self.recorder else 0,
            trace_failing=self.recorder.failures.reason if self.recorder else "",
            probe_cost=self.state.probe_cost(),
        )

    # The footprint, measured on the main thread each tick (psutil is not for two threads).
    _cpu_percent = 0.0
    _rss_bytes = 0
    _events_per_s = 0.0

    def _tick(self, now: int, elapsed_s: float) -> None:
        with self.me.oneshot():
            self._cpu_percent = self.me.cpu_percent()
            self._rss_bytes = self.me.memory_info().rss
        self._events_per_s = (self.state.events - self._events_at_tick) / max(elapsed_s, 1e-9)
        self._events_at_tick = self.state.events
        status = self._status()
        self.metrics.observe_engine(self.queue.dropped)
        for sink, failures in (("log", self.log and self.log.failures),
                               ("trace", self.recorder and self.recorder.failures)):  # fmt: skip
            if failures:
                self.metrics.observe_sink(sink, failures.dropped_total, failures.failing)
        if self.stream is not None:
            self.stream.publish(status)
            self.metrics.observe_stream(self.stream.clients, self.stream.dropped_total)
        if self.recorder is not None:
            self.recorder.tick(now)
        self._keep_floors()
        self.own.keep_up(status["lost_kernel"] + status["lost_user"], now)
        self._tend_own(now)
        self.notifier.status(status_line(status))

    def _tend_own(self, now: int) -> None:
        """Our threads: new ones get their policy; off the watched processes' CPUs when the
        set changed or their CPUs may have (meta.self goes to the engine when ours changed)."""
        if now >= self._repin_at:
            self._repin_at = now + REPIN_NS
            self.own.keep_off(self._watched)
        announced = self.own.tend(now)
        if announced is not None:
            self.queue.emit(announced)
        while self.own.notes:
            self._say(self.own.notes.pop(0))

    def _final_status(self) -> None:
        """The last daemon.status, sent after the last attribution and before the socket
        closes, and its count in the journal: a reader reconciles the log with it (every
        attribution made is a log line or counted in log_dropped)."""
        status = self._status()
        if self.stream is not None:
            self.stream.publish(status)
        self._say(f"stopped: {status['attributions']} attributions made, "
                  f"{status['log_dropped']} of them dropped by the log, "
                  f"{status['self_inflicted']} self-inflicted")  # fmt: skip

    def _reopen(self) -> None:
        """SIGHUP: reopen the log (after logrotate moved it) and start a new trace file."""
        self.notifier.reloading()
        if self.log is not None:
            self.log.reopen()
        if self.recorder is not None:
            self.recorder.rotate()
        self.notifier.ready()
