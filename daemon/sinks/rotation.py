"""When a sink starts a new file and which old files it deletes: one policy for the trace
capture and the JSON-lines log, so `--record` and the attribution log rotate alike."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpujitter.errors import GpujitterError


@dataclass(frozen=True, slots=True)
class Rotation:
    """max_bytes: start a new file before one would grow past this (0: never by size).
    max_age_ns: start a new file when the current one is this old (0: never by age).
    keep_files / keep_bytes: at most this many files / bytes in all, the file being
    written included at its full max_bytes (0: no limit); the oldest go first, the current
    file never."""

    max_bytes: int = 0
    max_age_ns: int = 0
    keep_files: int = 0
    keep_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_age_ns", "keep_files", "keep_bytes"):
            if getattr(self, name) < 0:
                raise GpujitterError(f"rotation {name} must not be negative")
        if 0 < self.keep_bytes < self.max_bytes:
            raise GpujitterError(
                f"rotation keeps {self.keep_bytes} bytes in all but rotates at "
                f"{self.max_bytes}: the retention limit must be at least the file size"
            )

    def due(self, size: int, age_ns: int) -> bool:
        """Whether a file that would be `size` bytes, `age_ns` old, is due for a new one."""
        by_size = self.max_bytes > 0 and size > self.max_bytes
        by_age = self.max_age_ns > 0 and age_ns >= self.max_age_ns
        return by_size or by_age

    def prune(
        self, files: Sequence[Path], cannot_delete: Callable[[Path, OSError], None]
    ) -> list[Path]:
        """Delete the oldest of `files` (oldest first; the last is the one being written)
        until the limits hold. Returns what was deleted. A file that cannot be deleted (a
        directory by that name, a mount point, no permission) is kept and handed to
        `cannot_delete`: deleting is housekeeping, and must not stop the sink writing."""
        sizes = [_size(f) for f in files]
        # The file being written will grow to max_bytes: leave room for it now, so that the
        # limit holds until the next rotation, not only at this moment.
        sizes[-1] = max(sizes[-1], self.max_bytes)
        total = sum(sizes)
        removed: list[Path] = []
        for i, path in enumerate(files[:-1]):
            too_many = self.keep_files > 0 and len(files) - i > self.keep_files
            too_big = self.keep_bytes > 0 and total > self.keep_bytes
            if not (too_many or too_big):
                break
            # Counted as gone either way: newer files are not deleted to make up for one
            # that is not the sink's to delete.
            total -= sizes[i]
            try:
                path.unlink(missing_ok=True)  # deleted by someone already: the limit holds
            except OSError as err:
                cannot_delete(path, err)
                continue
            removed.append(path)
        return removed


def say_once(what: str, say: Callable[[str], None]) -> Callable[[Path, OSError], None]:
    """A `cannot_delete` for `prune` that tells `say` about the first such file only: the same
    file comes up at every rotation (a log's under its next number), and one line for each
    would bury the journal."""
    told = False

    def cannot_delete(path: Path, err: OSError) -> None:
        nonlocal told
        if not told:
            told = True
            say(f"{what}: cannot delete old file {path}: {err.strerror or err}; keeping it "
                "and writing on (said once)")  # fmt: skip

    return cannot_delete


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # gone, or not ours to read: prune then fails on it, and says so
        return 0


def fsync_dir(path: Path) -> None:
    """Make a create, rename or unlink in `path` durable (the entry lives in the directory)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
