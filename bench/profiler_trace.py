"""A PyTorch profiler (Kineto) trace and a gpujitter recording of the same run, on a GPU node,
as the fixture for `gpujitter export --merge` (tests/unit/test_export.py): a small training
loop with two injected host stalls (a 40 ms sleep, 30 ms of host work) between steps, under
torch.profiler with a chrome-trace export, while the daemon (`gpujitter run --record`)
records the probes and the GPU side. Also writes each step's start and end (CLOCK_MONOTONIC
ns) and clock pairs taken before and after, so the test can check that the merged timeline
puts the gaps under the steps that suffered them.

    python3 bench/profiler_trace.py OUTDIR     (root, on a node with a GPU and PyTorch)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STEPS = 12
STALLS = {5: "sleep", 8: "cpu"}  # step index -> stall injected before it


def clock_pair() -> dict[str, int]:
    return {"monotonic_ns": time.monotonic_ns(), "realtime_ns": time.time_ns()}


def main(out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    out.mkdir(parents=True, exist_ok=True)
    rec = subprocess.Popen(
        [sys.executable, "-P", "-m", "gpujitter", "run", "--pid", str(os.getpid()),
         "--no-gpu-processes", "--record", str(out / "rec"), "--log", "", "--socket", "",
         "--quiet", "--probes", "sched,cuda"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(8)  # the probes compile and attach
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(512, 2048, device="cuda")
    steps = []
    pairs = [clock_pair()]
    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    # No schedule: every step is kept (a schedule's cycle ends by clearing what it held).
    with profile(activities=acts) as prof:
        for i in range(STEPS + 1):
            if STALLS.get(i) == "sleep":
                time.sleep(0.040)
            elif STALLS.get(i) == "cpu":
                end = time.monotonic_ns() + 30_000_000
                while time.monotonic_ns() < end:
                    pass
            t0 = time.monotonic_ns()
            for _ in range(4):
                loss = model(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            loss.item()
            steps.append({"step": i, "start_ns": t0, "end_ns": time.monotonic_ns(),
                          "stall_before": STALLS.get(i, "")})  # fmt: skip
            prof.step()
    pairs.append(clock_pair())
    prof.export_chrome_trace(str(out / "profiler.pt.trace.json"))
    time.sleep(2)
    rec.send_signal(signal.SIGINT)
    _, err = rec.communicate(timeout=30)
    (out / "steps.json").write_text(json.dumps({"steps": steps, "clocks": pairs}, indent=1))
    print(err[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
