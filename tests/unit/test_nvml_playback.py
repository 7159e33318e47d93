"""The NVML side against what a real H200 answered: the recording of the GPU proof run
(bench/gpu_proof.py, tests/fixtures/nvml/h200-training.jsonl) and of `gpujitter gpus` on the
idle GPU, played back through probes/nvml.py's backend. Sample rings are played back as rings, by
time: the sampler reads them at its own cadence on a stepped clock, and one that passed a wrong
lastSeenTimeStamp, or came back after a ring wrapped, would read samples twice or miss them."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpujitter.probes import gpu
from gpujitter.probes.events import Event, GpuClockMap, GpuProcesses, GpuSample, ProbeStatus
from gpujitter.probes.gpu import LAG_NS, READ_EVERY_NS, GpuSampler, read_every_ns
from gpujitter.probes.gpu_clock import Observation, calibrate, offsets_from_header
from gpujitter.probes.nvml import Nvml, NvmlSample
from gpujitter.probes.nvml_session import NvmlPlayback, load
from tests.conftest import FIXTURES

TRAINING = FIXTURES / "nvml" / "h200-training.jsonl"
IDLE = FIXTURES / "nvml" / "h200-idle.jsonl"
MS = 1_000_000


class SteppedClock:
    """A clock that moves only when the code under test sleeps: a recorded session plays in
    no time, with each read where a live sampler's would fall."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def sleep(self, seconds: float) -> None:
        self.ns += math.ceil(seconds * 1e9)


@dataclass(slots=True)
class Played:
    """A GpuSampler reading a recorded session on a stepped clock."""

    playback: NvmlPlayback
    sampler: GpuSampler
    events: list[Event]
    clock: SteppedClock

    def run(self, polls: int | None = None) -> None:
        """Start the sampler and run its own loop for `polls` polls; or to the recording's
        end, then stop it there as SamplerThread does (a last read of every stream)."""
        self.sampler.start()
        count = itertools.count()
        stop: Callable[[], bool] = (
            (lambda: self.playback.now() >= self.playback.end_ns)
            if polls is None
            else (lambda: next(count) >= polls)
        )
        self.sampler.run(stop, sleep=self.clock.sleep)
        if polls is None:
            self.sampler.flush()


def playback_sampler(recording: Path | tuple[dict, list[dict]], **playback_args: object) -> Played:
    clock = SteppedClock()
    playback = NvmlPlayback(recording, clock=clock, **playback_args)  # type: ignore[arg-type]
    events: list[Event] = []
    sampler = GpuSampler(
        Nvml(playback).open(),
        events.append,
        cpu_count=16,
        offsets=lambda: offsets_from_header(playback.header),
        clock=playback.now,
    )
    return Played(playback, sampler, events, clock)


@pytest.fixture(scope="module")
def training() -> Played:
    played = playback_sampler(TRAINING)
    played.run()
    return played


def distinct_recorded(metric: str, since_us: int) -> int:
    """Samples of one stream the H200 took after `since_us`, each counted once (a sample
    read twice can come back with its timestamp a microsecond apart)."""
    _, entries = load(TRAINING)
    kind = {"power": 0, "util": 1}[metric]
    stamps = sorted(
        {
            s["timeStamp"]
            for e in entries
            if e["fn"] == "nvmlDeviceGetSamples" and e["args"][0] == kind and "ret" in e
            for s in e["ret"][1]
        }
    )
    distinct = [stamps[0]]
    for ts in stamps[1:]:
        if ts - distinct[-1] > 5:
            distinct.append(ts)
    return sum(1 for ts in distinct if ts > since_us)


def test_every_sample_is_read_once_and_none_is_skipped(training: Played) -> None:
    playback, sampler, events = training.playback, training.sampler, training.events
    realtime = offsets_from_header(playback.header)["realtime"]
    for metric, period_ms in (("power", 20), ("util", 200)):
        samples = [e for e in events if isinstance(e, GpuSample) and e.metric == metric]
        # The first one emitted, as NVML stamped it: everything after it must come once.
        first = samples[0]
        first_us = (first.ts_ns + first.period_ns + LAG_NS[metric] + realtime) // 1000
        assert len(samples) == 1 + distinct_recorded(metric, first_us + 5), metric
        # The H200 spaces power samples 8 to 45 ms apart around 20 ms, utilisation ones
        # 200 ms apart: a re-read sample (µs apart) or a hole would show here.
        gaps = [b.ts_ns - a.ts_ns for a, b in itertools.pairwise(samples)]
        assert min(gaps) > period_ms * MS // 3, metric
        assert max(gaps) < period_ms * MS * 5 // 2, metric
        assert abs(statistics.median(s.period_ns for s in samples) - period_ms * MS) < MS
    streams = sampler.gpus[0].streams
    assert streams["power"].skipped == streams["util"].skipped == 0
    assert (streams["power"].ring, streams["util"].ring) == (119, 71)  # ~2.4 s and ~14 s


def test_samples_map_onto_the_monotonic_clock(training: Played) -> None:
    events = training.events
    (first, *_, final) = [e for e in events if isinstance(e, GpuClockMap)]
    assert first.source == final.source == "realtime"
    assert final.observations >= 64
    # Played back, a sample is readable from its timestamp on: the least lag is how soon
    # after a power sample a read came, under the widest spacing of two (45 ms).
    assert 0 <= final.lag_min_ns < 45 * MS
    assert final.lag_max_ns < 3_000 * MS  # read before the 2.4 s power ring wraps
    # Mapped samples lie in the session's time span, none in the future of their read.
    _, entries = load(TRAINING)
    start, end = entries[0]["t"], entries[-1]["t_end"]
    samples = [e for e in events if isinstance(e, GpuSample)]
    assert all(start - 15_000 * MS < s.ts_ns < end for s in samples)


@pytest.mark.parametrize("step_s", [-5, 5, 3600])
def test_a_stepped_wall_clock_moves_no_sample(training: Played, step_s: int) -> None:
    """NVML's stamps do not follow a step of the host's wall clock (an H100 stepped 5 s
    back and on: bench/results/h100/nvml-clock-step-34cb069.json), and the recording's
    stamps are NVML's: the host's clock stepped midway must move no sample. Mapped with the
    offset of each read, every sample after a step back lay 5 s in the future."""
    played = playback_sampler(TRAINING)
    true = offsets_from_header(played.playback.header)
    midway = (played.playback.now() + played.playback.end_ns) // 2

    def stepped() -> dict[str, int]:
        late = played.playback.now() >= midway
        return {**true, "realtime": true["realtime"] + (step_s * 10**9 if late else 0)}

    played.sampler._offsets = stepped
    played.run()
    got = [e for e in played.events if isinstance(e, GpuSample)]
    assert got == [e for e in training.events if isinstance(e, GpuSample)]
    assert played.sampler.gpus[0].remapped == 0


class TakesUpTheStep(NvmlPlayback):
    """The recording's NVML taking up a step of the host's wall clock `by_s` back from
    `at_ns` on, as an H100's did 61 s after a step of 60 s: every stamp of its rings read
    from then on lies by_s earlier, and so does the lastSeenTimeStamp each read passes."""

    def __init__(self, recording: Path, at_ns: int, by_s: int, **kwargs: Any) -> None:
        super().__init__(recording, **kwargs)
        self.at_ns, self.by_us = at_ns, by_s * 10**6

    def _ring_call(self, name: str, gpu: int | None, args: tuple[Any, ...]) -> Any:
        if name != "nvmlDeviceGetSamples" or self.now() < self.at_ns:
            return super()._ring_call(name, gpu, args)
        *head, last_seen = args
        value_type, samples = super()._ring_call(name, gpu, (*head, last_seen + self.by_us))
        moved = [SimpleNamespace(**{**vars(s), "timeStamp": s.timeStamp - self.by_us})
                 for s in samples]  # fmt: skip
        return value_type, moved


def test_stamps_that_took_up_a_step_back_are_read_on_from_the_last_read(training: Played) -> None:
    """The host's wall clock stepped 5 s back midway, and NVML's stamps took it up 2 s
    later: asked for the samples after the newest stamp read (then 5 s ahead of its
    stamps), NVML gave none until its stamps passed it again, and the sampler was blind
    for as long as the step (60 s on the H100). It reads its ring whole once a stream has
    been silent for a period and a second, sees the stamps moved, takes the offset anew
    and reads on from its last read: the same samples as the run without a step."""
    clock = SteppedClock()
    header, _ = load(TRAINING)
    start = NvmlPlayback(TRAINING, clock=clock).now()
    end = NvmlPlayback(TRAINING, clock=clock).end_ns
    midway = (start + end) // 2
    playback = TakesUpTheStep(TRAINING, midway + 2 * 10**9, 5, clock=clock)
    true = offsets_from_header(header)

    def stepped() -> dict[str, int]:
        late = playback.now() >= midway
        return {**true, "realtime": true["realtime"] - (5 * 10**9 if late else 0)}

    events: list[Event] = []
    sampler = GpuSampler(
        Nvml(playback).open(), events.append, cpu_count=16, offsets=stepped, clock=playback.now
    )
    Played(playback, sampler, events, clock).run()
    got = [e for e in events if isinstance(e, GpuSample)]
    assert got == [e for e in training.events if isinstance(e, GpuSample)]
    assert sampler.gpus[0].remapped == 1
    moved = [e for e in events if isinstance(e, GpuClockMap)][-1]
    assert moved.offset_ns == true["realtime"] - 5 * 10**9
    assert midway + 2 * 10**9 < moved.ts_ns < midway + 4 * 10**9


def test_stamps_that_moved_back_with_no_step_of_the_host_are_read_on() -> None:
    """Stamps that moved back with no step of the host's clock to say by how much: each
    stream reads on from the time of its last read, not blind for 5 s."""
    clock = SteppedClock()
    first = NvmlPlayback(TRAINING, clock=clock)
    at = (first.now() + first.end_ns) // 2
    playback = TakesUpTheStep(TRAINING, at, 5, clock=clock)
    played = Played(playback, GpuSampler(
        Nvml(playback).open(), (events := []).append, cpu_count=16,
        offsets=lambda: offsets_from_header(playback.header), clock=playback.now,
    ), events, clock)  # fmt: skip
    played.run()
    assert played.sampler.gpus[0].remapped == 1
    for metric in ("power", "util"):  # read on within a second and a period of the move
        after = [e.ts_ns for e in events if isinstance(e, GpuSample) and e.metric == metric
                 and e.ts_ns > at - 5 * 10**9]  # fmt: skip
        assert after and min(after) < at - 5 * 10**9 + 1_500 * MS, metric


def test_stamps_that_moved_are_mapped_with_the_offset_then_in_force() -> None:
    """Where NVML's stamps did move (the newest sample of a read would lie after the read,
    or long before the read before it), the offset is taken anew and said."""
    played = playback_sampler(TRAINING)
    played.run(polls=20)
    sampler, gpu0 = played.sampler, played.sampler.gpus[0]
    power = gpu0.streams["power"]
    held, read_at = gpu0.offset_ns, played.playback.now()
    newest_us = (read_at + held) // 1000  # stamped as it is read: the mapping holds
    offsets = {"realtime": held - 5 * 10**9, "boottime": 0, "monotonic": 0}
    sampler._hold(gpu0, power, NvmlSample(newest_us, 100.0), read_at, offsets)
    assert (gpu0.offset_ns, gpu0.remapped) == (held, 0)
    # stamped 5 s on: NVML followed a host clock stepped 5 s on
    sampler._hold(gpu0, power, NvmlSample(newest_us + 5 * 10**6, 100.0), read_at + 1, offsets)
    assert (gpu0.offset_ns, gpu0.remapped) == (held - 5 * 10**9, 1)
    assert played.events[-1] == GpuClockMap(
        ts_ns=read_at + 1, gpu=0, source="realtime", offset_ns=held - 5 * 10**9,
        lag_min_ns=gpu0.calibration.lag_min_ns, lag_median_ns=gpu0.calibration.lag_median_ns,
        lag_max_ns=gpu0.calibration.lag_max_ns, observations=gpu0.calibration.observations,
    )  # fmt: skip
    # and back: the newest stamp 2 s before the last read
    back = newest_us - 2 * 10**6
    sampler._hold(gpu0, power, NvmlSample(back, 100.0), read_at + 2, {"realtime": held})
    assert (gpu0.offset_ns, gpu0.remapped) == (held, 2)


def test_calibration_from_the_recorded_reads_alone() -> None:
    header, entries = load(TRAINING)
    offsets = offsets_from_header(header)
    observations = [
        Observation(max(s["timeStamp"] for s in e["ret"][1]), e["t_end"], offsets)
        for e in entries
        if e["fn"] == "nvmlDeviceGetSamples" and "ret" in e and e["args"][1]
    ]
    cal = calibrate(observations)
    assert cal.source == "realtime"
    assert 0 <= cal.lag_min_ns < 5 * MS  # a power sample is readable within ms
    assert cal.lag_median_ns < 600 * MS  # read every 500 ms


def test_each_stream_is_read_at_its_own_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Power every 500 ms, utilisation every 2 s and the processes' SM share every 10 s
    (READ_EVERY_NS, PROCESS_UTIL_EVERY_NS: what a read costs), read together where their
    beats meet; the stop reads everything once more."""
    played = playback_sampler(TRAINING)
    nvml, now = played.sampler.nvml, played.playback.now
    reads: dict[str, list[int]] = {"power": [], "util": [], "procs": []}
    samples, processes = nvml.samples, nvml.process_utilization

    def read_samples(index: int, kind: str, last_seen_us: int) -> object:
        reads[kind].append(now())
        return samples(index, kind, last_seen_us)

    def read_processes(index: int, last_seen_us: int) -> object:
        reads["procs"].append(now())
        return processes(index, last_seen_us)

    monkeypatch.setattr(nvml, "samples", read_samples)
    monkeypatch.setattr(nvml, "process_utilization", read_processes)
    played.run()
    spacing = {kind: {b - a for a, b in itertools.pairwise(at[:-1])} for kind, at in reads.items()}
    assert spacing == {"power": {500 * MS}, "util": {2000 * MS}, "procs": {10_000 * MS}}
    assert set(reads["util"][:-1]) <= set(reads["power"])
    assert reads["util"][-1] == reads["power"][-1] == reads["procs"][-1]  # the stop's read


def test_the_samples_do_not_depend_on_the_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The playback serves a ring by time: read every 500 ms, as the recorded session did,
    or at the sampler's cadence, the same samples come out, once each."""

    def emitted(played: Played) -> dict[str, list[float]]:
        played.run()
        got = [e for e in played.events if isinstance(e, GpuSample)]
        return {m: [e.value for e in got if e.metric == m] for m in ("power", "util")}

    own = emitted(playback_sampler(TRAINING))
    monkeypatch.setitem(READ_EVERY_NS, "util", 500 * MS)
    recorded_cadence = emitted(playback_sampler(TRAINING))
    assert own == recorded_cadence
    assert len(own["power"]) > 1500 and len(own["util"]) > 150


def shallow_power_ring(depth: int) -> tuple[dict, list[dict]]:
    """The H200 recording as if its power ring held only `depth` samples: the recorded read
    of the whole ring cut to its newest `depth`."""
    header, entries = load(TRAINING)
    (whole,) = [e for e in entries if e["fn"] == "nvmlDeviceGetSamples" and e["args"] == [0, 0]]
    value_type, samples = whole["ret"]
    whole["ret"] = [value_type, samples[-depth:]]
    return header, entries


def test_a_shallow_ring_is_read_before_it_wraps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cadence follows the ring's measured depth: a power ring of 20 samples (~0.4 s on
    the H200) is read three times over its span, and nothing is overwritten unread; read at
    the default 500 ms it wraps, and the sampler counts what it lost."""
    assert read_every_ns("power", 119, 20 * MS) == 500 * MS  # the H200's: the default
    assert read_every_ns("util", 71, 200 * MS) == 2000 * MS
    assert read_every_ns("power", 20, 20 * MS) == 133_333_333
    played = playback_sampler(shallow_power_ring(20))
    played.run()
    assert played.sampler.status(0).lost_user == 0
    assert "overwritten" not in played.sampler.status(0).reason

    monkeypatch.setattr(gpu, "read_every_ns", lambda metric, ring, period: READ_EVERY_NS[metric])
    late = playback_sampler(shallow_power_ring(20))
    late.run()
    assert late.sampler.status(0).lost_user > 0
    assert "power samples overwritten" in late.sampler.status(0).reason


def test_compute_processes_and_their_share(training: Played) -> None:
    sampler, events = training.sampler, training.events
    listed = [e for e in events if isinstance(e, GpuProcesses)]
    assert len(listed) >= 15  # every 2 s over the recording's 31 s
    workload = {pid for e in listed for pid in e.pids}
    assert len(workload) == 1  # the proof's PyTorch process, alone on the GPU
    busy = [share for e in listed for pid, share in e.sm_util]
    assert max(busy) >= 50  # it kept the SMs busy for most of the run
    assert sampler.gpu_processes() == sorted(workload)  # what WatchSpec.gpu_processes sees


def test_status_reports_what_the_h200_could_not_give(training: Played) -> None:
    sampler, events = training.sampler, training.events
    statuses = [e for e in events if isinstance(e, ProbeStatus)]
    assert statuses[0].state == "running"
    assert sampler.status(0).lost_user == 0
    # The VM's H200 has no NUMA id for NVML: that is for `gpujitter gpus`, not the sampler.
    assert "NumaNode" not in sampler.status(0).reason


def test_gpu_identity_from_the_idle_recording() -> None:
    nvml = Nvml(NvmlPlayback(IDLE)).open()
    (gpu,) = nvml.gpus(cpu_count=16)
    assert gpu.name == "NVIDIA H200"
    assert gpu.pci_bus_id == "0000:00:06.0"
    assert gpu.local_cpus == tuple(range(16))
    assert gpu.numa_node is None
    assert nvml.why_not(0, "nvmlDeviceGetNumaNodeId") == "Not Supported"
    assert nvml.compute_processes(0) == []
    assert nvml.utilization_percent(0) == 0
    power = nvml.power_watts(0)
    assert power is not None and 60 < power < 150  # an idle H200 draws ~80 W
