"""Events in, findings out: gap detection, then attribution of each gap. The daemon, `report`,
drills and the TUI's embedded and replay modes all run this one path, so the attributions of
one event stream are the same live and replayed. Both stages are pure functions of the
stream; their configuration, and the GPUs' idle floors the daemon started with (kept from an
earlier run), travel in the trace header (AnalysisConfig) so that a replay runs with what was
in force live.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpujitter.daemon.analysis.engine.engine import Engine, EngineConfig
from gpujitter.daemon.analysis.gaps import GapConfig, GapDetector, plausible_idle_w
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import BadRecord, Event, typed
from gpujitter.probes.topology import Topology


@dataclass(frozen=True, slots=True)
class AnalysisConfig:
    gaps: GapConfig = field(default_factory=GapConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # GPU index -> idle power (W) an earlier run proved for its board
    # (daemon/service/idle_floors.py).
    idle_floors_w: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for gpu, watts in self.idle_floors_w.items():
            if not plausible_idle_w(watts):
                raise GpujitterError(
                    f"idle_floors_w: GPU {gpu}: {watts} W is no board's idle power"
                )

    def to_record(self) -> dict[str, Any]:
        engine = dataclasses.asdict(self.engine)
        engine["gpu_bus_ids"] = {str(k): v for k, v in self.engine.gpu_bus_ids.items()}
        floors = {str(k): v for k, v in self.idle_floors_w.items()}
        return {"gaps": dataclasses.asdict(self.gaps), "engine": engine, "idle_floors_w": floors}

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> AnalysisConfig:
        """Settings a newer version added are ignored; missing ones take their defaults, or
        what the version before them did (_AS_BEFORE); one of the wrong type is refused,
        named."""
        gaps = rec.get("gaps")
        if isinstance(gaps, Mapping):
            older = {k: was(gaps) for k, was in _AS_BEFORE.items() if k not in gaps}
            rec = {**rec, "gaps": {**gaps, **older}} if older else rec
        try:
            config = typed(cls, rec)
        except BadRecord as err:
            raise GpujitterError(f"bad analysis settings in trace header: {err}") from None
        except GpujitterError as err:  # a value GapConfig or EngineConfig refuses
            raise GpujitterError(f"bad analysis settings in trace header: {err}") from None
        return config


# Gap settings that changed what the detector does when they came, and for a header written
# before them, the value that does what its daemon did: the replay of an older trace gives
# what that daemon logged. offcpu_unsynced_ns (f8244af): every thread's off-CPU intervals were
# kept for the whole history.
_AS_BEFORE: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "offcpu_unsynced_ns": lambda gaps: gaps.get("history_ns", GapConfig().history_ns),
}


class Pipeline:
    def __init__(self, topology: Topology, config: AnalysisConfig | None = None) -> None:
        self.config = config or AnalysisConfig()
        self.detector = GapDetector(self.config.gaps, self.config.idle_floors_w)
        self.engine = Engine(topology, self.config.engine)

    def feed(self, ev: Event) -> list[Event]:
        """What this event settles: gaps the detector decided, then attributions the engine
        released (a gap is itself an event for the engine, right after the one that
        decided it)."""
        out: list[Event] = list(self.engine.feed(ev))
        for gap in self.detector.feed(ev):
            out.append(gap)
            out.extend(self.engine.feed(gap))
        return out

    def flush(self) -> list[Event]:
        """End of stream: decide every pending gap and attribute every held one."""
        out: list[Event] = []
        for gap in self.detector.flush():
            out.append(gap)
            out.extend(self.engine.feed(gap))
        out.extend(self.engine.flush())
        return out

    def run(self, events: Iterable[Event]) -> Iterator[Event]:
        """Every gap and attribution of a whole stream (a trace, a drill), in order."""
        for ev in events:
            yield from self.feed(ev)
        yield from self.flush()


def analyse(
    events: Iterable[Event], topology: Topology, config: AnalysisConfig | None = None
) -> Iterator[Event]:
    """Every gap and attribution of a whole stream, by a pipeline of its own."""
    return Pipeline(topology, config).run(events)
