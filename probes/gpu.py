"""The NVML sampler: per GPU, the utilisation (200 ms) and power (20 ms) sample streams read
with last-seen timestamps so that no sample is read twice or skipped, mapped onto
CLOCK_MONOTONIC (probes/gpu_clock.py); compute processes and their SM share. It feeds the
gap detector (GpuSample, GpuProcesses) and the watched set (`gpu_processes`, the hook of
WatchSpec). Each reading has a cadence of its own, set by what a read costs (READ_EVERY_NS):
power every 500 ms, utilisation and the processes every 2 s, their SM share every 10 s, and a
ring never less often than three times over the span it holds (measured at the first read),
so none wraps unread. From the per-read costs measured on the H200, ~1.8 ms of NVML CPU a
second per GPU, where reading both rings every 500 ms and the processes with their share
every second cost ~6.9 ms (docs/gpu.md).

NVML faults are per GPU and per reading: a GPU that is lost, or a reading its driver does not
support, is reported in the sampler's status and skipped; the rest keeps going.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpujitter.probes.base import Emit
from gpujitter.probes.events import Event, GpuClockMap, GpuProcesses, GpuSample, ProbeStatus
from gpujitter.probes.gpu_clock import (
    EARLY_NS,
    Calibration,
    CalibrationFailed,
    Observation,
    calibrate,
    live_offsets,
)
from gpujitter.probes.nvml import Nvml, NvmlSample

METRICS: tuple[Literal["util", "power"], ...] = ("util", "power")
# How often each reading is taken, by what one read costs the NVML thread on the H200
# (bench/results/h200/nvml_calls.json, docs/performance.md "The daemon's own CPU"): a power-ring
# read 0.29 ms of CPU, a utilisation-ring read 2.1 ms, a per-process utilisation read 2.1 ms.
# Power is cheap, its ring short (119 samples, ~2.4 s) and the gap detector waits for it to
# judge a candidate: every 500 ms. The utilisation ring holds ~14 s and a candidate gap
# waits up to 3 s for its evidence: every 2 s. The processes every 2 s: a new GPU process is
# watched up to ~3 s after NVML lists it (this, then the watched set's refresh each second).
READ_EVERY_NS = {"power": 500_000_000, "util": 2_000_000_000}
PROCESSES_EVERY_NS = 2_000_000_000
# The processes' share of the SMs (sm_util) every 10 s: its read costs 2.1 ms of CPU, and
# nothing in gpujitter judges a gap by it (people read it: the stream, a trace). Read with
# the process list every 2 s it was ~1 ms a second, a quarter of the NVML thread.
PROCESS_UTIL_EVERY_NS = 10_000_000_000
# A ring is read at least this many times over the span it holds (its depth times the
# spacing of its samples, both measured), however long READ_EVERY_NS says: a read that comes
# late (a busy node, a slow driver call) still finds the samples since the last one.
READS_PER_RING = 3
# Nominal sample periods (measured on the H200: docs/gpu.md); the observed spacing is used
# once a stream has shown two samples.
NOMINAL_PERIOD_NS = {"util": 200_000_000, "power": 20_000_000}
# Where the activity a sample reflects lies, relative to its timestamp (measured on the
# H200 against known idle/busy edges, docs/gpu.md): a utilisation sample covers the period
# that ends at its timestamp; board power follows activity about 10 ms late, so a power
# sample reflects the period ending 10 ms before its timestamp. GpuSample.ts_ns is when the
# period it reflects began.
LAG_NS = {"util": 0, "power": 10_000_000}
# The readings the sampler depends on; other NVML problems (identity, NUMA) are `gpus`'s.
SAMPLER_READINGS = (
    "nvmlDeviceGetSamples",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
    "clock",
)
# Sample reads whose lag (read time - sample time) the clock mapping is judged on; the
# mapping is reported when first made and once more when these are in.
CALIBRATION_OBSERVATIONS = 64
# A read's newest sample stamped this long (and a period) before the last read is no sample
# the last read missed (a stamp comes into a ring at once: lags from 0.3 ms seen, docs/gpu.md)
# but a sign that NVML's stamps moved back (_hold).
STAMPS_MOVED_NS = 1_000_000_000


def read_every_ns(metric: Literal["util", "power"], ring: int, period_ns: int) -> int:
    """The time between two reads of a stream whose ring holds `ring` samples `period_ns`
    apart (0: not known yet): READ_EVERY_NS, or less where the ring holds less than
    READS_PER_RING times that."""
    every = READ_EVERY_NS[metric]
    if not ring:
        return every
    return min(every, ring * (period_ns or NOMINAL_PERIOD_NS[metric]) // READS_PER_RING)


@dataclass(slots=True)
class _Stream:
    metric: Literal["util", "power"]
    last_seen_us: int = 0
    period_ns: int = 0
    read: int = 0
    ring: int = 0  # how many samples NVML keeps (what a read from lastSeen 0 returns)
    skipped: int = 0  # samples the ring dropped before they were read
    due_ns: int = 0  # when it is read next
    read_ns: int = 0  # when fresh samples were last read
    checked_ns: int = 0  # when its silence was last checked for stamps that moved back

    def every_ns(self) -> int:
        return read_every_ns(self.metric, self.ring, self.period_ns)


@dataclass(slots=True)
class _Gpu:
    index: int
    streams: dict[str, _Stream] = field(default_factory=lambda: {m: _Stream(m) for m in METRICS})
    pids: tuple[int, ...] = ()
    proc_last_us: int = 0
    share_due_ns: int = 0  # when the processes' SM share is read next
    calibration: Calibration | None = None
    observations: list[Observation] = field(default_factory=list)
    # The calibrated clock's offset from CLOCK_MONOTONIC that its stamps map with (_hold).
    offset_ns: int = 0
    remapped: int = 0  # times NVML's stamps moved and the offset was taken anew


class GpuSampler:
    """Poll NVML: call `poll()` when `next_due_ns()` comes (or `run()` on a thread of its
    own); each poll reads the streams and process lists that are due. The first read (at
    `start()`) takes each ring whole, which both calibrates the clock mapping and tells how
    deep the ring is; only samples taken after `start()` are emitted."""

    name = "nvml"

    def __init__(
        self,
        nvml: Nvml,
        emit: Emit,
        *,
        cpu_count: int,
        offsets: Callable[[], Mapping[str, int]] = live_offsets,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.nvml = nvml
        self._emit = emit
        self._offsets = offsets
        self._clock = clock
        self.gpus = {g.index: _Gpu(g.index) for g in nvml.gpus(cpu_count)}
        self.start_ns = 0
        self._procs_due_ns = 0
        self._lock = threading.Lock()
        self._status: tuple[str, str] | None = None
        self.events = 0

    def emit(self, ev: Event) -> None:
        self.events += 1
        self._emit(ev)

    def start(self) -> None:
        self.start_ns = self._clock()
        self._poll(self.start_ns, due_only=False)

    def poll(self) -> None:
        """Read what is due."""
        self._poll(self._clock(), due_only=True)

    def flush(self) -> None:
        """Read every stream and process list now, due or not: the last read before a stop."""
        self._poll(self._clock(), due_only=False)

    def next_due_ns(self) -> int:
        """When the next reading is due (the sampler's clock)."""
        streams = [s.due_ns for gpu in self.gpus.values() for s in gpu.streams.values()]
        return min([self._procs_due_ns, *streams])

    def _poll(self, now: int, due_only: bool) -> None:
        offsets = self._offsets()
        for gpu in self.gpus.values():
            for stream in gpu.streams.values():
                if not due_only or now >= stream.due_ns:
                    self._read_stream(gpu, stream, offsets)
                    stream.due_ns = _next_due(stream.due_ns, stream.every_ns(), now)
            if gpu.index in self.nvml.lost and gpu.pids:
                with self._lock:
                    gpu.pids = ()  # nothing is known to run on a lost GPU
        if not due_only or now >= self._procs_due_ns:
            self._procs_due_ns = _next_due(self._procs_due_ns, PROCESSES_EVERY_NS, now)
            for gpu in self.gpus.values():
                self._read_processes(gpu, now, due_only)
        self._report(now)

    def _read_stream(self, gpu: _Gpu, stream: _Stream, offsets: Mapping[str, int]) -> None:
        metric = stream.metric
        got = self.nvml.samples(gpu.index, metric, stream.last_seen_us)
        read_at = self._clock()  # every sample returned existed by now
        if got == [] and self._moved_back(gpu, stream, read_at, offsets):
            got = self.nvml.samples(gpu.index, metric, stream.last_seen_us)
        if not got:
            return
        first_read = stream.last_seen_us == 0
        if len(gpu.observations) < CALIBRATION_OBSERVATIONS:
            self._calibrate(gpu, got, read_at, offsets, newest_only=first_read)
        # NVML derives a sample's timestamp anew at each read, and it can come back a
        # microsecond later than before: within half a period of the newest one read, it is
        # that sample again (seen on the H200), not a new one.
        half_us = (stream.period_ns or NOMINAL_PERIOD_NS[metric]) // 2000
        fresh = [s for s in got if first_read or s.ts_us > stream.last_seen_us + half_us]
        previous = stream.last_seen_us
        stream.last_seen_us = max(previous, got[-1].ts_us)
        if first_read:
            stream.ring = len(got)
        if not fresh or gpu.calibration is None:
            return
        if len(fresh) > 1:  # the mean spacing of this batch
            stream.period_ns = (fresh[-1].ts_us - fresh[0].ts_us) * 1000 // (len(fresh) - 1)
        self._hold(gpu, stream, fresh[-1], read_at, offsets)
        if previous and len(got) >= stream.ring:
            # A full ring of unread samples: older ones may have been overwritten.
            self._count_skipped(stream, metric, previous, fresh[0].ts_us)
        for sample in fresh:
            self._emit_sample(gpu, metric, stream, sample)

    def _hold(
        self,
        gpu: _Gpu,
        stream: _Stream,
        newest: NvmlSample,
        read_at: int,
        offsets: Mapping[str, int],
    ) -> None:
        """Keep the offset the mapping was calibrated with while it holds. NVML stamps on a
        copy of the wall clock of its own, which does not follow a step of the host's: on an
        H100, the wall clock stepped 5 s back, the stamps went on 5 s ahead of it for as
        long as the step lasted (bench/results/h100/nvml-clock-step-34cb069.json); mapped
        with the host's offset of each read, every sample lay 5 s in the future, and the
        engine's clock with them. The offset is taken anew only when NVML's stamps moved:
        the newest sample read would lie after this read, or before the last read by more
        than a period and STAMPS_MOVED_NS (it followed the host's clock after all)."""
        assert gpu.calibration is not None
        mapped = newest.ts_us * 1000 - gpu.offset_ns
        period = stream.period_ns or NOMINAL_PERIOD_NS[stream.metric]
        if mapped > read_at + EARLY_NS or (
            stream.read_ns and mapped < stream.read_ns - period - STAMPS_MOVED_NS
        ):
            self._remap(gpu, offsets[gpu.calibration.source], read_at)
        stream.read_ns = read_at

    def _remap(self, gpu: _Gpu, offset_ns: int, now: int) -> None:
        """NVML's stamps moved: the offset taken anew, counted and said (a gpu.clock record)."""
        gpu.offset_ns = offset_ns
        gpu.remapped += 1
        self._clock_map(gpu, now)

    def _moved_back(
        self, gpu: _Gpu, stream: _Stream, read_at: int, offsets: Mapping[str, int]
    ) -> bool:
        """Whether NVML's stamps moved back behind the newest one read, the offset then taken
        anew. NVML takes up a step of the host's wall clock back in the end: on an H100, 61 s
        after a step of 60 s back, its stamps went from 60 s ahead of the wall clock to 9 ms
        behind it at once (bench/results/h100/nvml-clock-step-long-68b1586.json). Asked for
        the samples after the newest stamp read, it then gives none until its stamps pass
        that stamp again, as long as the step: a silence _hold never sees. So a stream that
        has had no sample for a period and STAMPS_MOVED_NS reads its ring whole once, and
        where the ring's newest stamp lies that far before the newest read, every stream of
        the GPU reads on from its last read, by the offset now in force."""
        period = stream.period_ns or NOMINAL_PERIOD_NS[stream.metric]
        since = max(stream.read_ns, stream.checked_ns)
        if gpu.calibration is None or not since or read_at - since < period + STAMPS_MOVED_NS:
            return False
        stream.checked_ns = read_at
        ring = self.nvml.samples(gpu.index, stream.metric, 0)
        if not ring or ring[-1].ts_us * 1000 > stream.last_seen_us * 1000 - STAMPS_MOVED_NS:
            return False
        # NVML took up the host's step where the host's offset now maps the ring's newest
        # stamp to about now; where it does not (no step seen, or another), the offset is
        # the one that does, by the calibration's median lag.
        newest_ns, held = ring[-1].ts_us * 1000, gpu.offset_ns
        offset = offsets[gpu.calibration.source]
        if not read_at - period - STAMPS_MOVED_NS <= newest_ns - offset <= read_at + EARLY_NS:
            offset = newest_ns - read_at + gpu.calibration.lag_median_ns
        self._remap(gpu, offset, read_at)
        # Each stream's newest stamp read, moved as the stamps moved, is the same sample.
        moved_us = (held - gpu.offset_ns) // 1000
        for each in gpu.streams.values():
            each.last_seen_us = max(0, each.last_seen_us - moved_us)
        gpu.proc_last_us = 0  # the share's next read takes what the ring holds
        return True

    def _calibrate(
        self,
        gpu: _Gpu,
        got: list[NvmlSample],
        now: int,
        offsets: Mapping[str, int],
        newest_only: bool,
    ) -> None:
        # A whole-ring read only says when its newest sample was taken (about now).
        fresh = got[-1:] if newest_only else got
        first = not gpu.observations
        before = gpu.calibration
        gpu.observations += [Observation(s.ts_us, now, dict(offsets)) for s in fresh]
        try:
            gpu.calibration = calibrate(gpu.observations)
        except CalibrationFailed:
            gpu.calibration = None
            self.nvml.problems[(gpu.index, "clock")] = "NVML timestamps match no host clock"
            return
        if before is None or before.source != gpu.calibration.source:
            gpu.offset_ns = offsets[gpu.calibration.source]  # held from here on (_hold)
        if not first and len(gpu.observations) < CALIBRATION_OBSERVATIONS:
            return
        self._clock_map(gpu, now)

    def _clock_map(self, gpu: _Gpu, now: int) -> None:
        """The mapping in force, as a record (the trace keeps each)."""
        cal = gpu.calibration
        assert cal is not None
        self.emit(
            GpuClockMap(
                ts_ns=now,
                gpu=gpu.index,
                source=cal.source,
                offset_ns=gpu.offset_ns,
                lag_min_ns=cal.lag_min_ns,
                lag_median_ns=cal.lag_median_ns,
                lag_max_ns=cal.lag_max_ns,
                observations=cal.observations,
            )
        )

    def _count_skipped(self, stream: _Stream, metric: str, last_us: int, next_us: int) -> None:
        period = stream.period_ns or NOMINAL_PERIOD_NS[metric]
        hole_ns = (next_us - last_us) * 1000
        if hole_ns > period * 3 // 2:
            stream.skipped += round(hole_ns / period) - 1

    def _emit_sample(
        self,
        gpu: _Gpu,
        metric: Literal["util", "power"],
        stream: _Stream,
        sample: NvmlSample,
    ) -> None:
        period = stream.period_ns or NOMINAL_PERIOD_NS[metric]
        begin = sample.ts_us * 1000 - gpu.offset_ns - LAG_NS[metric] - period
        if begin < self.start_ns:
            return  # history from before the start: the ring's older contents
        stream.read += 1
        self.emit(
            GpuSample(
                ts_ns=begin, gpu=gpu.index, metric=metric, value=sample.value, period_ns=period
            )
        )

    def _read_processes(self, gpu: _Gpu, now: int, due_only: bool) -> None:
        procs = self.nvml.compute_processes(gpu.index)
        if procs is None:
            return
        util = []
        if not due_only or now >= gpu.share_due_ns:
            gpu.share_due_ns = _next_due(gpu.share_due_ns, PROCESS_UTIL_EVERY_NS, now)
            util = self.nvml.process_utilization(gpu.index, gpu.proc_last_us) or []
        if util:
            gpu.proc_last_us = max(u.ts_us for u in util)
        share: dict[int, list[int]] = {}
        for u in util:
            share.setdefault(u.pid, []).append(u.sm_percent)
        pids = tuple(sorted({p.pid for p in procs}))
        with self._lock:
            gpu.pids = pids
        self.emit(
            GpuProcesses(
                ts_ns=now,
                gpu=gpu.index,
                pids=pids,
                sm_util=tuple((pid, round(sum(v) / len(v))) for pid, v in sorted(share.items())),
            )
        )

    def gpu_processes(self) -> list[int]:
        """Every process using a GPU now (WatchSpec.gpu_processes)."""
        with self._lock:
            return sorted({pid for gpu in self.gpus.values() for pid in gpu.pids})

    def problems(self) -> list[str]:
        """What this node's NVML cannot give, per GPU, in a few words each."""
        out = []
        for (index, fn), why in sorted(self.nvml.problems.items(), key=str):
            if fn in SAMPLER_READINGS and (index is None or index not in self.nvml.lost):
                out.append(f"GPU {index if index is not None else '-'}: {fn}: {why}")
        out += [f"GPU {index}: {why}" for index, why in sorted(self.nvml.lost.items())]
        for gpu in self.gpus.values():
            for metric, stream in gpu.streams.items():
                if stream.skipped:
                    out.append(f"GPU {gpu.index}: {stream.skipped} {metric} samples overwritten")
        return out

    def status(self, now_ns: int) -> ProbeStatus:
        problems = self.problems()
        if not self.gpus:
            state, reason = "unavailable", "NVML sees no GPU"
        elif len(self.nvml.lost) == len(self.gpus):
            state, reason = "unavailable", "; ".join(problems)
        else:
            state, reason = ("degraded" if problems else "running"), "; ".join(problems)
        return ProbeStatus(
            ts_ns=now_ns,
            probe=self.name,
            state=state,  # type: ignore[arg-type]
            reason=reason,
            events=self.events,
            lost_user=sum(s.skipped for g in self.gpus.values() for s in g.streams.values()),
        )

    def _report(self, now: int) -> None:
        status = self.status(now)
        key = (status.state, status.reason)
        if key != self._status:
            self._status = key
            self.emit(status)

    def run(
        self, should_stop: Callable[[], bool], sleep: Callable[[float], object] = time.sleep
    ) -> None:
        """Poll when a reading is due until `should_stop` (`sleep` in seconds: a test's
        clock moves with it)."""
        while not should_stop():
            sleep(max(0.0, (self.next_due_ns() - self._clock()) / 1e9))
            self.poll()


def _next_due(due_ns: int, every_ns: int, now_ns: int) -> int:
    """The next read on the stream's beat (streams of one GPU read together where their beats
    meet), or a whole interval from now when the reader fell behind it."""
    beat = due_ns + every_ns
    return beat if beat > now_ns else now_ns + every_ns


class SamplerThread:
    """A GpuSampler polling on a background thread until the block ends."""

    def __init__(self, sampler: GpuSampler) -> None:
        self.sampler = sampler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="gpujitter-nvml", daemon=True)

    def _main(self) -> None:
        self.sampler.run(self._stop.is_set)

    def __enter__(self) -> SamplerThread:
        self.sampler.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sampler.flush()
