"""Events -> the records the daemon's socket would carry: the one seam between the probes
(or a trace's events) and the app for the embedded and replay sources.

For now a pass-through: the kinds the stream carries as they are (cpu.stats, meta.probe,
gpu.sample, gpu.procs, meta.watch, and gaps or attributions a trace recorded); raw probe
events (sched.offcpu, irq.stolen, ...) go through too and the model ignores them. When the
daemon's pipeline (gpujitter.daemon.pipeline) lands, `StreamPipeline` wraps it: feed it the
events, return what it publishes (gaps, attributions, cpu.stats, meta.probe, daemon.status),
and take `snapshot` from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpujitter.probes.events import Event, to_record
from gpujitter.probes.topology import Topology


class StreamPipeline:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology

    def feed(self, events: Iterable[Event]) -> list[dict[str, Any]]:
        """The stream records these events give (in order)."""
        return [to_record(ev) for ev in events]

    def snapshot(self, now_ns: int) -> dict[str, Any]:
        return {"type": "snapshot", "ts_ns": now_ns, "gpus": []}
