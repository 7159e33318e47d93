"""Events -> the records the daemon's socket would carry, for the replay source: a trace's
events are played against a replay clock (pause, seek), so they are fed here rather than
through the runtime the embedded source runs. It wraps the daemon's own pipeline (gap
detection, then attribution) and node state, so the app shows for a replayed trace exactly
what a daemon would have streamed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpujitter.daemon.analysis.pipeline import AnalysisConfig, Pipeline
from gpujitter.daemon.service.state import NodeState
from gpujitter.probes.events import Event, to_record
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.topology import Topology


class StreamPipeline:
    def __init__(
        self,
        topology: Topology,
        config: AnalysisConfig | None = None,
        gpus: list[GpuInfo] | None = None,
    ) -> None:
        self.topology = topology
        self.pipeline = Pipeline(topology, config)
        self.state = NodeState(topology, gpus)

    def feed(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        """The stream records these events give (in order): the kinds the stream carries,
        and the gaps and attributions they settle."""
        out: list[dict[str, Any]] = []
        for ev in events:
            self._take(ev, out)
            for found in self.pipeline.feed(ev):
                self._take(found, out)
        return out

    def flush(self) -> list[dict[str, Any]]:
        """End of the stream: the findings still pending."""
        out: list[dict[str, Any]] = []
        for found in self.pipeline.flush():
            self._take(found, out)
        return out

    def _take(self, ev: Event, out: list[dict[str, Any]]) -> None:
        self.state.observe(ev)
        if self.state.streamed(ev):
            out.append(to_record(ev))

    def snapshot(self, now_ns: int, status: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.state.snapshot(now_ns, status or self.state.status(now_ns))
