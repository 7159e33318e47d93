"""Run a set of probes: the core module first, then each probe; a probe the kernel refuses is
reported unavailable and the rest keep running. One thread does all bcc work (bcc objects
are not thread-safe): it consumes ring buffers every `poll_ms` and, once a second, reads
in-kernel aggregates, refreshes the watched set and reports probe health.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpujitter.errors import GpujitterError
from gpujitter.probes import bundle, registry
from gpujitter.probes.base import (
    Emit,
    Probe,
    ProbeContext,
    ProbeUnavailable,
    release_compiler_memory,
)
from gpujitter.probes.bundle import ModulePart
from gpujitter.probes.events import Event, ProbeStatus
from gpujitter.probes.feeders import Feeders
from gpujitter.probes.host import HostPaths, can_load_bpf
from gpujitter.probes.progstats import Cost, CostMeter
from gpujitter.probes.topology import Topology
from gpujitter.probes.watch import CoreBpf, WatchSpec, module_parts

QUIET_RECORDS = 64  # fewer in a poll: the next one may wait twice as long


def set_parts(probes: Sequence[Probe], ctx: ProbeContext) -> list[ModulePart]:
    """The parts of the one module compiled for a set's probes (probes/bundle.py): every
    probe's .bpf.c, a part two probes share (faults and swap) once."""
    parts = {part.name: part for probe in probes for part in probe.parts(ctx)}
    return list(parts.values())


def compile_ahead(
    names: Sequence[str],
    *,
    topology: Topology,
    thresholds: Mapping[str, Mapping[str, int]] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Start compiling, on a thread of its own, the module that a ProbeSet of these
    arguments compiles when it starts (probes/bundle.py compile_ahead). The set's probes
    work out their parts again then and take this compile where they are the same; where
    they are not (another topology, a probe's options), or whatever fails here, the set
    compiles and reports as it would have. Only a head start: never raises."""
    ctx = ProbeContext(topology=topology, emit=lambda ev: True, thresholds=thresholds or {},
                       options=options or {})  # fmt: skip
    try:
        probes = [spec.factory(spec) for spec in map(registry.get, names)]
        parts = module_parts(set_parts(probes, ctx))
    except Exception:  # raised again, and reported, by the set's own start
        return
    bundle.compile_ahead(parts)


class ProbeSet:
    def __init__(
        self,
        names: Sequence[str],
        *,
        topology: Topology,
        watch: WatchSpec,
        emit: Emit,
        thresholds: Mapping[str, Mapping[str, int]] | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        paths: HostPaths | None = None,
    ) -> None:
        self.specs = [registry.get(n) for n in names]
        self.emit = emit
        feeders = Feeders()
        self.delivered = 0  # events the probes handed on (the core's excepted)

        def noted(ev: Event) -> bool | None:
            self.delivered += 1
            feeders.note(ev)
            return emit(ev)

        self.ctx = ProbeContext(
            topology=topology, emit=noted, thresholds=thresholds or {}, options=options or {}
        )
        self.core = CoreBpf(watch, topology, paths or HostPaths())
        self.ctx.shared["core"] = self.core  # the watched set, for probes without BPF
        self.ctx.shared["feeders"] = feeders  # the threads a sampler looks at first
        self.probes: list[Probe] = []
        self.meter = CostMeter()
        self._last_tick = 0

    def start(self, release: bool = True) -> list[ProbeStatus]:
        """Load the core, then every probe (compiled as one module with the core's part
        where the process has no core yet). Returns each probe's status; raises only when
        the core cannot load (then no probe can run). release: hand back the compiler's
        memory now (False: the caller does it, after it said the probes are running)."""
        probes = [spec.factory(spec) for spec in self.specs]
        try:
            self.ctx.bundle = self.core.start(self.emit, set_parts(probes, self.ctx))
        except ProbeUnavailable as err:
            if not can_load_bpf(self.core.paths):
                raise GpujitterError(
                    "loading the probes needs root (CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN); "
                    "run it with sudo (`gpujitter doctor` lists what is missing)"
                ) from None
            raise GpujitterError(f"cannot load the core BPF module: {err}") from None
        now = time.monotonic_ns()
        self._last_tick = now  # start() refreshed the watched set and reported health
        statuses = []
        for probe in probes:
            try:
                probe.start(self.ctx)
            except ProbeUnavailable as err:
                probe.state, probe.reason = "unavailable", str(err)
            self.probes.append(probe)
            status = probe.status(now)
            self.emit(status)
            statuses.append(status)
        if self.ctx.bundle is not None:
            self.ctx.bundle.release()  # the parts hold what they use
        if release:
            release_compiler_memory()
        self.measure_cost(now)  # the first measured stretch starts now
        return statuses

    @property
    def running(self) -> list[Probe]:
        return [p for p in self.probes if p.state in ("running", "degraded")]

    def poll(self) -> None:
        self.core.poll()
        for probe in self.running:
            probe.poll()

    def measure_cost(self, now_ns: int) -> None:
        """Each running probe's BPF cost (progstats.CostMeter), kept on the probe."""
        costs = self.meter.tick(now_ns, {p.name: p.programs() for p in self.running})
        for probe in self.probes:
            probe.cost = costs.get(probe.name, Cost())

    def tick(self, now_ns: int) -> None:
        """Once a second: aggregates, watched-set refresh, cost, health."""
        self.core.refresh(now_ns)
        for probe in self.running:
            for ev in probe.sample(now_ns):
                self.emit(ev)
        self.measure_cost(now_ns)
        for probe in self.probes:
            self.emit(probe.status(now_ns))

    def run(self, should_stop: Callable[[], bool], poll_ms: int = 50, tick_ms: int = 1000) -> None:
        """Poll every poll_ms, or every 2 * poll_ms after a poll that found fewer than
        QUIET_RECORDS: an idle node wakes the thread half as often, and the rings (16 pages
        and more: ~1 000 records) still hold twice the designed 5k records/s over the
        longer wait. Tick every tick_ms."""
        while not should_stop():
            before = self.delivered
            self.poll()
            now = time.monotonic_ns()
            if now - self._last_tick >= tick_ms * 1_000_000:
                self._last_tick = now
                self.tick(now)
            quiet = self.delivered - before < QUIET_RECORDS
            time.sleep((2 * poll_ms if quiet else poll_ms) / 1000)
        self.poll()

    def close(self) -> None:
        """Detach every probe, then the core module (the probes' programs use its maps).
        Detaching costs the kernel a wait per hook (~30-90 ms on 6.18; a libcuda's 59 uprobes
        took 6.9 s), so the probes detach side by side, each its own bcc object on one
        thread while this one waits: the default set's 1.5 s became 0.7-1.2 s here."""
        closers = [threading.Thread(target=p.close, name=f"close-{p.spec.name}")
                   for p in self.probes]  # fmt: skip
        for t in closers:
            t.start()
        for t in closers:
            t.join()
        self.core.close()
        self.meter.close()

    def __enter__(self) -> ProbeSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProbeThread:
    """A ProbeSet owned by a background thread (bcc objects stay on the thread that made
    them), for callers that do other work meanwhile: tests that generate load, the CLI.

        with ProbeThread(["sched"], topology=t, watch=w, emit=events.append) as pt:
            pt.started.wait()  # statuses in pt.statuses
            ...generate load...
        # leaving the block stops, drains the ring buffers and closes
    """

    def __init__(
        self, names: Sequence[str], *, poll_ms: int = 50, tick_ms: int = 1000, **kwargs: Any
    ) -> None:
        import threading

        self._set_args = (names, kwargs)
        self._periods = (poll_ms, tick_ms)
        self.started = threading.Event()
        self.statuses: list[ProbeStatus] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="gpujitter-probes", daemon=True)

    def _main(self) -> None:
        names, kwargs = self._set_args
        try:
            with ProbeSet(names, **kwargs) as probes:
                self.statuses = probes.start(release=False)
                self.started.set()
                # After the start is said: the daemon's READY need not wait for it (~60 ms).
                release_compiler_memory()
                probes.run(self._stop.is_set, *self._periods)
        except BaseException as err:  # handed to the owner thread, which re-raises it
            self.error = err
        finally:
            self.started.set()

    def __enter__(self) -> ProbeThread:
        self._thread.start()
        self.started.wait()
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error
