"""Every NVML call goes through this module (the nvitop/dcgm-exporter way): lazy init, one
session per process, and errors mapped per call, so a missing library, a lost GPU or a
function this driver lacks disables one reading of one GPU and never crashes a caller.

The backend is pynvml by default. Tests pass a backend that replays calls recorded on a real
GPU (tests/fixtures/nvml/), which exposes the same function names; nothing else is faked.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node at all (no library, no driver): one line why."""


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


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Nvml:
    """A session over NVML. `open()` initialises it once; `call()` runs one NVML function
    and returns None where the driver says not supported / not found; a GPU that is lost is
    remembered and skipped afterwards."""

    def __init__(self, backend: Any = None) -> None:
        if backend is None:
            import pynvml

            backend = pynvml
        self.nv = backend
        self._lock = threading.Lock()
        self._open = False
        self.lost: dict[int, str] = {}  # GPU index -> why it is no longer read

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
        if gpu is not None and gpu in self.lost:
            return None
        fn: Callable[..., Any] | None = getattr(self.nv, fn_name, None)
        if fn is None:
            return None  # older pynvml without this binding
        try:
            return fn(*args)
        except self.nv.NVMLError as err:
            if gpu is not None and _is(self.nv, err, "NVMLError_GpuIsLost"):
                self.lost[gpu] = "GPU is lost (fell off the bus or driver reset)"
            return None

    def driver_version(self) -> str | None:
        version = self.call("nvmlSystemGetDriverVersion")
        return None if version is None else _text(version)

    def device_count(self) -> int:
        return int(self.call("nvmlDeviceGetCount") or 0)

    def handle(self, index: int) -> Any:
        return self.call("nvmlDeviceGetHandleByIndex", index, gpu=index)

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
            name=_text(self.call("nvmlDeviceGetName", h, gpu=index) or "unknown"),
            uuid=_text(self.call("nvmlDeviceGetUUID", h, gpu=index) or ""),
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


def open_nvml(backend: Any = None) -> Nvml:
    """An open session, or NvmlUnavailable with one line why."""
    return Nvml(backend).open()
