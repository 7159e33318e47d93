"""The daemon.status record (docs/schema.md): what the runtime says of itself once a tick
(footprint, losses, what it made, where its own and the watched threads run, what each probe
costs). One typed record: the runtime builds it, its sinks read it (the stream sends it,
metrics count from it, sd_notify's STATUS line sums it up) and the TUI decodes it back."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpujitter.text import printable

KIND = "daemon.status"


@dataclass(frozen=True, slots=True)
class WatchedThread:
    """A live watched thread and the CPU (and its node) it last ran on."""

    tid: int
    tgid: int
    comm: str
    cpu: int
    node: int


@dataclass(frozen=True, slots=True)
class ProbeCost:
    """A probe's cost and delivery as its latest meta.probe says."""

    state: str
    bpf_ns_per_s: int
    bpf_runs_per_s: int
    cost_from: str
    events: int
    lost_kernel: int
    lost_user: int


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """self_inflicted: -1 when a daemon did not say (one older than the field)."""

    ts_ns: int
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    events_per_s: float = 0.0
    lost_kernel: int = 0
    lost_user: int = 0
    engine_dropped: int = 0
    late_events: int = 0
    attributed_early: int = 0
    clients: int = 0
    client_dropped: int = 0
    attributions: int = 0
    self_inflicted: int = -1
    self_inflicted_ns: int = 0
    own_cpus: tuple[int, ...] = ()
    own_nice: int = 0
    log_dropped: int = 0
    log_failing: str = ""
    trace_lost: int = 0
    trace_failing: str = ""
    probe_cost: Mapping[str, ProbeCost] = field(default_factory=dict)
    threads: tuple[WatchedThread, ...] = ()

    def file_sinks(self) -> tuple[tuple[str, int, str], ...]:
        """(sink, records it dropped, why it is failing or "") of the log and the trace."""
        return (
            ("log", self.log_dropped, self.log_failing),
            ("trace", self.trace_lost, self.trace_failing),
        )

    def to_record(self) -> dict[str, Any]:
        """The record as the stream carries it."""
        rec: dict[str, Any] = {"type": KIND}
        for f in dataclasses.fields(self):
            rec[f.name] = getattr(self, f.name)
        rec["own_cpus"] = list(self.own_cpus)
        rec["probe_cost"] = {p: dataclasses.asdict(c) for p, c in self.probe_cost.items()}
        rec["threads"] = [dataclasses.asdict(t) for t in self.threads]
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> DaemonStatus:
        """A received record, read leniently (a client of a newer or older daemon): unknown
        fields ignored, missing ones defaulted, every string made printable."""
        values: dict[str, Any] = {"ts_ns": int(rec.get("ts_ns", 0))}
        for f in dataclasses.fields(cls):
            if f.name in rec and f.name not in ("ts_ns", "probe_cost", "threads", "own_cpus"):
                values[f.name] = _as(f.type, rec[f.name])
        values["own_cpus"] = tuple(int(c) for c in rec.get("own_cpus") or ())
        values["probe_cost"] = {
            printable(str(p)): ProbeCost(**{k.name: _as(k.type, c.get(k.name)) for k in
                                            dataclasses.fields(ProbeCost)})
            for p, c in (rec.get("probe_cost") or {}).items()
            if isinstance(c, Mapping)
        }  # fmt: skip
        values["threads"] = tuple(
            WatchedThread(
                tid=int(t.get("tid", 0)),
                tgid=int(t.get("tgid", 0)),
                comm=printable(str(t.get("comm", ""))),
                cpu=int(t.get("cpu", -1)),
                node=int(t.get("node", -1)),
            )
            for t in rec.get("threads") or ()
            if isinstance(t, Mapping)
        )
        return cls(**values)


def _as(kind: object, value: Any) -> Any:
    """A received field's value as its annotation (a string under `from __future__`) says."""
    if kind == "float":
        return float(value or 0.0)
    if kind == "str":
        return printable(str(value or ""))
    return int(value or 0)
