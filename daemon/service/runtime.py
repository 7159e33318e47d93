"""The one loop every event-consuming command runs: an event source (live probes and NVML, a
recording, a synthetic list) feeds one bounded queue; the runtime takes each event on its own
thread, keeps the node state, feeds the pipeline (gaps, then attributions) and fans events and
findings out to sinks (trace capture, log, stream, metrics, console, a command's printer).
Once a tick (1 s) it measures its footprint, tends its own threads' scheduling and hands the
daemon.status to the sinks. `run`, `record`, `gaps`, `probe`, drills and the TUI's embedded
mode are configurations of it: which source, which sinks, whether it analyses.

Stopping: SIGTERM/SIGINT (when it owns the signals) or the caller's `stopped` end the loop;
the source stops and hands over what it held, the queue is drained, the pipeline flushed,
then the sinks close, last added first. Before the source has started (the probes' compile),
either signal ends the process at once with one line and exit 130 (stop_while_starting).
SIGHUP or SIGUSR1 (where asked: the daemon) has the sinks reopen their files; other signals
whose default would end it unflushed are ignored, each said once.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import psutil

from gpujitter.daemon.analysis.pipeline import AnalysisConfig, Pipeline
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.service.own_scheduling import OwnScheduling, in_slices
from gpujitter.daemon.service.sdnotify import Notifier
from gpujitter.daemon.service.state import NodeState
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.probes.base import Emit, descriptors_said
from gpujitter.probes.clock import clock_ref, stepped
from gpujitter.probes.events import ClockRef, CudaCall, Event, ProbeStatus, WatchChange
from gpujitter.probes.host import HostPaths
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.procfs import alive, process_age_ns
from gpujitter.probes.topology import Topology
from gpujitter.signals import RELOAD_SIGNALS, STOP_SIGNALS, STRAY_SIGNALS, stop_while_starting

TICK_NS = 1_000_000_000
# How long the loop gathers events before it takes them (unless a burst fills a quarter of
# the queue or a stop wakes it): how late a tick can be, and how often an idle daemon
# wakes. The probe thread hands over on the same period (probes/runner.py POLL_MS): a
# larger batch a wake-up costs less an event (docs/performance.md, "Fewer wake-ups").
DRAIN_TIMEOUT_S = 0.25
# With a source that says when it handed a batch over (the live probes, after each drain),
# the loop wakes on that, and its own period only backs it up: longer than the probe
# thread's, so that the two do not both wake a few ms apart each period.
HANDED_TIMEOUT_S = 0.5
# The watched processes may pin their threads at any time: their CPUs are read again this
# often, besides whenever the watched set changes.
REPIN_NS = 10_000_000_000
# A thread that made no CUDA call for this long is no longer kept clear of (keep_off).
FEEDER_QUIET_NS = 60_000_000_000


class EventQueue:
    """Fan-in from event sources to one consumer thread. `emit` is what a source calls (the
    probes' Emit): it never blocks and takes no lock (a deque's append is atomic); when the
    consumer falls `maxsize` events behind, the event is dropped, counted in `dropped`, and
    emit returns False so the probe counts it as lost too.

    The consumer takes the queue in batches: `drain` waits out its timeout to gather one
    (one wake-up a period, whatever the rate: a niced thread woken per ring-buffer poll ran
    cold, ~85 µs an event live against ~15-30 replayed, docs/performance.md), and returns
    early only when a quarter of the bound is queued (a burst is not dropped), a source says
    it `handed` a batch over (the probe thread, after each of its drains) or `wake` is
    called (a stop). The wait is a poll on an eventfd, not a threading.Event: `wake` takes
    no lock, so a signal handler may call it (one that set an Event could deadlock on the
    lock the thread it interrupted holds), and a stop never waits out the period.

    The default bound is memory: a full queue holds ~7 MiB of decoded events (~460 B
    each), and Python keeps that much after a backlog drains (long-lived objects allocated
    among the events pin their arenas). It absorbs a main-loop pause of 3 s at the 5k
    events/s the probes are designed not to exceed (minutes at the rates seen on real
    workloads); what comes past it is dropped and counted."""

    def __init__(self, maxsize: int = 16384) -> None:
        self.maxsize = maxsize
        self.dropped = 0
        self._events: collections.deque[Event] = collections.deque()
        self._wake_at = max(1, maxsize // 4)
        self._more = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        weakref.finalize(self, os.close, self._more)
        self._waiter = select.poll()
        self._waiter.register(self._more, select.POLLIN)
        # Written once per batch: a burst's emits past the quarter mark cost no syscall each.
        # Read and written by several threads without a lock: a race costs one write more,
        # or the early wake-up of one batch (the period then ends its wait).
        self._woken = False

    def emit(self, ev: Event) -> bool:
        events = self._events
        if len(events) >= self.maxsize:
            self.dropped += 1
            return False
        events.append(ev)
        if len(events) >= self._wake_at:
            self._wake_once()
        return True

    def wake(self) -> None:
        """End the consumer's wait now (a stop: from another thread, or a signal handler)."""
        os.eventfd_write(self._more, 1)

    def handed(self) -> None:
        """A source handed a batch over: the consumer takes it now, not when its period
        ends. Its wake-ups then follow the probe thread's drains instead of adding their
        own, and it takes the events right behind the thread that made them (the main
        thread a third cheaper on the development VM, unchanged on the H200:
        docs/performance.md). Nothing queued, or a wake-up already due: no syscall."""
        if self._events:
            self._wake_once()

    def _wake_once(self) -> None:
        """Wake the consumer unless a wake-up is already due for this batch."""
        if not self._woken:
            self._woken = True
            os.eventfd_write(self._more, 1)

    def empty(self) -> bool:
        return not self._events

    def drain(self, timeout_s: float = 0.0, limit: int = 10_000) -> list[Event]:
        """What is queued (up to `limit`, oldest first), after waiting up to timeout_s for
        a quarter of the bound to gather."""
        if timeout_s and len(self._events) < self._wake_at:
            self._waiter.poll(math.ceil(timeout_s * 1000))
        with contextlib.suppress(BlockingIOError):  # nothing written: the period ended
            os.eventfd_read(self._more)
        self._woken = False
        events = self._events
        return [events.popleft() for _ in range(min(len(events), limit))]


# Whether a thread of this node still exists (for the node state's threads, each tick).
_ALIVE = partial(alive, HostPaths())


class EventSource:
    """Where a runtime's events come from. A live source delivers from threads of its own
    through `emit` (the runtime's bounded queue, which drops and counts past its bound); a
    recorded one hands its events over in order through `pull`, never dropped."""

    label = ""
    hands_over = False  # says when it handed a batch over (`start`'s handed)
    on_this_node = False  # its threads are this node's (/proc tells whether they are alive)

    def __init__(self) -> None:
        self.gpus: list[GpuInfo] = []
        self.statuses: list[ProbeStatus] = []

    def start(self, emit: Emit, handed: Callable[[], None] | None = None) -> None:
        """Begin delivering (live sources: start their threads); one that `hands_over`
        calls `handed` after each batch it emitted."""

    def stop(self) -> None:
        """Stop, after handing over through `emit` what was still held."""

    def pull(self, limit: int) -> list[Event] | None:
        """The next events of a recorded source ([] when it has none to hand over this
        way: a live one), None once it has handed over everything."""
        return []

    @property
    def failed(self) -> bool:
        """The source cannot deliver any more (a live source's thread died)."""
        return False

    def gpu_bus_ids(self) -> dict[int, str]:
        """GPU index -> PCI bus id, for the engine's GPU-node lookups."""
        return {g.index: g.pci_bus_id for g in self.gpus if g.pci_bus_id}


class LiveSource(EventSource):
    """The probes, the libcuda tracer and the NVML sampler (probes/live.py), each on its
    own thread; `kwargs` are LiveProbes' (probe names, topology, watch, ...)."""

    label = "live"
    hands_over = True
    on_this_node = True

    def __init__(self, probes: Sequence[str], **kwargs: Any) -> None:
        super().__init__()
        self.probes = list(probes)
        self.kwargs = kwargs
        self._evidence: Any = None

    def start(self, emit: Emit, handed: Callable[[], None] | None = None) -> None:
        from gpujitter.probes.live import LiveProbes

        evidence = LiveProbes(self.probes, emit=emit, handed=handed, **self.kwargs)
        evidence.__enter__()
        self._evidence = evidence
        self.gpus = evidence.gpus
        self.statuses = evidence.statuses

    def stop(self) -> None:
        evidence, self._evidence = self._evidence, None
        if evidence is not None:
            evidence.__exit__(None, None, None)

    @property
    def failed(self) -> bool:
        return self._evidence is not None and bool(self._evidence.failed)


class ListSource(EventSource):
    """Events already in hand: a recording's (`gpujitter.daemon.offline.recordings`), a drill's,
    or a synthetic stream for tests. `live` hands them through the queue at start, as probe
    threads would (so the queue's bound applies); otherwise they are pulled in order."""

    def __init__(
        self,
        events: Iterable[Event],
        *,
        label: str = "events",
        gpus: Sequence[GpuInfo] = (),
        live: bool = False,
    ) -> None:
        super().__init__()
        self.label = label
        self.gpus = list(gpus)
        self.live = live
        self._events: Iterator[Event] = iter(events)

    def start(self, emit: Emit, handed: Callable[[], None] | None = None) -> None:
        if self.live:
            for ev in self._events:
                emit(ev)

    def pull(self, limit: int) -> list[Event] | None:
        if self.live:
            return []  # handed over at start; it ends when the runtime is stopped
        batch = [ev for _, ev in zip(range(limit), self._events, strict=False)]
        return batch or None


class Sink:
    """What a runtime fans out to; every hook is optional. `status` adds the sink's counters
    to the daemon.status record (called on the runtime's thread and on the stream's)."""

    def started(self, runtime: Runtime) -> None:
        """The source is delivering and the pipeline exists (sinks open their files here)."""

    def wants(self, kind: type[Event]) -> bool:
        """Whether `event` takes events of this type (asked once per type: the others are
        never handed to it)."""
        return True

    def event(self, ev: Event) -> None:
        """One input event, in order."""

    def finding(self, found: Event) -> None:
        """A gap or attribution the pipeline settled."""

    def batch_done(self) -> None:
        """The loop took one batch of events (up to 10 000): a sink that hands its output
        on in batches (the TUI) does it here."""

    def tick(self, now_ns: int, status: DaemonStatus) -> None:
        """Once a tick, with the daemon.status of that moment."""

    def reload(self) -> None:
        """SIGHUP: reopen files (after logrotate moved them)."""

    def status(self) -> dict[str, Any]:
        """This sink's fields of the daemon.status (DaemonStatus's names)."""
        return {}

    def close(self) -> None:
        """After the last finding."""


class Runtime:
    """One run of one source. analysis: a callable giving the pipeline's settings once the
    source has started (they depend on its GPUs), or None for no analysis. sinks: Sinks, or a
    callable making them once the pipeline exists. own: the threads' scheduling to tend (the
    runtime's and the source's). signals: take SIGTERM/SIGINT (main thread only); reload:
    take SIGHUP too, to reopen the sinks' files (otherwise it keeps its default: a hangup
    ends an interactive command)."""

    def __init__(
        self,
        source: EventSource,
        topology: Topology,
        *,
        sinks: Sequence[Sink] | Callable[[Runtime], Sequence[Sink]] = (),
        analysis: Callable[[EventSource], AnalysisConfig] | None = None,
        duration_ns: int | None = None,
        own: OwnScheduling | None = None,
        notifier: Notifier | None = None,
        signals: bool = True,
        reload: bool = False,
        stopped: Callable[[], bool] | None = None,
        tick_ns: int = TICK_NS,
        queue: EventQueue | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.source = source
        self.topology = topology
        self._make_sinks = sinks
        self.sinks: list[Sink] = []
        # Event type -> what takes it: the runtime's own handling, then the sinks that want it.
        self._on_event: dict[type, list[Callable[[Any], None]]] = {}
        self._on_finding: list[Callable[[Event], None]] = []
        self.analysis = analysis
        self.duration_ns = duration_ns
        self.own = own
        self.notifier = notifier
        self.signals = signals
        self.reload = reload
        self._stopped = stopped or (lambda: False)
        self.tick_ns = tick_ns
        self.queue = queue or EventQueue()
        self.say = say or (lambda text: None)
        self.pipeline: Pipeline | None = None
        self.state = NodeState(topology)
        # The wall clock against the monotonic one, for what prints wall times (the console,
        # the log's `time`, the stream's hello): this node's, for a live source (a recorded
        # one's times are its recording's). A live run looks each tick whether it was set
        # since, and sends the new reference down the stream as a meta.clock event.
        self.clock: ClockRef | None = clock_ref() if source.on_this_node else None
        self.ready = False  # the source started: from then on a stop is clean
        self.start_ns = 0  # when the source had started (durations count from here)
        self.attributions = 0  # made since start
        self.self_inflicted = 0  # of them, gaps a watched thread waited behind our threads
        self.self_inflicted_ns = 0
        self._stop = False
        self._reload = False
        self._strays: set[int] = set()  # stray signals caught since the loop last looked
        self._strays_said: set[int] = set()  # each is said once
        self._me = psutil.Process()
        self._watched: set[int] = set()  # tgids, from the meta.watch changes seen
        self._feeders: dict[int, int] = {}  # tid -> when it last called CUDA (stream time)
        self._repin_at = 0  # when to read the watched processes' CPUs again (0: at once)
        # The footprint, measured on the runtime's thread each tick (psutil is not for two).
        # CPU: the process's CPU time to the ns over the tick's own window ((monotonic ns,
        # CPU ns) at the last reading); psutil's reads /proc/PID/stat's 10 ms ticks, which
        # over a 1 s tick read 0 % and 2 % by turns for a daemon at 0.9 %.
        self._cpu_at = (0, 0)
        self._cpu_percent = 0.0
        self._rss_bytes = 0
        self._events_per_s = 0.0
        self._events_at_tick = 0

    # -- signals ----------------------------------------------------------------------

    def stop(self) -> None:
        """End the loop at its next turn (from any thread, or a signal handler)."""
        self._stop = True
        self.queue.wake()

    def _on_stop(self, signum: int, frame: object) -> None:
        if not self.ready:  # still compiling and attaching probes (seconds)
            stop_while_starting(signum, frame)
        self.stop()

    def _on_hup(self, signum: int, frame: object) -> None:
        self._reload = True

    def _on_stray(self, signum: int, frame: object) -> None:
        self._strays.add(signum)

    def _take_signals(self) -> dict[int, Any]:
        if not self.signals:
            return {}
        handlers: dict[int, Any] = dict.fromkeys(STOP_SIGNALS, self._on_stop)
        if self.reload:
            handlers |= dict.fromkeys(RELOAD_SIGNALS, self._on_hup)
            handlers |= dict.fromkeys(STRAY_SIGNALS, self._on_stray)
        return {sig: signal.signal(sig, h) for sig, h in handlers.items()}

    def _say_strays(self) -> None:
        """Each stray signal once: what it did (nothing) and what would have."""
        caught, self._strays = self._strays, set()
        for signum in sorted(caught - self._strays_said):
            self._strays_said.add(signum)
            self.say(
                f"{signal.Signals(signum).name} ignored: SIGTERM or SIGINT stops gpujitter, "
                "SIGHUP or SIGUSR1 reopens its log and starts a new trace file"
            )

    @contextlib.contextmanager
    def running(self, name: str) -> Iterator[Runtime]:
        """The runtime on a thread of its own while the block runs (the caller keeps its
        signals: take none): the block starts once the source delivers; leaving it stops
        the runtime, which drains and closes its sinks. An error of the runtime's thread
        (a source that cannot start, a probe thread that died) is raised here."""
        self.signals = False
        ready = threading.Event()
        errors: list[BaseException] = []

        def body() -> None:
            try:
                self.run(lambda _: ready.set())
            except BaseException as err:  # handed to the caller's thread
                errors.append(err)
            finally:
                ready.set()

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        ready.wait()
        try:
            if errors:
                raise errors[0]
            yield self
        finally:
            self.stop()
            thread.join()
        if errors:
            raise errors[0]

    def run(self, ready: Callable[[Runtime], None] | None = None) -> None:
        """Run until the source ends, the duration passes or a stop; `ready` is called once
        the source delivers and the sinks are open."""
        previous = self._take_signals()
        try:
            self._run(ready)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.notifier is not None:
                self.notifier.close()
            if self.own is not None:
                # Run inside a longer-lived process (the TUI, a drill, a test): its threads
                # get their scheduling back, later work is not niced and batch.
                self.own.restore()

    def _run(self, ready: Callable[[Runtime], None] | None) -> None:
        # Before any thread starts: the probe thread (and its compiles) inherit the policy.
        if self.own is not None:
            self.own.runs_here()
        self._tend_own(time.monotonic_ns())
        self.source.start(self.queue.emit, self.queue.handed)
        try:
            with descriptors_said():  # the sinks' files and sockets, at the probes' heels
                self._open(ready)
            self._loop()
            if self.own is not None:
                # Stopping: the last drain, the probes' detaches and the flushes run as the
                # process was started, not at nice 10 batch, which a busy node starves (on 2
                # CPUs at a load of 4 an exit took 12.7 s of the 2 s it may).
                self.own.restore()
            if self.notifier is not None:
                self.notifier.stopping()
        except BaseException:
            self._abandon()
            raise
        self._finish()

    @contextlib.contextmanager
    def stepped(self) -> Iterator[Callable[[int], bool]]:
        """The runtime driven by its caller instead of its own loop: a recorded source played
        against a clock of the caller's (`top --replay`: play, pause, seek). Yields
        step(limit), which takes up to `limit` of the source's next events through the node
        state, the pipeline and the sinks, and is False once the source has handed over
        everything. Leaving the block flushes the pipeline and closes the sinks; leaving it
        by an exception (a replay started over) closes the sinks only."""
        self.source.start(self.queue.emit)
        try:
            self._open(None)
            yield self._step
        except BaseException:
            self._abandon()
            raise
        self._finish()

    def _step(self, limit: int) -> bool:
        pulled = self.source.pull(limit)
        if pulled is None:
            return False
        self._take(pulled)
        return True

    def _abandon(self) -> None:
        try:
            self.source.stop()
        finally:
            self._close_sinks()

    def _finish(self) -> None:
        try:
            self.source.stop()  # hands over what it still held (or raises why it died)
        finally:
            # Even after a source that died: what it delivered is analysed and written.
            try:
                self._drain()
                if self.pipeline is not None:
                    for found in self.pipeline.flush():
                        self._finding(found)
            finally:
                self._close_sinks()

    def _open(self, ready: Callable[[Runtime], None] | None) -> None:
        self.ready = True  # the source started: a stop from here on closes what opens below
        if self.analysis is not None:
            self.pipeline = Pipeline(self.topology, self.analysis(self.source))
        self.state.gpus = self.source.gpus
        made = self._make_sinks
        for sink in made(self) if callable(made) else made:
            self.sinks.append(sink)
            sink.started(self)
        self._on_event = {}
        self._on_finding = [s.finding for s in self.sinks if type(s).finding is not Sink.finding]
        self._tend_own(time.monotonic_ns())
        if self.own is not None:
            self.own.step_to(0)
        self.start_ns = time.monotonic_ns()
        self._measure_start(self.start_ns)
        if ready is not None:
            ready(self)

    def _close_sinks(self) -> None:
        # A sink closing may still read the others' counters (the last status): the list
        # empties only once all are closed.
        for sink in reversed(self.sinks):
            sink.close()
        self.sinks, self._on_event, self._on_finding = [], {}, []

    def _measure_start(self, now: int) -> None:
        """The footprint until the first tick: the CPU the process spent since it started
        (the probes' compile included) as a share of that time, not a 0 % never measured;
        the ticks measure from here."""
        self._cpu_at = (now, process_cpu_ns())
        # Its age to the clock tick (psutil's create_time adds the boot time in whole seconds).
        lived_ns = process_age_ns(HostPaths(), "self")
        if lived_ns is not None:
            self._cpu_percent = round(100 * self._cpu_at[1] / max(lived_ns, 1_000_000), 2)
        with contextlib.suppress(OSError, psutil.Error):
            self._rss_bytes = self._me.memory_info().rss

    def _loop(self) -> None:
        last_tick = self.start_ns
        period_s = HANDED_TIMEOUT_S if self.source.hands_over else DRAIN_TIMEOUT_S
        while not (self._stop or self._stopped() or self.source.failed):
            now = time.monotonic_ns()
            if self.duration_ns is not None and now - self.start_ns >= self.duration_ns:
                break
            pulled = self.source.pull(10_000)
            if pulled is None and self.queue.empty():
                break  # a recorded source handed over everything
            self._take(pulled or self.queue.drain(timeout_s=period_s))
            if self._reload:
                self._reload = False
                self._reopen()
            if self._strays:
                self._say_strays()
            now = time.monotonic_ns()
            if now - last_tick >= self.tick_ns:
                self._tick(now, (now - last_tick) / 1e9)
                last_tick = now
            if self.notifier is not None:
                self.notifier.watchdog()

    def _drain(self) -> None:
        """What the queue still holds, the source's last events with it (a recorded source
        that was stopped hands over no more)."""
        while batch := list(self.queue.drain()):
            self._take(batch)

    def _take(self, batch: Iterable[Event]) -> None:
        for ev in in_slices(batch):
            self._event(ev)
        for sink in self.sinks:
            sink.batch_done()

    def _event(self, ev: Event) -> None:
        self.state.observe(ev)
        hooks = self._on_event.get(type(ev))
        if hooks is None:
            hooks = self._hooks(type(ev))
        for on_event in hooks:
            on_event(ev)
        if self.pipeline is not None:
            for found in self.pipeline.feed(ev):
                self._finding(found)

    def _hooks(self, kind: type[Event]) -> list[Callable[[Any], None]]:
        """What takes events of one type, found on its first event: per event only these
        are called (a call per event and sink is ~0.1-0.3 µs; of the daemon's six sinks
        three take events, and most events concern the trace capture alone)."""
        hooks: list[Callable[[Any], None]] = []
        if issubclass(kind, WatchChange):
            hooks.append(self._watch_changed)
        if issubclass(kind, CudaCall) and self.own is not None:
            hooks.append(self._fed)
        hooks += [s.event for s in self.sinks
                  if type(s).event is not Sink.event and s.wants(kind)]  # fmt: skip
        self._on_event[kind] = hooks
        return hooks

    def _watch_changed(self, ev: WatchChange) -> None:
        self._watched.difference_update(ev.removed)
        self._watched.update(ev.added)
        self._repin_at = 0

    def _fed(self, ev: CudaCall) -> None:
        """A thread that calls CUDA: the daemon keeps off its CPUs where it can (keep_off),
        from the next tick when that is what places it (not for each thread a server starts)."""
        if ev.tid <= 0:
            return
        if ev.tid not in self._feeders and self.own is not None and self.own.by_feeders:
            self._repin_at = 0
        self._feeders[ev.tid] = ev.ts_ns

    def _finding(self, found: Event) -> None:
        self.state.observe(found)
        if isinstance(found, Attribution):
            self.attributions += 1
            if found.self_inflicted:
                self.self_inflicted += 1
                self.self_inflicted_ns += found.self_ns
        for on_finding in self._on_finding:
            on_finding(found)

    # -- once a tick ------------------------------------------------------------------

    def status(self) -> DaemonStatus:
        """The daemon.status record; built on the runtime's thread and on the stream's (a
        client's first snapshot): it reads only what is safe from both. What no sink says
        (clients, a log's or a trace's losses) keeps DaemonStatus's zero."""
        lost_kernel, lost_user = self.state.lost()
        own = self.own
        pipeline = self.pipeline  # None until the source delivers
        engine = pipeline.engine.stats() if pipeline is not None else None
        fields: dict[str, Any] = {
            "cpu_percent": self._cpu_percent,
            "rss_bytes": self._rss_bytes,
            "events_per_s": self._events_per_s,
            "lost_kernel": lost_kernel,
            "lost_user": lost_user + self.queue.dropped,
            "engine_dropped": self.queue.dropped,
            "late_events": engine.late_events if engine else 0,
            "attributed_early": engine.forced if engine else 0,
            "attributions": self.attributions,
            "self_inflicted": self.self_inflicted,
            "self_inflicted_ns": self.self_inflicted_ns,
            "own_cpus": tuple(sorted(own.cpus)) if own else (),
            "own_nice": own.nice if own else 0,
        }
        for sink in list(self.sinks):
            fields.update(sink.status())
        fields["probe_cost"] = self.state.probe_cost()
        return self.state.status(time.monotonic_ns(), **fields)

    def _tick(self, now: int, elapsed_s: float) -> None:
        # Reading /proc needs a descriptor, and the daemon may be out of them (stream clients):
        # a tick without a fresh footprint keeps the last one rather than ending the run.
        cpu_ns, (at, at_cpu_ns) = process_cpu_ns(), self._cpu_at
        self._cpu_percent = round(100 * (cpu_ns - at_cpu_ns) / max(now - at, 1), 2)
        self._cpu_at = (now, cpu_ns)
        with contextlib.suppress(OSError, psutil.Error):
            self._rss_bytes = self._me.memory_info().rss
        self._events_per_s = (self.state.events - self._events_at_tick) / max(elapsed_s, 1e-9)
        self._events_at_tick = self.state.events
        if self.source.on_this_node:
            self.state.forget_gone(_ALIVE)
            self._follow_clock()
        status = self.status()
        for sink in self.sinks:
            sink.tick(now, status)
        if self.own is not None:
            late_ns = int(elapsed_s * 1e9) - self.tick_ns
            self.own.keep_up(status.lost_kernel + status.lost_user, now, late_ns)
        self._tend_own(now)
        if self.notifier is not None:
            self.notifier.status(status_line(status))

    def _follow_clock(self) -> None:
        """A wall clock set while the run goes on (NTP's first sync after a boot, a date set
        by hand): said once a step, and its new reference sent on as an event, which every
        sink that prints wall times takes (and a trace records), so that their times follow
        the clock rather than the one the run started with."""
        now = clock_ref()
        moved = stepped(self.clock, now) if self.clock is not None else 0
        if moved:
            self.clock = now
            self.say(
                f"clock: the wall clock was set {moved / 1e9:+.3f} s: wall times from here on "
                "follow it (earlier lines keep the times of the clock then)"
            )
            self.queue.emit(now)

    def _tend_own(self, now: int) -> None:
        """Our threads: new ones get their policy; off the watched processes' CPUs when the
        set changed or their CPUs may have; their announcement (meta.self) goes into the
        stream like any event, so the engine and a trace see it."""
        own = self.own
        if own is None:
            return
        # tend first: a new thread's scheduling is remembered before keep_off moves it.
        announced = own.tend(now)
        if now >= self._repin_at:
            self._repin_at = now + REPIN_NS
            since = now - FEEDER_QUIET_NS
            self._feeders = {t: at for t, at in self._feeders.items() if at >= since}
            own.keep_off(self._watched, self._feeders)
        if announced is not None:
            self.queue.emit(announced)
        while own.notes:
            self.say(own.notes.pop(0))

    def _reopen(self) -> None:
        if self.notifier is not None:
            self.notifier.reloading()
        for sink in self.sinks:
            sink.reload()
        if self.notifier is not None:
            self.notifier.ready()


def process_cpu_ns() -> int:
    """The CPU time of this process to the ns: every thread's, those that ended included."""
    return time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)


def status_line(status: DaemonStatus) -> str:
    """What `systemctl status` shows while the daemon runs (sd_notify STATUS=), from the
    daemon.status record: is it seeing, finding, keeping up, writing."""
    parts = [
        f"{status.attributions} gaps attributed",
        f"{status.events_per_s:.0f} events/s",
        f"lost {status.lost_kernel + status.lost_user}",
        f"self-inflicted {status.self_inflicted}",
        *([f"late {status.late_events}"] if status.late_events else []),
        *([f"attributed early {status.attributed_early}"] if status.attributed_early else []),
        f"{status.clients} clients",
        f"cpu {status.cpu_percent:.1f}%",
        f"rss {status.rss_bytes >> 20} MiB",
    ]
    for sink, dropped, failing in status.file_sinks():
        if failing:
            parts.append(f"{sink} failing ({dropped} dropped): {failing}")
    return "; ".join(parts)
