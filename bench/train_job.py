"""A real training job for the GPU machine, to run gpujitter beside (bench/real_job.py): a
decoder-only transformer language model (12 layers, d_model 768, 12 heads, vocab 32k,
sequence 512: ~110M parameters, printed), bf16 autocast, fused AdamW, loss.item() every
step, fed by a DataLoader with worker processes (pin_memory) that random-crop token
windows from a large memory-mapped file (bench/train_parts.py). GPU-bound when clean:
~40-60 ms a step on an H200 at batch 32 (--target-step-ms rescales the batch once).

    python3 -P -m bench.train_job --out DIR [--batch 32] [--workers 4] [--target-step-ms 50]

It logs every step to DIR/steps.tsv (step, start, batch in hand, end: CLOCK_MONOTONIC ns;
the end is loss.item()'s return) and prints records as JSON lines on stdout: ready, then
for each scenario run: scenario (its start), stall (one per injected stall: its truth, as
the drills' feeder measures it), scenario_end; done at the end. Commands on stdin:
  scenario NAME COUNT STALL_MS SPACING_S   inject COUNT stalls (bench/train_parts.py
                                           JOB_SCENARIOS), SPACING_S apart
  quit
The training thread runs alone on one CPU (--cpu, default the last); every other thread and
the workers run on the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import statistics
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.train_parts import (
    AFTER_SYNC,
    IN_SYNC,
    JOB_SCENARIOS,
    LOADER,
    MB,
    HoldRing,
    JobScenario,
    TokenBatches,
    close_quietly,
    data_file,
    make_tokens,
)
from gpujitter.daemon.drill import build, scenarios, system
from gpujitter.daemon.drill.feeder import stall as injected_stall
from gpujitter.daemon.drill.injectors import Injector, load_inject
from gpujitter.probes.topology import load_topology

MS = 1_000_000
WARMUP_STEPS = 10
MEASURE_STEPS = 10
GPU_EST_STEPS = 50  # recent clean steps the sync scenario's GPU time estimate comes from
READAHEAD_FILE_BYTES = 512 * MB


SyncHook = Callable[[Any, int], None]  # (the step's start event, its host time)


@dataclass(frozen=True, slots=True)
class Step:
    t0: int  # start: before the batch is fetched
    tf: int  # the batch in hand
    tl: int  # every launch of the step queued
    t1: int  # loss.item() returned: the GPU's queue is empty


def nothing() -> None:
    return None


def say(**rec: Any) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


# -- the model -----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, 4 * d_model, bias=False)
        self.down = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, heads, s, head_dim)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class DecoderLM(nn.Module):
    def __init__(self, vocab: int, seq: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2 does

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(pos)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))


# -- the loop ------------------------------------------------------------------------------


class Job:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dev = torch.device("cuda")
        self.cpu = args.cpu if args.cpu >= 0 else max(os.sched_getaffinity(0))
        self.others = sorted(os.sched_getaffinity(0) - {self.cpu}) or [self.cpu]
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic_ns()
        self.tokens = make_tokens(self.work / "tokens.u16", args.data_tokens, args.vocab)
        self.data_ns = time.monotonic_ns() - t0
        self.ring = HoldRing()
        self.model = DecoderLM(args.vocab, args.seq, args.d_model, args.layers, args.heads)
        self.model.to(self.dev)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1,
                                     fused=True)  # fmt: skip
        self.batch = args.batch
        self.loader_iter: Any = None
        self.fetched = 0  # batches taken from the loader (the next one's index)
        self.steps = 0
        # Line-buffered: the harness reads a round's steps as soon as the round ends (a
        # 64 KiB buffer held ~50 s of steps, and 20 s cost rounds read none); one write per
        # ~50 ms step costs the job nothing it could see.
        self.steps_log = open(Path(args.out) / "steps.tsv", "w", buffering=1)  # noqa: SIM115
        self.clean_gpu_ns: deque[int] = deque(maxlen=GPU_EST_STEPS)
        self.while_busy: Callable[[], None] = nothing  # a scenario's bounded background work
        self.commands: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.lib = load_inject(str(build.cached_inject()))

    # the data
    def start_loader(self) -> None:
        dataset = TokenBatches(self.tokens, self.batch, self.args.seq, self.args.vocab,
                               self.ring)  # fmt: skip
        others = set(self.others)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            sampler=range(self.fetched, 1 << 40),
            num_workers=self.args.workers,
            pin_memory=True,
            prefetch_factor=self.args.prefetch,
            persistent_workers=True,
            multiprocessing_context="fork",
            worker_init_fn=lambda _: os.sched_setaffinity(0, others),
        )
        self.loader_iter = iter(loader)

    def stop_loader(self) -> None:
        it, self.loader_iter = self.loader_iter, None
        if it is not None:
            it._shutdown_workers()

    # one step
    def step(self, sync_hook: SyncHook | None = None) -> Step:
        """Fetch a batch and train on it."""
        t0 = time.monotonic_ns()
        x, y, pos = next(self.loader_iter)
        self.fetched += 1
        tf = time.monotonic_ns()
        e0, h0 = None, 0
        if sync_hook is not None:
            e0 = torch.cuda.Event(enable_timing=True)
            h0 = time.monotonic_ns()
            e0.record()
        x = x.to(self.dev, non_blocking=True)
        y = y.to(self.dev, non_blocking=True)
        pos = pos.to(self.dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(x, pos)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        tl = time.monotonic_ns()  # every launch of the step queued
        self.while_busy()
        if sync_hook is not None and e0 is not None:
            sync_hook(e0, h0)
        loss.item()
        t1 = time.monotonic_ns()
        self.steps += 1
        self.steps_log.write(f"{self.steps} {t0} {tf} {t1}\n")
        return Step(t0, tf, tl, t1)

    def warm_up(self) -> dict[str, Any]:
        for _ in range(WARMUP_STEPS):
            self.step()
        got = [self.step() for _ in range(MEASURE_STEPS)]
        step_ms = statistics.median(s.t1 - s.t0 for s in got) / 1e6
        host_ms = statistics.median(s.tl - s.t0 for s in got) / 1e6
        return {
            "step_ms": round(step_ms, 3),
            "fetch_ms": round(statistics.median(s.tf - s.t0 for s in got) / 1e6, 3),
            "host_ms": round(host_ms, 3),  # fetch + every launch queued: the host's share
            "gpu_bound": host_ms < 0.7 * step_ms,
        }

    def pin(self) -> None:
        """The training thread alone on its CPU; every other thread of the process (pin
        memory, autograd, CUDA's) on the others."""
        me = threading.get_native_id()
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(tid), {self.cpu} if int(tid) == me else self.others)

    def read_commands(self) -> None:
        for line in sys.stdin:
            self.commands.put(line.strip())
        self.commands.put("quit")


class Scenario:
    """One scenario's run inside the job: its set-up (made on a thread of its own while the
    job trains, since a swap file or a helper's fill takes seconds), its stalls at their due
    times, its tear-down."""

    def __init__(self, job: Job, spec: JobScenario, count: int, stall_ms: float, spacing_s: float):
        self.job = job
        self.spec = spec
        self.count = count
        self.stall_ns = round(stall_ms * MS)
        self.spacing_ns = round(spacing_s * 1e9)
        self.stack = contextlib.ExitStack()
        self.injector: Injector | None = None
        self.params: dict[str, Any] = {}
        self.setup: dict[str, Any] = {}
        self.notes: list[str] = []
        self.error = ""
        self.due: list[int] = []
        self.end_ns = 0
        self.index = 0
        self.held: dict[int, int] = {}  # batch held in its worker -> stall index
        self.sync_due = False
        self.ready = threading.Event()
        threading.Thread(target=self._prepare, daemon=True).start()

    def _prepare(self) -> None:
        try:
            job, spec = self.job, self.spec
            if spec.drill_stage:
                stage = scenarios.Stage(self.stack, job.work, load_topology(), "torch",
                                        self.count, self.stall_ns / MS,
                                        feeder_cpu=job.cpu)  # fmt: skip
                scenarios.SCENARIOS[spec.drill_stage].stage(stage)
                self.params.update(stage.params)
                self.notes += stage.notes
            if spec.name == "migrate":
                self.params["remote_cpu"] = job.others[0]
            if spec.name == "readahead":
                self.params["file"] = str(data_file(job.work, READAHEAD_FILE_BYTES))
            if spec.injector is not None:
                self.injector = spec.injector(job.lib, self.stall_ns, self.params)
                self.stack.callback(close_quietly, self.injector)
                self.setup = self.injector.setup()
                self.injector.start()
        except Exception as err:  # reported in the scenario record; the job trains on
            self.error = f"{type(err).__name__}: {err}"
        self.ready.set()

    def begin(self, now: int) -> None:
        self.due = [now + self.spacing_ns * (k + 1) for k in range(self.count)]
        self.end_ns = now + self.spacing_ns * (self.count + 1)
        say(scenario={"name": self.spec.name, "cause": self.spec.cause, "truth": self.spec.truth,
                      "where": self.spec.where, "start_ns": now, "count": self.count,
                      "stall_ms": self.stall_ns / MS, "cpu": self.job.cpu,
                      "params": {k: v for k, v in self.params.items() if k != "trigger_fd"},
                      "setup": self.setup, "notes": self.notes})  # fmt: skip
        if self.injector is not None:
            self.job.while_busy = self.injector.background

    def after_step(self, now: int) -> None:
        """Called after each step's loss.item(): the GPU's queue is empty."""
        if not self.due or now < self.due[0]:
            return
        self.due.pop(0)
        if self.spec.where == AFTER_SYNC and self.injector is not None:
            rec = injected_stall(self.injector, self.index, self.stall_ns)
            self._record(rec)
        elif self.spec.where == LOADER:
            # far enough ahead that no worker has started it yet
            batch = self.job.fetched + self.job.args.workers * self.job.args.prefetch + 4
            self.job.ring.mark(batch)
            self.held[batch] = self.index
            self.index += 1
        elif self.spec.where == IN_SYNC:
            self.sync_due = True

    def before_fetch(self) -> int | None:
        """LOADER: the stall index if the batch about to be fetched is held (its release is
        posted now: the worker computes until then)."""
        stall = self.held.pop(self.job.fetched, None)
        if stall is not None:
            self.job.ring.post(self.job.fetched, time.monotonic_ns() + self.stall_ns)
        return stall

    def loader_stall(self, stall: int, t0: int, t1: int) -> None:
        self.job.ring.clear(self.job.fetched - 1)
        self._record({"index": stall, "t0_ns": t0, "t1_ns": t1, "cause_ns": t1 - t0})

    def sync_hook(self, e0: Any, h0: int) -> None:
        """IN_SYNC: every launch of the step is queued; the hog takes this thread's CPU from
        now until the GPU has been done for stall_ns (by the recent steps' GPU time), while
        the thread waits in torch.cuda.synchronize()."""
        e1 = torch.cuda.Event(enable_timing=True)
        e1.record()
        gpu_est = statistics.median(self.job.clean_gpu_ns) if self.job.clean_gpu_ns else 0
        called = time.monotonic_ns()
        deadline = max(h0 + round(1.1 * gpu_est), called) + self.stall_ns
        os.write(self.params["trigger_fd"], struct.pack("<Q", deadline))
        torch.cuda.synchronize()
        back = time.monotonic_ns()
        gpu_done = h0 + round(e0.elapsed_time(e1) * MS)
        self._record({"index": self.index, "t0_ns": gpu_done, "t1_ns": back,
                      "cause_ns": max(0, back - gpu_done), "sync_called_ns": called,
                      "hog_deadline_ns": deadline, "gpu_est_ns": gpu_est})  # fmt: skip
        self.sync_due = False

    def _record(self, rec: dict[str, Any]) -> None:
        say(stall={"scenario": self.spec.name, **rec})
        self.index = max(self.index, rec["index"] + 1)

    def finished(self, now: int) -> bool:
        return not self.due and not self.held and not self.sync_due and now >= self.end_ns

    def close(self, now: int) -> None:
        self.job.while_busy = nothing
        self.stack.close()
        say(scenario_end={"name": self.spec.name, "end_ns": now})


def train(job: Job) -> dict[str, Any]:
    """Steps until `quit`, running the scenarios asked for one at a time."""
    pending: deque[tuple[JobScenario, int, float, float]] = deque()
    current: Scenario | None = None
    started = False
    while True:
        while True:
            try:
                cmd = job.commands.get_nowait()
            except queue.Empty:
                break
            if cmd == "quit":
                if current is not None:
                    current.close(time.monotonic_ns())
                return {"steps": job.steps, "batches": job.fetched}
            words = cmd.split()
            if len(words) == 5 and words[0] == "scenario" and words[1] in JOB_SCENARIOS:
                pending.append((JOB_SCENARIOS[words[1]], int(words[2]), float(words[3]),
                                float(words[4])))  # fmt: skip
            else:
                say(error=f"unknown command {cmd!r}")
        if current is None and pending:
            current = Scenario(job, *pending.popleft())
            started = False
        if current is not None and not started and current.ready.is_set():
            if current.error:
                say(scenario={"name": current.spec.name, "error": current.error})
                current.close(time.monotonic_ns())
                current = None
            else:
                current.begin(time.monotonic_ns())
                started = True
        active = current if current is not None and started else None
        held = active.before_fetch() if active is not None else None
        hook = active.sync_hook if active is not None and active.sync_due else None
        s = job.step(hook)
        if held is not None and active is not None:
            active.loader_stall(held, s.t0, s.tf)
        elif hook is None:
            job.clean_gpu_ns.append(s.t1 - s.tf)
        if active is not None:
            now = time.monotonic_ns()
            active.after_step(now)
            if active.finished(now):
                active.close(now)
                current = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for steps.tsv")
    p.add_argument("--work", default="/var/tmp/gj-realjob", help="data files (on a disk)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--data-tokens", type=int, default=128 << 20, help="token file size")
    p.add_argument(
        "--target-step-ms",
        type=float,
        default=0.0,
        help="rescale the batch once so that a step takes about this long",
    )
    p.add_argument("--cpu", type=int, default=-1, help="the training thread's CPU")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    with system.interrupted_by_signals():
        job = Job(args)
        job.start_loader()
        timing = job.warm_up()
        if args.target_step_ms > 0 and abs(timing["step_ms"] / args.target_step_ms - 1) > 0.2:
            job.stop_loader()
            job.batch = max(1, round(job.batch * args.target_step_ms / timing["step_ms"]))
            job.start_loader()
            timing = job.warm_up()
        job.pin()
        threading.Thread(target=job.read_commands, daemon=True).start()
        say(ready={
            "pid": os.getpid(), "tid": threading.get_native_id(), "cpu": job.cpu,
            "params": job.params, "batch": job.batch, "seq": args.seq, "layers": args.layers,
            "d_model": args.d_model, "heads": args.heads, "vocab": args.vocab,
            "workers": args.workers, "prefetch": args.prefetch, "data_tokens": args.data_tokens,
            "data_s": round(job.data_ns / 1e9, 2), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0), **timing,
        })  # fmt: skip
        print(f"# {job.params / 1e6:.1f}M parameters, batch {job.batch}x{args.seq}, "
              f"{timing['step_ms']:.1f} ms a step", file=sys.stderr, flush=True)  # fmt: skip
        try:
            totals = train(job)
        finally:
            job.steps_log.close()
            job.stop_loader()
    say(done=totals)


if __name__ == "__main__":
    main()
