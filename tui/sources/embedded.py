"""The embedded source: when no daemon runs, `gpujitter top` runs the probes itself (in the
probe runner's own thread) and turns their events into stream records through
StreamPipeline, so the app sees what a daemon would have sent. What the probes cannot give
(no root, no bcc, a refused hook: the irq or cstate probe not running) the kernel's
counters give, coarser (ProcCpuSampler). Once a second it also reports its own footprint as
the daemon.status a daemon would send.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil

from gpujitter import __version__
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import clock_ref
from gpujitter.probes.events import Event, ProbeStatus, to_record
from gpujitter.probes.host import HostPaths
from gpujitter.probes.topology import Topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.tui.sources import Sink, Source
from gpujitter.tui.sources.pipeline import StreamPipeline
from gpujitter.tui.sources.procstat import ProcCpuSampler

QUEUE_LIMIT = 100_000  # events between the probe thread and this source; beyond: lost_user
DRAIN_S = 0.1
# Probes whose cpu.stats halves replace the kernel counters' (interrupts; idle residency).
IRQ_PROBE, IDLE_PROBE = "irq", "cstate"


class EmbeddedSource(Source):
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
        self.pipeline = StreamPipeline(topology)
        self._events: deque[Event] = deque()
        self._lost = 0
        self._probes: dict[str, str] = {}  # probe -> state

    def _emit(self, ev: Event) -> bool:
        """Called on the probe thread: hand the event over, or refuse it (counted lost)."""
        if len(self._events) >= QUEUE_LIMIT:
            self._lost += 1
            return False
        self._events.append(ev)
        return True

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

    def run(self, sink: Sink, stopped: Callable[[], bool]) -> None:
        sink.connection("embedded", "starting the probes")
        sink.records([self.hello(), self.pipeline.snapshot(time.monotonic_ns())])
        from gpujitter.probes.sources import EvidenceSources

        try:
            with EvidenceSources(
                self.names,
                topology=self.topology,
                watch=self.watch,
                emit=self._emit,
                thresholds=self.thresholds,
                paths=self.paths,
            ) as sources:
                self.pipeline.state.gpus = sources.gpus
                sink.records([self.pipeline.snapshot(time.monotonic_ns())])
                sink.connection("embedded", f"probes: {', '.join(self.names) or 'none'}")
                self._loop(sink, stopped, probes_failed=lambda: sources.failed)
        except GpujitterError as err:
            self._without_probes(sink, stopped, str(err))
        except Exception as err:  # bcc missing, a probe thread that died: degrade, not crash
            self._without_probes(sink, stopped, f"{type(err).__name__}: {err}")
        sink.connection("stopped")

    def _without_probes(self, sink: Sink, stopped: Callable[[], bool], why: str) -> None:
        """The probes cannot run at all: say so per probe, keep showing the kernel's counters."""
        now = time.monotonic_ns()
        why = why.splitlines()[0] if why else "the probes could not start"
        sink.records(
            to_record(ProbeStatus(ts_ns=now, probe=name, state="unavailable", reason=why))
            for name in self.names
        )
        sink.connection("embedded", f"probes unavailable: {why}; kernel counters only")
        self._loop(sink, stopped, probes_failed=lambda: False)

    def _loop(
        self, sink: Sink, stopped: Callable[[], bool], probes_failed: Callable[[], bool]
    ) -> None:
        me = psutil.Process()
        me.cpu_percent()
        sampler: ProcCpuSampler | None = None
        covered: tuple[bool, bool] | None = None
        next_tick = time.monotonic()
        delivered = 0
        while not stopped() and not probes_failed():
            delivered += self._drain(sink)
            now = time.monotonic()
            if now < next_tick:
                time.sleep(min(DRAIN_S, next_tick - now))
                continue
            next_tick = now + self.tick_s
            now_ns = time.monotonic_ns()
            running = {p for p, s in self._probes.items() if s in ("running", "degraded")}
            want = (IRQ_PROBE not in running, IDLE_PROBE not in running)
            if want != covered:  # a probe came or went: the counters fill what it leaves
                covered = want
                sampler = ProcCpuSampler(self.topology, self.paths, irq=want[0], idle=want[1])
            if sampler is not None and any(want):
                sink.records(sampler.sample(now_ns))
            sink.records([self._status(me, now_ns, delivered / self.tick_s)])
            delivered = 0
        self._drain(sink)

    def _drain(self, sink: Sink) -> int:
        events = []
        while self._events:
            ev = self._events.popleft()
            if isinstance(ev, ProbeStatus):
                self._probes[ev.probe] = ev.state
            events.append(ev)
        if events:
            sink.records(self.pipeline.feed(events))
        return len(events)

    def _status(self, me: psutil.Process, now_ns: int, events_per_s: float) -> dict[str, Any]:
        """This process in the daemon's place: its CPU and memory, what it lost."""
        probes = self.pipeline.state.probes.values()
        return self.pipeline.state.status(
            now_ns,
            cpu_percent=me.cpu_percent(),
            rss_bytes=me.memory_info().rss,
            events_per_s=events_per_s,
            lost_kernel=sum(p.lost_kernel for p in probes),
            lost_user=sum(p.lost_user for p in probes) + self._lost,
            engine_dropped=self._lost,
            clients=1,
            client_dropped=0,
        )
