"""Tap every NVML call a real session makes, and play such a session back as the backend of
probes/nvml.py: CI runs the NVML code against what a real GPU answered (tests/fixtures/nvml/),
never against invented numbers.

A session file is JSON lines: a header (the host clocks read together), then one line per call
with its CLOCK_MONOTONIC start and end, the function, the GPU (device handles are stored as
GPU indexes), the other arguments, and either the result as plain data or the NVML error
code.

NvmlPlayback answers each (function, GPU) with the recorded results in order (the last one again
once they run out: identity does not change). Sample rings (nvmlDeviceGetSamples,
nvmlDeviceGetProcessUtilization) are played back as rings, by time, not as answers: a
playback runs on the recording's timeline (`now()`: from the moment its rings had all been
read whole once, on `clock`, real time unless a test steps it), and a call gets what the
ring held at that moment: of the samples any recorded read returned, those taken by then
(mapped through the clock the recording's own reads show NVML stamped with), the newest
`depth` of each process (the ring's depth: what a recorded read of the whole ring returned),
newer than the lastSeenTimeStamp it passes. So a caller may read at a cadence of its own, and
one that passes the wrong timestamp, or comes back after the ring wrapped, reads duplicates or
misses samples, as it would on the GPU. Faults a GPU rarely shows (lost, not supported) can be
injected into a real recording at a chosen call; tests say so where they do.
"""

from __future__ import annotations

import ctypes
import math
import time
from bisect import bisect_right, insort
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

from gpujitter.files import read_regular
from gpujitter.probes.gpu_clock import (
    CalibrationFailed,
    Observation,
    calibrate,
    offsets_from_header,
)

FORMAT = "gpujitter-nvml-recording"
# Far past a recording of hours (the H200 training fixture: 330 KB for its calls of a few
# seconds' sampling); a larger file is a mistake, and it is read whole.
MAX_RECORDING_BYTES = 256 << 20
VERSION = 1
RING_FUNCS = ("nvmlDeviceGetSamples", "nvmlDeviceGetProcessUtilization")
JITTER_US = 5  # how far apart two reads of one sample's timestamp were seen (H200: 1 µs)


class NvmlPlaybackMissing(AssertionError):
    """The code under test called something the recording never saw: a test bug, loudly."""


def clock_offsets() -> dict[str, int]:
    """The host clocks read back to back (the tightest of a few tries): what a playback needs
    to map the recording's NVML timestamps the way the live session did."""
    best: tuple[int, dict[str, int]] | None = None
    for _ in range(5):
        a = time.monotonic_ns()
        reads = {
            "realtime_ns": time.clock_gettime_ns(time.CLOCK_REALTIME),
            "boottime_ns": time.clock_gettime_ns(time.CLOCK_BOOTTIME),
        }
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, {"mono_ns": (a + b) // 2, **reads})
    assert best is not None
    return best[1]


def _pynvml() -> Any:
    import pynvml

    return pynvml


def plain(value: Any, handles: dict[int, int]) -> Any:
    """An NVML result as JSON-able data: structures as dicts of their fields, handles as
    {"handle": gpu}."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, int | str | bool):
        return value
    if isinstance(value, list | tuple):
        return [plain(v, handles) for v in value]
    if isinstance(value, ctypes._Pointer):
        return {"handle": handles.get(_handle_key(value) or 0, -1)}
    if isinstance(value, ctypes.Structure | ctypes.Union):
        return {name: plain(getattr(value, name), handles) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array):
        return [plain(v, handles) for v in value]
    if hasattr(value, "__dict__"):  # pynvml's friendly objects
        return {k: plain(v, handles) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def _handle_key(value: Any) -> int | None:
    """A device handle's identity: the address it points to."""
    if isinstance(value, ctypes._Pointer):
        return ctypes.cast(value, ctypes.c_void_p).value
    return None


class NvmlTap:
    """A backend that forwards to a real one (pynvml) and logs each nvml* call:
    `Nvml(tap)` taps a session; `tap.save(path)` writes it."""

    def __init__(self, backend: Any = None, clock: Callable[[], int] = time.monotonic_ns):
        self._nv = backend if backend is not None else _pynvml()
        self._clock = clock
        self._handles: dict[int, int] = {}  # address of a device handle -> GPU index
        self.entries: list[dict[str, Any]] = []
        self.header: dict[str, Any] = {"format": FORMAT, "version": VERSION, **clock_offsets()}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._nv, name)
        if not name.startswith("nvml") or not callable(target):
            return target

        def recorded(*args: Any) -> Any:
            gpu, rest = self._split(args)
            entry: dict[str, Any] = {"t": self._clock(), "fn": name, "gpu": gpu, "args": rest}
            try:
                result = target(*args)
            except self._nv.NVMLError as err:
                entry["t_end"] = self._clock()
                entry["err"] = int(err.value)
                self.entries.append(entry)
                raise
            entry["t_end"] = self._clock()
            if name == "nvmlDeviceGetHandleByIndex":
                key = _handle_key(result)
                if key is not None:
                    self._handles[key] = int(args[0])
            entry["ret"] = plain(result, self._handles)
            self.entries.append(entry)
            return result

        return recorded

    def _split(self, args: tuple[Any, ...]) -> tuple[int | None, list[Any]]:
        if args:
            key = _handle_key(args[0])
            if key is not None and key in self._handles:
                return self._handles[key], [plain(a, self._handles) for a in args[1:]]
        return None, [plain(a, self._handles) for a in args]

    def save(self, path: str | Path, *, new: bool = False, **header: Any) -> None:
        """Write the session to `path`; `new`: only as a new file (FileExistsError if one
        came there meanwhile), never over one."""
        lines = [orjson.dumps({**self.header, **header})]
        lines += [orjson.dumps(e) for e in self.entries]
        with open(path, "xb" if new else "wb") as f:
            f.write(b"\n".join(lines) + b"\n")


def load(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A recording's header and call records; ValueError saying where a file is not one,
    GpujitterError where it is no regular file of at most MAX_RECORDING_BYTES."""
    data = read_regular(Path(path), "NVML recording", MAX_RECORDING_BYTES, "not a recording")
    lines = data.splitlines()
    try:
        header = orjson.loads(lines[0]) if lines else None
    except orjson.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError("not an NVML recording")
    if (version := header.get("version")) != VERSION:
        raise ValueError(
            f"an NVML recording of version {version!r}; this gpujitter reads {VERSION}"
        )
    entries = []
    for n, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ValueError(f"line {n}: not JSON") from None
        if not _is_call(entry):
            raise ValueError(f"line {n}: not an NVML call record")
        entries.append(entry)
    return header, entries


def _is_call(e: Any) -> bool:
    """The shape NvmlTap writes: a function, its GPU and arguments, the call's clock before
    and after, and what it returned or the NVML error it raised."""
    return (
        isinstance(e, dict)
        and isinstance(e.get("fn"), str)
        and isinstance(e.get("args"), list)
        and (e.get("gpu") is None or type(e.get("gpu")) is int)
        and all(type(e.get(k)) is int for k in ("t", "t_end"))
        and ("ret" in e or type(e.get("err")) is int)
    )


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"handle"}:
            return NvmlPlaybackHandle(int(value["handle"]))
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class NvmlPlaybackHandle:
    gpu: int


@dataclass(slots=True)
class _Ring:
    """One sample stream as the recording saw it: the union of the samples its reads returned,
    per process (pid 0 for nvmlDeviceGetSamples), and how many of each the GPU keeps."""

    samples: dict[int, dict[int, Any]] = field(default_factory=dict)  # pid -> ts -> sample
    stamps: dict[int, list[int]] = field(default_factory=dict)  # pid -> its ts, in order
    depth: int = 0  # per process, what a read of the whole ring returned; 0: never read whole
    value_type: int = 1
    answered: bool = False  # some recorded read returned samples
    error: int = 0  # the last error a recorded read failed with

    def add(self, raw: list[dict[str, Any]], whole: bool) -> None:
        per_pid: dict[int, int] = defaultdict(int)
        for s in raw:
            ts, pid = int(s["timeStamp"]), int(s.get("pid", 0))
            per_pid[pid] += 1
            kept = self.samples.setdefault(pid, {})
            # NVML re-derives timestamps at each read: the same sample can come back a few
            # µs off. The ring holds it once, as first seen.
            if not any(ts + d in kept for d in range(-JITTER_US, JITTER_US + 1)):
                kept[ts] = s
                insort(self.stamps.setdefault(pid, []), ts)
        if whole:
            self.depth = max([self.depth, *per_pid.values()])

    def held(self, horizon_us: int, last_seen_us: int) -> list[Any]:
        """What a read passing `last_seen_us` gets when the GPU's newest sample is no newer
        than `horizon_us`: per process, of the `depth` newest samples, those past last_seen."""
        out = []
        for pid, stamps in self.stamps.items():
            end = bisect_right(stamps, horizon_us)
            begin = max(end - self.depth if self.depth else 0, bisect_right(stamps, last_seen_us))
            out += [self.samples[pid][ts] for ts in stamps[begin:end]]
        return sorted(out, key=lambda s: int(s["timeStamp"]))


class NvmlPlayback:
    """A pynvml stand-in answering from a recording. `lose_gpu` {gpu: n}: from that GPU's
    n-th call on, every call for it fails with GPU_IS_LOST. `refuse` {(fn, gpu)}: those
    calls fail with NOT_SUPPORTED. `clock` (ns) moves the playback along the recording's
    timeline: real time by default, a test's own clock to play a recording in no time.
    Error classes and constants are pynvml's own."""

    def __init__(
        self,
        recording: str | Path | tuple[dict[str, Any], list[dict[str, Any]]],
        *,
        lose_gpu: dict[int, int] | None = None,
        refuse: Iterable[tuple[str, int | None]] = (),
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.header, entries = load(recording) if isinstance(recording, str | Path) else recording
        self._nv = _pynvml()
        self._answers: dict[tuple[str, int | None], list[dict[str, Any]]] = defaultdict(list)
        self._rings: dict[tuple[str, int | None, tuple[Any, ...]], _Ring] = {}
        ring_reads: list[dict[str, Any]] = []
        # A recording is input: one whose answers are not of the shapes NvmlTap wrote is
        # refused whole, here, rather than failing a call later.
        e: dict[str, Any] = {}
        try:
            for e in entries:
                if e["fn"] == "nvmlDeviceGetHandleByIndex":
                    e = {**e, "gpu": int(e["args"][0])}
                if e["fn"] in RING_FUNCS:
                    self._add_ring(e)
                    ring_reads.append(e)
                else:
                    self._answers[(e["fn"], e["gpu"])].append(e)
            # The timeline starts once every ring has been read whole (before that the
            # recording does not know all a ring held) and ends with the last read of one.
            whole: dict[tuple[Any, ...], int] = {}
            for e in ring_reads:
                if e["args"][-1] == 0:
                    whole.setdefault((e["fn"], e["gpu"], tuple(e["args"][:-1])), e["t_end"])
            self.start_ns = max(whole.values(), default=int(self.header.get("mono_ns", 0)))
            self.end_ns = max((e["t_end"] for e in ring_reads), default=self.start_ns)
            self._nvml_offset_ns = self._nvml_clock(ring_reads)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
            where = f"a {e['fn']} record" if e else "its header"
            raise ValueError(f"{where} is malformed ({err!r})") from None
        self._clock = clock
        self._clock_zero = clock()
        self._next: dict[tuple[Any, ...], int] = defaultdict(int)
        self._gpu_calls: dict[int, int] = defaultdict(int)
        self.lose_gpu = dict(lose_gpu or {})
        self.refuse = set(refuse)
        self.calls: list[tuple[str, int | None]] = []

    def now(self) -> int:
        """Where the playback is on the recording's timeline (its CLOCK_MONOTONIC ns): the
        recording's start_ns plus the time `clock` has run since the playback was made."""
        return self.start_ns + self._clock() - self._clock_zero

    def _nvml_clock(self, ring_reads: list[dict[str, Any]]) -> int | None:
        """NVML's timestamp clock minus CLOCK_MONOTONIC in the recorded session (ns), found as
        the sampler finds it (probes/gpu_clock.py) from each recorded read's newest sample;
        None when no clock explains them (a ring read then fails loudly)."""
        offsets = offsets_from_header(self.header)
        observations = [
            Observation(max(int(s["timeStamp"]) for s in raw), int(e["t_end"]), offsets)
            for e in ring_reads
            if "ret" in e and (raw := _ring_samples(e))
        ]
        try:
            return offsets[calibrate(observations).source]
        except CalibrationFailed:
            return None

    def _add_ring(self, e: dict[str, Any]) -> None:
        extra = tuple(e["args"][:-1])  # the sampling type; the last argument is lastSeen
        ring = self._rings.setdefault((e["fn"], e["gpu"], extra), _Ring())
        if "err" in e:
            ring.error = int(e["err"])
            return
        if e["fn"] == "nvmlDeviceGetSamples":
            ring.value_type = e["ret"][0]
        ring.answered = True
        ring.add(_ring_samples(e), whole=e["args"][-1] == 0)

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            return getattr(self._nv, name)
        return lambda *args: self._call(name, args)

    def _fail(self, code: int) -> BaseException:
        return self._nv.NVMLError(code)

    def _call(self, name: str, args: tuple[Any, ...]) -> Any:
        gpu = args[0].gpu if args and isinstance(args[0], NvmlPlaybackHandle) else None
        if name == "nvmlDeviceGetHandleByIndex":
            gpu = int(args[0])
        self.calls.append((name, gpu))
        if gpu is not None:
            self._gpu_calls[gpu] += 1
            if gpu in self.lose_gpu and self._gpu_calls[gpu] > self.lose_gpu[gpu]:
                raise self._fail(self._nv.NVML_ERROR_GPU_IS_LOST)
        if (name, gpu) in self.refuse:
            raise self._fail(self._nv.NVML_ERROR_NOT_SUPPORTED)
        if name in RING_FUNCS:
            return self._ring_call(name, gpu, args)
        answers = self._answers.get((name, gpu))
        if not answers:
            raise NvmlPlaybackMissing(f"recording has no {name} for GPU {gpu}")
        i = self._next[(name, gpu)]
        self._next[(name, gpu)] = i + 1
        e = answers[min(i, len(answers) - 1)]
        if "err" in e:
            raise self._fail(int(e["err"]))
        return _namespace(e["ret"])

    def _ring_call(self, name: str, gpu: int | None, args: tuple[Any, ...]) -> Any:
        extra = tuple(args[1:-1])
        ring = self._rings.get((name, gpu, extra))
        if ring is None:
            raise NvmlPlaybackMissing(f"recording has no {name}{extra} for GPU {gpu}")
        if not ring.answered:  # every recorded read failed: so does this one
            raise self._fail(ring.error)
        if self._nvml_offset_ns is None:
            raise NvmlPlaybackMissing(
                f"recording's sample timestamps fit none of its header's clocks: {name}"
            )
        horizon_us = (self.now() + self._nvml_offset_ns) // 1000
        picked = ring.held(horizon_us, int(args[-1]))
        if not picked:
            raise self._fail(self._nv.NVML_ERROR_NOT_FOUND)
        samples = [_namespace(s) for s in picked]
        return (ring.value_type, samples) if name == "nvmlDeviceGetSamples" else samples

    def gpu_calls(self, gpu: int) -> int:
        return self._gpu_calls[gpu]


def _ring_samples(e: dict[str, Any]) -> list[dict[str, Any]]:
    """The samples a recorded ring read returned."""
    return list(e["ret"][1] if e["fn"] == "nvmlDeviceGetSamples" else e["ret"])
