"""Tap every NVML call a real session makes, and play such a session back as the backend of
probes/nvml.py: CI runs the NVML code against what a real GPU answered (tests/fixtures/nvml/),
never against invented numbers.

A session file is JSON lines: a header (the host clocks read together), then one line per call
with its CLOCK_MONOTONIC start and end, the function, the GPU (device handles are stored as
GPU indexes), the other arguments, and either the result as plain data or the NVML error
code.

NvmlPlayback answers each (function, GPU) with the recorded results in order (the last one again
once they run out: identity does not change). Sample rings (nvmlDeviceGetSamples,
nvmlDeviceGetProcessUtilization) are played back as rings, not as answers: a call gets every
recorded sample newer than the lastSeenTimeStamp it passes and no newer than what the real
GPU had at that call, so a caller that passes the wrong timestamp reads duplicates or misses
samples, as it would on the GPU. Faults a GPU rarely shows (lost, not supported) can be
injected into a real recording at a chosen call; tests say so where they do.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

FORMAT = "gpujitter-nvml-recording"
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

    def save(self, path: str | Path, **header: Any) -> None:
        lines = [orjson.dumps({**self.header, **header})]
        lines += [orjson.dumps(e) for e in self.entries]
        Path(path).write_bytes(b"\n".join(lines) + b"\n")


def load(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = Path(path).read_bytes().splitlines()
    header = orjson.loads(lines[0])
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: not an NVML recording")
    return header, [orjson.loads(line) for line in lines[1:] if line.strip()]


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
    """The union of one sample stream's recorded samples, and per call what the GPU held."""

    samples: dict[tuple[int, int], Any] = field(default_factory=dict)  # (ts, pid) -> sample
    horizons: list[int | None] = field(default_factory=list)  # newest ts at each call
    entries: list[dict[str, Any]] = field(default_factory=list)  # the recorded calls
    span_us: int = 0  # how far back the ring reaches
    value_type: int = 1


class NvmlPlayback:
    """A pynvml stand-in answering from a recording. `lose_gpu` {gpu: n}: from that GPU's
    n-th call on, every call for it fails with GPU_IS_LOST. `refuse` {(fn, gpu)}: those
    calls fail with NOT_SUPPORTED. Error classes and constants are pynvml's own."""

    def __init__(
        self,
        recording: str | Path | tuple[dict[str, Any], list[dict[str, Any]]],
        *,
        lose_gpu: dict[int, int] | None = None,
        refuse: Iterable[tuple[str, int | None]] = (),
    ) -> None:
        self.header, entries = load(recording) if isinstance(recording, str | Path) else recording
        self._nv = _pynvml()
        self._answers: dict[tuple[str, int | None], list[dict[str, Any]]] = defaultdict(list)
        self._rings: dict[tuple[str, int | None, tuple[Any, ...]], _Ring] = {}
        for e in entries:
            if e["fn"] == "nvmlDeviceGetHandleByIndex":
                e = {**e, "gpu": int(e["args"][0])}
            if e["fn"] in RING_FUNCS:
                self._add_ring(e)
            else:
                self._answers[(e["fn"], e["gpu"])].append(e)
        self._next: dict[tuple[Any, ...], int] = defaultdict(int)
        self._gpu_calls: dict[int, int] = defaultdict(int)
        self.lose_gpu = dict(lose_gpu or {})
        self.refuse = set(refuse)
        self.calls: list[tuple[str, int | None]] = []
        self._now = int(self.header.get("mono_ns", 0))

    def now(self) -> int:
        """The clock a played-back session runs on: when the real session's sample read that
        was played back last returned (sample reads pace a sampler: one per stream per poll)."""
        return self._now

    def _answered(self, e: dict[str, Any]) -> None:
        if e["fn"] == "nvmlDeviceGetSamples":
            self._now = max(self._now, int(e.get("t_end", e["t"])))

    def _add_ring(self, e: dict[str, Any]) -> None:
        extra = tuple(e["args"][:-1])  # the sampling type; the last argument is lastSeen
        ring = self._rings.setdefault((e["fn"], e["gpu"], extra), _Ring())
        ring.entries.append(e)
        if "err" in e:
            ring.horizons.append(ring.horizons[-1] if ring.horizons else None)
            return
        ret = e["ret"]
        if e["fn"] == "nvmlDeviceGetSamples":
            ring.value_type, raw = ret
        else:
            raw = ret
        stamps = [int(s["timeStamp"]) for s in raw]
        for s in raw:
            ts, pid = int(s["timeStamp"]), int(s.get("pid", 0))
            # NVML re-derives timestamps at each read: the same sample can come back a few
            # µs off. The ring holds it once, as first seen.
            if not any((ts + d, pid) in ring.samples for d in range(-JITTER_US, JITTER_US + 1)):
                ring.samples[(ts, pid)] = s
        newest = max(stamps) if stamps else None
        previous = ring.horizons[-1] if ring.horizons else None
        ring.horizons.append(newest if previous is None or (newest or 0) > previous else previous)
        if stamps and e["args"][-1] == 0:  # a read of the whole ring shows how deep it is
            ring.span_us = max(ring.span_us, max(stamps) - min(stamps))

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
        self._answered(e)
        if "err" in e:
            raise self._fail(int(e["err"]))
        return _namespace(e["ret"])

    def _ring_call(self, name: str, gpu: int | None, args: tuple[Any, ...]) -> Any:
        extra = tuple(args[1:-1])
        ring = self._rings.get((name, gpu, extra))
        if ring is None:
            raise NvmlPlaybackMissing(f"recording has no {name}{extra} for GPU {gpu}")
        key = (name, gpu, extra)
        i = self._next[key]
        self._next[key] = i + 1
        horizon = ring.horizons[min(i, len(ring.horizons) - 1)]
        self._answered(ring.entries[min(i, len(ring.entries) - 1)])
        last_seen = int(args[-1])
        oldest = (horizon or 0) - ring.span_us if ring.span_us else 0
        picked = [
            s
            for (ts, _pid), s in sorted(ring.samples.items())
            if horizon is not None and last_seen < ts <= horizon and ts >= oldest
        ]
        if not picked:
            raise self._fail(self._nv.NVML_ERROR_NOT_FOUND)
        samples = [_namespace(s) for s in picked]
        return (ring.value_type, samples) if name == "nvmlDeviceGetSamples" else samples

    def gpu_calls(self, gpu: int) -> int:
        return self._gpu_calls[gpu]
