"""The engine's clock is CLOCK_MONOTONIC ns; wall time appears only at the edges, through a
ClockRef (a monotonic and a realtime reading taken back to back)."""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Container, Mapping
from datetime import datetime
from itertools import pairwise

from gpujitter.probes.events import ClockRef


def clock_ref() -> ClockRef:
    """Take the pair of readings whose gap is smallest out of a few tries (the two reads can
    be split by preemption; the tightest pair bounds the error)."""
    best: tuple[int, int, int] | None = None
    for _ in range(5):
        a = time.monotonic_ns()
        wall = time.time_ns()
        b = time.monotonic_ns()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) // 2, wall)
    assert best is not None
    return ClockRef(ts_ns=best[1], realtime_ns=best[2])


# How far the wall clock may move against the monotonic one between two references before
# it counts as set: the two readings of a reference are ~0.1 µs apart, and NTP's slewing
# moves both clocks alike, so anything over this is a step (chrony's or ntpd's, a date set
# by hand, a VM's clock put right after a pause).
STEP_NS = 1_000_000


def stepped(ref: ClockRef, now: ClockRef) -> int:
    """How far the wall clock was set between two references, in ns (0: not set)."""
    moved = (now.realtime_ns - now.ts_ns) - (ref.realtime_ns - ref.ts_ns)
    return moved if abs(moved) > STEP_NS else 0


def wall_ns(ref: ClockRef, mono_ns: int) -> int:
    return ref.realtime_ns + (mono_ns - ref.ts_ns)


def wall_time(ref: ClockRef, mono_ns: int) -> datetime | None:
    """The local wall time of a monotonic timestamp; None where no datetime holds it (a
    recording's clock or times from a damaged or made-up file: years past 9999)."""
    try:
        return datetime.fromtimestamp(wall_ns(ref, mono_ns) / 1e9).astimezone()
    except (ValueError, OverflowError, OSError):
        return None


def format_wall(ref: ClockRef, mono_ns: int, *, date: bool = False) -> str:
    """Local wall time of a monotonic timestamp: 12:01:07.250123, or with the date and the
    zone's UTC offset if asked (2026-12-01 12:01:07.250123 +0000), which journalctl,
    Prometheus and Grafana times can be compared with; a time no clock holds as seconds of
    the monotonic clock (+12.250123s)."""
    dt = wall_time(ref, mono_ns)
    if dt is None:
        return f"+{mono_ns / 1e9:.6f}s"
    return dt.strftime("%Y-%m-%d %H:%M:%S.%f %z" if date else "%H:%M:%S.%f")


class Clocks:
    """The wall clock's references through a recording, the first its header's, then each
    meta.clock a run sent when the clock was set: a time is shown by the latest reference
    taken at or before it. `notes`: each reference that set the clock, said, so that the
    times it moved are explained where they are shown, and each one not followed.

    A reference read after one taken later (by the monotonic clock) is out of time order:
    records of two timelines read one after the other. One that says what the clock in
    force at its time says is a repeat (recordings of one node that overlap); one that says
    what the next reference says is that one's step seen earlier (a meta.clock written after
    a rotation's header took the new clock), followed from its time. Any other is not
    followed but said, with how far it puts the clock: following it would move the times of
    records around it that it need not belong to, some of them already shown by the clock in
    force.

    began: the references that are a trace file's header (a rotated recording's later file)
    and the file, for the note to say where the clock was found set; restarts: those that
    began a later boot (the node restarted: its monotonic clock began again, and a time no
    longer names one moment), said, after which none is followed: the records read on are
    shown by the clock of the boot before, as the note says."""

    def __init__(
        self,
        first: ClockRef,
        *,
        began: Mapping[ClockRef, object] | None = None,
        restarts: Container[ClockRef] = (),
    ) -> None:
        self._refs = [first]
        self._taken = [first.ts_ns]
        self._unfollowed: list[str] = []
        self._began = {} if began is None else began
        self._restarts = restarts
        self._restarted = False

    @property
    def notes(self) -> list[str]:
        steps = [_set_note(before, ref, self._began.get(ref)) for before, ref in self.steps]
        return steps + self._unfollowed

    @property
    def steps(self) -> list[tuple[ClockRef, ClockRef]]:
        """Each pair of references, in time order, of which the second set the clock."""
        # (an events file repeats its first reference, and a log's lines give one each time
        # their `time` says the clock was set: only a step moves the times after it; a log
        # whose first lines carry no `time` has no clock until one does, which sets none)
        return [
            (before, ref)
            for before, ref in pairwise(self._refs)
            if before.realtime_ns and stepped(before, ref)
        ]

    def add(self, ref: ClockRef) -> None:
        if self._restarted:  # a later boot's: how its times are shown is said
            return
        if ref in self._restarts:
            self._restarted = True
            where = (
                f"before {self._began[ref]} began" if ref in self._began else "during the recording"
            )
            self._unfollowed.append(
                f"clock: the node restarted {where} (its monotonic clock began again; it "
                f"booted at {format_wall(ref, 0, date=True)} by its clock): the times from "
                "there on are shown by the clock of the boot before "
                f"({stepped(ref, self.at(ref.ts_ns)) / 1e9:+.3f} s off where it began), and "
                "its records are read after that boot's, out of time order: read each boot's "
                "files on their own"
            )
            return
        if ref.ts_ns >= self._taken[-1]:
            self._refs.append(ref)
            self._taken.append(ref.ts_ns)
            return
        at = bisect_right(self._taken, ref.ts_ns)
        if not stepped(self._refs[max(at - 1, 0)], ref):
            return  # what the clock in force then says: a repeat
        if at and not stepped(ref, self._refs[at]):  # the next one's step, seen earlier
            self._refs.insert(at, ref)
            self._taken.insert(at, ref.ts_ns)
            return
        shown = self.at(ref.ts_ns)
        self._unfollowed.append(
            "clock: a wall-clock reference out of time order (taken before one read ahead of "
            "it: records of two timelines read one after the other, recordings of one node "
            f"that overlap, or a file edited) says {format_wall(ref, ref.ts_ns, date=True)} "
            f"where the times shown say {format_wall(shown, ref.ts_ns)} "
            f"({stepped(shown, ref) / 1e9:+.3f} s): not followed"
        )

    def at(self, mono_ns: int) -> ClockRef:
        return self._refs[max(bisect_right(self._taken, mono_ns) - 1, 0)]

    def wall_ns(self, mono_ns: int) -> int:
        """A monotonic time as the wall clock of its time showed it (as it is printed)."""
        return wall_ns(self.at(mono_ns), mono_ns)


def _set_note(before: ClockRef, ref: ClockRef, began: object = None) -> str:
    """A reference that set the clock, said: by how much, when by both clocks (a file's
    header: by the time that file began)."""
    moved = stepped(before, ref)
    where = (
        f"between the recording's files, by the time {began} began at"
        if began is not None
        else "during the recording, at"
    )
    return (
        f"clock: the wall clock was set {moved / 1e9:+.3f} s {where} "
        f"{format_wall(before, ref.ts_ns, date=True)} "
        f"({format_wall(ref, ref.ts_ns)} by the new clock): the times from there on "
        "are by the new clock"
    )
