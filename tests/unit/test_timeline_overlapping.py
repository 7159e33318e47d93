"""A timeline's window reads under out-of-order arrival and eviction: `overlapping` bisects
an index of the spans' starts kept beside each list, so after every step of a random history
it must answer what a scan of the spans answers."""

from __future__ import annotations

import random

from gpujitter.daemon.analysis.engine.timeline import SPAN_RULES, Span, Timeline
from gpujitter.probes.events import GilWait

RULE = SPAN_RULES[GilWait]  # one exact interval per event, no place points


def scanned(tl: Timeline, a: int, b: int) -> list[Span]:
    return [
        s
        for s in tl.spans["gil"]
        if s.start < b and (s.end > a or (s.start == s.end and s.start >= a))
    ]


def test_window_reads_match_a_scan_through_every_change() -> None:
    rng = random.Random(5)
    tl = Timeline(tid=7, tgid=7)
    t = 0
    for step in range(3000):
        t += rng.randrange(0, 500)
        start = t - rng.randrange(0, 3000) if rng.random() < 0.2 else t  # out of order
        dur = rng.choice((0, rng.randrange(1, 400), rng.randrange(1, 20_000)))
        ev = GilWait(ts_ns=start, dur_ns=dur, tid=7, tgid=7, cpu=step % 4, holder_tid=8)
        tl.add(RULE, *RULE.bounds(ev), ev)
        if step % 97 == 0:
            tl.evict_older(t - rng.randrange(5_000, 60_000))
        elif step % 131 == 0 and tl.spans["gil"]:
            tl.drop_oldest(rng.randrange(1, 40))
        a = rng.randrange(max(0, t - 30_000), t + 1)
        b = a + rng.randrange(0, 10_000)
        assert tl.overlapping("gil", a, b) == scanned(tl, a, b), step
