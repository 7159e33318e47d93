"""The threads that feed the GPUs, and those that hold them up, as the probes' own events name
them: for a sampler that cannot afford every watched thread (python_stacks) to look first.

A thread is a feeder for KEEP_NS after an event last named it: a libcuda call of its own (the
launcher or synchroniser of a gap's edge, and the thread active before the quiet stretch), a
GIL wait (the waiter and the holder), or a wake-up of a feeder after a wait (the waker: a
data-loader worker that hands a batch over, a thread that releases a lock).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpujitter.probes.events import CudaCall, Event, GilWait, OffCpu

KEEP_NS = 10_000_000_000  # a thread named once in ten seconds still feeds: steps are shorter

# Event class -> the thread ids it names as feeders (0: none).
NAMED_BY: dict[type[Event], Callable[[Any], tuple[int, ...]]] = {
    CudaCall: lambda e: (e.tid, e.prev_tid),
    GilWait: lambda e: (e.tid, e.holder_tid),
}


class Feeders:
    """Feeding threads by the time they were last named; noted on the thread that delivers
    events, read on the sampler's."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # tid -> ts_ns it was last named
        self._lock = threading.Lock()
        self.changes = 0  # bumped when a thread becomes a feeder or stops being one

    def note(self, ev: Event) -> None:
        named = NAMED_BY.get(type(ev))
        if named is not None:
            tids = named(ev)
        elif isinstance(ev, OffCpu) and ev.waker_tid and ev.tid in self._seen:
            tids = (ev.waker_tid,)
        else:
            return
        with self._lock:
            for tid in tids:
                if tid:
                    if tid not in self._seen:
                        self.changes += 1
                    self._seen[tid] = max(ev.ts_ns, self._seen.get(tid, 0))

    def recent(self, now_ns: int) -> set[int]:
        """The threads named within KEEP_NS before now_ns (older ones are forgotten)."""
        with self._lock:
            for tid in [t for t, ts in self._seen.items() if now_ns - ts > KEEP_NS]:
                del self._seen[tid]
                self.changes += 1
            return set(self._seen)
