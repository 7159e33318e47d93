"""Attributions in words: each cause names what its evidence says."""

from __future__ import annotations

import dataclasses

import pytest

from gpujitter.daemon.analysis.describe import one_line, part_text
from gpujitter.daemon.analysis.engine.causes import CAUSE_BY_NAME, Cause
from gpujitter.daemon.analysis.records import (
    AllocEvidence,
    Attribution,
    CauseTime,
    FaultEvidence,
    IdleEvidence,
    IrqEvidence,
    NodeEvidence,
    Part,
    SyscallEvidence,
    TaskEvidence,
    ThreadRole,
)
from gpujitter.probes.events import ClockRef

MS = 1_000_000


def attribution(*parts: Part) -> Attribution:
    return Attribution(
        ts_ns=5 * 10**9, end_ns=5 * 10**9 + sum(p.ns for p in parts), gpu=0, sources=("cuda",),
        resolution_ns=5_000, confidence=0.9, parts=parts, tgid=4121, tid=4130, comm="python",
        gpu_node=0,
    )  # fmt: skip


def test_the_operators_sentence() -> None:
    attr = attribution(
        Part("swap_in", 29 * MS, (4130,), (FaultEvidence("swap", 120, 29 * MS, (17,)),)),
        Part("irq", 6 * MS, (4130,),
             (IrqEvidence("hardirq", 36, "nvme0q3", (17,), 40, 6 * MS, remote_to_gpu=True),)),
        Part("unexplained", 3 * MS),
    )  # fmt: skip
    # 2026-01-01 12:01:07 UTC at monotonic 0 -> the gap starts 5 s later
    clock = ClockRef(ts_ns=0, realtime_ns=1_767_268_867_000_000_000)
    text = one_line(attr, clock)
    assert text.startswith("GPU0 idle 38.00ms at ")
    assert text.endswith(
        ": 29.00ms swap-in (pid 4121 tid 4130, 120 faults), 6.00ms IRQs (nvme0q3 on CPU 17 "
        "(remote to GPU)), 3.00ms unexplained [cuda, ±5.0us]"
    )


def test_each_cause_names_its_evidence() -> None:
    attr = attribution()
    cases = {
        Part("runq_wait", MS, (1,), (TaskEvidence(812, "kworker/3:1", (3,), 4, MS, True),)):
            "1.00ms run-queue wait (behind kworker/3:1 (tid 812) on CPU 3, after a cross-NUMA "
            "migration)",
        Part("idle_wake", MS, (1,), (IdleEvidence(3, "C6", (4, 5), 2, MS, 133_000),)):
            "1.00ms wake-up from idle (from C6 on CPUs 4,5)",
        Part("blocked", MS, (1,), (SyscallEvidence("sleeping", "futex", 202, 1, MS),)):
            "1.00ms blocked (in futex)",
        Part("alloc_stall", MS, (1,), (AllocEvidence("munmap", "", 2, MS, 64 << 20),)):
            "1.00ms allocator stall (munmap 64.00MiB x2)",
        Part("remote_oncpu", MS, (1,), (NodeEvidence(1, (8,), MS, True),)):
            "1.00ms on-CPU on a remote node (node 1, GPU on node 0)",
        Part("host_work", MS, (1,)): "1.00ms host work",
        Part("runq_wait", MS, (1,), (TaskEvidence(0, "", (2,), 1, MS),)):
            "1.00ms run-queue wait (behind an unknown task on CPU 2)",
    }  # fmt: skip
    for part, text in cases.items():
        assert part_text(part, attr) == text


def test_a_gap_on_no_known_gpu() -> None:
    attr = dataclasses.replace(attribution(Part("runq_wait", 25 * MS)), gpu=-1)
    assert one_line(attr).startswith("GPU? idle 25.00ms at t=5000000000ns: ")


def test_time_followed_into_a_waker_names_its_thread_and_process() -> None:
    worker = ThreadRole(301, 300, "pt_data_worker", "waker", 38 * MS, "host_work", hops=3,
                        woke=302, causes=(CauseTime("host_work", 36 * MS),
                                          CauseTime("swap_in", 2 * MS)))  # fmt: skip
    pin = ThreadRole(4131, 4121, "pin_memory", "waker", 40 * MS, "host_work", hops=1, woke=4130,
                     causes=(CauseTime("host_work", MS),))  # fmt: skip
    attr = dataclasses.replace(
        attribution(
            Part("host_work", 37 * MS, (301, 4131)),
            Part("swap_in", 2 * MS, (301,), (FaultEvidence("swap", 3, 2 * MS, (5,)),)),
            Part("blocked", MS, (4130,), (SyscallEvidence("sleeping", "futex", 202, 1, MS),)),
        ),
        threads=(ThreadRole(4130, 4121, "python", "critical", 40 * MS, "host_work"), worker, pin),
    )
    assert one_line(attr).endswith(
        ": 37.00ms host work (36.00ms in pt_data_worker pid 300 tid 301, 3 hops), "
        "2.00ms swap-in (3 faults, in pt_data_worker pid 300 tid 301, 3 hops), "
        "1.00ms blocked (in futex) [cuda, ±5.0us]"
    )


class Defrag(Cause):
    """A cause as a new module would add it: its label and its detail are all it words."""

    name = "defrag"
    label = "compaction"
    colour = "#000000"

    def claim(self, *args: object) -> int:
        return 0

    def evidence(self, *args: object) -> tuple[()]:
        return ()

    def detail(self, part: Part, attr: Attribution) -> str:
        return f"{len(part.evidence)} items, pid {attr.tgid}"


def test_a_new_cause_reads_through_its_own_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-liners ask the cause table, so a cause added there needs nothing in here."""
    part = Part("defrag", 4 * MS, (4130,), (NodeEvidence(0, (1,), 4 * MS, False),))
    assert part_text(part, attribution(part)) == "4.00ms defrag"  # unknown: reads as itself
    monkeypatch.setitem(CAUSE_BY_NAME, "defrag", Defrag())
    assert part_text(part, attribution(part)) == "4.00ms compaction (1 items, pid 4121)"
