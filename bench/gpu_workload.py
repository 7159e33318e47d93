"""A training-like PyTorch loop for the GPU proof and the tracer's cost benchmark; run as its
own process (the tracer watches it), driven by commands on stdin, one JSON reply per line.

A step: a 4096-wide bf16 MLP of LAYERS GEMM+ReLU layers (two launches each) on a batch of
ROWS rows, a host data step that prepares the next slice of the batch while the GPU
computes and copies it up asynchronously, then loss.item() (a synchronisation). With 8192
rows the GPU needs ~8 ms a step and the host ~1 ms: GPU-bound, ~5k launches/s, so a clean
stretch has no idle gap; with 1024 rows the host is the bottleneck. Commands:
  rows N             use a batch of N rows from now on
  steps N            run N steps; reply the mean step time
  clean MS           run steps for MS milliseconds; reply the stretch (first launch, last sync)
  stall KIND         one host stall after a step's sync: sleep50 (50 ms sleep), faults (touch
                     FAULT_MB of fresh memory: a page-fault storm), cpu20 (a 20 ms CPU-bound
                     step); reply its start and end
  idle MS            sleep MS (the GPU idles); reply start and end
  busy MS            steps for MS milliseconds (for the clock calibration); reply as clean
  hits N             call libcuda's cuLaunchKernel N times with no function (it returns an
                     error at once): reply ns per call (the uprobe cost, when traced)
  script JSON        run a list of [command, argument] back to back, with no round trip to
                     the driver in between (so nothing but the commands sits between a
                     stall and the steps around it); reply the list of their replies
  quit
All times are CLOCK_MONOTONIC ns.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import sys
import time

import numpy as np
import torch

WIDTH = 4096
LAYERS = 20
ROWS = 8192
DATA_ROWS = 512  # the slice of the batch the host prepares each step
FAULT_MB = 256
MS = 1_000_000


class Loop:
    def __init__(self) -> None:
        self.dev = torch.device("cuda")
        self.weights = [
            torch.randn(WIDTH, WIDTH, device=self.dev, dtype=torch.bfloat16) / 64 for _ in range(4)
        ]
        self.resize(ROWS)
        self.host = torch.randn(DATA_ROWS, WIDTH, dtype=torch.float32)
        self.staging = torch.empty(DATA_ROWS, WIDTH, dtype=torch.bfloat16).pin_memory()
        self.libcuda = ctypes.CDLL("libcuda.so.1")

    def resize(self, rows: int) -> None:
        self.batch = torch.randn(rows, WIDTH, device=self.dev, dtype=torch.bfloat16)

    def step(self) -> None:
        h = self.batch
        for i in range(LAYERS):
            h = torch.relu(h @ self.weights[i % 4])
        loss = h.float().mean()
        # Data step, overlapped with the GPU work above: "augment" on the host, stage, copy.
        self.host.mul_(1.0001).add_(0.0001)
        self.staging.copy_(self.host)
        self.batch[:DATA_ROWS].copy_(self.staging, non_blocking=True)
        loss.item()

    def run_for(self, ms: float) -> dict[str, int]:
        t0 = time.monotonic_ns()
        steps = 0
        while time.monotonic_ns() - t0 < ms * MS:
            self.step()
            steps += 1
        return {"t0": t0, "t1": time.monotonic_ns(), "steps": steps}

    def stall(self, kind: str) -> dict[str, int]:
        t0 = time.monotonic_ns()
        if kind == "sleep50":
            time.sleep(0.05)
        elif kind == "cpu20":
            x = 0
            while time.monotonic_ns() - t0 < 20 * MS:
                x += 1
        elif kind == "faults":
            size = FAULT_MB << 20
            buf = mmap.mmap(-1, size)
            pages = np.frombuffer(buf, dtype=np.uint8)
            pages[::4096] = 1  # one write per page: a fault per page
            del pages
            buf.close()
        else:
            raise ValueError(kind)
        return {"t0": t0, "t1": time.monotonic_ns()}

    def hits(self, n: int) -> dict[str, float]:
        launch = self.libcuda.cuLaunchKernel
        args = (None, 1, 1, 1, 1, 1, 1, 0, None, None, None)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            launch(*args)
        return {"ns_per_call": (time.perf_counter_ns() - t0) / n}


def execute(loop: Loop, cmd: str, arg: str) -> dict[str, object]:
    if cmd == "rows":
        loop.resize(int(arg))
        torch.cuda.synchronize()
        return {"rows": int(arg)}
    if cmd == "steps":
        t0 = time.perf_counter_ns()
        for _ in range(int(arg)):
            loop.step()
        return {"step_ns": (time.perf_counter_ns() - t0) / int(arg)}
    if cmd in ("clean", "busy"):
        return loop.run_for(float(arg))
    if cmd == "stall":
        return loop.stall(arg)
    if cmd == "idle":
        t0 = time.monotonic_ns()
        time.sleep(float(arg) / 1000)
        return {"t0": t0, "t1": time.monotonic_ns()}
    if cmd == "hits":
        return loop.hits(int(arg))
    if cmd == "script":
        return {
            "results": [
                {"cmd": c, "arg": a, **execute(loop, c, str(a))} for c, a in json.loads(arg)
            ]
        }
    return {"error": f"unknown command {cmd}"}


def main() -> None:
    loop = Loop()
    for _ in range(20):
        loop.step()
    torch.cuda.synchronize()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            break
        print(json.dumps({"cmd": cmd, **execute(loop, cmd, arg)}), flush=True)


if __name__ == "__main__":
    main()
