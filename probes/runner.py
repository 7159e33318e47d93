"""Run a set of probes: the core module first, then each probe; a probe the kernel refuses is
reported unavailable and the rest keep running. One thread does all bcc work (bcc objects
are not thread-safe): it consumes ring buffers every `poll_ms`, or sooner when the kernel
wakes it for a burst, and, once a second, reads in-kernel aggregates, refreshes the watched
set and reports probe health (the core's too, as the probe CORE_PROBE); the probes' log2
histograms every HIST_EVERY_NS, and all of it once more at the stop.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpujitter.errors import GpujitterError
from gpujitter.probes import bundle, registry
from gpujitter.probes.base import (
    DRAIN_SLICE_NS,
    DrainSlice,
    Emit,
    Probe,
    ProbeContext,
    ProbeUnavailable,
    descriptors_said,
    release_compiler_memory,
)
from gpujitter.probes.bundle import ModulePart
from gpujitter.probes.events import CORE_PROBE, Event, ProbeStatus
from gpujitter.probes.feeders import Feeders
from gpujitter.probes.host import HostPaths, can_load_bpf
from gpujitter.probes.progstats import Cost, CostMeter
from gpujitter.probes.topology import Topology
from gpujitter.probes.watch import CoreBpf, WatchSpec, module_parts

# The rings are drained this often: records wait in the kernel meanwhile (a record wakes
# nobody), and a drain of a quarter second's records cost the daemon ~20 % less CPU beside
# a busy job than drains every 50-100 ms; half a second saved nothing more
# (docs/performance.md, "Fewer wake-ups"). A burst does not wait for it: the kernel wakes
# the drain after GJ_WAKE_RECORDS records (gpujitter.h), half the smallest ring.
POLL_MS = 250
# The last drain, at the stop, may take this long (DRAIN_SLICE_NS for the others): a ring's
# few thousand records take tens of ms; where the thread gets a sliver of a CPU (a saturated
# node) the stop cannot wait for them, and what is left goes with the maps.
STOP_DRAIN_NS = 500_000_000
# The probes' in-kernel log2 histograms (Log2Hist) are handed on this often, and once more at
# the stop. Nothing in the daemon reads them (they are for `gpujitter probe` and recordings),
# and reading one costs a copy of it from every CPU and a sum of its slots across them in
# Python: on a 16-CPU host, beside a training job, they were a fifth of the probe thread's
# samples (docs/performance.md, "Histograms every 10 s").
HIST_EVERY_NS = 10_000_000_000


class RingWaits:
    """Where the probe thread waits between drains: an edge-triggered epoll on the rings'
    fds, which report ready only when the kernel wakes them (GJ_WAKE_RECORDS records since
    the last drain; records submitted without a wake-up leave a waiter asleep), and on an
    eventfd that a stop writes to."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._fds: set[int] = set()
        self._stop_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._stop_fd, select.EPOLLIN)
        self._closing = threading.Lock()  # a stop's wake-up (its thread) against the close

    def watch(self, fds: Iterable[int]) -> None:
        """Wait on these rings too (fds already waited on are left as they are)."""
        for fd in set(fds) - self._fds:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLET)
            self._fds.add(fd)

    def wait(self, timeout_s: float) -> None:
        self._epoll.poll(timeout_s)

    def wake(self) -> None:
        """End the wait now, and every later one (a stop); nothing once closed (the probe
        thread's set ended, by an error it hands on: a stop's EBADF here replaced it)."""
        with self._closing:
            if not self._epoll.closed:
                os.eventfd_write(self._stop_fd, 1)

    def close(self) -> None:
        with self._closing:
            if not self._epoll.closed:
                self._epoll.close()
                os.close(self._stop_fd)


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
        handed: Callable[[], None] | None = None,
        thresholds: Mapping[str, Mapping[str, int]] | None = None,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        paths: HostPaths | None = None,
    ) -> None:
        self.specs = [registry.get(n) for n in names]
        self.emit = emit
        # Told after each drain (and tick) of `run`, once what it delivered is emitted: a
        # consumer that takes events in batches takes them then (the daemon's queue).
        self.handed = handed
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
        self.waits = RingWaits()
        self._last_tick = 0
        self._hists_read = 0  # when the histograms were handed on last

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
        self.emit(self.core.status(now))
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
        # start() refreshed the watched set and reported health: the first tick is due a
        # second from now, and the first measured stretch starts now (not when the core was
        # up: the probes' compiles since would count as a stretch in which nothing ran)
        self._last_tick = self._hists_read = time.monotonic_ns()
        self.measure_cost(self._last_tick)
        self._watch_rings()
        return statuses

    @property
    def running(self) -> list[Probe]:
        return [p for p in self.probes if p.state in ("running", "degraded")]

    def poll(self, slice_ns: int = DRAIN_SLICE_NS) -> bool:
        """Drain every ring, for `slice_ns` at most; True where that ran out first (records
        are left: the loop drains again before it waits)."""
        with DrainSlice(slice_ns) as drain:
            self.core.poll()
            for probe in self.running:
                probe.poll()
        self.core.rearm()
        return drain.cut

    def _watch_rings(self) -> None:
        probes = [fd for probe in self.running for fd in probe.ring_fds()]
        self.waits.watch([*self.core.ring_fds(), *probes])

    def measure_cost(self, now_ns: int) -> None:
        """Each running probe's BPF cost (progstats.CostMeter), kept on the probe, and the
        core's, kept on the core (its programs are in the probes' module, not their cost)."""
        running = self.running
        costs = self.meter.tick(
            now_ns,
            lambda: {CORE_PROBE: self.core.programs(), **{p.name: p.programs() for p in running}},
        )
        self.core.cost = costs.get(CORE_PROBE, Cost())
        for probe in self.probes:
            if probe in running and (shared := probe.cost_counted_with()):
                probe.cost = Cost(source=f"with {shared}")
            elif probe.name in costs:
                probe.cost = costs[probe.name]
            elif probe in running and not self.meter.refused and probe.programs():
                # programs that came after the last measured stretch (a uprobe on an
                # interpreter that started since): sampled, they are measured in the next
                probe.cost = Cost(source="pending")
            else:
                probe.cost = Cost()

    def tick(self, now_ns: int, final: bool = False) -> None:
        """Once a second: aggregates, watched-set refresh, cost, health; the histograms every
        HIST_EVERY_NS, and at the `final` tick (the stop) what they counted since."""
        self.core.refresh(now_ns)
        running = self.running
        for probe in running:
            for ev in probe.sample(now_ns):
                self.emit(ev)
        if final or now_ns - self._hists_read >= HIST_EVERY_NS:
            self._hists_read = now_ns
            for probe in running:
                for hists in probe.log2_maps():
                    for ev in hists.delta(now_ns):
                        self.emit(ev)
        self.measure_cost(now_ns)
        self.emit(self.core.status(now_ns))
        for probe in self.probes:
            self.emit(probe.status(now_ns))

    def run(
        self, should_stop: Callable[[], bool], poll_ms: int = POLL_MS, tick_ms: int = 1000
    ) -> None:
        """Poll every poll_ms, or as soon as the kernel wakes a ring (a burst), or at once
        after a drain its slice cut short (records left); tick every tick_ms. A stop ends
        the wait at once (`waits.wake`), then drains and ticks once more: what the probes
        counted since the last tick (per-CPU totals, histograms, losses) is handed over, not
        dropped with the maps."""
        while not should_stop():
            cut = self.poll()
            now = time.monotonic_ns()
            if now - self._last_tick >= tick_ms * 1_000_000:
                self._last_tick = now
                self.tick(now)
            if self.handed is not None:
                self.handed()
            if cut:
                continue
            due = [self._last_tick + tick_ms * 1_000_000]
            due += [d for p in self.running if (d := p.due_ns()) is not None]
            self.waits.wait(max(0.0, min(poll_ms, (min(due) - now) / 1e6)) / 1000)
        self.poll(STOP_DRAIN_NS)
        self.tick(time.monotonic_ns(), final=True)

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
        self.waits.close()

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
        self, names: Sequence[str], *, poll_ms: int = POLL_MS, tick_ms: int = 1000, **kwargs: Any
    ) -> None:
        import threading

        self._set_args = (names, kwargs)
        self._periods = (poll_ms, tick_ms)
        self.started = threading.Event()
        self.statuses: list[ProbeStatus] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._waits: RingWaits | None = None  # the running set's, for a stop to end its wait
        self._thread = threading.Thread(target=self._main, name="gpujitter-probes", daemon=True)

    def _main(self) -> None:
        names, kwargs = self._set_args
        try:
            # Out of descriptors (a limit lowered under the daemon, descriptors it inherited),
            # a tick's open failed and the error read `standard output: Bad file descriptor`.
            with descriptors_said(), ProbeSet(names, **kwargs) as probes:
                self._waits = probes.waits
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
        if self._waits is not None:
            self._waits.wake()
        self._thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error
