"""What a file sink does when the disk refuses a write (full, over quota, I/O error): it keeps
the daemon running, drops the records it cannot write and counts them, says so once when
writing stops and once when it works again, and leaves the count in the file itself (the
log's next line, a trace's `meta.lost` record) as well as in status and metrics."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

# What a disk says when it has no room (for now): a sink that meets one of these at start
# starts anyway and tries again; any other error at start is a configuration error.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


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

    @property
    def failing(self) -> bool:
        return bool(self.reason)

    def failed(self, reason: str, ts_ns: int, records: int = 1) -> None:
        """`records` could not be written because of `reason`."""
        if not self.failing:
            self.reason = reason or "write failed"
            self.since_ns = ts_ns
            # The reason names the file already ("cannot write log PATH: ...").
            self.say(f"{self.reason}; dropping records until writes succeed again")
        self.dropped += records
        self.dropped_total += records

    def recovered(self) -> int:
        """A write went through: end the episode; returns how many records it lost."""
        if not self.failing:
            return 0
        lost = self.dropped
        self.say(f"{self.what}: writing again; {lost} records were dropped")
        self.dropped, self.reason = 0, ""
        return lost
