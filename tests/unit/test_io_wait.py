"""I/O waits as a cause, on a recorded readahead drill (tests/fixtures/iowait): the trace the
drill kept, replayed the way `gpujitter report` does, gives every stall to io_wait within
the targets and names the disk; the same intervals without the sched probe's I/O fields
are plain `blocked`, and the cause reads as words everywhere an operator sees it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpujitter.daemon.analysis import describe, remedies
from gpujitter.daemon.analysis.describe import evidence_line
from gpujitter.daemon.analysis.engine.causes import CAUSES, cause_label
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.analysis.records import Attribution, IoEvidence
from gpujitter.daemon.drill.score import Stall, score
from gpujitter.daemon.sinks.trace import TraceReader
from gpujitter.probes.events import Event, OffCpu, to_record
from gpujitter.probes.topology import Topology
from gpujitter.tui import decode
from tests.conftest import FIXTURES, cause_ns

TRACE = FIXTURES / "iowait" / "readahead-drill.gjtrace"
TRUTH = json.loads((FIXTURES / "iowait" / "readahead-drill-truth.json").read_text())
STALLS = [Stall.from_record(s) for s in TRUTH["stalls"]]


def recorded() -> tuple[list[Event], Topology, AnalysisConfig]:
    with TraceReader(TRACE) as trace:
        header = trace.header
        return list(trace), header.topology, AnalysisConfig.from_record(header.analysis)


def attributions(events: list[Event]) -> list[Attribution]:
    _, topology, config = recorded()
    return [a for a in analyse(events, topology, config) if isinstance(a, Attribution)]


@pytest.fixture(scope="module")
def replayed() -> list[Attribution]:
    return attributions(recorded()[0])


def test_every_stall_is_an_io_wait_within_the_targets(replayed: list[Attribution]) -> None:
    result = score("io_wait", STALLS, replayed, tuple(TRUTH["window"]))
    targets = result.to_record()["targets"]
    assert targets["found_all"] and targets["top_cause"] and targets["attributed"], targets
    # The other gaps are real: the feeder, woken inside a sync, waited on the run queue
    # behind the VM's other tasks (the detector sees those since issue 11's sync fix).
    assert all(g.top_cause == "runq_wait" for g in result.false_gaps), result.to_record()
    assert result.top_right == len(STALLS) == 3
    assert result.error is not None and abs(result.error) <= 0.05


def test_the_evidence_names_the_disk_and_the_read(replayed: list[Attribution]) -> None:
    gaps = [a for a in replayed if a.top_cause == "io_wait"]
    assert len(gaps) == len(STALLS)
    for a in gaps:
        (part,) = [p for p in a.parts if p.cause == "io_wait"]
        (io,) = part.evidence
        assert isinstance(io, IoEvidence)
        seen = (io.dev, io.name, io.op, io.syscall, io.node)
        assert seen == ("254:0", "vda", "read", "readv", -1)
        assert io.count >= 1 and io.bytes > 0 and io.ns == part.ns
        assert a.remedies[0] == f"io_wait: {remedies.io_wait('vda', 'read', -1, a.gpu_node)}"
        line = describe.one_line(a)
        assert "I/O wait (read on vda in readv x" in line


def test_without_the_io_fields_the_same_waits_are_only_blocked() -> None:
    # The stream as a sched probe without block tracepoints would have recorded it.
    events = [
        dataclasses.replace(e, io_dev="", io_bytes=0, io_op="") if isinstance(e, OffCpu) else e
        for e in recorded()[0]
    ]
    plain = attributions(events)
    result = score("blocked", STALLS, plain, tuple(TRUTH["window"]))
    assert result.top_right == len(STALLS)
    assert all(cause_ns(a, "io_wait") == 0 for a in plain)


def test_the_cause_and_its_evidence_read_in_words(replayed: list[Attribution]) -> None:
    assert "io_wait" in CAUSES
    assert cause_label("io_wait") == "I/O wait"
    gap = next(a for a in replayed if a.top_cause == "io_wait")
    shown = decode.attribution(to_record(gap))
    (io_part,) = [p for p in shown.parts if p.cause == "io_wait"]
    assert evidence_line(io_part.evidence[0], gap.ts_ns).startswith("read on vda in readv: ")
