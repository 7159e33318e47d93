"""What a file sink does when the disk refuses a write (full, over quota, I/O error): it keeps
the daemon running, drops the records it cannot write and counts them, says so once when
writing stops and once when it works again, and leaves the count in the file itself (the
log's next line, a trace's `meta.lost` record) as well as in status and metrics. Each kind of
failure (its errno) is said at once, a kind said already at most once a minute: a disk at its
full mark fails and recovers by turns, but a folder removed, then the file made immutable,
then replaced by a folder are three failures to be told of."""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# What a disk says when it has no room (for now): a sink that meets one of these at start
# starts anyway and tries again; any other error at start is a configuration error.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# A failure of a kind said within this long is said only once it is that long since; until
# then its records are counted into the next line that is said.
SAY_EVERY_NS = 60_000_000_000


def _errno(err: BaseException) -> int | None:
    """The errno of `err`, or of the OSError it was raised from."""
    cause = err if isinstance(err, OSError) else err.__context__
    return cause.errno if isinstance(cause, OSError) else None


def no_room(err: BaseException) -> bool:
    """Whether `err` (or the OSError it was raised from) says the disk is full."""
    return _errno(err) in NO_ROOM


def failure_kind(err: BaseException | str) -> int | str:
    """What tells one kind of failure from another: the errno behind `err`, else its text."""
    number = _errno(err) if isinstance(err, BaseException) else None
    return str(err) if number is None else number


def to_stderr(line: str) -> None:
    print(f"# {line}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class WriteFailures:
    """One sink's failing episodes. `say` takes one line for the operator (the journal)."""

    what: str  # "log /var/log/gpujitter/attributions.jsonl", "trace /var/lib/..."
    say: Callable[[str], None] = field(default=to_stderr, repr=False)
    dropped: int = 0  # records lost in the episode under way
    dropped_total: int = 0  # since start
    since_ns: int = 0  # when the episode under way began (its first lost record)
    reason: str = ""  # the latest failed write's error (names the file); "" while writing
    kind: int | str = 0  # that error's kind (failure_kind)

    said_ns: dict[int | str, int] = field(default_factory=dict)  # kinds said in SAY_EVERY_NS
    unsaid: bool = False  # the failure under way (its kind) has not been said yet
    episode_said: bool = False  # the episode under way was said: its end is said too
    unsaid_dropped: int = 0  # records of short episodes never said, for the next line
    unsaid_episodes: int = 0

    @property
    def failing(self) -> bool:
        return bool(self.reason)

    def failed(self, err: BaseException | str, ts_ns: int, records: int = 1) -> None:
        """`records` could not be written because of `err`, an error or its text."""
        kind = failure_kind(err)
        if not self.failing:
            self.since_ns = ts_ns
        if not self.failing or kind != self.kind:  # (another kind: what fails now)
            self.reason, self.kind, self.unsaid = str(err) or "write failed", kind, True
        self.lost(records)

    def lost(self, records: int = 1) -> None:
        """`records` could not be written for the failure under way (no file to write to)."""
        self.dropped += records
        self.dropped_total += records
        if not self.unsaid:
            return
        now = time.monotonic_ns()
        self.said_ns = {k: t for k, t in self.said_ns.items() if now - t < SAY_EVERY_NS}
        if self.kind not in self.said_ns:
            self.unsaid, self.episode_said, self.said_ns[self.kind] = False, True, now
            # The reason names the file already ("cannot write log PATH: ...").
            self.say(f"{self.reason}; dropping records until writes succeed again"
                     f"{self._unsaid_tally()}")  # fmt: skip

    def recovered(self) -> int:
        """A write went through: end the episode; returns how many records it lost."""
        if not self.failing:
            return 0
        lost = self.dropped
        if not self.episode_said:  # short, and of a kind said within the minute
            self.unsaid_dropped += lost
            self.unsaid_episodes += 1
        else:
            self.say(f"{self.what}: writing again; {lost} records were dropped"
                     f"{self._unsaid_tally()}")  # fmt: skip
        self.dropped, self.reason, self.unsaid, self.episode_said = 0, "", False, False
        return lost

    def _unsaid_tally(self) -> str:
        if not self.unsaid_episodes:
            return ""
        tally = (f" (and {self.unsaid_dropped} in {self.unsaid_episodes} short failing "
                 "episodes before, not said)")  # fmt: skip
        self.unsaid_dropped = self.unsaid_episodes = 0
        return tally
