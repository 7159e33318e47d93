"""Records the daemon derives from probe events: GPU idle gaps (and, from the attribution
engine, what each gap's time went to). They travel as events of their own kinds, so the
log, the socket stream and replay all use one serialisation."""

from __future__ import annotations

from dataclasses import dataclass

from gpujitter.probes.events import Event, event_kind


@event_kind("gpu.gap")
@dataclass(frozen=True, slots=True)
class GpuGap(Event):
    """GPU `gpu` sat idle from ts_ns to end_ns.

    sources: the evidence that placed it ("cuda": a host-side launch gap, µs placement;
    "power": 20 ms NVML power samples; "util": 200 ms utilisation duty cycle).
    resolution_ns: how far start and end may be off. confidence: 0..1, how sure the
    detector is that the GPU was idle for the whole span. tgids: the processes feeding this
    GPU; tid_before/tid_after: the threads that launched last before and first after the
    gap (0 when unknown).
    """

    end_ns: int
    gpu: int
    sources: tuple[str, ...]
    resolution_ns: int
    confidence: float
    tgids: tuple[int, ...] = ()
    tid_before: int = 0
    tid_after: int = 0

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.ts_ns

    @property
    def gap_id(self) -> str:
        return f"{self.gpu}:{self.ts_ns}"
