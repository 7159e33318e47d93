"""The live probes at once: the eBPF probes (host jitter and libcuda) and the NVML
sampler, each on its own thread, all emitting into one callable. The runtime's live source
(daemon/service/runtime.py: `run`, `record`, `gaps`, `probe`, drills, the TUI's embedded mode) takes
its events from here, so they all see the same evidence.

A missing GPU or NVML is one unavailable probe (an `nvml` ProbeStatus says why), never an
error; when NVML is there, the processes it lists on each GPU join the watched set.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpujitter.probes.base import Emit
from gpujitter.probes.events import ProbeStatus
from gpujitter.probes.gpu_clock import offsets_from_header
from gpujitter.probes.host import HostPaths
from gpujitter.probes.nvml import GpuInfo, Nvml, NvmlUnavailable, open_nvml
from gpujitter.probes.nvml_session import NvmlPlayback
from gpujitter.probes.topology import Topology
from gpujitter.probes.watch import WatchSpec


class LiveProbes:
    """Start with `with LiveProbes(...) as probes:`; leaving the block stops every
    probe after it handed over what it still held.

    nvml: True to open NVML (pynvml), False for none, or a backend object (a recording
    played back, for tests). gpu_processes: watch every process NVML lists on a GPU."""

    def __init__(
        self,
        probes: Sequence[str],
        *,
        topology: Topology,
        watch: WatchSpec,
        emit: Emit,
        handed: Callable[[], None] | None = None,
        thresholds: Mapping[str, Mapping[str, int]] | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        nvml: bool | Any = True,
        gpu_processes: bool = True,
        paths: HostPaths | None = None,
    ) -> None:
        self.probes = list(probes)
        self.topology = topology
        self.watch = watch
        self.emit = emit
        self.handed = handed
        self.thresholds = thresholds or {}
        self.options = options or {}
        self.nvml_choice = nvml
        self.gpu_processes = gpu_processes
        self.paths = paths
        self.nvml: Nvml | None = None
        self.gpus: list[GpuInfo] = []
        self.statuses: list[ProbeStatus] = []  # each one's at the start: NVML's, the probes'
        self._probes: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> LiveProbes:
        from gpujitter.probes.gpu import GpuSampler, SamplerThread
        from gpujitter.probes.runner import ProbeThread

        try:
            sampler = self._sampler(GpuSampler)
            if sampler is not None:
                self._stack.enter_context(SamplerThread(sampler))
                if self.gpu_processes:
                    self.watch.gpu_processes = sampler.gpu_processes
            elif self.gpu_processes and not self.watch.selects_any():
                # Asked to follow GPU processes on a node without NVML, nothing else named:
                # watch everything rather than nothing (thresholds keep the rate down).
                self.watch.all = True
            probes = ProbeThread(
                self.probes,
                topology=self.topology,
                watch=self.watch,
                emit=self.emit,
                handed=self.handed,
                thresholds=self.thresholds,
                options=self.options,
                paths=self.paths,
            )
            self._stack.enter_context(probes)
            self._probes = probes
            self.statuses += probes.statuses
        except BaseException:
            self._stack.close()
            raise
        return self

    def _sampler(self, sampler_cls: Any) -> Any:
        if self.nvml_choice is False:
            return None
        backend = None if self.nvml_choice is True else self.nvml_choice
        try:
            self.nvml = open_nvml(backend)
        except NvmlUnavailable as err:
            # Kept with the probes' statuses too: `run` says at start what is unavailable.
            status = ProbeStatus(ts_ns=time.monotonic_ns(), probe="nvml", state="unavailable",
                                 reason=str(err))  # fmt: skip
            self.emit(status)
            self.statuses.append(status)
            return None
        self._stack.callback(self.nvml.close)
        self.gpus = self.nvml.gpus(os.cpu_count() or 1)
        if isinstance(backend, NvmlPlayback):
            # A recording answers with the timestamps and clocks it was made with: map them
            # as the live session did, on the recording's own timeline (played in real time).
            return sampler_cls(self.nvml, self.emit, cpu_count=os.cpu_count() or 1,
                               offsets=lambda: offsets_from_header(backend.header),
                               clock=backend.now)  # fmt: skip
        return sampler_cls(self.nvml, self.emit, cpu_count=os.cpu_count() or 1)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def failed(self) -> bool:
        """The probe thread died (its error is re-raised when the block ends)."""
        return self._probes is not None and self._probes.error is not None

    def gpu_bus_ids(self) -> dict[int, str]:
        """GPU index -> PCI bus id, for the engine's GPU-node lookups."""
        return {g.index: g.pci_bus_id for g in self.gpus if g.pci_bus_id}
