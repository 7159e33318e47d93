"""Scoring a drill: the attributions the pipeline made against the stalls the feeding loop
injected (their times as the loop measured them, and its own measure of the injected
cause's time). A pure function of the two lists, unit-tested on its own.

A stall is found when a gap overlaps it; the gaps that overlap it are its gaps (normally
one). Its top cause is the top cause of its longest gap; its attributed time is the time
its gaps give to the injected cause. Gaps that overlap no stall and begin while the loop
runs (not the idle GPU before its start or after its end) are false gaps. Targets
(issue 5): every stall of at least 10 ms found; the top cause right for at least 95 % of
those stalls (of all of them where none is that long); the injected cause's attributed
time within ±20 % of the truth (summed over the stalls); no false gap. Where the injected
cause ran in another process than the feeding loop's (a data-loader worker), the stall's
longest gap must also name a thread of that process as holding the top cause (the culprit).

Where the cause ran in another process (`culprit_tgid`), its attributed time is that
process's threads' time to it: the loop's truth is the culprit's own measure.

Outside contention: on a busy machine the feeding thread also waits behind tasks that are
no part of the drill. Given the drill's own threads (`own_tids`), run-queue wait behind any
other task is explained time that is not the injection's: it is taken out of each gap's
parts before the top cause is picked, out of the truth where the loop's measure holds such
waits (`truth_holds_waits`: as much of it as must lie inside the stall, the gaps' parts
outside the stall holding the rest first), and a gap it makes up at least half of is not a
false gap. Where the loop measured the cause over less than the stall, the waits may lie in
the rest as well: the truth is then a range, and the attributed time is held to its nearer
end.

The loop's own work between stalls: outside load can stretch a stall's gap over the work the
loop does while the GPU is busy (the malloc scenario maps its next blocks then). That work is
named as what it is (an mmap, not the injected munmaps) and is no part of the stall: a
scenario that says which evidence its injection makes (`injected`) is credited with that
evidence's time only.

Self-inflicted gaps: gaps of the loop's run in which the feeding thread waited behind the
drill's gpujitter process itself (the engine marks that evidence `own`, from meta.self).
The observer must not delay the observed: the target is none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpujitter.daemon.analysis.engine.causes import CAUSES
from gpujitter.daemon.analysis.records import Attribution, Evidence, FrameEvidence, TaskEvidence
from gpujitter.probes import registry

MIN_STALL_NS = 10_000_000  # stalls at least this long must be found
TOP_CAUSE_SHARE = 0.95
TOLERANCE = 0.20


@dataclass(frozen=True, slots=True)
class Stall:
    """One injected stall: [t0_ns, t1_ns) as the loop measured it; cause_ns: the injected
    cause's share of it by the loop's own measure (the whole stall unless it knows better)."""

    index: int
    t0_ns: int
    t1_ns: int
    cause_ns: int
    culprit_tgid: int = 0  # the process the cause ran in, when not the loop's own (0)

    @property
    def dur_ns(self) -> int:
        return self.t1_ns - self.t0_ns

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Stall:
        return cls(rec["index"], rec["t0_ns"], rec["t1_ns"], rec["cause_ns"],
                   rec.get("culprit_tgid", 0))  # fmt: skip


@dataclass(frozen=True, slots=True)
class StallScore:
    index: int
    cause: str  # the injected cause
    injected_ns: int
    truth_ns: int  # the injected cause's time by the loop's measure
    found: bool
    gaps: int
    gap_ns: int  # summed length of its gaps
    top_cause: str  # "" when not found
    attributed_ns: int  # its gaps' time given to the injected cause
    parts: dict[str, int]  # cause -> ns over its gaps, outside contention taken out
    outside_ns: int = 0  # its gaps' run-queue wait behind tasks outside the drill
    # The truth the injected cause is held to: a range where the loop measured the cause
    # over part of the stall only, and outside waits may lie in the rest (expected_ns: all
    # of them inside the cause's measure; expected_max_ns: as many outside it as fit)
    expected_ns: int = 0
    expected_max_ns: int = 0
    culprit_tgid: int = 0
    culprit: str = ""  # "comm pid P tid T": the culprit's thread named for the top cause

    @property
    def top_right(self) -> bool:
        return self.found and self.top_cause == self.cause


@dataclass(frozen=True, slots=True)
class FalseGap:
    ts_ns: int
    end_ns: int
    top_cause: str
    parts: dict[str, int]


@dataclass(frozen=True, slots=True)
class Score:
    cause: str  # the injected cause ("" for the control)
    stalls: tuple[StallScore, ...]
    false_gaps: tuple[FalseGap, ...]
    window_ns: int  # how long the loop ran
    outside_gaps: int = 0  # gaps outside the stalls made by outside contention (not false)
    self_inflicted: int = 0  # gaps of the run with waits behind gpujitter's own threads
    self_inflicted_ns: int = 0
    targets: dict[str, bool] = field(default_factory=dict)

    @property
    def injected(self) -> int:
        return len(self.stalls)

    @property
    def found(self) -> int:
        return sum(s.found for s in self.stalls)

    @property
    def top_right(self) -> int:
        return sum(s.top_right for s in self.stalls)

    @property
    def truth_ns(self) -> int:
        return sum(s.truth_ns for s in self.stalls)

    @property
    def expected_ns(self) -> int:
        return sum(s.expected_ns for s in self.stalls)

    @property
    def expected_max_ns(self) -> int:
        return sum(s.expected_max_ns for s in self.stalls)

    @property
    def attributed_ns(self) -> int:
        return sum(s.attributed_ns for s in self.stalls)

    @property
    def error(self) -> float | None:
        """Attributed vs the nearer end of the expected range, relative (0.05: 5 % over, 0
        within the range); None where nothing is expected."""
        low, high, got = self.expected_ns, self.expected_max_ns, self.attributed_ns
        if high <= 0:
            return None
        if got > high:
            return got / high - 1.0
        return got / low - 1.0 if got < low else 0.0

    @property
    def passed(self) -> bool:
        return all(self.targets.values())

    def to_record(self) -> dict[str, Any]:
        error = self.error
        return {
            "cause": self.cause,
            "injected": self.injected,
            "found": self.found,
            "top_right": self.top_right,
            "injected_ms": round(sum(s.injected_ns for s in self.stalls) / 1e6, 3),
            "truth_ms": round(self.truth_ns / 1e6, 3),
            "outside_ms": round(sum(s.outside_ns for s in self.stalls) / 1e6, 3),
            "expected_ms": round(self.expected_ns / 1e6, 3),
            "expected_max_ms": round(self.expected_max_ns / 1e6, 3),
            "attributed_ms": round(self.attributed_ns / 1e6, 3),
            "error_pct": None if error is None else round(100 * error, 1),
            "false_gaps": len(self.false_gaps),
            "false_gap_ms": round(sum(g.end_ns - g.ts_ns for g in self.false_gaps) / 1e6, 3),
            "outside_gaps": self.outside_gaps,
            "self_inflicted": self.self_inflicted,
            "self_inflicted_ms": round(self.self_inflicted_ns / 1e6, 3),
            "window_s": round(self.window_ns / 1e9, 3),
            "targets": dict(self.targets),
            "passed": self.passed,
            "stalls": [{**asdict(s), "top_right": s.top_right} for s in self.stalls],
            "false": [asdict(g) for g in self.false_gaps],
        }


def _overlap(a0: int, a1: int, b0: int, b1: int) -> int:
    return max(0, min(a1, b1) - max(a0, b0))


def _outside(a: Attribution, own_tids: frozenset[int] | None) -> int:
    """Run-queue wait behind tasks that are no part of the drill (none when its own tasks
    are not given; tid 0, an unknown task, is never outside)."""
    if own_tids is None:
        return 0
    return sum(
        e.ns
        for p in a.parts
        if p.cause == "runq_wait"
        for e in p.evidence
        if isinstance(e, TaskEvidence) and e.tid > 0 and e.tid not in own_tids
    )


def _parts(attrs: Iterable[Attribution], own_tids: frozenset[int] | None) -> dict[str, int]:
    """Cause -> ns over the attributions, their outside contention taken out."""
    out: dict[str, int] = {}
    for a in attrs:
        for p in a.parts:
            out[p.cause] = out.get(p.cause, 0) + p.ns
        if "runq_wait" in out:
            out["runq_wait"] -= _outside(a, own_tids)
    return dict(sorted(((c, ns) for c, ns in out.items() if ns > 0),
                       key=lambda kv: (-kv[1], CAUSES.index(kv[0]))))  # fmt: skip


def score(
    cause: str,
    stalls: Sequence[Stall],
    attributions: Sequence[Attribution],
    window: tuple[int, int],
    own_tids: frozenset[int] | None = None,
    truth_holds_waits: bool = True,
    injected: Callable[[Evidence], bool] | None = None,
) -> Score:
    """cause: the cause the injection is (CAUSES name), "" for the control; window: when the
    loop started and ended (CLOCK_MONOTONIC ns); own_tids: the drill's threads (feeder and
    helpers), None to count every wait as the drill's; truth_holds_waits: whether the loop's
    measure of the cause includes time it waited to run; injected: which evidence of the
    cause the injection makes (None: all of it)."""
    go_ns, end_ns = window
    matched: set[int] = set()
    scored = []
    for st in stalls:
        mine = [
            (i, a)
            for i, a in enumerate(attributions)
            if _overlap(a.ts_ns, a.end_ns, st.t0_ns, st.t1_ns) > 0
        ]
        matched.update(i for i, _ in mine)
        gaps = [a for _, a in mine]
        longest = max(gaps, key=lambda a: (a.dur_ns, -a.ts_ns), default=None)
        parts = _parts(gaps, own_tids)
        waits = [(a, _outside(a, own_tids)) for a in gaps]  # each gap's outside waits
        outside = sum(ns for _, ns in waits)
        # The truth is held to the stall less the outside waits inside it. A gap that began
        # before the stall (the loop kept waiting behind outside load) may hold such waits
        # before it too: only what its part outside the stall cannot hold lies inside.
        inside = sum(
            max(0, ns - (a.dur_ns - _overlap(a.ts_ns, a.end_ns, st.t0_ns, st.t1_ns)))
            for a, ns in waits
        )
        scored.append(
            StallScore(
                index=st.index,
                cause=cause,
                injected_ns=st.dur_ns,
                truth_ns=st.cause_ns,
                found=bool(gaps),
                gaps=len(gaps),
                gap_ns=sum(a.dur_ns for a in gaps),
                top_cause=next(iter(_parts([longest], own_tids)), "") if longest else "",
                attributed_ns=(
                    _culprit_ns(gaps, cause, st.culprit_tgid)
                    if st.culprit_tgid
                    else parts.get(cause, 0) - _not_injected(gaps, cause, injected)
                ),
                parts=parts,
                outside_ns=outside,
                expected_ns=max(0, st.cause_ns - inside) if truth_holds_waits else st.cause_ns,
                # the stall's time beyond the loop's measure of the cause (a migrated
                # thread's wait to run on its new CPU before it reads its clock) can hold
                # that much of the waits
                expected_max_ns=(
                    max(0, st.cause_ns - max(0, inside - (st.dur_ns - st.cause_ns)))
                    if truth_holds_waits
                    else st.cause_ns
                ),
                culprit_tgid=st.culprit_tgid,
                culprit=_culprit(longest, st.culprit_tgid) if longest else "",
            )
        )
    unmatched = [a for i, a in enumerate(attributions)
                 if i not in matched and go_ns <= a.ts_ns < end_ns]  # fmt: skip
    by_outside = [a for a in unmatched if 2 * _outside(a, own_tids) >= a.dur_ns > 0]
    false = tuple(
        FalseGap(a.ts_ns, a.end_ns, a.top_cause, _parts([a], None))
        for a in unmatched
        if a not in by_outside
    )
    own = [a for a in attributions if a.self_inflicted and go_ns <= a.ts_ns < end_ns]
    result = Score(cause, tuple(scored), false, end_ns - go_ns, len(by_outside), len(own),
                   sum(a.self_ns for a in own))  # fmt: skip
    return replace(result, targets=_targets(result))


def _not_injected(
    attrs: Iterable[Attribution], cause: str, injected: Callable[[Evidence], bool] | None
) -> int:
    """The cause's time in evidence the injection did not make (the loop's own work)."""
    if injected is None:
        return 0
    return sum(getattr(e, "ns", 0) for a in attrs for p in a.parts if p.cause == cause
               for e in p.evidence if not injected(e))  # fmt: skip


def _culprit_ns(attrs: Iterable[Attribution], cause: str, tgid: int) -> int:
    """The cause's time in the culprit process's threads, as the attributions list them: the
    truth is that process's own measure, and the feeding process's own host work in the
    same gap (its Python around the queues) is not part of it."""
    return sum(
        c.ns
        for a in attrs
        for r in a.threads
        if r.tgid == tgid
        for c in r.causes
        if c.cause == cause
    )


def _culprit(a: Attribution, tgid: int) -> str:
    """The thread of process tgid that the attribution names as holding its top cause: one
    of its listed threads, in that process, whose own time went mostly to that cause."""
    if not tgid:
        return ""
    for r in a.threads:
        if r.tgid == tgid and r.causes and r.causes[0].cause == a.top_cause:
            return f"{r.comm} pid {r.tgid} tid {r.tid}"
    return ""


# Each target a drill can be held to, as its score table says it.
TARGETS = {
    "found_all": f"every stall ≥ {MIN_STALL_NS // 1_000_000} ms found",
    "top_cause": f"top cause right ≥ {TOP_CAUSE_SHARE:.0%} of the stalls ≥ "
    f"{MIN_STALL_NS // 1_000_000} ms",
    "attributed": f"attributed within ±{TOLERANCE:.0%}",
    "no_false_gaps": "no false gaps",
    "no_self_inflicted": "no self-inflicted gaps",
    "culprit": "the busy process named in every stall",
}


def _targets(s: Score) -> dict[str, bool]:
    must = [st for st in s.stalls if st.injected_ns >= MIN_STALL_NS]
    targets = {
        "found_all": all(st.found for st in must),
        "no_false_gaps": not s.false_gaps,
        "no_self_inflicted": not s.self_inflicted,
    }
    if s.stalls:
        # over the stalls that must be found: one the injection left under MIN_STALL_NS (a
        # hog that missed its turn: 0.1 ms on the real job) is no gap to name a cause of
        counted = must or s.stalls
        targets["top_cause"] = sum(st.top_right for st in counted) >= TOP_CAUSE_SHARE * len(counted)
        error = s.error
        targets["attributed"] = error is not None and abs(error) <= TOLERANCE
    if any(st.culprit_tgid for st in s.stalls):
        targets["culprit"] = all(st.culprit for st in s.stalls if st.culprit_tgid)
    return targets


def named_frames(
    stalls: Sequence[Mapping[str, Any]], attrs: Iterable[Attribution]
) -> dict[str, Any]:
    """For stalls that say which Python function ran them (pyhot: func, file, line): of the
    gaps over them whose host work lasted a sampling period or more (less leaves no sample
    to name it by), how many name that function as host work's top frame (issue 14's
    target: >= 90 %). Frames that tie for the top count alike: a gap the feeder ran two
    sampling periods of (a stall under a one-CPU hog) holds one sample in the function and
    one in its caller's loop, and neither is more the top than the other."""
    period_ns = registry.get("python_stacks").thresholds["period"]
    named = scored = 0
    for a in attrs:
        if not any(a.ts_ns < s["t1_ns"] and s["t0_ns"] < a.end_ns for s in stalls):
            continue
        host = [p for p in a.parts if p.cause == "host_work"]
        if sum(p.ns for p in host) < period_ns:
            continue
        frames = [e for p in host for e in p.evidence if isinstance(e, FrameEvidence)]
        top = max((e.ns for e in frames), default=0)
        scored += 1
        named += any(
            (e.func, e.file, e.line) == (s["func"], s["file"], s["line"])
            for e in frames
            if e.ns == top
            for s in stalls
        )
    return {"gaps": scored, "named": named}
