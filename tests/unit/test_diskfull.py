"""A file sink's failing episodes (daemon/sinks/diskfull.py) as the operator reads them: a
disk at its full mark fails and recovers by turns, and each turn used to say two lines."""

from __future__ import annotations

import errno
import os

import pytest

from gpujitter.daemon.sinks import diskfull
from gpujitter.daemon.sinks.diskfull import SAY_EVERY_NS, WriteFailures
from gpujitter.errors import GpujitterError

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


def failure(number: int, text: str) -> GpujitterError:
    """A sink's error as the sinks raise one: in its words, from the OSError behind it."""
    try:
        try:
            raise OSError(number, os.strerror(number))
        except OSError:
            raise GpujitterError(f"{text}: {os.strerror(number)}") from None
    except GpujitterError as err:
        return err


def test_each_new_kind_of_failure_is_said_at_once_and_a_kind_said_once_a_minute(
    clock: Clock,
) -> None:
    """Within a minute the log's folder was removed, the log made immutable, replaced by a
    folder, then by a link: only the first failure got its lines; the rest showed only as
    log_failing in the status. Each kind (errno) is said when it starts; one said already
    within the minute is counted into the next line, as a disk at its full mark's are."""
    f = clock.failures("log /x.jsonl")
    kinds = [(errno.ENOENT, "cannot open log /x.jsonl"), (errno.EPERM, "cannot write log /x.jsonl"),
             (errno.EISDIR, "cannot open log /x.jsonl"), (errno.ELOOP, "cannot open log /x.jsonl"),
             (errno.ENOENT, "cannot open log /x.jsonl")]  # fmt: skip
    for number, text in kinds:
        f.failed(failure(number, text), clock.ns, 3)
        clock.ns += 5 * S
        f.recovered()
        clock.ns += 5 * S
    starts = [line for line in clock.said if "dropping records" in line]
    assert [line.split(": ")[1].split(";")[0] for line in starts] == [
        "No such file or directory", "Operation not permitted", "Is a directory",
        "Too many levels of symbolic links",
    ]  # fmt: skip
    assert clock.said.count("log /x.jsonl: writing again; 3 records were dropped") == 4
    # Another kind while one fails: what fails now, said, and the episode's count goes on.
    f.failed(failure(errno.ENOSPC, "cannot write log /x.jsonl"), clock.ns)
    f.failed(failure(errno.EIO, "cannot write log /x.jsonl"), clock.ns)
    assert f.reason == "cannot write log /x.jsonl: Input/output error" and f.dropped == 2
    assert clock.said[-1].startswith("cannot write log /x.jsonl: Input/output error; dropping")
    assert f.recovered() == 2
    assert clock.said[-1].startswith("log /x.jsonl: writing again; 2 records were dropped")
