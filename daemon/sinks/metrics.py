"""Prometheus metrics of the daemon, for clusters that aggregate many nodes: gaps and
attributed time by GPU and cause, idle time by Kubernetes pod or Slurm job, probe health and
lost events, stream clients, gaps gpujitter itself caused (self-inflicted), and the daemon's
own CPU and memory (prometheus_client's
process collector), and the endpoint's own refusals. Served on a localhost port only when
asked (`metrics.listen`, metrics_server.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.process_collector import ProcessCollector

from gpujitter.daemon.service.config import parse_listen
from gpujitter.daemon.sinks.metrics_server import CONNECTION_TIMEOUT_S, MetricsServer
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import ProbeStatus
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.workload import scope_of

PROBE_STATES = ("running", "degraded", "unavailable", "off", "stopped")
# Per-GPU series carry the GPU's identity as NVIDIA's DCGM exporter gives it (the same
# values), in snake_case as Prometheus' conventions (and promtool) want: `gpu` and
# `pci_bus_id` match DCGM's labels as they are, its `UUID` and `modelName` are our `uuid` and
# `model_name` (label_replace joins them: docs/operations.md, "Metrics").
GPU_LABELS = ("gpu", "uuid", "pci_bus_id", "model_name")
MAX_WORKLOADS = 64  # pods and Slurm jobs with series of their own; later ones go to "_other"
GAP_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


def nvml_bus_id(sysfs_id: str) -> str:
    """0000:3b:00.0 (sysfs, as gpujitter keeps it) -> 00000000:3B:00.0 (NVML's, DCGM's)."""
    domain, _, rest = sysfs_id.partition(":")
    return f"{int(domain, 16):08X}:{rest.upper()}" if rest else sysfs_id


@dataclass(slots=True)
class _ProbeSeries:
    """One probe's series, looked up once: each probe reports its status every second or
    so, and prometheus_client's labels() costs a few µs a call (ten of them per status)."""

    states: tuple[tuple[str, Any], ...]  # (state, its gauge), PROBE_STATES in order
    events: Any
    lost_kernel: Any
    lost_user: Any
    # The BPF cost gauges (seconds, runs), made once it is first measured: absent until then.
    bpf: tuple[Any, Any] | None = None

    @classmethod
    def of(cls, metrics: DaemonMetrics, probe: str) -> _ProbeSeries:
        states = tuple((s, metrics.probe_state.labels(probe=probe, state=s)) for s in PROBE_STATES)
        return cls(
            states=states,
            events=metrics.probe_events.labels(probe=probe),
            lost_kernel=metrics.probe_lost.labels(probe=probe, where="kernel"),
            lost_user=metrics.probe_lost.labels(probe=probe, where="user"),
        )


class DaemonMetrics:
    def __init__(self) -> None:
        # Counters' *_created series only double what a scrape sends (process-wide switch).
        disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(namespace="gpujitter", registry=r)
        self.gaps = Counter("gpujitter_gaps", "GPU idle gaps detected", GPU_LABELS, registry=r)
        self.gap_seconds = Counter(
            "gpujitter_gap_seconds", "GPU idle time in detected gaps", GPU_LABELS, registry=r
        )
        self.gap_duration = Histogram(
            "gpujitter_gap_duration_seconds",
            "how long detected GPU idle gaps lasted",
            GPU_LABELS,
            buckets=GAP_BUCKETS_S,
            registry=r,
        )
        self.attributed = Counter(
            "gpujitter_attributed_seconds",
            "GPU idle time attributed to each cause (unexplained included)",
            [*GPU_LABELS, "cause"],
            registry=r,
        )
        self.workload_idle = Counter(
            "gpujitter_workload_idle_seconds",
            "GPU idle time in attributed gaps whose feeding thread runs in a Kubernetes pod "
            f"or a Slurm job (the first {MAX_WORKLOADS} seen; later ones under pod _other)",
            ["gpu", "namespace", "pod", "slurm_job"],
            registry=r,
        )
        self._workloads: set[tuple[str, str, str]] = set()
        self.probe_state = Gauge(
            "gpujitter_probe_state",
            "1 for the state each probe is in",
            ["probe", "state"],
            registry=r,
        )
        self.probe_events = Counter(
            "gpujitter_probe_events", "events a probe delivered", ["probe"], registry=r
        )
        self.probe_lost = Counter(
            "gpujitter_probe_lost_events",
            "events a probe lost, in the kernel (ring buffer full) or in Python (queue full)",
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
        self.stream_dropped = Counter(
            "gpujitter_stream_dropped_records",
            "records dropped for stream clients that read too slowly",
            registry=r,
        )
        self.engine_lost = Counter(
            "gpujitter_engine_dropped_events",
            "events dropped between the probes and the engine (queue full)",
            registry=r,
        )
        self.engine_late = Counter(
            "gpujitter_engine_late_events",
            "events that reached the engine more than its lateness bound after they ended "
            "(a gap may have been attributed without them)",
            registry=r,
        )
        self.engine_early = Counter(
            "gpujitter_engine_attributed_early",
            "gaps attributed before their lateness bound because too many were pending",
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
            GPU_LABELS,
            registry=r,
        )
        self.self_inflicted = Counter(
            "gpujitter_self_inflicted_gaps",
            "attributed gaps in which a watched thread waited behind gpujitter's own threads "
            "(the target is none)",
            GPU_LABELS,
            registry=r,
        )
        self.self_inflicted_seconds = Counter(
            "gpujitter_self_inflicted_seconds",
            "time watched threads waited behind gpujitter's own threads inside gaps",
            GPU_LABELS,
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
        self._probe_series: dict[str, _ProbeSeries] = {}
        self._gpus: dict[int, dict[str, str]] = {}
        self._server: MetricsServer | None = None

    def set_gpus(self, gpus: Iterable[GpuInfo]) -> None:
        """The GPUs NVML knows: their identity goes on every per-GPU series."""
        self._gpus = {
            g.index: {"gpu": str(g.index), "uuid": g.uuid,
                      "pci_bus_id": nvml_bus_id(g.pci_bus_id), "model_name": g.name}
            for g in gpus
        }  # fmt: skip

    def _gpu(self, gpu: int) -> dict[str, str]:
        # A GPU NVML does not know (the stub libcuda, no driver): its index alone.
        return self._gpus.get(gpu) or {"gpu": str(gpu), "uuid": "", "pci_bus_id": "",
                                        "model_name": ""}  # fmt: skip

    def observe_gap(self, gpu: int, seconds: float) -> None:
        labels = self._gpu(gpu)
        self.gaps.labels(**labels).inc()
        self.gap_seconds.labels(**labels).inc(seconds)
        self.gap_duration.labels(**labels).observe(seconds)

    def observe_attribution(
        self, gpu: int, parts: Iterable[tuple[str, float]], workload: str = ""
    ) -> None:
        labels = self._gpu(gpu)
        self.attributions.labels(**labels).inc()
        total = 0.0
        for cause, seconds in parts:
            self.attributed.labels(**labels, cause=cause).inc(seconds)
            total += seconds
        scope = scope_of(workload)
        if scope == ("", "", ""):
            return
        if scope not in self._workloads:
            if len(self._workloads) >= MAX_WORKLOADS:
                scope = ("", "_other", "")
            else:
                self._workloads.add(scope)
        namespace, pod, job = scope
        self.workload_idle.labels(gpu=str(gpu), namespace=namespace, pod=pod, slurm_job=job).inc(
            total
        )

    def observe_self_inflicted(self, gpu: int, seconds: float) -> None:
        labels = self._gpu(gpu)
        self.self_inflicted.labels(**labels).inc()
        self.self_inflicted_seconds.labels(**labels).inc(seconds)

    def observe_probe(self, status: ProbeStatus) -> None:
        series = self._probe_series.get(status.probe)
        if series is None:
            series = self._probe_series[status.probe] = _ProbeSeries.of(self, status.probe)
        for state, gauge in series.states:
            gauge.set(1 if status.state == state else 0)
        name = status.probe
        self._advance(series.events, f"events/{name}", status.events)
        self._advance(series.lost_kernel, f"lost/{name}/kernel", status.lost_kernel)
        self._advance(series.lost_user, f"lost/{name}/user", status.lost_user)
        if status.bpf_ns_per_s >= 0:
            if series.bpf is None:
                series.bpf = (self.probe_bpf_seconds.labels(probe=name),
                              self.probe_bpf_runs.labels(probe=name))  # fmt: skip
            seconds, runs = series.bpf
            seconds.set(status.bpf_ns_per_s / 1e9)
            runs.set(status.bpf_runs_per_s)

    def observe_stream(self, clients: int, dropped_total: int) -> None:
        self.stream_clients.set(clients)
        self._advance(self.stream_dropped, "stream", dropped_total)

    def observe_engine(self, dropped_total: int, late_total: int = 0, early_total: int = 0) -> None:
        """Called each tick with the event queue's running drop count and the engine's running
        counts of late events and of gaps attributed early."""
        self._advance(self.engine_lost, "engine", dropped_total)
        self._advance(self.engine_late, "engine_late", late_total)
        self._advance(self.engine_early, "engine_early", early_total)

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
