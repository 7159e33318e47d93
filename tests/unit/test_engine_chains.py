"""Waker chains on a real recording: the `loader` drill on the development VM (stub libcuda,
the real probes, the product's trace writer), cut to its one stall by
tests/fixtures/chains/cut.py. The feeding thread waited on a queue that an intermediate
thread fills from a worker process's result queue; the worker, forked by the feeder after
the probes started, computed the batch. The engine must follow the wait three wakers down,
into the worker's process, and say that the worker's host work was the stall."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.sinks.trace import TraceHeader, TraceReader
from gpujitter.probes.events import Event, from_record
from tests.conftest import FIXTURES, cause_ns

TRACE = FIXTURES / "chains" / "loader-stub.gjtrace"
RECORD = json.loads((FIXTURES / "chains" / "loader-stub.json").read_text())
STALL = RECORD["stall"]  # as the drill's loop measured it


@pytest.fixture(scope="module")
def recorded() -> tuple[TraceHeader, list[Event]]:
    with TraceReader(TRACE) as reader:
        return reader.header, list(reader)


def attribute(recorded: tuple[TraceHeader, list[Event]], **engine: int) -> Attribution:
    header, events = recorded
    config = AnalysisConfig.from_record(header.analysis)
    config = replace(config, engine=replace(config.engine, **engine))
    found = [a for a in analyse(events, header.topology, config) if isinstance(a, Attribution)]
    (attr,) = [a for a in found if a.ts_ns < STALL["t1_ns"] and STALL["t0_ns"] < a.end_ns]
    assert sum(p.ns for p in attr.parts) == attr.dur_ns
    return attr


def test_the_stall_is_the_worker_processes_host_work(recorded) -> None:
    attr = attribute(recorded)
    assert attr.top_cause == "host_work"
    assert abs(cause_ns(attr, "host_work") - STALL["cause_ns"]) <= 0.2 * STALL["cause_ns"]
    (worker,) = [t for t in attr.threads if t.tgid == STALL["culprit_tgid"] and t.hops == 3]
    assert (worker.role, worker.comm, worker.tid) == ("waker", "gj-loader-wkr", worker.tgid)
    assert worker.causes[0].cause == "host_work"
    assert worker.causes[0].ns >= 0.8 * STALL["cause_ns"]
    # The chain: the feeder woken by the intermediate thread, woken by the worker's queue
    # feeder thread, woken by the worker.
    chain = {t.tid: t for t in attr.threads if t.role == "waker"}
    feeder_thread = chain[worker.woke]
    assert (feeder_thread.tgid, feeder_thread.hops) == (worker.tgid, 2)
    intermediate = chain[feeder_thread.woke]
    assert (intermediate.comm, intermediate.tgid, intermediate.hops) == (
        "gj-loader-pin", attr.tgid, 1,
    )  # fmt: skip
    assert intermediate.woke == attr.tid


def test_a_budget_spent_before_the_worker_leaves_the_wait_blocked(recorded) -> None:
    attr = attribute(recorded, waker_budget=4)
    assert attr.top_cause == "blocked"
    assert STALL["culprit_tgid"] not in [t.tgid for t in attr.threads if t.hops]


def test_the_cut_recording_replays_to_what_the_drill_attributed_live(recorded) -> None:
    # Read as this version reads the live record (fields a later minor added take their
    # defaults), the replay's attribution is the same record.
    assert attribute(recorded) == from_record(RECORD["live"])
