"""The `top` longest gaps of a recording, taken in one attribution at a time: what the text
report and the HTML page list, without holding every attribution."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Generic, TypeVar

from gpujitter.daemon.analysis.records import Attribution

T = TypeVar("T")


class Longest(Generic[T]):
    """What `keep` makes of each of the `top` longest attributions added, in the order the
    reports list them: longest first, then earliest, then first added. `keep` runs only for
    one that is among the longest when it comes (the page's line is dear to make)."""

    def __init__(self, top: int, keep: Callable[[Attribution], T]) -> None:
        self.top = top
        self.keep = keep
        self.added = 0
        # a min-heap of (dur_ns, -ts_ns, -n, kept): that order reversed; n makes every key
        # unique, so what is kept is never compared
        self._heap: list[tuple[int, int, int, T]] = []

    def add(self, a: Attribution) -> None:
        self.added += 1
        key = (a.dur_ns, -a.ts_ns, -self.added)
        if len(self._heap) < self.top:
            heapq.heappush(self._heap, (*key, self.keep(a)))
        elif self.top and key > self._heap[0][:3]:
            heapq.heapreplace(self._heap, (*key, self.keep(a)))

    def items(self) -> list[T]:
        return [k[-1] for k in sorted(self._heap, reverse=True)]
