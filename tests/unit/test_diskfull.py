"""A file sink's failing episodes (daemon/sinks/diskfull.py) as the operator reads them: a
disk at its full mark fails and recovers by turns, and each turn used to say two lines."""

from __future__ import annotations

import pytest

from gpujitter.daemon.sinks import diskfull
from gpujitter.daemon.sinks.diskfull import SAY_EVERY_NS, WriteFailures

S = 1_000_000_000


def test_a_disk_at_its_full_mark_says_a_pair_of_lines_a_minute_with_every_record_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [10 * S]
    monkeypatch.setattr(diskfull.time, "monotonic_ns", lambda: now[0])
    said: list[str] = []
    f = WriteFailures("log /x.jsonl", say=said.append)
    lost = []
    for _ in range(30):  # a write fails and the next goes through, once a second
        f.failed("cannot write log /x.jsonl: No space left on device", now[0], 2)
        now[0] += S // 2
        lost.append(f.recovered())
        now[0] += S // 2
    assert sum(lost) == f.dropped_total == 60  # every record counted, in the file's lines too
    assert said == [
        "cannot write log /x.jsonl: No space left on device; dropping records until writes "
        "succeed again",
        "log /x.jsonl: writing again; 2 records were dropped",
    ]
    # A minute after the first line, the next episode is said with what went unsaid.
    now[0] = 10 * S + SAY_EVERY_NS
    f.failed("cannot write log /x.jsonl: No space left on device", now[0], 1)
    assert said[-1].endswith("(and 58 in 29 short failing episodes before, not said)")
    f.recovered()
    assert said[-1] == "log /x.jsonl: writing again; 1 records were dropped"


def test_an_unsaid_episode_that_goes_on_is_said_once_it_has_lasted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last line said must not stay "writing again" while the disk refuses every write."""
    now = [5 * S]
    monkeypatch.setattr(diskfull.time, "monotonic_ns", lambda: now[0])
    said: list[str] = []
    f = WriteFailures("trace /t", say=said.append)
    f.failed("cannot write trace /t: quota", now[0])
    f.recovered()
    now[0] += S
    for _ in range(100):  # full again, for good
        f.failed("cannot write trace /t: quota", now[0])
        now[0] += S
    assert len(said) == 3 and "dropping records" in said[-1]
    assert f.failing and f.dropped == 100
