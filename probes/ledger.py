"""Cumulative kernel counters handed out sample by sample, each sample at most its own length
(cstate's idle residency per CPU and state, sched's on-CPU time per thread and node)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence


def _as_is(value: int, at_ns: int) -> int:
    return value


class Ledger:
    """Per row (a CPU, a thread) and slot in it (a state, a node), the time handed out so far
    of a count that only grows. A sample gets what each slot gained since the last read, cut
    so that a row holds at most the sample's length (the largest slot first): a read can see
    time that belongs after it (a stretch begun between a copy and the read's stamp, a stint
    charged whole at its end); what is cut is held back for the samples after, none lost.
    A count seen to fall (an estimate read earlier was ahead) hands out nothing until it has
    caught up. value_at turns a row's word into the count at the read's time."""

    def __init__(
        self,
        rows: Mapping[int, Sequence[int]],
        read_ns: int,
        value_at: Callable[[int, int], int] = _as_is,
    ) -> None:
        self.since_ns = read_ns
        self._value_at = value_at
        self._reported = {
            row: {slot: value_at(word, read_ns) for slot, word in enumerate(words) if word}
            for row, words in rows.items()
        }
        self._owed: dict[int, int] = {}

    def take(
        self, rows: Mapping[int, Sequence[int]], read_ns: int
    ) -> dict[int, list[tuple[int, int]]]:
        """Per row in `rows`: (slot, ns) gained over [since_ns, read_ns), at most
        read_ns - since_ns in all; then since_ns moves on to read_ns."""
        interval_ns = read_ns - self.since_ns
        out: dict[int, list[tuple[int, int]]] = {}
        for row, words in rows.items():
            reported = self._reported.setdefault(row, {})
            gains = []
            for slot, word in enumerate(words):
                gain = self._value_at(word, read_ns) - reported.get(slot, 0) if word else 0
                if gain > 0:
                    gains.append((slot, gain))
            out[row] = _at_most(gains, interval_ns)
            for slot, ns in out[row]:
                reported[slot] = reported.get(slot, 0) + ns
            self._owed[row] = sum(ns for _, ns in gains) - sum(ns for _, ns in out[row])
        self.since_ns = read_ns
        return out

    def owed(self, row: int) -> int:
        """What the last take held back of the row's gain (ns): still to hand out."""
        return self._owed.get(row, 0)

    def forget(self, row: int) -> None:
        """The row is gone (a thread dropped, or its id now another thread's): start over."""
        self._reported.pop(row, None)
        self._owed.pop(row, None)


def _at_most(gains: list[tuple[int, int]], total_ns: int) -> list[tuple[int, int]]:
    """The gains, the largest cut first, so that they add up to at most total_ns."""
    over = sum(ns for _, ns in gains) - total_ns
    if over <= 0:
        return gains
    cut = dict(gains)
    for slot, ns in sorted(gains, key=lambda g: g[1], reverse=True):
        take = min(ns, over)
        cut[slot] -= take
        over -= take
        if not over:
            break
    return [(slot, cut[slot]) for slot, _ in gains if cut[slot]]
