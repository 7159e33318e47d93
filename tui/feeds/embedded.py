"""The embedded feed: when no daemon runs, `gpujitter top` runs the daemon's runtime
in-process (daemon/service/runtime.py: the probes and NVML, the queue, the pipeline and node state)
and hands the app the records a daemon's stream would carry. What the probes cannot give (no
root, no bcc, a refused hook: the irq or cstate probe not running) the kernel's counters
give, coarser (ProcCpuSampler). Once a tick it also reports its own footprint as the
daemon.status a daemon would send.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpujitter import __version__
from gpujitter.daemon.analysis.engine import EngineConfig
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.service.own_scheduling import OwnScheduling
from gpujitter.daemon.service.runtime import EventSource, ListSource, LiveSource, Runtime
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import clock_ref
from gpujitter.probes.events import Event, ProbeStatus, to_record
from gpujitter.probes.host import HostPaths
from gpujitter.probes.procstat import ProcCpuSampler
from gpujitter.probes.topology import Topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.tui.feeds import Feed, Receiver
from gpujitter.tui.feeds.streamed import StreamRecords

# Probes whose cpu.stats halves replace the kernel counters' (interrupts; idle residency).
IRQ_PROBE, IDLE_PROBE = "irq", "cstate"


class EmbeddedFeed(Feed):
    live = True

    def __init__(
        self,
        names: Sequence[str],
        *,
        topology: Topology,
        watch: WatchSpec,
        thresholds: Mapping[str, Mapping[str, int]] | None = None,
        paths: HostPaths | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self.names = list(names)
        self.topology = topology
        self.watch = watch
        self.thresholds = thresholds or {}
        self.paths = paths or HostPaths()
        self.tick_s = tick_s
        self.label = "embedded (no daemon)"

    def hello(self) -> dict[str, Any]:
        ref = clock_ref()
        return {
            "type": "hello",
            "schema": "gpujitter.stream/1",
            "scope": "all",
            "version": __version__,
            "host": socket.gethostname(),
            "kernel": os.uname().release,
            "pid": os.getpid(),
            "clock": to_record(ref),
            "topology": self.topology.to_record(),
            "probes": self.names,
        }

    def _runtime(self, source: EventSource, sink: Receiver, stopped: Callable[[], bool]) -> Runtime:
        return Runtime(
            source, self.topology, sinks=[_ToApp(sink, self.topology, self.paths)],
            analysis=lambda src: AnalysisConfig(engine=EngineConfig(gpu_bus_ids=src.gpu_bus_ids())),
            signals=False, stopped=stopped, tick_ns=int(self.tick_s * 1e9),
            own=OwnScheduling(shared=True),  # the TUI's own threads keep theirs, announced
        )  # fmt: skip

    def run(self, sink: Receiver, stopped: Callable[[], bool]) -> None:
        sink.connection("embedded", "starting the probes")
        live = LiveSource(self.names, topology=self.topology, watch=self.watch,
                          thresholds=self.thresholds, paths=self.paths)  # fmt: skip
        runtime = self._runtime(live, sink, stopped)
        now = time.monotonic_ns()
        sink.records([self.hello(), runtime.state.snapshot(now, runtime.state.status(now))])

        def attached(rt: Runtime) -> None:
            sink.records([rt.state.snapshot(time.monotonic_ns(), rt.status())])
            sink.connection("embedded", f"probes: {', '.join(self.names) or 'none'}")

        try:
            runtime.run(attached)
        except GpujitterError as err:
            self._without_probes(sink, stopped, str(err))
        except Exception as err:  # bcc missing, a probe thread that died: degrade, not crash
            self._without_probes(sink, stopped, f"{type(err).__name__}: {err}")
        sink.connection("stopped")

    def _without_probes(self, sink: Receiver, stopped: Callable[[], bool], why: str) -> None:
        """The probes cannot run at all: say so per probe, keep showing the kernel's counters."""
        now = time.monotonic_ns()
        why = why.splitlines()[0] if why else "the probes could not start"
        sink.records(
            to_record(ProbeStatus(ts_ns=now, probe=name, state="unavailable", reason=why))
            for name in self.names
        )
        sink.connection("embedded", f"probes unavailable: {why}; kernel counters only")
        self._runtime(ListSource((), live=True), sink, stopped).run()


class _ToApp(StreamRecords):
    """The runtime's output as the records the daemon's stream carries, handed to the app a
    batch at a time; each tick, the kernel counters for what no probe covers and the
    status (this process in the daemon's place)."""

    def __init__(self, app: Receiver, topology: Topology, paths: HostPaths) -> None:
        super().__init__()
        self.app = app
        self.topology = topology
        self.paths = paths
        self.probes: dict[str, str] = {}  # probe -> state
        self.sampler: ProcCpuSampler | None = None
        self.covered: tuple[bool, bool] | None = None

    def event(self, ev: Event) -> None:
        if isinstance(ev, ProbeStatus):
            self.probes[ev.probe] = ev.state
        super().event(ev)

    def batch_done(self) -> None:
        if records := self.take():
            self.app.records(records)

    def tick(self, now_ns: int, status: DaemonStatus) -> None:
        running = {p for p, s in self.probes.items() if s in ("running", "degraded")}
        want = (IRQ_PROBE not in running, IDLE_PROBE not in running)
        if want != self.covered:  # a probe came or went: the counters fill what it leaves
            self.covered = want
            self.sampler = ProcCpuSampler(self.topology, self.paths, irq=want[0], idle=want[1])
        if self.sampler is not None and any(want):
            self.app.records(self.sampler.sample(now_ns))
        self.app.records([status.to_record()])

    def status(self) -> dict[str, Any]:
        return {"clients": 1}

    def close(self) -> None:
        self.batch_done()
