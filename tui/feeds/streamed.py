"""The runtime's output as the records the daemon's stream carries (the kinds it streams, and
the gaps and attributions the pipeline settles), gathered for the app: the sink that the
embedded and replay feeds put on the one runtime (daemon/service/runtime.py)."""

from __future__ import annotations

from typing import Any

from gpujitter.daemon.service.runtime import Runtime, Sink
from gpujitter.probes.events import Event, to_record


class StreamRecords(Sink):
    """Gathers the records until `take` hands them over."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._runtime: Runtime | None = None

    def started(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def event(self, ev: Event) -> None:
        self._take(ev)

    def finding(self, found: Event) -> None:
        self._take(found)

    def _take(self, ev: Event) -> None:
        assert self._runtime is not None
        if self._runtime.state.streamed(ev):
            self.records.append(to_record(ev))

    def take(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records
