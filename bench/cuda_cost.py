"""What the cuda probe costs a real GPU workload, measured on a GPU node (as root):
- per traced call: a tight loop of cuLaunchKernel calls that fail at once (ctypes), with the
  uprobes detached and attached, the process watched and not;
- per step: the training-like loop of bench/gpu_workload.py with the uprobes detached and
  attached, GPU-bound (8192 rows, ~5k launches/s: the budget's point) and host-bound (1024
  rows, ~30k launches/s: the worst case).
The probe is compiled and attached once; the uprobes of the functions the workload calls are
then detached and attached again round by round (the order flipping each round) so that
drift in the VM cancels out (uprobes on functions nobody calls cost nothing).
Budget (issue 4): <= 1 µs per traced call, <= 0.5 % step time at 5k launches/s.

    python3 bench/cuda_cost.py [--rounds 8] [--calls 100000] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes as ct
import json
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from gpujitter.probes.cuda import FUNC_NAMES, CudaProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

WORKLOAD = Path(__file__).with_name("gpu_workload.py")
REGIMES = {"gpu-bound": (8192, 150), "host-bound": (1024, 600)}  # rows, steps per sample


def ask(child: subprocess.Popen[str], line: str) -> dict[str, Any]:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()
    return dict(json.loads(child.stdout.readline()))


class Bench:
    def __init__(self, probes: ProbeSet, child: subprocess.Popen[str]) -> None:
        self.probes = probes
        self.child = child
        self.probe = next(p for p in probes.probes if isinstance(p, CudaProbe))
        self.attached = True
        self.toggled: list[tuple[str, int, str, bool]] = []

    def toggle_used(self) -> list[str]:
        """Toggle only the uprobes of functions the workload calls (and the hits loop's)."""
        used = set(self.probe.hit_counts()) | {"cuLaunchKernel"}
        self.toggled = [
            a for a in self.probe.attachments if FUNC_NAMES[int(a[2].split("_")[1])] in used
        ]
        return sorted(used)

    def ask(self, line: str) -> dict[str, Any]:
        """ask() while this thread (the one that owns the bcc objects) drains the ring
        buffers as the daemon does, so the probe's whole path is measured."""
        reply: dict[str, Any] = {}
        asker = threading.Thread(target=lambda: reply.update(ask(self.child, line)))
        asker.start()
        while asker.is_alive():
            self.probes.poll()
            asker.join(0.05)
        return reply

    def attach(self, on: bool) -> None:
        if on == self.attached:
            return
        bpf = self.probe.bpf
        for path, addr, fn, with_return in self.toggled:
            if on:
                bpf.attach_uprobe(name=path, addr=addr, fn_name=fn)
                if with_return:
                    bpf.attach_uretprobe(name=path, addr=addr, fn_name="leave_sync")
            else:
                bpf.detach_uprobe(name=path, addr=addr)
                if with_return:
                    bpf.detach_uretprobe(name=path, addr=addr)
        self.attached = on

    def watch(self, on: bool) -> None:
        watched = self.probes.core.bpf["gj_watched"]
        key = ct.c_uint(self.child.pid)
        if on:
            watched[key] = ct.c_ubyte(1)
        else:
            del watched[key]

    def launches(self) -> int:
        counts = self.probe.hit_counts()
        return sum(v for k, v in counts.items() if "Synchronize" not in k)


def paired(bench: Bench, rounds: int, line: str, field: str) -> dict[str, Any]:
    """`line` with the probe detached and attached, `rounds` times, alternating the order."""
    off, on = [], []
    for r in range(rounds):
        for state in (False, True) if r % 2 == 0 else (True, False):
            bench.attach(state)
            (on if state else off).append(float(bench.ask(line)[field]))
    diffs = [b - a for a, b in zip(off, on, strict=True)]
    return {
        "off": statistics.median(off),
        "on": statistics.median(on),
        "diff_median": statistics.median(diffs),
        "off_all": off,
        "on_all": on,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    child = subprocess.Popen(
        [sys.executable, str(WORKLOAD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    assert json.loads(child.stdout.readline()).get("ready")
    result: dict[str, Any] = {}
    # One uprobe per address (not the probe's default uprobe-multi links): the benchmark
    # toggles the functions the workload calls one by one.
    with ProbeSet(
        ["cuda"],
        topology=load_topology(),
        watch=WatchSpec(pids={child.pid}),
        emit=lambda e: True,
        options={"cuda": {"uprobe_multi": False}},
    ) as probes:
        probes.start()
        bench = Bench(probes, child)
        bench.ask("steps 20")
        result["toggled"] = bench.toggle_used()
        calls = paired(bench, args.rounds, f"hits {args.calls}", "ns_per_call")
        bench.watch(False)
        unwatched = paired(bench, args.rounds, f"hits {args.calls}", "ns_per_call")
        bench.watch(True)
        result["per_call_ns"] = {"watched": calls, "unwatched": unwatched}
        for name, (rows, steps) in REGIMES.items():
            ask(child, f"rows {rows}")
            bench.attach(True)
            before = bench.launches()
            step = paired(bench, args.rounds, f"steps {steps}", "step_ns")
            per_step = (bench.launches() - before) / (steps * args.rounds)
            result[name] = {
                "rows": rows,
                "step_ms_off": step["off"] / 1e6,
                "step_ms_on": step["on"] / 1e6,
                "step_cost_percent": step["diff_median"] / step["off"] * 100,
                "launches_per_step": per_step,
                "launches_per_s": per_step / (step["on"] / 1e9),
                "step_ns": step,
            }
        result["probe"] = probes.probes[0].status(0).reason or "running"
    child.stdin.write("quit\n")
    child.stdin.close()
    child.wait(timeout=60)
    text = json.dumps(result, indent=1)
    summary = {
        "probe_ns_per_call_watched": calls["diff_median"],
        "probe_ns_per_call_unwatched": unwatched["diff_median"],
        **{
            f"{k}_{f}": result[k][f]
            for k in REGIMES
            for f in ("step_ms_off", "step_cost_percent", "launches_per_s")
        },
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
