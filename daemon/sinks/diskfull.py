"""What a file sink does when the disk refuses a write (full, over quota, I/O error): it keeps
the daemon running, drops the records it cannot write and counts them, says so once when
writing stops and once when it works again (at most once a minute each: a disk at its full
mark fails and recovers by turns), and leaves the count in the file itself (the log's next
line, a trace's `meta.lost` record) as well as in status and metrics."""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# What a disk says when it has no room (for now): a sink that meets one of these at start
# starts anyway and tries again; any other error at start is a configuration error.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# An episode that begins within this long of the last one said is said only if it lasts
# that long; until then its records are counted into the next line that is said.
SAY_EVERY_NS = 60_000_000_000


def no_room(err: BaseException) -> bool:
    """Whether `err` (or the OSError it was raised from) says the disk is full."""
    cause = err if isinstance(err, OSError) else err.__context__
    return isinstance(cause, OSError) and cause.errno in NO_ROOM


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
    reason: str = ""  # the first failed write's error (names the file); "" while writing

    said_ns: int = -SAY_EVERY_NS  # when an episode's start was last said (monotonic)
    unsaid: bool = False  # the episode under way has not been said yet
    unsaid_dropped: int = 0  # records of short episodes never said, for the next line
    unsaid_episodes: int = 0

    @property
    def failing(self) -> bool:
        return bool(self.reason)

    def failed(self, reason: str, ts_ns: int, records: int = 1) -> None:
        """`records` could not be written because of `reason`."""
        if not self.failing:
            self.reason = reason or "write failed"
            self.since_ns = ts_ns
            self.unsaid = True
        self.dropped += records
        self.dropped_total += records
        now = time.monotonic_ns()
        if self.unsaid and now - self.said_ns >= SAY_EVERY_NS:
            self.unsaid, self.said_ns = False, now
            # The reason names the file already ("cannot write log PATH: ...").
            self.say(f"{self.reason}; dropping records until writes succeed again"
                     f"{self._unsaid_tally()}")  # fmt: skip

    def recovered(self) -> int:
        """A write went through: end the episode; returns how many records it lost."""
        if not self.failing:
            return 0
        lost = self.dropped
        if self.unsaid:  # short, and soon after the last one said
            self.unsaid_dropped += lost
            self.unsaid_episodes += 1
        else:
            self.say(f"{self.what}: writing again; {lost} records were dropped"
                     f"{self._unsaid_tally()}")  # fmt: skip
        self.dropped, self.reason, self.unsaid = 0, "", False
        return lost

    def _unsaid_tally(self) -> str:
        if not self.unsaid_episodes:
            return ""
        tally = (f" (and {self.unsaid_dropped} in {self.unsaid_episodes} short failing "
                 "episodes before, not said)")  # fmt: skip
        self.unsaid_dropped = self.unsaid_episodes = 0
        return tally
