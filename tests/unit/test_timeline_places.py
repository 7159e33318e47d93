"""A timeline's place points under eviction: the CPUs it answers `cpus_until` with stay
those of the points left, whichever way the points go (by age, by count), checked against
a scan of the points after every step of a random history."""

from __future__ import annotations

import random

from gpujitter.daemon.analysis.engine.timeline import SPAN_RULES, Timeline
from gpujitter.probes.events import Migration

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
