"""Every NVML call goes through this module (the nvitop/dcgm-exporter way): lazy init, one
session per process, and errors mapped per call, so a missing library, a lost GPU or a
function this driver lacks disables one reading of one GPU and never crashes a caller.

The backend is pynvml by default. Tests pass a backend that plays back calls tapped on a real
GPU (probes/nvml_session.py, tests/fixtures/nvml/), which exposes the same function names;
nothing else is faked.

Readings beyond identity: the sample streams (nvmlDeviceGetSamples: GPU utilisation every
200 ms and board power every 20 ms on the H200) read with last-seen timestamps, per-process
utilisation, compute processes, instantaneous utilisation and power. Each returns None when
this GPU cannot answer and records why in `Nvml.problems`, so callers report it per GPU.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from gpujitter.probes.base import trim_heap

T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node at all (no library, no driver): one line why."""


# nvmlDeviceGetSamples sampling types (nvmlSamplingType_t) by the names the engine uses.
SAMPLE_TYPES = {"power": 0, "util": 1}  # NVML_TOTAL_POWER_SAMPLES, NVML_GPU_UTILIZATION_SAMPLES
# nvmlValueType_t -> the field of nvmlValue_t that holds the value.
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: "no sample newer than lastSeenTimeStamp", not a fault


@dataclass(frozen=True, slots=True)
class NvmlSample:
    """One entry of an NVML sample ring: ts_us on NVML's clock (see probes/gpu_clock.py);
    value in percent (util) or watts (power)."""

    ts_us: int
    value: float


@dataclass(frozen=True, slots=True)
class ProcessUtil:
    pid: int
    ts_us: int
    sm_percent: int
    mem_percent: int


@dataclass(frozen=True, slots=True)
class ComputeProcess:
    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    pci_bus_id: str  # sysfs form, 0000:00:06.0
    numa_node: int | None  # None when NVML does not know (one-node VMs report none)
    local_cpus: tuple[int, ...]  # CPUs NVML calls close to the GPU; () when unknown
    persistence_mode: bool | None


def normalize_bus_id(bus_id: str | bytes) -> str:
    """NVML's '00000000:00:06.0' -> sysfs's '0000:00:06.0' (lower case)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else bus_id
    domain, _, rest = text.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def _text(value: object, missing: str) -> str:
    """A string NVML returned (bytes in older pynvml); `missing` for none, or for anything
    else (a replayed recording may hold any JSON there)."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) and value else missing


class Nvml:
    """A session over NVML. `open()` initialises it once; `call()` runs one NVML function
    and returns None where the driver says not supported / not found; a GPU that is lost is
    remembered and skipped afterwards."""

    def __init__(self, backend: Any = None) -> None:
        self.nv = _import_pynvml() if backend is None else backend
        self._lock = threading.Lock()
        self._open = False
        self.lost: dict[int, str] = {}  # GPU index -> why it is no longer read
        # (GPU index or None, NVML function) -> why it returned nothing, for reports.
        self.problems: dict[tuple[int | None, str], str] = {}
        self._handles: dict[int, Any] = {}

    def open(self) -> Nvml:
        with self._lock:
            if not self._open:
                try:
                    self.nv.nvmlInit()
                except self.nv.NVMLError as err:
                    raise NvmlUnavailable(_describe_init_error(self.nv, err)) from None
                except OSError as err:  # libnvidia-ml present but broken
                    raise NvmlUnavailable(f"cannot load libnvidia-ml: {err}") from None
                self._open = True
        return self

    def close(self) -> None:
        with self._lock:
            if self._open:
                # The driver may already be gone; shutting down is best effort.
                with contextlib.suppress(self.nv.NVMLError):
                    self.nv.nvmlShutdown()
                self._open = False

    def call(self, fn_name: str, *args: Any, gpu: int | None = None) -> Any:
        """NVML function `fn_name`, or None where this driver or GPU cannot answer it.
        Marks `gpu` lost on GPU_IS_LOST so later calls for it return None at once."""
        value, _ = self.try_call(fn_name, *args, gpu=gpu)
        return value

    def try_call(self, fn_name: str, *args: Any, gpu: int | None = None) -> tuple[Any, int]:
        """(result, 0), or (None, NVML error code) with the reason kept in `problems`;
        code -1 when the binding is missing or the GPU was lost before."""
        if gpu is not None and gpu in self.lost:
            return None, -1
        fn: Callable[..., Any] | None = getattr(self.nv, fn_name, None)
        if fn is None:
            self.problems[(gpu, fn_name)] = "not in this pynvml"
            return None, -1
        try:
            return fn(*args), 0
        except self.nv.NVMLError as err:
            code = int(getattr(err, "value", -1))
            if gpu is not None and _is(self.nv, err, "NVMLError_GpuIsLost"):
                self.lost[gpu] = "GPU is lost (fell off the bus or driver reset)"
            if code != _NOT_FOUND:
                self.problems[(gpu, fn_name)] = str(err)
            return None, code

    def driver_version(self) -> str | None:
        return _text(self.call("nvmlSystemGetDriverVersion"), "") or None

    def device_count(self) -> int:
        return int(self.call("nvmlDeviceGetCount") or 0)

    def handle(self, index: int) -> Any:
        if index not in self._handles:
            h = self.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
            if h is None:
                return None
            self._handles[index] = h
        return None if index in self.lost else self._handles[index]

    def samples(self, index: int, kind: str, last_seen_us: int) -> list[NvmlSample] | None:
        """Samples of `kind` ("util" or "power") newer than last_seen_us, oldest first;
        [] when there is none yet, None when this GPU cannot give them. Passing the newest
        timestamp returned so far reads every sample exactly once (as long as the caller
        comes back before the ring wraps: ~14 s for util, ~2.4 s for power on the H200)."""
        h = self.handle(index)
        if h is None:
            return None
        result, code = self.try_call(
            "nvmlDeviceGetSamples", h, SAMPLE_TYPES[kind], last_seen_us, gpu=index
        )
        if result is None:
            return [] if code == _NOT_FOUND else None
        value_type, raw = result
        field_name = _VALUE_FIELDS[value_type] if 0 <= value_type < len(_VALUE_FIELDS) else "uiVal"
        scale = 1e-3 if kind == "power" else 1.0  # power samples are in mW
        out = [
            NvmlSample(int(s.timeStamp), float(getattr(s.sampleValue, field_name)) * scale)
            for s in raw
            if int(s.timeStamp) > last_seen_us
        ]
        out.sort(key=lambda s: s.ts_us)
        return out

    def process_utilization(self, index: int, last_seen_us: int) -> list[ProcessUtil] | None:
        """Per-process utilisation samples newer than last_seen_us ([] when none)."""
        h = self.handle(index)
        if h is None:
            return None
        raw, code = self.try_call("nvmlDeviceGetProcessUtilization", h, last_seen_us, gpu=index)
        if raw is None:
            return [] if code == _NOT_FOUND else None
        return [
            ProcessUtil(int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil))
            for s in raw
            if int(s.timeStamp) > last_seen_us
        ]

    def compute_processes(self, index: int) -> list[ComputeProcess] | None:
        h = self.handle(index)
        if h is None:
            return None
        raw = self.call("nvmlDeviceGetComputeRunningProcesses", h, gpu=index)
        if raw is None:
            return None
        return [ComputeProcess(int(p.pid), _opt_int(p.usedGpuMemory)) for p in raw]

    def utilization_percent(self, index: int) -> int | None:
        """The driver's current duty cycle (it changes once per 200 ms period)."""
        h = self.handle(index)
        rates = None if h is None else self.call("nvmlDeviceGetUtilizationRates", h, gpu=index)
        return None if rates is None else int(rates.gpu)

    def power_watts(self, index: int) -> float | None:
        h = self.handle(index)
        mw = None if h is None else self.call("nvmlDeviceGetPowerUsage", h, gpu=index)
        return None if mw is None else int(mw) / 1000.0

    def why_not(self, index: int, fn_name: str) -> str:
        """Why `fn_name` gave nothing for GPU `index`, in a few words."""
        return self.lost.get(index) or self.problems.get((index, fn_name), "no answer")

    def gpu_info(self, index: int, cpu_count: int) -> GpuInfo | None:
        h = self.handle(index)
        if h is None:
            return None
        pci = self.call("nvmlDeviceGetPciInfo", h, gpu=index)
        bus_id = normalize_bus_id(pci.busId) if pci is not None else ""
        node = self.call("nvmlDeviceGetNumaNodeId", h, gpu=index)
        words = (cpu_count + 63) // 64
        mask = self.call("nvmlDeviceGetCpuAffinity", h, words, gpu=index)
        mode = self.call("nvmlDeviceGetPersistenceMode", h, gpu=index)
        return GpuInfo(
            index=index,
            name=_text(self.call("nvmlDeviceGetName", h, gpu=index), "unknown"),
            uuid=_text(self.call("nvmlDeviceGetUUID", h, gpu=index), ""),
            pci_bus_id=bus_id,
            numa_node=node if isinstance(node, int) and node >= 0 else None,
            local_cpus=_cpus_from_mask(mask) if mask is not None else (),
            persistence_mode=None if mode is None else bool(mode),
        )

    def gpus(self, cpu_count: int) -> list[GpuInfo]:
        infos = (self.gpu_info(i, cpu_count) for i in range(self.device_count()))
        return [g for g in infos if g is not None]

    def __enter__(self) -> Nvml:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _cpus_from_mask(words: Any) -> tuple[int, ...]:
    """nvmlDeviceGetCpuAffinity's array of 64-bit words -> CPU numbers."""
    cpus: list[int] = []
    for w, word in enumerate(words):
        value = int(word)
        cpus.extend(w * 64 + bit for bit in range(64) if value >> bit & 1)
    return tuple(cpus)


def _is(nv: Any, err: BaseException, cls_name: str) -> bool:
    cls = getattr(nv, cls_name, None)
    return cls is not None and isinstance(err, cls)


def _describe_init_error(nv: Any, err: BaseException) -> str:
    if _is(nv, err, "NVMLError_LibraryNotFound"):
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this node"
    if _is(nv, err, "NVMLError_DriverNotLoaded"):
        return "NVIDIA kernel driver not loaded (modprobe nvidia)"
    if _is(nv, err, "NVMLError_NoPermission"):
        return "no permission to use NVML (run as root or add the user to the video group)"
    return f"NVML init failed: {err}"


def _import_pynvml() -> Any:
    """pynvml, with what its import freed handed back. Where it has no .pyc (an install
    that did not byte-compile, or PYTHONDONTWRITEBYTECODE: the H200 node's venv), each
    import compiles its ~290 KB of source: 95 ms there, and ~10 MB the compiler freed that
    glibc keeps, which a starting daemon would carry into the probes' compile and its
    resident peak (docs/performance.md, "Start and stop")."""
    fresh = "pynvml" not in sys.modules
    import pynvml

    if fresh:
        trim_heap()
    return pynvml


def open_nvml(backend: Any = None) -> Nvml:
    """An open session, or NvmlUnavailable with one line why."""
    return Nvml(backend).open()
