"""Attributions in words, the way an operator reads them:

    GPU0 idle 38.0ms at 12:01:07.250 in pod ml/trainer-0/pytorch: 29.0ms swap-in (pid 4121
    tid 4130), 6.0ms IRQs nvme0q3 on CPU 17, 3.0ms unexplained [cuda, ±5us]

`report`, `drill`, the daemon's console output and the TUI's breakdown share these phrases, so
a cause reads the same everywhere: one line per attribution (one_line), per part (part_text,
worded by the part's cause: Cause.detail) and per item of evidence (evidence_line, worded by
the evidence record: its `line`). Names in them (tasks, IRQs, pods) come from other
processes and are shown through gpujitter.text.printable: a line never carries a control
character.
"""

from __future__ import annotations

from gpujitter.daemon.analysis.engine.causes import CAUSE_BY_NAME, cause_label
from gpujitter.daemon.analysis.records import Attribution, Evidence, Part
from gpujitter.probes.clock import format_wall
from gpujitter.probes.events import ClockRef
from gpujitter.text import printable
from gpujitter.units import format_ns


def held_by(part: Part, attr: Attribution) -> str:
    """Where a part's time lay when a wait was followed into the thread that ended it: the
    waker holding most of it, named with its process and its hops from the critical thread
    ("" when none does). Its time comes first when it holds only some of the part."""
    held = attr.holder(part)
    if held is None:
        return ""
    ns, r = held
    share = f"{format_ns(ns)} " if ns < part.ns else ""
    hops = f"{r.hops} hop{'s' if r.hops != 1 else ''}"
    where = f" ({r.workload})" if r.workload and r.workload != attr.workload else ""
    return f"{share}in {r.comm or '?'} pid {r.tgid} tid {r.tid}{where}, {hops}"


def detail(part: Part, attr: Attribution) -> str:
    """What a part's evidence names, as its cause words it (Cause.detail); a cause this
    version does not know adds nothing."""
    cause = CAUSE_BY_NAME.get(part.cause)
    return cause.detail(part, attr) if cause else ""


def part_text(part: Part, attr: Attribution) -> str:
    more = ", ".join(x for x in (detail(part, attr), held_by(part, attr)) if x)
    text = f"{format_ns(part.ns)} {cause_label(part.cause)}"
    return printable(text + (f" ({more})" if more else ""))


def gpu_name(index: int) -> str:
    """GPU0, or GPU? for gaps on no known GPU (no NVML: the feeder's GPU is not known)."""
    return f"GPU{index}" if index >= 0 else "GPU?"


def one_line(attr: Attribution, clock: ClockRef | None = None) -> str:
    when = format_wall(clock, attr.ts_ns)[:-3] if clock else f"t={attr.ts_ns}ns"
    parts = ", ".join(part_text(p, attr) for p in attr.parts)
    sources = "+".join(attr.sources)
    where = f" in {attr.workload}" if attr.workload else ""
    return printable(
        f"{gpu_name(attr.gpu)} idle {format_ns(attr.dur_ns)} at {when}{where}: {parts} "
        f"[{sources}, ±{format_ns(attr.resolution_ns)}]"
    )


def evidence_line(e: Evidence, gap_start_ns: int) -> str:
    """One item of evidence in words, as its record words it (a migration's time relative
    to the gap's start); the breakdown lists every item under its cause."""
    return printable(e.words(gap_start_ns))
