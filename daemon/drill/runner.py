"""Running one drill: set the scenario's stage, start the feeding loop, run the real live
probes (every default probe, NVML on a GPU node) watching it, let it inject its stalls,
then run the daemon's pipeline over what the runtime took and score the attributions
against the stalls the loop reports. Everything the drill changed is restored on the way
out, on failure and on SIGINT/SIGTERM too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujitter.daemon.analysis.engine.engine import EngineConfig
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.checks.audit import slow_fault_notes
from gpujitter.daemon.drill import build, scenarios, system
from gpujitter.daemon.drill.feeder import FeederConfig
from gpujitter.daemon.drill.helpers import child_env
from gpujitter.daemon.drill.score import Score, Stall, score
from gpujitter.daemon.service.own_scheduling import OwnScheduling
from gpujitter.daemon.service.runtime import LiveSource, Runtime, Sink
from gpujitter.daemon.sinks.trace import TraceHeader, TraceWriter
from gpujitter.errors import GpujitterError
from gpujitter.probes import registry
from gpujitter.probes.events import Event, to_record
from gpujitter.probes.host import HostPaths
from gpujitter.probes.nvml import NvmlUnavailable, open_nvml
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec

WARMUP_S = 1.0  # go -> first stall: the loop steady, the probes' first ticks done
TAIL_S = 1.0  # last stall -> end
MIN_SPACING_S = 0.5  # between stalls, beyond the stall itself (pools refill, faults settle)
SETTLE_S = 0.5  # after the loop: the ring buffers drain (stalls end >= TAIL_S before it)
READY_TIMEOUT_S = 300.0  # set-up (a swap fill, a CUDA context) before the loop starts
# The longest loop: a drill keeps every event in memory until the loop ends, and waits for
# the loop's records with a selector, whose timeout stops at 2**31 ms (24.8 days).
MAX_DURATION_S = 24 * 3600
WORK_ROOT = Path("/var/tmp")  # scratch files must be on a disk: tmpfs has no page cache to drop

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DrillOptions:
    duration_s: float | None = None  # None: the scenario's default
    stalls: int = 8
    stall_ms: float = 25.0
    backend: str = "auto"  # auto, stub, torch
    step_ms: float = 10.0
    keep_trace: Path | None = None


@dataclass(frozen=True, slots=True)
class DrillResult:
    scenario: str
    backend: str
    cause: str
    truth: str
    duration_s: float
    stall_ms: float
    score: Score
    feeder: dict[str, Any]  # what the loop reported at ready and done
    probes: dict[str, str]  # probe -> state at the start
    notes: tuple[str, ...]
    events: int
    gaps: int
    trace: str | None = None
    topology_override: str | None = None
    stalls: tuple[dict[str, Any], ...] = field(default=())  # the loop's stall records
    attributions: tuple[Attribution, ...] = ()

    def to_record(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "backend": self.backend,
            "cause": self.cause,
            "truth": self.truth,
            "duration_s": self.duration_s,
            "stall_ms": self.stall_ms,
            **self.score.to_record(),
            "loop": {**self.feeder, "stalls": list(self.stalls)},
            "probes": self.probes,
            "notes": list(self.notes),
            "events": self.events,
            "gaps_detected": self.gaps,
            "trace": self.trace,
            "topology_override": self.topology_override,
            "attributions": [to_record(a) for a in self.attributions],
        }


def stall_times(duration_s: float, stalls: int, stall_ms: float) -> tuple[float, ...]:
    """When each stall starts, seconds after go: evenly spread between the warm-up and the
    tail, each in the middle of its slot."""
    if stalls <= 0:
        return ()
    spacing = (duration_s - WARMUP_S - TAIL_S) / stalls
    if spacing < stall_ms / 1000 + MIN_SPACING_S:
        # Rounded up to a tenth: rounded to the second, 3.05 s asked for "3s or more" of a 3s
        # that was just refused.
        need = math.ceil(10 * (WARMUP_S + TAIL_S + stalls * (stall_ms / 1000 + MIN_SPACING_S)))
        raise GpujitterError(
            f"{duration_s:g}s is too short for {stalls} stalls of {stall_ms:g} ms: "
            f"give --duration {need / 10:g}s or more"
        )
    return tuple(round(WARMUP_S + spacing * (k + 0.5), 3) for k in range(stalls))


def choose_backend(choice: str) -> str:
    """ "torch" when this node has a GPU (NVML lists one) and PyTorch is installed, else
    "stub"; an explicit choice is checked."""
    if choice == "stub":
        return choice
    has_torch = importlib.util.find_spec("torch") is not None
    if choice == "torch":
        if not has_torch:
            raise GpujitterError("--backend torch: PyTorch is not installed")
        return choice
    try:
        nvml = open_nvml()
    except NvmlUnavailable:
        return "stub"
    try:
        gpus = nvml.gpus(os.cpu_count() or 1)
    finally:
        nvml.close()
    return "torch" if gpus and has_torch else "stub"


class Feeder:
    """The feeding loop's process and its line protocol (feeder.py)."""

    def __init__(self, cfg: FeederConfig, pass_fds: list[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "gpujitter.daemon.drill.feeder", cfg.to_json()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=pass_fds,
            env=child_env(),
        )
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self, timeout_s: float) -> dict[str, Any]:
        """The next record; GpujitterError if the loop ended or went quiet for timeout_s."""
        import json

        assert self.proc.stdout is not None
        if not self._sel.select(timeout_s):
            raise GpujitterError(f"the feeding loop said nothing for {timeout_s:.0f}s")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise GpujitterError(f"the feeding loop ended early (exit status {code})")
        rec: dict[str, Any] = json.loads(line)
        return rec

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._sel.close()


@contextlib.contextmanager
def work_folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gpujitter-drill-", dir=WORK_ROOT) as work:
        yield Path(work)


def run_drill(name: str, opts: DrillOptions, progress: Progress) -> DrillResult:
    scenario = scenarios.get(name)
    if os.geteuid() != 0:
        raise GpujitterError("drills need root: probes, swap, cgroups, IRQ affinity")
    duration = opts.duration_s or scenario.duration_s
    stalls = opts.stalls if scenario.cause else 0
    at = stall_times(duration, stalls, opts.stall_ms)
    backend = choose_backend(opts.backend)
    known = registry.specs()
    notes = [f"probe {p} is not in this build: {scenario.cause} cannot be seen"
             for p in scenario.needs if p not in known]  # fmt: skip
    for note in system.recover_killed(WORK_ROOT):
        progress(note)
        notes.append(note)
    progress(f"building the drill's C parts ({backend} backend)")
    inject_lib = build.cached_inject()
    stub = str(build.cached_stub()) if backend == "stub" else ""
    real = load_topology()
    if {"faults", "swap"} & set(scenario.needs):  # its cause is fault time
        notes += [f"{n} (this drill's faults may be among them)"
                  for n in slow_fault_notes(HostPaths(), real)]  # fmt: skip
    events: list[Event] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(system.interrupted_by_signals())
        work = stack.enter_context(work_folder())
        stack.enter_context(system.undo_log(work))
        stage = scenarios.Stage(stack, work, real, backend, stalls, opts.stall_ms)
        scenario.stage(stage)
        notes += stage.notes
        stack.enter_context(system.own_affinity(stage.other_cpus))
        topology = load_topology(override=stage.override) if stage.override else real
        cfg = FeederConfig(
            backend=backend,
            inject_lib=str(inject_lib),
            scenario=name,
            cpu=stage.feeder_cpu,
            duration_s=duration,
            stall_ms=opts.stall_ms,
            stall_at_s=at,
            step_ms=opts.step_ms,
            stub=stub,
            params=stage.params,
            prefeed=scenario.prefeed,
        )
        feeder = Feeder(cfg, stage.pass_fds)
        stack.callback(feeder.stop)
        progress(f"starting the feeding loop on CPU {stage.feeder_cpu}")
        ready = feeder.read(READY_TIMEOUT_S)["ready"]
        # the probes the scenario needs run even where they are off by default (cstate)
        off = [p for p in scenario.needs if p in known and not known[p].default_on]
        names = [*registry.default_names(), *off]
        # The runtime as the daemon runs it (its own scheduling, its threads announced in
        # meta.self, so a wait of the loop behind the drill's own process is scored
        # self-inflicted), keeping every event; the analysis runs once the loop is done.
        source = LiveSource(
            names,
            topology=topology,
            watch=WatchSpec(pids={feeder.pid}),
            thresholds=stage.thresholds,
            options={"cuda": {"libcuda": [stub]}} if stub else {},
            nvml=backend == "torch",
            gpu_processes=False,
        )
        kept = _Kept(events)
        runtime = Runtime(
            source, topology, sinks=[kept], own=OwnScheduling(shared=True), signals=False
        )
        with runtime.running("gpujitter-runtime"):
            probes: dict[str, str] = {s.probe: s.state for s in source.statuses}
            notes += [f"probe {s.probe} {s.state}: {s.reason}" for s in source.statuses
                      if s.state not in ("running", "degraded") or (s.probe in scenario.needs
                      and s.reason)]  # fmt: skip
            progress(
                f"probes: {', '.join(f'{p} {s}' for p, s in probes.items())}; "
                f"{len(at)} stalls of {opts.stall_ms:g} ms over {duration:g}s"
            )
            feeder.go()
            stall_records, done = _follow(feeder, len(at), duration, progress)
            time.sleep(SETTLE_S)
            helper_tids = stage.helper_tids()
        bus_ids = source.gpu_bus_ids()
    progress(f"analysing {len(events)} events")
    analysis = AnalysisConfig(engine=EngineConfig(gpu_bus_ids=bus_ids))
    found = list(analyse(events, topology, analysis))
    attrs = [e for e in found if isinstance(e, Attribution)]
    # Waits behind any other task are outside contention (a busy machine), not the drill's.
    feeder_tids = {
        getattr(ev, "tid", 0) for ev in events if getattr(ev, "tgid", 0) == feeder.pid
    } - {0}
    result = score(
        scenario.cause,
        [Stall.from_record(s) for s in stall_records],
        attrs,
        (done["go_ns"], done["end_ns"]),
        own_tids=frozenset(feeder_tids | helper_tids | {feeder.pid}),
        truth_holds_waits=scenario.truth_holds_waits,
        injected=scenario.injected,
    )
    trace = None
    if opts.keep_trace is not None:
        trace = str(_keep(opts.keep_trace, events, topology, names, stage, analysis, feeder))
    return DrillResult(
        scenario=name,
        backend=backend,
        cause=scenario.cause,
        truth=scenario.truth,
        duration_s=duration,
        stall_ms=opts.stall_ms,
        score=result,
        feeder={"ready": ready, "done": done},
        probes=probes,
        notes=tuple(notes),
        events=len(events),
        gaps=len(found) - len(attrs),
        trace=trace,
        topology_override=topology.override,
        stalls=tuple(stall_records),
        attributions=tuple(attrs),
    )


class _Kept(Sink):
    """Every event the runtime took, in order."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events

    def event(self, ev: Event) -> None:
        self.events.append(ev)


def _follow(
    feeder: Feeder, stalls: int, duration_s: float, progress: Progress
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + duration_s + READY_TIMEOUT_S
    while True:
        rec = feeder.read(max(1.0, deadline - time.monotonic()))
        if "done" in rec:
            return records, rec["done"]
        st = rec["stall"]
        records.append(st)
        progress(
            f"stall {st['index'] + 1}/{stalls}: {(st['t1_ns'] - st['t0_ns']) / 1e6:.1f} ms"
            + (" (short: the injection ran out)" if st.get("short") else "")
        )


def _keep(
    path: Path,
    events: list[Event],
    topology: Topology,
    names: list[str],
    stage: scenarios.Stage,
    analysis: AnalysisConfig,
    feeder: Feeder,
) -> Path:
    """The drill's event stream as a trace file, for `gpujitter report`."""
    in_force = {n: {**registry.get(n).thresholds, **stage.thresholds.get(n, {})} for n in names}
    header = TraceHeader.now(topology, names, in_force, f"pid {feeder.pid}",
                             analysis=analysis.to_record())  # fmt: skip
    if events:
        header = dataclasses.replace(header, start_ns=events[0].ts_ns)
    with TraceWriter(path, header) as writer:
        for ev in events:
            writer.write(ev)
    return path
