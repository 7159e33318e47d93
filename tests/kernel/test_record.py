"""`gpujitter record` on the real kernel: a process maps and unmaps a known number of buffers
of a distinctive size while the recorder runs; the trace read back must hold exactly those
calls, the counts the recorder reported, and a header that describes this node."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from gpujitter.daemon.service.idle_floors import FILE_NAME, IdleFloorStore
from gpujitter.daemon.sinks.trace import TraceReader, TraceSet
from gpujitter.probes import registry
from gpujitter.probes.events import AllocSyscall, Event, OwnThreads, ProbeStatus
from gpujitter.probes.nvml import Nvml
from gpujitter.probes.nvml_session import NvmlPlayback
from gpujitter.probes.topology import load_topology
from tests.conftest import FIXTURES

SIZE = (3 << 20) + 7 * 4096  # no allocator maps exactly this much by itself

MAPPER = textwrap.dedent("""
    import mmap, sys
    n, size = int(sys.argv[1]), int(sys.argv[2])
    sys.stdin.readline()              # wait until the recorder watches us
    for _ in range(n):
        m = mmap.mmap(-1, size)       # mmap(2)
        m[0] = 1
        m.close()                     # munmap(2)
""")


def start_mapper(n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(n), str(SIZE)], stdin=subprocess.PIPE, text=True
    )


def start_record(output: Path, pid: int, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "gpujitter", "record", "-o", str(output), "malloc"]
    return subprocess.Popen(
        [*command, "--pid", str(pid), "-t", "malloc.syscall=0", "--json", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def release_when_recording(recorder: subprocess.Popen[str], mapper: subprocess.Popen[str],
                           started: Path) -> None:  # fmt: skip
    """The recorder creates its output only once the probes are attached."""
    deadline = time.monotonic() + 120
    while not started.exists():
        assert recorder.poll() is None, recorder.communicate()
        assert time.monotonic() < deadline, "the recorder never started"
        time.sleep(0.1)
    assert mapper.stdin is not None
    mapper.stdin.write("go\n")
    mapper.stdin.flush()
    assert mapper.wait(timeout=60) == 0


def mapped(events: list[Event], pid: int, syscall: str) -> list[AllocSyscall]:
    return [
        e
        for e in events
        if isinstance(e, AllocSyscall) and e.tgid == pid and e.syscall == syscall
        if e.length == SIZE
    ]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_record_until_signalled_writes_what_the_probes_saw(tmp_path: Path, stop: int) -> None:
    n = 25
    trace = tmp_path / "node.gjtrace"
    mapper = start_mapper(n)
    recorder = start_record(trace, mapper.pid)
    release_when_recording(recorder, mapper, trace)
    time.sleep(0.5)  # the ring buffers are drained every 50 ms
    recorder.send_signal(stop)
    out, err = recorder.communicate(timeout=60)
    assert recorder.returncode == 0, err
    summary = json.loads(out)

    with TraceReader(trace) as reader:
        events = list(reader)
        # A clean stop: nothing torn, nothing unknown.
        assert (reader.torn_tail_bytes, reader.skipped) == (0, Counter())
        header = reader.header
    assert len(events) == summary["events"]
    assert dict(Counter(e.KIND for e in events)) == summary["kinds"]
    maps = mapped(events, mapper.pid, "mmap")
    assert len(maps) == n
    assert len(mapped(events, mapper.pid, "munmap")) == n
    assert summary["lost"] == 0 and summary["files"] == [str(trace)]
    # The recorder's own threads are in the trace, so `report` can mark waits behind them.
    own = [e for e in events if isinstance(e, OwnThreads)]
    assert own and {e.tgid for e in own} == {recorder.pid} and len(own[-1].tids) > 1

    assert header.probes == ("malloc",)
    # every threshold in force: the one given, the rest at the registry's defaults
    defaults = registry.get("malloc").thresholds
    assert header.thresholds == {"malloc": {**defaults, "syscall": 0}}
    assert header.watch == f"pid {mapper.pid}"
    assert (header.host, header.kernel) == (socket.gethostname(), os.uname().release)
    now = load_topology()  # the node's map; IRQ counts have moved on since the recording
    assert (header.topology.cpu_node, header.topology.irq_node, header.topology.gpu_node) == (
        now.cpu_node, now.irq_node, now.gpu_node,
    )  # fmt: skip
    assert [(i.irq, i.name) for i in header.topology.irqs] == [(i.irq, i.name) for i in now.irqs]
    assert header.clock.ts_ns < header.start_ns < maps[0].ts_ns
    statuses = [e for e in events if isinstance(e, ProbeStatus) and e.probe == "malloc"]
    assert statuses and all(s.state == "running" and s.lost_kernel == 0 for s in statuses)
    assert trace.stat().st_mode & 0o777 == 0o640


def test_a_recording_holds_the_gpu_side_and_the_analysis_settings(tmp_path: Path) -> None:
    """`record` once ran the kernel probes only: its traces had no NVML samples, no GPU
    processes and no analysis settings, so `report` saw cuda-only gaps. It now takes the
    daemon's live probes (here NVML answered from a recording made on the H200)."""
    trace = tmp_path / "gpu.gjtrace"
    nvml = FIXTURES / "nvml" / "h200-training.jsonl"
    # The node's daemon proved this board's idle power earlier: the header carries it, as the
    # daemon's own recordings do.
    state = tmp_path / "state"
    state.mkdir()
    IdleFloorStore(state / FILE_NAME, Nvml(NvmlPlayback(nvml)).open().gpus(1)).save({0: 118.0})
    done = subprocess.run(
        [sys.executable, "-m", "gpujitter", "record", "-o", str(trace), "sched",
         "--pid", str(os.getpid()), "--nvml-replay", str(nvml), "--duration", "3s", "--json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "GPUJITTER_STATE_DIR": str(state)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with TraceReader(trace) as reader:
        kinds = Counter(e.KIND for e in reader)
        header = reader.header
    assert kinds["gpu.sample"] > 0 and kinds["gpu.procs"] > 0
    assert header.analysis["engine"]["gpu_bus_ids"] == {"0": "0000:00:06.0"}
    assert header.analysis["gaps"]["min_gap_ns"] > 0
    assert header.analysis["idle_floors_w"] == {"0": 118.0}


def test_rotated_recording_reads_back_as_one_stream(tmp_path: Path) -> None:
    # Each file holds its own header (~7 KiB with this node's topology) and some events.
    n = 240
    target = tmp_path / "traces"
    mapper = start_mapper(n)
    recorder = start_record(target, mapper.pid, "--rotate-size", "16K", "--duration", "3s")
    release_when_recording(recorder, mapper, target)
    out, err = recorder.communicate(timeout=120)
    assert recorder.returncode == 0, err
    summary = json.loads(out)

    traces = TraceSet([target])
    events = list(traces)
    assert traces.damage == []
    assert [str(p) for p in traces.paths] == summary["files"] and len(traces.paths) >= 5
    assert [h.segment for h in traces.headers] == list(range(len(traces.paths)))
    assert len({h.session for h in traces.headers}) == 1
    assert all(p.stat().st_size <= 16384 for p in traces.paths)
    assert len(events) == summary["events"]
    assert len(mapped(events, mapper.pid, "mmap")) == n
    assert len(mapped(events, mapper.pid, "munmap")) == n

    info = subprocess.run(
        [sys.executable, "-m", "gpujitter", "trace", "--json", str(target)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(info.stdout)["events"] == summary["events"]
