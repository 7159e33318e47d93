"""A timeline's place points under eviction: the CPUs it answers `cpus_until` with stay
those of the points left, whichever way the points go (by age, by count), checked against
a scan of the points after every step of a random history."""

from __future__ import annotations

import random

from gpujitter.daemon.analysis.engine.timeline import SPAN_RULES, Timeline
from gpujitter.probes.events import GilWait, Migration, NodeTime

RULE = SPAN_RULES[Migration]  # one place point (t, CPU before, CPU after) per migration


def scanned_first(tl: Timeline) -> dict[int, int]:
    first: dict[int, int] = {}
    for t, before, after in tl.places:
        first.setdefault(before, t)
        first.setdefault(after, t)
    return first


def test_first_seen_cpus_follow_every_eviction() -> None:
    rng = random.Random(12)
    tl = Timeline(tid=7, tgid=7)
    t = 0
    for step in range(3000):
        # mostly two CPUs, now and then a far one that may never come back
        cpus = [1, 2] if rng.random() < 0.95 else [rng.randrange(64)]
        t += rng.randrange(1, 1000)
        late = t - rng.randrange(0, 3000) if rng.random() < 0.1 else t  # out of order
        ev = Migration(ts_ns=late, tid=7, tgid=7, src_cpu=rng.choice(cpus),
                       dst_cpu=rng.choice(cpus), src_node=0, dst_node=0)  # fmt: skip
        tl.add(RULE, late, late, ev)
        if step % 97 == 0:
            tl.evict_older(t - rng.randrange(5_000, 60_000))
        elif step % 131 == 0 and tl.spans["migration"]:
            tl.drop_oldest(rng.randrange(1, 40))
        assert tl._first == scanned_first(tl), step
        if tl.places:
            b = rng.randrange(tl.places[0][0], t + 1)
            brute = tl.cpus_in(0, b)
            assert tl.cpus_until(b) == brute, step


def test_drop_oldest_takes_the_oldest_entries_of_every_kind_and_place_points() -> None:
    # The n oldest entries go whatever their kind, and it returns what went: its count was
    # once all taken from the last kind's list, empty, so nothing went while the engine's
    # count of what it held went down (a 4000-thread process: 600k spans, 550 MB).
    tl = Timeline(tid=7, tgid=7)
    for t in range(0, 100, 10):
        gil = GilWait(ts_ns=t, dur_ns=5, tid=7, tgid=7, cpu=1)
        node = NodeTime(ts_ns=t + 2, interval_ns=5, tid=7, tgid=7, node_ns=((0, 5),))
        moved = Migration(ts_ns=t + 4, tid=7, tgid=7, src_cpu=1, dst_cpu=2, src_node=0,
                          dst_node=0)  # fmt: skip
        for ev in (gil, node, moved):
            start, end = SPAN_RULES[type(ev)].bounds(ev)
            tl.add(SPAN_RULES[type(ev)], start, end, ev)
    size = tl.size  # 10 of each kind of span, 10 migration spans with a place point each
    assert tl.drop_oldest(10) == 10 and tl.size == size - 10
    # up to 22: the gil and nodetime spans of 0, 10 and 20, the migrations' of 0 and 10
    assert [s.start for s in tl.spans["gil"]] == list(range(30, 100, 10))
    assert [s.start for s in tl.spans["nodetime"]] == list(range(32, 100, 10))
    assert [s.start for s in tl.spans["migration"]] == list(range(24, 100, 10))
    assert [p[0] for p in tl.places] == list(range(24, 100, 10))
    # Everything but the last place point, which stays: the thread's CPU stays known.
    left = tl.size
    assert tl.drop_oldest(1000) == left - 1
    assert tl.size == 1 and tl.places == [(94, 1, 2)]
