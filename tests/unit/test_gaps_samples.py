"""The gap detector's cheap paths give what the full scans gave: the samples lying inside a
span found by bisection (in order) or by a scan (out of order, until that ages out), and a
decision pass only for the GPUs whose earliest pending candidate may settle."""

from __future__ import annotations

import random

import pytest

from gpujitter.daemon.analysis.gaps import GapDetector, _Samples
from gpujitter.probes.events import Event, GpuSample
from tests.fixtures.streams.synthetic import gappy_steps

MS = 1_000_000


def sample(ts_ns: int, period_ns: int = 20 * MS, value: float = 400.0) -> GpuSample:
    return GpuSample(ts_ns=ts_ns, gpu=0, metric="power", value=value, period_ns=period_ns)


def scanned(kept: list[GpuSample], start: int, end: int) -> list[GpuSample]:
    return [s for s in kept if s.ts_ns >= start and s.ts_ns + s.period_ns <= end]


@pytest.mark.parametrize("seed", range(40))
def test_inside_is_the_scan_whatever_the_order(seed: int) -> None:
    """Mostly in order, as NVML delivers; now and then a sample stepped back (a clock
    step) or with a negative period (a hand-made trace); the oldest forgotten as time
    passes, so a disorder ages out and bisection takes over again."""
    rng = random.Random(seed)
    samples, kept = _Samples(), []
    ts = 0
    for n in range(600):
        ts += rng.choice((20 * MS, 20 * MS, 19 * MS, 0))
        step = -rng.randrange(1, 60) * MS if rng.random() < 0.02 else 0
        period = -5 * MS if rng.random() < 0.01 else rng.choice((20 * MS, 21 * MS, 0))
        s = sample(max(0, ts + step), period)
        samples.append(s)
        kept.append(s)
        if n % 7 == 0:
            horizon = ts - 2_000 * MS
            samples.forget_before(horizon)
            while kept and kept[0].ts_ns < horizon:
                kept.pop(0)
        start = rng.randrange(max(1, ts - 2_500 * MS), ts + 1) if ts else 0
        end = start + rng.randrange(0, 400 * MS)
        assert list(samples.inside(start, end)) == scanned(kept, start, end)
    assert list(samples) == kept


def test_a_disorder_ages_out() -> None:
    """After the sample that stepped back is forgotten, the span is found by bisection
    again: a sample stepping back no longer counts against the stream."""
    samples = _Samples()
    for k in range(10):
        samples.append(sample(k * 20 * MS))
    samples.append(sample(150 * MS))  # steps back from 180 ms
    samples.append(sample(200 * MS))
    assert [s.ts_ns // MS for s in samples.inside(140 * MS, 200 * MS)] == [140, 160, 180, 150]
    samples.forget_before(190 * MS)  # 0-180 ms gone, and with them the descent 180 -> 150
    assert [s.ts_ns for s in samples] == [200 * MS]
    samples.append(sample(220 * MS))
    assert [s.ts_ns for s in samples.inside(200 * MS, 240 * MS)] == [200 * MS, 220 * MS]


class EveryGpu(GapDetector):
    """The decision pass as it was: every pending candidate looked at on each evidence."""

    def _settling(self) -> set[int]:
        return set(self._first_end)


def decided(detector: GapDetector, events: list[Event]) -> list[tuple[int, object]]:
    """Each gap with the index of the event at which it was decided."""
    out = [(n, gap) for n, ev in enumerate(events) for gap in detector.feed(ev)]
    return out + [(len(events), gap) for gap in detector.flush()]


@pytest.mark.parametrize("gpus", [1, 3])
def test_gpus_not_settling_skip_the_pass_and_nothing_else_moves(gpus: int) -> None:
    events = gappy_steps(gpus, 8)
    reference = decided(EveryGpu(), events)
    assert len({gap.gpu for _, gap in reference}) == gpus  # type: ignore[attr-defined]
    assert len(reference) > 100 * gpus
    assert decided(GapDetector(), events) == reference
