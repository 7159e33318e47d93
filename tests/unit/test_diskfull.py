"""A file sink's failing episodes (daemon/sinks/diskfull.py) as the operator reads them: a
disk at its full mark fails and recovers by turns, and each turn used to say two lines."""

from __future__ import annotations

import pytest

from gpujitter.daemon.sinks import diskfull
from gpujitter.daemon.sinks.diskfull import SAY_EVERY_NS, WriteFailures

S = 1_000_000_000


class Clock:
    """The monotonic clock the episodes read, moved by hand, and the lines said."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ns = 10 * S
        self.said: list[str] = []
        monkeypatch.setattr(diskfull.time, "monotonic_ns", lambda: self.ns)

    def failures(self, what: str) -> WriteFailures:
        return WriteFailures(what, say=self.said.append)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def test_a_disk_at_its_full_mark_says_a_pair_of_lines_a_minute_with_every_record_counted(
    clock: Clock,
) -> None:
    f = clock.failures("log /x.jsonl")
    lost = []
    for _ in range(30):  # a write fails and the next goes through, once a second
        f.failed("cannot write log /x.jsonl: No space left on device", clock.ns, 2)
        clock.ns += S // 2
        lost.append(f.recovered())
        clock.ns += S // 2
    assert sum(lost) == f.dropped_total == 60  # every record counted, in the file's lines too
    assert clock.said == [
        "cannot write log /x.jsonl: No space left on device; dropping records until writes "
        "succeed again",
        "log /x.jsonl: writing again; 2 records were dropped",
    ]
    # A minute after the first line, the next episode is said with what went unsaid.
    clock.ns = 10 * S + SAY_EVERY_NS
    f.failed("cannot write log /x.jsonl: No space left on device", clock.ns, 1)
    assert clock.said[-1].endswith("(and 58 in 29 short failing episodes before, not said)")
    f.recovered()
    assert clock.said[-1] == "log /x.jsonl: writing again; 1 records were dropped"


def test_an_unsaid_episode_that_goes_on_is_said_once_it_has_lasted(clock: Clock) -> None:
    """The last line said must not stay "writing again" while the disk refuses every write."""
    f = clock.failures("trace /t")
    f.failed("cannot write trace /t: quota", clock.ns)
    f.recovered()
    clock.ns += S
    for _ in range(100):  # full again, for good
        f.failed("cannot write trace /t: quota", clock.ns)
        clock.ns += S
    assert len(clock.said) == 3 and "dropping records" in clock.said[-1]
    assert f.failing and f.dropped == 100
