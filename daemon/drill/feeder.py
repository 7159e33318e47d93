"""The drills' feeding loop, run as its own process (the one the probes watch):

    python -m gpujitter.daemon.drill.feeder CONFIG_JSON

A steady loop that keeps a GPU busy, on the stub libcuda (a simulated queue) or, on a GPU
node, with PyTorch matmuls: each step enqueues step_ms of GPU work, does the injector's
bounded background work while the GPU runs, then synchronises. Between a synchronisation
and the next launch the host takes microseconds, so the GPU never idles by itself. At each
stall time it was given, right after a synchronisation (the GPU's queue is empty), the
feeding thread runs the scenario's injection (injectors.py) until the stall's deadline, and
the GPU sits idle until it launches again; or, for an injection that lands inside the
synchronisation or just before it (sync-contention, sync-spin, sync-late: stub only), the
stall runs from the moment the simulated queue drains to the synchronisation's return.
With `prefeed` the loop feeds from the start, before the go line (the daemon attaches to a
GPU already busy), and the window it reports begins there.

Protocol, one JSON object per line on stdout: {"ready": {...}} once set up; then it waits
for a line on stdin; {"stall": {...}} as each stall ends (t0_ns..t1_ns, CLOCK_MONOTONIC, as
the loop measured them, with what the injection reported); {"done": {...}} at the end.
"""

from __future__ import annotations

import ctypes as ct
import json
import os
import resource
import select
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from gpujitter.daemon.drill.helpers import die_with_parent, leave_interrupts_to_the_drill
from gpujitter.daemon.drill.injectors import INJECTORS, Injector, load_inject
from gpujitter.daemon.drill.schedule import caller

KERNEL_US = 500  # one stub launch's simulated GPU time
MATMUL_N = 4096  # torch: square bf16 matmuls of this size (~0.2 ms each on an H200)


@dataclass(frozen=True, slots=True)
class FeederConfig:
    backend: str  # "stub" or "torch"
    inject_lib: str
    scenario: str
    cpu: int  # where the feeding thread runs
    duration_s: float
    stall_ms: float
    stall_at_s: tuple[float, ...] = ()  # after go
    step_ms: float = 10.0
    stub: str = ""  # the stub libcuda (backend "stub")
    params: dict[str, Any] = field(default_factory=dict)
    prefeed: bool = False  # feed between ready and go too

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> FeederConfig:
        rec = json.loads(text)
        rec["stall_at_s"] = tuple(rec.get("stall_at_s", ()))
        return cls(**rec)


class StubGpu:
    """The stub libcuda: cuLaunchKernel enqueues simulated work, cuStreamSynchronize waits
    for the queue to drain (sleeping, as a blocking-sync CUDA context does; spinning, as
    CUDA's default schedule does, with params stub_sync "spin")."""

    def __init__(self, cfg: FeederConfig) -> None:
        if cfg.params.get("stub_sync") == "spin":
            os.environ["GPUJITTER_STUB_SYNC"] = "spin"  # read by the stub at its first sync
        lib = ct.CDLL(cfg.stub)
        self._launch = caller(lib, "cuLaunchKernel")
        self._sync = caller(lib, "cuStreamSynchronize")
        self._drains_at = lib.stubDrainsAtNs
        self._drains_at.restype = ct.c_ulonglong
        self.launches = max(1, round(cfg.step_ms * 1000 / KERNEL_US))

    def describe(self) -> dict[str, Any]:
        return {"backend": "stub", "launches_per_step": self.launches, "kernel_us": KERNEL_US}

    def step(self) -> None:
        for _ in range(self.launches):
            self._launch(KERNEL_US)

    def sync(self) -> None:
        self._sync(0)

    def drains_at_ns(self) -> int:
        """When the simulated queue drains (CLOCK_MONOTONIC ns)."""
        return int(self._drains_at())


class TorchGpu:
    """A real GPU through PyTorch: a step is as many bf16 matmuls as fill step_ms (measured
    at start), a synchronisation is torch.cuda.synchronize()."""

    def __init__(self, cfg: FeederConfig) -> None:
        import torch

        self.torch = torch
        self.a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
        self.out = torch.empty_like(self.a)
        self.count = 8
        self.step()
        self.sync()
        t0 = time.monotonic_ns()
        for _ in range(5):
            self.step()
        self.sync()
        per_matmul_ns = (time.monotonic_ns() - t0) / (5 * self.count)
        self.count = max(1, round(cfg.step_ms * 1e6 / per_matmul_ns))
        self.matmul_ns = per_matmul_ns

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "torch",
            "device": self.torch.cuda.get_device_name(0),
            "matmuls_per_step": self.count,
            "matmul_us": round(self.matmul_ns / 1000, 1),
        }

    def step(self) -> None:
        for _ in range(self.count):
            self.torch.matmul(self.a, self.a, out=self.out)

    def sync(self) -> None:
        self.torch.cuda.synchronize()


def say(**rec: Any) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def stall(injector: Injector, index: int, stall_ns: int) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_THREAD)
    t0 = time.monotonic_ns()
    facts = injector.inject(t0 + stall_ns)
    t1 = time.monotonic_ns()
    after = resource.getrusage(resource.RUSAGE_THREAD)
    return {
        "index": index,
        "t0_ns": t0,
        "t1_ns": t1,
        "cause_ns": facts.pop("cause_ns", t1 - t0),
        "minflt": after.ru_minflt - before.ru_minflt,
        "majflt": after.ru_majflt - before.ru_majflt,
        "nivcsw": after.ru_nivcsw - before.ru_nivcsw,
        **facts,
    }


def stall_in_sync(injector: Injector, gpu: StubGpu, index: int, stall_ns: int) -> dict[str, Any]:
    """The injection lands while the thread waits in the synchronisation (or on its way
    there): the GPU is idle from the moment its queue drains until the synchronisation
    returns."""
    drained = gpu.drains_at_ns()
    facts = injector.inject(drained + stall_ns)
    gpu.sync()
    t1 = time.monotonic_ns()
    return {"index": index, "t0_ns": drained, "t1_ns": t1, "cause_ns": t1 - drained, **facts}


def prefeed(gpu: StubGpu | TorchGpu) -> None:
    """Keep the GPU busy until the go line arrives."""
    while not select.select([sys.stdin], [], [], 0)[0]:
        gpu.step()
        gpu.sync()


def feed(cfg: FeederConfig, gpu: StubGpu | TorchGpu, injector: Injector) -> dict[str, Any]:
    """The loop, from go to the end of the run; returns its totals."""
    go = time.monotonic_ns()
    end = go + round(cfg.duration_s * 1e9)
    due = [go + round(s * 1e9) for s in cfg.stall_at_s]
    stall_ns = round(cfg.stall_ms * 1e6)
    steps = 0
    slowest_background_ns = 0
    while True:
        gpu.step()
        t = time.monotonic_ns()
        injector.background()
        slowest_background_ns = max(slowest_background_ns, time.monotonic_ns() - t)
        index = len(cfg.stall_at_s) - len(due)
        if injector.inside_sync and due and time.monotonic_ns() >= due[0]:
            due.pop(0)
            assert isinstance(gpu, StubGpu)  # the scenario refuses other backends
            say(stall=stall_in_sync(injector, gpu, index, stall_ns))
        else:
            gpu.sync()
        steps += 1
        now = time.monotonic_ns()
        if not injector.inside_sync and due and now >= due[0]:
            due.pop(0)
            say(stall=stall(injector, index, stall_ns))
        elif now >= end:
            break
    gpu.step()  # the launch that ends the last stretch
    gpu.sync()
    return {
        "go_ns": go,
        "end_ns": time.monotonic_ns(),
        "steps": steps,
        "slowest_background_ns": slowest_background_ns,
    }


def main() -> None:
    die_with_parent()
    leave_interrupts_to_the_drill()  # its loader worker's too
    cfg = FeederConfig.from_json(sys.argv[1])
    os.sched_setaffinity(0, {cfg.cpu})
    lib = load_inject(cfg.inject_lib)
    injector = INJECTORS[cfg.scenario](lib, round(cfg.stall_ms * 1e6), cfg.params)
    gpu = TorchGpu(cfg) if cfg.backend == "torch" else StubGpu(cfg)
    setup = injector.setup()
    injector.background()
    say(ready={"pid": os.getpid(), "tid": threading.get_native_id(), **gpu.describe(), **setup})
    fed_since = time.monotonic_ns()
    if cfg.prefeed:
        prefeed(gpu)
    if not sys.stdin.readline():  # the drill went away before the start
        sys.exit(1)
    try:
        injector.start()
        totals = feed(cfg, gpu, injector)
        if cfg.prefeed:
            totals["go_ns"] = fed_since
    finally:
        injector.close()
    say(done=totals)


if __name__ == "__main__":
    main()
