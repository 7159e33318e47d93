"""The soak's memory verdict (bench/soak.py rss_growth): a leak is growth that goes on, a
drained backlog a step that stops; the limit must catch the one and hold the other to its
height wherever it falls."""

from __future__ import annotations

import random

from bench.soak import RSS_GROWTH_LIMIT_BYTES, rss_growth

MIB = 1 << 20


def _series(rss_at, seconds: int = 900) -> list[tuple[float, int, int, int]]:
    """A sample a second (t, rss, threads, fds), with ±0.3 MiB of noise."""
    rng = random.Random(7)
    return [
        (float(t), int(rss_at(t) + rng.uniform(-0.3, 0.3) * MIB), 6, 150) for t in range(seconds)
    ]


def test_a_step_counts_its_height_wherever_it_comes() -> None:
    """A 7 MiB backlog kept after a stall, at the window's start, middle or end: the growth
    is the step's (the fitted slope made up to 10.5 MiB of the mid-window one)."""
    for at in (250, 550, 850):
        got = rss_growth(_series(lambda t, at=at: 90 * MIB + (7 * MIB if t >= at else 0)), 200.0)
        assert 6 * MIB <= got["growth_bytes"] <= 8 * MIB, (at, got["growth_bytes"] / MIB)
        assert got["growth_bytes"] <= RSS_GROWTH_LIMIT_BYTES


def test_a_leak_over_the_limit_is_caught() -> None:
    """1 MiB a minute for the 700 s window grows ~11 MiB: over the 10 MiB limit."""
    got = rss_growth(_series(lambda t: 90 * MIB + t * MIB / 60), 200.0)
    assert got["growth_bytes"] > RSS_GROWTH_LIMIT_BYTES
    assert abs(got["slope_bytes_per_hour"] - 60 * MIB) < 2 * MIB


def test_a_flat_series_grows_nothing_and_too_few_samples_say_so() -> None:
    assert abs(rss_growth(_series(lambda t: 90 * MIB), 200.0)["growth_bytes"]) < MIB
    assert rss_growth(_series(lambda t: 90 * MIB, seconds=205), 200.0) == {"samples": 5}
    assert rss_growth([], 200.0) == {"samples": 0}
