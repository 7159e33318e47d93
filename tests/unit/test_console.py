"""`gpujitter run`'s console: a terminal that stops reading costs it lines, never the
journal's notes and never the stop."""

from __future__ import annotations

import io
import os
import queue
import signal
import sys
import threading
import time

import orjson
import pytest

from gpujitter.daemon.service.service import Console
from gpujitter.daemon.sinks.jsonlog import JsonLog, rfc3339_ns
from gpujitter.probes.events import ClockRef, from_record
from tests.unit.test_hostile_names import attribution_behind


class StuckTerminal(io.StringIO):
    """An output whose reader went away: every write waits until the test ends."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def write(self, text: str) -> int:
        self.released.wait()
        return len(text)


class Journal(io.StringIO):
    """stderr as the journal: each line written lands in `lines`."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: queue.Queue[str] = queue.Queue()

    def write(self, text: str) -> int:
        if text.strip():
            self.lines.put(text.strip())
        return len(text)


def test_a_stuck_stdout_neither_silences_the_notes_nor_holds_up_the_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The soak found the journal silent while stdout was stuck: one writer thread served
    both streams, so the disk-full and stop notes waited behind an attribution line."""
    journal, terminal = Journal(), StuckTerminal()
    monkeypatch.setattr(sys, "stderr", journal)
    attr = attribution_behind("trainer").one()
    console = Console(terminal, as_json=True, clock=None)
    try:
        for _ in range(3):
            console.attribution(attr)  # the first blocks the terminal's writer for good
        console.note("cannot write log: No space left on device")
        assert journal.lines.get(timeout=10) == "# cannot write log: No space left on device"
        console.close()  # returns: the stuck terminal's line is given up
    finally:
        terminal.released.set()


def test_quiet_hides_attributions_but_not_the_readiness_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`run --quiet` also hid the one line a script outside systemd waits for."""
    journal = Journal()
    monkeypatch.setattr(sys, "stderr", journal)
    out = io.StringIO()
    console = Console(out, as_json=False, clock=None, quiet=True)
    console.attribution(attribution_behind("stress").one())
    console.note("probes attached: sched; watching pid 42")
    console.close()
    assert out.getvalue() == ""
    assert journal.lines.get(timeout=5) == "# probes attached: sched; watching pid 42"


def test_a_pipe_nobody_reads_leaves_the_stream_free_for_the_last_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpujitter run --json` into a pipe nobody read (the soak's): the console's thread
    blocked in the stream's buffer, holding its lock, and the main thread's last flush (and
    the interpreter's exit) waited on it for ever: SIGTERM took 60 s and a SIGKILL."""
    monkeypatch.setattr(sys, "stderr", Journal())
    read_end, write_end = os.pipe()
    out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write_end, "w")), encoding="utf-8")
    attr = attribution_behind("trainer").one()
    console = Console(out, as_json=True, clock=None)
    try:
        for _ in range(400):  # far past the pipe's 64 KiB
            console.attribution(attr)
        time.sleep(0.5)  # the writer fills the pipe, and waits for room
        started = time.monotonic()
        console.close()
        assert time.monotonic() - started < 2
        flushed = threading.Thread(target=out.flush, daemon=True)
        flushed.start()
        flushed.join(timeout=5)
        assert not flushed.is_alive(), "the stream's last flush waited on the console"
        head = os.read(read_end, 65536)  # what came through is whole lines, then a tail
        assert head.startswith(b'{"type":"gpu.attribution"')
    finally:
        out.close()
        os.close(read_end)


@pytest.mark.parametrize("printing", [True, False])
def test_a_pipes_reader_gone_stops_the_daemon_as_a_pipelines_command(
    monkeypatch: pytest.MonkeyPatch, printing: bool
) -> None:
    """`gpujitter run --json | head -1`: every write's EPIPE was swallowed and the daemon ran
    on, printing to nobody, until killed. It stops now (the signal every stop takes), seen
    on the next write or, with nothing to print, within a second or two of the reader's
    going; elsewhere (the journal's socket) it only says so."""
    journal = Journal()
    monkeypatch.setattr(sys, "stderr", journal)
    signals: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signals.append((pid, sig)))
    read_end, write_end = os.pipe()
    out = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write_end, "w")), encoding="utf-8")
    console = Console(out, as_json=True, clock=None)
    try:
        os.close(read_end)
        if printing:
            console.attribution(attribution_behind("trainer").one())
        assert journal.lines.get(timeout=5) == (
            "# standard output's reader is gone (broken pipe): stopping"
        )
        assert signals == [(os.getpid(), signal.SIGTERM)]
        console.close()
    finally:
        out.close()


def test_json_lines_carry_the_wall_time_the_log_gives_the_same_record(tmp_path) -> None:
    """`gpujitter run --json | jq` had only CLOCK_MONOTONIC ns to say when a gap was; each
    line leads with the log's `time` now, by the clock in force (one set later is followed),
    and says none where there is no clock (a replay's times are its recording's)."""
    attr = attribution_behind("trainer").one()
    lines = []
    for clock in (None, ClockRef(ts_ns=0, realtime_ns=1_767_268_867 * 10**9),
                  ClockRef(ts_ns=0, realtime_ns=1_767_268_872 * 10**9)):  # fmt: skip
        out = io.StringIO()
        console = Console(out, as_json=True, clock=clock)
        log = JsonLog(tmp_path / f"{len(lines)}.log")
        log.clock = clock
        console.attribution(attr)
        log.write(attr)
        console.close(timeout_s=5)
        log.close()
        line = orjson.loads(out.getvalue())
        assert line == {k: v for k, v in orjson.loads(log.path.read_bytes()).items()
                        if k != "schema"}  # fmt: skip
        assert from_record({k: v for k, v in line.items() if k != "time"}) == attr
        lines.append(line)
    assert "time" not in lines[0]
    assert next(iter(lines[1])) == "time"  # first, as in the log after its schema
    assert rfc3339_ns(lines[2]["time"]) - rfc3339_ns(lines[1]["time"]) == 5 * 10**9
