"""Where a runtime's events and findings go (daemon/service/runtime.py's Sink): the trace capture,
the attribution log, the console, the unix-socket stream and the Prometheus metrics, each an
adapter over the writer that does the work. A command picks the ones it needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.service.runtime import Sink
from gpujitter.daemon.service.state import STREAMED
from gpujitter.probes.events import ClockRef, Event, ProbeStatus, to_record

if TYPE_CHECKING:
    from gpujitter.daemon.service.runtime import Runtime
    from gpujitter.daemon.service.service import Console
    from gpujitter.daemon.service.state import NodeState
    from gpujitter.daemon.service.status import DaemonStatus
    from gpujitter.daemon.sinks.capture import TraceCapture
    from gpujitter.daemon.sinks.jsonlog import JsonLog
    from gpujitter.daemon.sinks.metrics import DaemonMetrics
    from gpujitter.daemon.sinks.stream import StreamServer


class CaptureSink(Sink):
    """Every input event into a trace (file or rotated directory); flushed on the tick, a
    new file at SIGHUP."""

    def __init__(self, capture: TraceCapture) -> None:
        self.capture = capture

    def event(self, ev: Event) -> None:
        self.capture.write(ev)

    def tick(self, now_ns: int, status: DaemonStatus) -> None:
        self.capture.tick(now_ns)

    def reload(self) -> None:
        self.capture.rotate()

    def status(self) -> dict[str, Any]:
        f = self.capture.failures
        return {"trace_lost": f.dropped_total, "trace_failing": f.reason}

    def close(self) -> None:
        self.capture.close()


class _Clocked(Protocol):
    clock: ClockRef | None  # the reference its wall times are written by


class _WallTimes(Sink):
    """A sink whose writer writes wall times (the log, the console): its clock is the
    runtime's, then each meta.clock's (the wall clock set during the run), the only events
    it takes."""

    def __init__(self, writer: _Clocked) -> None:
        self._writer = writer

    def started(self, runtime: Runtime) -> None:
        self._writer.clock = runtime.clock

    def wants(self, kind: type[Event]) -> bool:
        return kind is ClockRef

    def event(self, ev: Event) -> None:
        assert isinstance(ev, ClockRef)
        self._writer.clock = ev


class LogSink(_WallTimes):
    """Each attribution as one JSON line, its `time` by the clock of the moment; reopened at
    SIGHUP (after logrotate)."""

    def __init__(self, log: JsonLog) -> None:
        super().__init__(log)
        self.log = log

    def finding(self, found: Event) -> None:
        if isinstance(found, Attribution):
            self.log.write(found)

    def reload(self) -> None:
        self.log.reopen()

    def status(self) -> dict[str, Any]:
        f = self.log.failures
        return {"log_dropped": f.dropped_total, "log_failing": f.reason}

    def close(self) -> None:
        self.log.close()


class ConsoleSink(_WallTimes):
    """Each attribution as a line (or NDJSON) on the console, its wall time by the clock of
    the moment."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.console = console

    def finding(self, found: Event) -> None:
        if isinstance(found, Attribution):
            self.console.attribution(found)


class StreamSink(Sink):
    """The socket stream: the kinds it carries, every finding, the status each tick; the
    last status goes out before the socket closes."""

    def __init__(self, stream: StreamServer, state: NodeState) -> None:
        self.stream = stream
        self.state = state
        self._runtime: Runtime | None = None

    def started(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def wants(self, kind: type[Event]) -> bool:
        return kind.KIND in STREAMED

    def event(self, ev: Event) -> None:
        if self.stream.listened():
            self.stream.publish(to_record(ev), self.state.tgids_of(ev))

    def finding(self, found: Event) -> None:
        if self.stream.listened():
            self.stream.publish(to_record(found), self.state.tgids_of(found))

    def tick(self, now_ns: int, status: DaemonStatus) -> None:
        if self.stream.listened():  # its record is built for clients only (~0.5 ms a tick)
            self.stream.publish(status.to_record())

    def status(self) -> dict[str, Any]:
        return {"clients": self.stream.clients, "client_dropped": self.stream.dropped_total}

    def close(self) -> None:
        if self._runtime is not None:
            self.stream.publish(self._runtime.status().to_record())
        self.stream.close()


class MetricsSink(Sink):
    """Prometheus counters and gauges; `files` names the file sinks whose failures it
    exports (only those configured)."""

    def __init__(self, metrics: DaemonMetrics, files: tuple[str, ...]) -> None:
        self.metrics = metrics
        self.files = files

    def started(self, runtime: Runtime) -> None:
        self.metrics.set_gpus(runtime.source.gpus)

    def wants(self, kind: type[Event]) -> bool:
        return issubclass(kind, ProbeStatus)

    def event(self, ev: Event) -> None:
        assert isinstance(ev, ProbeStatus)  # the only kind it wants
        self.metrics.observe_probe(ev)

    def finding(self, found: Event) -> None:
        if isinstance(found, GpuGap):
            self.metrics.observe_gap(found.gpu, found.dur_ns / 1e9)
        elif isinstance(found, Attribution):
            if found.self_inflicted:
                self.metrics.observe_self_inflicted(found.gpu, found.self_ns / 1e9)
            self.metrics.observe_attribution(
                found.gpu, [(p.cause, p.ns / 1e9) for p in found.parts], found.workload
            )

    def tick(self, now_ns: int, status: DaemonStatus) -> None:
        self.metrics.observe_engine(
            status.engine_dropped, status.late_events, status.attributed_early
        )
        for sink, dropped, failing in status.file_sinks():
            if sink in self.files:
                self.metrics.observe_sink(sink, dropped, bool(failing))
        if "stream" in self.files:
            self.metrics.observe_stream(status.clients, status.client_dropped)
