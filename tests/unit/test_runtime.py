"""The one runtime (daemon/service/runtime.py) through its configurations: it analyses a stream as
the offline pipeline does, bounds its queue and counts what it drops, stops on SIGTERM with its
sinks closed; and `record` and `run --record` over the same stretch of a real H200 session
(tests/fixtures/nvml) write traces that `report` reads alike."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpujitter.cli import build_parser, load_commands, main
from gpujitter.cli import record as record_cli
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.service import runtime as runtime_module
from gpujitter.daemon.service.config import load_config
from gpujitter.daemon.service.idle_floors import FILE_NAME, IdleFloorStore
from gpujitter.daemon.service.runtime import EventQueue, ListSource, Runtime, Sink, status_line
from gpujitter.daemon.service.service import Daemon
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.daemon.sinks.metrics import DaemonMetrics
from gpujitter.daemon.sinks.trace import TraceReader
from gpujitter.errors import GpujitterError
from gpujitter.probes import bundle
from gpujitter.probes.events import Event, Migration, OffCpu, to_record
from gpujitter.probes.nvml import GpuInfo, NvmlUnavailable
from gpujitter.probes.runner import RingWaits
from gpujitter.probes.topology import load_topology
from gpujitter.tui.model import NodeModel
from gpujitter.tui.views.status import status_text
from tests.conftest import FIXTURES
from tests.unit.test_metrics import scrape_value
from tests.unit.test_nvml_playback import playback_sampler

TRAINING = FIXTURES / "nvml" / "h200-training.jsonl"


def h200_stretch() -> tuple[list[GpuInfo], list[Event]]:
    """The NVML sampler's events over a whole recorded H200 training session, read at the
    sampler's own cadence."""
    played = playback_sampler(TRAINING)
    played.run()
    return played.sampler.nvml.gpus(16), played.events


class Kept(Sink):
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.found: list[Event] = []
        self.closed = False

    def event(self, ev: Event) -> None:
        self.events.append(ev)

    def finding(self, found: Event) -> None:
        self.found.append(found)

    def close(self) -> None:
        self.closed = True


def test_a_recorded_stream_gives_what_the_offline_pipeline_gives() -> None:
    gpus, events = h200_stretch()
    topology = load_topology()
    kept = Kept()
    runtime = Runtime(ListSource(events, gpus=gpus), topology, sinks=[kept],
                      analysis=lambda source: AnalysisConfig(), signals=False)  # fmt: skip
    runtime.run()
    offline = list(analyse(events, topology))
    assert [to_record(e) for e in kept.found] == [to_record(e) for e in offline]
    assert any(isinstance(e, Attribution) for e in offline)
    assert kept.events == events and kept.closed
    assert runtime.status().attributions == sum(isinstance(e, Attribution) for e in offline)


def test_a_stepped_runtime_finds_what_its_loop_finds_and_an_early_leave_closes_it() -> None:
    """A replay steps the runtime at its own pace: stepped to the end it hands the sinks
    what the loop does; left before the end (a replay started over), its sinks close
    without the pipeline being flushed into them."""
    gpus, events = h200_stretch()
    topology = load_topology()

    def runtime(kept: Kept) -> Runtime:
        return Runtime(ListSource(events, gpus=gpus), topology, sinks=[kept],
                       analysis=lambda source: AnalysisConfig(), signals=False)  # fmt: skip

    looped = Kept()
    runtime(looped).run()
    stepped = Kept()
    with runtime(stepped).stepped() as step:
        steps = 0
        while step(100):
            steps += 1
    assert steps == -(-len(events) // 100) and stepped.closed
    assert [to_record(e) for e in stepped.found] == [to_record(e) for e in looped.found]
    assert stepped.events == events
    left = Kept()
    with contextlib.suppress(GeneratorExit), runtime(left).stepped() as step:
        step(100)
        raise GeneratorExit  # as when a replay's reading generator is closed
    assert left.closed and len(left.events) == 100 and len(left.found) < len(looped.found)


def test_the_queue_is_bounded_and_what_it_drops_is_counted() -> None:
    _, events = h200_stretch()
    kept = Kept()
    runtime = Runtime(
        ListSource(events[:50], live=True), load_topology(), sinks=[kept], signals=False,
        queue=EventQueue(maxsize=20),
        stopped=lambda: len(kept.events) >= 20,
    )  # fmt: skip
    runtime.run()
    status = runtime.status()
    assert len(kept.events) == 20
    assert status.engine_dropped == 30 and status.lost_user >= 30
    # top's status line says the same losses: the engine's drops are in lost_user already
    # (once, not 60), and a probe's newer record does not hide them.
    model = NodeModel()
    model.apply(status.to_record())
    assert model.lost_events() == status.lost_kernel + status.lost_user == 30
    model.apply({"type": "meta.probe", "ts_ns": 1, "probe": "sched", "state": "running",
                 "lost_kernel": 4})  # fmt: skip
    assert model.lost_events() == 34


def test_a_burst_ends_the_consumers_wait_and_what_came_before_a_stop_is_taken() -> None:
    """The loop gathers events for a period before it takes them (one wake-up a period,
    not one per event); a quarter of the bound queued ends the wait early (a wait of the
    whole timeout here would end by the suite's timeout). What was emitted before a stop,
    however little, is taken before the sinks close."""
    _, events = h200_stretch()
    queue = EventQueue(maxsize=8)
    burst = threading.Timer(0.05, lambda: [queue.emit(ev) for ev in events[:2]])
    burst.start()
    assert queue.drain(timeout_s=3600) == events[:2]
    burst.join()
    kept = Kept()
    runtime = Runtime(ListSource([], live=True), load_topology(), sinks=[kept], signals=False,
                      queue=EventQueue(maxsize=8))  # fmt: skip
    with runtime.running("test-runtime"):
        runtime.queue.emit(events[0])  # one event: below a quarter, no early wake-up
    assert kept.closed and kept.events == events[:1]


def test_a_hand_over_ends_the_consumers_wait_when_events_are_queued() -> None:
    """A source's `handed` (the probe thread after each drain) wakes the consumer at once
    when it left events, and not at all when it left none: the consumer then waits out its
    period (a wake-up with nothing to take is the cost the period exists to avoid)."""
    _, events = h200_stretch()
    queue = EventQueue(maxsize=8)  # one event is below a quarter: no early wake-up by count
    queue.handed()
    start = time.monotonic()
    assert queue.drain(timeout_s=0.3) == []
    assert time.monotonic() - start >= 0.25
    hand = threading.Timer(0.05, lambda: (queue.emit(events[0]), queue.handed()))
    hand.start()
    assert queue.drain(timeout_s=3600) == events[:1]
    hand.join()


def test_the_status_is_one_typed_record_from_the_runtime_to_the_tui() -> None:
    """What the runtime says of itself is one DaemonStatus: each sink adds its counters, the
    stream carries it as daemon.status, and the TUI decodes that record into the same type
    (the comm of a watched thread made inert on the way)."""

    class Writing(Sink):
        def status(self) -> dict[str, Any]:
            return {"log_dropped": 2, "log_failing": "no room"}

    topology = load_topology()
    runtime = Runtime(ListSource([]), topology, sinks=[Writing()], signals=False)
    runtime.run()
    runtime.state.observe(Migration(5, tid=42, tgid=41, src_cpu=1, dst_cpu=0, src_node=0,
                                    dst_node=0, comm="py\x1b[2J"))  # fmt: skip
    runtime.sinks = [Writing()]  # closed sinks leave the list: as while running
    status = runtime.status()
    assert isinstance(status, DaemonStatus)
    assert (status.log_dropped, status.log_failing) == (2, "no room")
    assert [(t.tid, t.tgid) for t in status.threads] == [(42, 41)]
    wire = orjson.loads(orjson.dumps(status.to_record()))
    assert wire["type"] == "daemon.status" and wire["threads"][0]["comm"] == "py\x1b[2J"
    model = NodeModel()
    model.apply(wire)
    shown = model.status
    assert isinstance(shown, DaemonStatus) and shown.threads[0].comm == "py\\x1b[2J"
    assert dataclasses.replace(shown, threads=status.threads) == status
    assert "log failing (2 dropped): no room" in status_line(status)


def test_events_that_came_after_their_gaps_could_go_out_are_counted_and_shown() -> None:
    """A span that reaches the engine more than its lateness bound after it ended may have
    missed the gap it belonged to: the daemon counts it, and says so where it says its
    losses (the status record, systemctl's line, the metrics, top's status line)."""
    s = 1_000_000_000
    off = lambda at: OffCpu(at, end_ns=at + 1_000_000, tid=7, tgid=7, cpu=0, cpu_in=0,  # noqa: E731
                            state="sleeping", runnable_ns=at + 1_000_000)  # fmt: skip
    events: list[Event] = [off(1 * s), off(5 * s), off(6 * s), off(2 * s), off(7 * s)]
    runtime = Runtime(ListSource(events), load_topology(),
                      analysis=lambda source: AnalysisConfig(), signals=False)  # fmt: skip
    runtime.run()
    status = runtime.status()
    assert (status.late_events, status.attributed_early) == (1, 0)  # 2 s arrived after 6 s
    assert "late 1" in status_line(status) and "attributed early" not in status_line(status)
    assert "late" not in status_line(dataclasses.replace(status, late_events=0))
    metrics = DaemonMetrics()
    metrics.observe_engine(0, status.late_events, 3)
    text = metrics.exposition().decode()
    assert scrape_value(text, "gpujitter_engine_late_events_total") == 1
    assert scrape_value(text, "gpujitter_engine_attributed_early_total") == 3
    model = NodeModel()
    model.apply(orjson.loads(orjson.dumps(status.to_record())))
    shown = status_text(model, None, None, inbox_dropped=0, paused=False).plain
    assert "late 1" in shown and "attributed early" not in shown


def test_the_daemons_cpu_is_its_cpu_time_over_each_tick_to_the_ns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cpu_percent is the CPU time the process spent over the tick's own window, counted to
    the ns: psutil's, from /proc/PID/stat's 10 ms ticks, read a daemon at 0.9 % of a CPU as
    0 % and 2 % by turns (0.0 with 0.87 % spent, 2.0 with 0.92 %). Before the first tick
    the status says what the process spent since it started, not a 0 % never measured."""
    cpu_ns = lambda: time.clock_gettime_ns(time.CLOCK_PROCESS_CPUTIME_ID)  # noqa: E731
    # (tick's now, CPU ns at the sink, cpu_percent said, the runtime's last CPU reading)
    seen: list[tuple[int, int, float, int]] = []
    read: list[int] = []  # each process CPU time the runtime read
    first: list[tuple[float, float]] = []  # (cpu_percent said before the first tick, spent)

    def reading() -> int:
        read.append(cpu_ns())
        return read[-1]

    monkeypatch.setattr(runtime_module, "process_cpu_ns", reading)

    def ready(rt: Runtime) -> None:
        with open("/proc/self/stat", "rb") as f:  # field 22: start, in clock ticks since boot
            started = int(f.read().rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        lived_s = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        first.append((rt.status().cpu_percent, 100 * cpu_ns() / 1e9 / lived_s))

    class Burning(Sink):
        def tick(self, now_ns: int, status: DaemonStatus) -> None:
            seen.append((now_ns, cpu_ns(), status.cpu_percent, read[-1]))
            until = cpu_ns() + 3_000_000  # 3 ms of CPU a tick: a third of /proc's tick
            while cpu_ns() < until:
                pass

    runtime = Runtime(ListSource([], live=True), load_topology(), sinks=[Burning()],
                      signals=False, tick_ns=100_000_000,
                      stopped=lambda: len(seen) >= 8)  # fmt: skip
    runtime.run(ready)
    said, spent = first[0]
    assert said > 0 and said == pytest.approx(spent, rel=0.05), first
    # Each tick's window: from the previous tick's reading to this one's, which the runtime
    # takes before it builds the status, so before this sink reads the clock. Measured
    # against the sink's own reads instead, the CPU any thread spends in between (the
    # status's building, a collection of the suite's heap; 1.3 ms of a 100 ms window on a
    # busy CI machine) moves from one window to the next.
    for (t0, c0, _, r0), (t1, c1, said, r1) in itertools.pairwise(seen):
        assert r1 <= c1 and r1 - r0 >= 3_000_000  # the process's clock, the burn included
        assert said == pytest.approx(100 * (r1 - r0) / (t1 - t0), abs=0.006), seen
        assert said == pytest.approx(100 * (c1 - c0) / (t1 - t0), abs=5.0), seen


def test_sigterm_stops_the_loop_and_closes_the_sinks() -> None:
    kept = Kept()
    runtime = Runtime(ListSource([], live=True), load_topology(), sinks=[kept])
    before = signal.getsignal(signal.SIGTERM)
    runtime.run(ready=lambda rt: os.kill(os.getpid(), signal.SIGTERM))
    assert kept.closed
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


def test_sigterm_ends_the_loops_wait_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler wakes the queue's wait itself: a stop does not wait out the period (here
    made a minute, so that a missed wake-up cannot pass)."""
    monkeypatch.setattr("gpujitter.daemon.service.runtime.DRAIN_TIMEOUT_S", 60.0)
    runtime = Runtime(ListSource([], live=True), load_topology(), sinks=[Kept()])
    sent: list[float] = []

    def term_later(rt: Runtime) -> None:
        def term() -> None:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Timer(0.3, term).start()  # once the loop waits

    runtime.run(ready=term_later)
    assert sent and time.monotonic() - sent[0] < 10


class OutOfDescriptors(Kept):
    def started(self, runtime: Runtime) -> None:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))  # socketpair() at the limit


def test_a_start_out_of_descriptors_is_one_line_naming_the_limit() -> None:
    """A sink that cannot open its socket or file for want of a descriptor, the probes just
    attached (descriptors the daemon was started with): an internal error before (exit 70,
    which the unit restarts on); now the limit and what to raise, its sinks closed."""
    sinks = [Kept(), OutOfDescriptors()]
    runtime = Runtime(ListSource([], live=True), load_topology(), sinks=sinks, signals=False)
    with pytest.raises(GpujitterError, match=r"^out of file descriptors \(Too many open files\)"
                       r": none is left under its open-file limit of \d+ \(ulimit -n"):  # fmt: skip
        runtime.run()
    assert all(sink.closed for sink in sinks)


def test_a_probe_sets_waits_woken_after_they_closed_raise_nothing() -> None:
    """The probe thread's set closes its waits as it ends, on an error too; the stop's wake-up
    after that raised EBADF, which replaced the error it was ending on (`standard output: Bad
    file descriptor`, from a probe thread out of descriptors)."""
    waits = RingWaits()
    waits.close()
    waits.wake()


def report_of(trace: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["report", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return {"summary": out["summary"], "attributions": out["attributions"]}


def test_a_daemon_told_no_nvml_never_opens_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run --no-nvml` (host evidence only): the topology's GPUs come from sysfs too; it
    had opened NVML for them (on a GPU node: pynvml's import, nvmlInit's 18 MB)."""

    def refuse() -> None:
        raise AssertionError("NVML opened")

    monkeypatch.setattr("gpujitter.probes.topology.open_nvml", refuse)
    config = load_config(environ={}, flags={
        "log.path": ("--log", ""), "socket.path": ("--socket", ""),
    })  # fmt: skip
    assert Daemon(config, nvml=False, source=ListSource([])).run() == 0


def test_a_daemons_first_nvml_session_waits_for_the_compile_started_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nvmlInit's 18 MB stay live from the first session on (the topology's): opened beside
    the probes' compile they sat on the start's peak, at its 200 MB line on the H200. The
    compile is waited for first, and stays pending for the probe set to take."""
    finished = threading.Event()

    def compiling() -> None:
        time.sleep(0.3)
        finished.set()

    ahead = bundle._Ahead(parts=(), text="", renamed={})
    ahead.thread = threading.Thread(target=compiling)
    monkeypatch.setattr(bundle, "_ahead", ahead)
    opened: list[bool] = []

    def open_nvml() -> None:
        opened.append(finished.is_set())
        raise NvmlUnavailable("no GPU in this test")

    monkeypatch.setattr("gpujitter.probes.topology.open_nvml", open_nvml)
    config = load_config(environ={}, flags={
        "log.path": ("--log", ""), "socket.path": ("--socket", ""),
    })  # fmt: skip
    ahead.thread.start()
    Daemon(config, source=ListSource([]))
    assert opened == [True] and bundle._ahead is ahead


def test_report_on_record_equals_report_on_run_record_of_the_same_stretch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`record` once wrote the default gap length and no idle floors into its header while
    the daemon wrote the node's (gaps.min_gap, the floors kept in state.dir): the same
    stretch read differently. Both now take the daemon's analysis settings."""
    gpus, events = h200_stretch()
    state = tmp_path / "state"
    state.mkdir()
    IdleFloorStore(state / FILE_NAME, gpus).save({0: 118.0})  # proven by an earlier daemon
    monkeypatch.setenv("GPUJITTER_STATE_DIR", str(state))
    monkeypatch.setenv("GPUJITTER_GAPS_MIN_GAP", "100ms")

    recorded = tmp_path / "record.gjtrace"
    args = build_parser(load_commands()).parse_args(["record", "-o", str(recorded), "--quiet"])
    assert record_cli.run(args, source=ListSource(events, gpus=gpus)) == 0

    kept = tmp_path / "run"
    config = load_config(environ=dict(os.environ), flags={
        "record.path": ("--record", str(kept)), "log.path": ("--log", ""),
        "socket.path": ("--socket", ""),
    })  # fmt: skip
    assert Daemon(config, source=ListSource(events, gpus=gpus)).run() == 0
    (daemon_trace,) = kept.iterdir()

    with TraceReader(recorded) as a, TraceReader(daemon_trace) as b:
        assert a.header.analysis == b.header.analysis
        assert a.header.analysis["idle_floors_w"] == {"0": 118.0}
        assert a.header.analysis["gaps"]["min_gap_ns"] == 100_000_000
    capsys.readouterr()
    from_record, from_run = report_of(recorded, capsys), report_of(daemon_trace, capsys)
    assert from_record["attributions"]  # the stretch holds gaps to compare
    assert from_record == from_run


def test_sighup_reopens_files_only_where_asked() -> None:
    """The daemon reopens its log at SIGHUP (logrotate); `probe` or `gaps` in a terminal keep
    the default, so a hangup still ends them."""
    reloaded: list[bool] = []

    class Reopens(Kept):
        def reload(self) -> None:
            reloaded.append(True)
            runtime.stop()

    runtime = Runtime(ListSource([], live=True), load_topology(), sinks=[Reopens()], reload=True)
    runtime.run(ready=lambda rt: os.kill(os.getpid(), signal.SIGHUP))
    assert reloaded == [True]

    seen: list[object] = []
    before = signal.getsignal(signal.SIGHUP)
    plain = Runtime(ListSource([], live=True), load_topology())
    plain.run(ready=lambda rt: (seen.append(signal.getsignal(signal.SIGHUP)), rt.stop()))
    assert seen == [before]


def test_the_daemon_outlives_stray_signals_and_takes_sigusr1_as_sighup() -> None:
    """A logrotate postrotate written for nginx sends SIGUSR1; a `kill -USR2` or an alarm
    meant for something else would end the daemon unflushed by their default. USR1 reopens
    the files; the strays are ignored and each said once, however often it comes."""
    reloaded: list[bool] = []
    said: list[str] = []
    kicks = iter([signal.SIGUSR2, signal.SIGUSR2, signal.SIGALRM, signal.SIGUSR1])

    class Reopens(Kept):
        def batch_done(self) -> None:
            if (signum := next(kicks, None)) is not None:
                os.kill(os.getpid(), signum)

        def reload(self) -> None:
            reloaded.append(True)
            runtime.stop()

    runtime = Runtime(
        ListSource([], live=True), load_topology(), sinks=[Reopens()], reload=True, say=said.append
    )
    runtime.run()
    assert reloaded == [True]
    assert [line.split(" ", 1)[0] for line in said] == ["SIGUSR2", "SIGALRM"], said
    assert all("ignored" in line and "SIGUSR1 reopens" in line for line in said)


def test_a_stopped_recording_is_not_read_to_its_end() -> None:
    """A recorded source hands its events over a batch (10 000) at a time; a stop ends the
    read there (no analysis here, so repeating the stretch is harmless)."""
    _, events = h200_stretch()
    events *= 10
    kept = Kept()

    class StopsAtOnce(Kept):
        def event(self, ev: Event) -> None:
            kept.event(ev)
            runtime.stop()

    runtime = Runtime(ListSource(events), load_topology(), sinks=[StopsAtOnce()], signals=False)
    runtime.run()
    assert len(events) > 10_000 and len(kept.events) == 10_000


STOPPING = """
import json, os, signal
from gpujitter.daemon.service.own_scheduling import OwnScheduling
from gpujitter.daemon.service.runtime import ListSource, Runtime
from gpujitter.probes.topology import load_topology

def now():
    return [os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)]

seen = {"before": now()}

class Source(ListSource):
    def stop(self):
        seen["stopping"] = now()  # where the probes detach and hand over their last events
        super().stop()

def ready(rt):
    seen["running"] = now()
    os.kill(os.getpid(), signal.SIGTERM)

Runtime(Source([], live=True), load_topology(), own=OwnScheduling()).run(ready=ready)
print(json.dumps(seen))
"""


def test_the_stop_runs_as_the_process_was_started_not_at_its_running_scheduling() -> None:
    """Running, the runtime's threads are niced and batch (the observer must not delay the
    observed); stopping, the last drain, the detaches and the flushes get the scheduling
    the process started with, so that a busy node does not stretch the exit (12.7 s of
    the 2 s it may on 2 CPUs at a load of 4)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STOPPING], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    seen = json.loads(done.stdout)
    assert seen["running"] != seen["before"]
    assert seen["stopping"] == seen["before"]
