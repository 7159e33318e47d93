"""Self-inflicted gaps: a watched thread that waited on the run queue behind one of gpujitter's
own threads (announced by meta.self) is marked on the attribution and counted by the daemon's
status line, the metrics, the TUI status line and the drills' score, whose target is none."""

from __future__ import annotations

import pytest

from gpujitter.daemon.analysis.describe import one_line
from gpujitter.daemon.analysis.pipeline import analyse
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.drill.score import Stall, score
from gpujitter.daemon.service.runtime import status_line
from gpujitter.daemon.service.status import DaemonStatus
from gpujitter.daemon.sinks.metrics import DaemonMetrics
from gpujitter.probes.events import OwnThreads, from_record, to_record
from gpujitter.tui.model import NodeModel
from gpujitter.tui.views.status import status_text
from tests.fixtures.streams.synthetic import CONFIG, MS, Stream, evidence
from tests.unit.test_metrics import scrape_value, unknown_gpu

DAEMON, PROBES = 900, 903  # gpujitter's process (its main thread) and its ring-drain thread


def waits_behind(other: int, announce: bool = True) -> Attribution:
    """Thread 101 waits 25 ms of a 40 ms gap behind `other`, 5 ms behind a hog."""
    s = Stream()
    if announce:
        s.add(OwnThreads(ts_ns=0, tgid=DAEMON, tids=(DAEMON, PROBES)))
    s.offcpu(100, 125, runnable=100, state="preempted", other=other, other_comm="gpujitter")
    s.offcpu(130, 135, runnable=130, state="preempted", other=555, other_comm="hog")
    return s.ran(0, 1000).gap(100, 140).one(CONFIG)


def test_a_wait_behind_gpujitters_own_thread_is_self_inflicted() -> None:
    attr = waits_behind(PROBES)
    assert attr.self_inflicted and attr.self_ns == 25 * MS
    own, hog = evidence(attr, "runq_wait")
    assert (own.tid, own.own, own.ns) == (PROBES, True, 25 * MS)
    assert (hog.tid, hog.own) == (555, False)


def test_the_line_and_the_remedy_name_gpujitter_itself() -> None:
    attr = waits_behind(PROBES)
    assert f"behind gpujitter itself (tid {PROBES}, self-inflicted)" in one_line(attr, None)
    assert attr.remedies[0].startswith(f"runq_wait: gpujitter's own thread {PROBES} ran instead")
    assert "gpujitter itself" not in one_line(waits_behind(777), None)


def test_its_main_thread_counts_too_and_other_tasks_never_do() -> None:
    assert waits_behind(DAEMON).self_ns == 25 * MS
    assert not waits_behind(777).self_inflicted
    # Without the announcement (a trace of an older version) nothing is self-inflicted.
    assert not waits_behind(PROBES, announce=False).self_inflicted


def test_the_mark_survives_the_wire_and_a_replay() -> None:
    attr = waits_behind(PROBES)
    back = from_record(to_record(attr))
    assert back == attr and isinstance(back, Attribution) and back.self_ns == 25 * MS
    announced = OwnThreads(ts_ns=1, tgid=DAEMON, tids=(DAEMON, PROBES))
    assert from_record(to_record(announced)) == announced
    # The pipeline (daemon, report, drills) gives the same from the same stream.
    s = Stream().add(announced)
    s.offcpu(100, 125, runnable=100, state="preempted", other=PROBES).ran(0, 1000).gap(100, 140)
    (found,) = [a for a in analyse(s.in_emission_order(), s.topology) if isinstance(a, Attribution)]
    assert found.self_ns == 25 * MS


def status(self_inflicted: int = 0) -> DaemonStatus:
    return DaemonStatus(ts_ns=1, attributions=3, events_per_s=10.0, cpu_percent=1.0,
                        rss_bytes=50 << 20, self_inflicted=self_inflicted)  # fmt: skip


def test_the_daemons_status_line_and_metrics_count_them() -> None:
    assert "self-inflicted 0" in status_line(status())
    assert "self-inflicted 2" in status_line(status(self_inflicted=2))
    m = DaemonMetrics()
    m.observe_self_inflicted(0, 0.025)
    m.observe_self_inflicted(0, 0.005)
    text = m.exposition().decode()
    assert scrape_value(text, "gpujitter_self_inflicted_gaps_total", **unknown_gpu(0)) == 2
    assert scrape_value(text, "gpujitter_self_inflicted_seconds_total", **unknown_gpu(0)) == (
        pytest.approx(0.03)
    )


def test_the_tui_status_line_shows_the_daemons_count_when_it_reports_one() -> None:
    m = NodeModel()
    m.apply({"type": "daemon.status", "ts_ns": 1})  # a daemon that does not count them
    assert "self-inflicted" not in status_text(m, None, None, inbox_dropped=0, paused=False).plain
    m.apply({"type": "daemon.status", "ts_ns": 2, "self_inflicted": 4})
    assert "self-inflicted 4" in status_text(m, None, None, inbox_dropped=0, paused=False).plain


def test_a_drill_reports_self_inflicted_gaps_against_a_target_of_none() -> None:
    attr = waits_behind(PROBES)
    clean = waits_behind(777)
    stalls = [Stall(0, attr.ts_ns, attr.end_ns, attr.dur_ns)]
    run = (attr.ts_ns - 1_000 * MS, attr.end_ns + 1_000 * MS)
    s = score("runq_wait", stalls, [attr], run)
    assert (s.self_inflicted, s.self_inflicted_ns) == (1, 25 * MS)
    assert s.targets["no_self_inflicted"] is False and not s.passed
    assert s.to_record()["self_inflicted"] == 1
    s = score("runq_wait", stalls, [clean], run)
    assert s.self_inflicted == 0 and s.targets["no_self_inflicted"] is True
    # Outside the loop's run (the idle GPU before it started) a gap is not the drill's.
    assert score("runq_wait", [], [attr], (attr.end_ns, run[1])).self_inflicted == 0
