"""What NVML costs a fresh process in memory and CPU, step by step as the daemon's start
takes them: importing pynvml (compiled from source where it has no .pyc), glibc's freed heap
handed back, nvmlInit, the GPU queries, a shutdown and a second session (the topology's,
then the sampler's). One JSON line a step: resident size and peak (MB), the largest
mappings, the process's CPU seconds so far.

    python3 -m bench.nvml_memory      # on a GPU node (docs/performance.md, "Start and stop")
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.startstop import smaps_by_mapping


def step(label: str) -> None:
    status = {
        line.split(":")[0]: int(line.split()[1]) / 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith(("VmRSS:", "VmHWM:"))
    }
    top = smaps_by_mapping(os.getpid()).most_common(6)
    print(json.dumps({
        "step": label, "rss_mb": round(status["VmRSS"], 1), "peak_mb": round(status["VmHWM"], 1),
        "cpu_s": round(time.process_time(), 3),
        "by_mapping_mb": {name: round(kb / 1024, 1) for name, kb in top},
    }), flush=True)  # fmt: skip


def main() -> None:
    from gpujitter.probes.base import trim_heap

    step("start")
    import pynvml

    step("import pynvml")
    trim_heap()
    step("malloc_trim")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise SystemExit(f"bench.nvml_memory: no NVML here: {err}") from None
    step("nvmlInit")
    from gpujitter.probes.nvml import Nvml

    session = Nvml(pynvml).open()  # open: nvmlInit counts its sessions
    session.gpus(os.cpu_count() or 1)
    step("the GPUs' queries")
    trim_heap()
    step("malloc_trim")
    session.close()
    pynvml.nvmlShutdown()
    step("nvmlShutdown")
    again = Nvml(pynvml).open()
    again.gpus(os.cpu_count() or 1)
    step("a second session and its queries")
    again.close()


if __name__ == "__main__":
    main()
