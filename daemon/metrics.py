"""Prometheus metrics of the daemon, for clusters that aggregate many nodes: gaps and
attributed time by GPU and cause, probe health and lost events, stream clients, and the
daemon's own CPU and memory (prometheus_client's process collector), and the endpoint's own
refusals. Served on a localhost port only when asked (`metrics.listen`, metrics_server.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest
from prometheus_client.process_collector import ProcessCollector

from gpujitter.daemon.config import parse_listen
from gpujitter.daemon.metrics_server import CONNECTION_TIMEOUT_S, MetricsServer
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import ProbeStatus

PROBE_STATES = ("running", "degraded", "unavailable", "off", "stopped")


class DaemonMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(namespace="gpujitter", registry=r)
        self.gaps = Counter("gpujitter_gaps", "GPU idle gaps detected", ["gpu"], registry=r)
        self.gap_seconds = Counter(
            "gpujitter_gap_seconds", "GPU idle time in detected gaps", ["gpu"], registry=r
        )
        self.attributed = Counter(
            "gpujitter_attributed_seconds",
            "GPU idle time attributed to each cause (unexplained included)",
            ["gpu", "cause"],
            registry=r,
        )
        self.probe_state = Gauge(
            "gpujitter_probe_state",
            "1 for the state each probe is in",
            ["probe", "state"],
            registry=r,
        )
        self.probe_events = Gauge(
            "gpujitter_probe_events",
            "events a probe delivered since start",
            ["probe"],
            registry=r,
        )
        self.probe_lost = Gauge(
            "gpujitter_probe_lost_events",
            "events a probe lost since start, in the kernel (ring buffer full) or in Python",
            ["probe", "where"],
            registry=r,
        )
        self.probe_bpf_seconds = Gauge(
            "gpujitter_probe_bpf_seconds_per_second",
            "CPU time of a probe's BPF programs in the kernel per second, last measured "
            "stretch (kernel BPF statistics, or sampled 1 s a minute); absent until measured",
            ["probe"],
            registry=r,
        )
        self.probe_bpf_runs = Gauge(
            "gpujitter_probe_bpf_runs_per_second",
            "runs of a probe's BPF programs per second, last measured stretch",
            ["probe"],
            registry=r,
        )
        self.stream_clients = Gauge(
            "gpujitter_stream_clients", "clients connected to the stream socket", registry=r
        )
        self.stream_dropped = Gauge(
            "gpujitter_stream_dropped_records",
            "records dropped for slow stream clients since start",
            registry=r,
        )
        self.engine_lost = Counter(
            "gpujitter_engine_dropped_events",
            "events dropped between the probes and the engine (queue full)",
            registry=r,
        )
        self.http_closed = Counter(
            "gpujitter_metrics_connections_closed",
            "connections to this endpoint closed for cause: over_limit, timeout, bad_request",
            ["reason"],
            registry=r,
        )
        self.attributions = Counter(
            "gpujitter_attributions",
            "attributions made; each is in the log or counted in gpujitter_sink_dropped_records",
            ["gpu"],
            registry=r,
        )
        self.sink_dropped = Counter(
            "gpujitter_sink_dropped_records",
            "records a sink could not write because the disk refused them (full, quota, I/O)",
            ["sink"],
            registry=r,
        )
        self.sink_failing = Gauge(
            "gpujitter_sink_failing",
            "1 while a sink's disk refuses writes (records are dropped and counted)",
            ["sink"],
            registry=r,
        )
        self._totals: dict[str, int] = {}  # running totals the daemon hands in
        self._server: MetricsServer | None = None

    def observe_gap(self, gpu: int, seconds: float) -> None:
        self.gaps.labels(gpu=str(gpu)).inc()
        self.gap_seconds.labels(gpu=str(gpu)).inc(seconds)

    def observe_attribution(self, gpu: int, parts: Iterable[tuple[str, float]]) -> None:
        self.attributions.labels(gpu=str(gpu)).inc()
        for cause, seconds in parts:
            self.attributed.labels(gpu=str(gpu), cause=cause).inc(seconds)

    def observe_probe(self, status: ProbeStatus) -> None:
        for state in PROBE_STATES:
            self.probe_state.labels(probe=status.probe, state=state).set(
                1 if status.state == state else 0
            )
        self.probe_events.labels(probe=status.probe).set(status.events)
        self.probe_lost.labels(probe=status.probe, where="kernel").set(status.lost_kernel)
        self.probe_lost.labels(probe=status.probe, where="user").set(status.lost_user)
        if status.bpf_ns_per_s >= 0:
            self.probe_bpf_seconds.labels(probe=status.probe).set(status.bpf_ns_per_s / 1e9)
            self.probe_bpf_runs.labels(probe=status.probe).set(status.bpf_runs_per_s)

    def observe_stream(self, clients: int, dropped_total: int) -> None:
        self.stream_clients.set(clients)
        self.stream_dropped.set(dropped_total)

    def observe_engine(self, dropped_total: int) -> None:
        """Called each tick with the event queue's running drop count."""
        self._advance(self.engine_lost, "engine", dropped_total)

    def observe_sink(self, sink: str, dropped_total: int, failing: bool) -> None:
        """Called each tick with a file sink's running count of records the disk refused."""
        self._advance(self.sink_dropped.labels(sink=sink), sink, dropped_total)
        self.sink_failing.labels(sink=sink).set(1 if failing else 0)

    def _advance(self, counter: Any, key: str, total: int) -> None:
        """Counters only go up: add what a running total grew by since the last call."""
        last = self._totals.get(key, 0)
        counter.inc(max(total - last, 0))
        self._totals[key] = total

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, listen: str, *, timeout_s: float = CONNECTION_TIMEOUT_S) -> None:
        """Serve /metrics on HOST:PORT ([::1]:PORT for IPv6) from a background thread; a
        listen address that cannot be bound is a GpujitterError at once."""
        try:
            host, port = parse_listen(listen)
        except ValueError as err:
            raise GpujitterError(f"metrics.listen {listen!r}: {err}") from None
        try:
            server = MetricsServer(
                host,
                port,
                self.exposition,
                closed=lambda reason: self.http_closed.labels(reason=reason).inc(),
                timeout_s=timeout_s,
            )
        except OSError as err:
            raise GpujitterError(f"metrics.listen {listen}: {err.strerror or err}") from None
        self._server = server.start()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
