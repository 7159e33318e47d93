"""Finding the files watched processes map, for probes that attach per file (libcuda, the
Python interpreter): which processes to look at now, and when one is done with.

Uprobes are per file, so one attachment serves every process that maps it; only a file not
seen before costs anything. A process is looked at every second until it has mapped what the
probe wants (frameworks load libcuda at their first CUDA call); with every process watched,
only during the first `late_load_ns` after it started. A process already running at the
first scan counts from its own start, not the daemon's: a job started with the daemon (a
node's boot, a restart of the service) that loads libcuda a second later is still looked
at, while one running for longer is looked at once (rescanning every process of a busy node
for a minute would cost more than the probe itself).
"""

from __future__ import annotations

import os

from gpujitter.probes.host import HostPaths, proc_pids
from gpujitter.probes.procfs import alive, process_age_ns

LATE_LOAD_NS = 60_000_000_000


def file_key(path: str) -> tuple[int, int] | None:
    """(device, inode) of a file: one attachment per file, whatever path reached it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class MappedScan:
    """Which processes to look at; call `due` each scan, `done` for a process found to map
    what was wanted, `forget` for one that exited, `forget_exited` to look for those."""

    def __init__(self, late_load_ns: int = LATE_LOAD_NS, paths: HostPaths | None = None) -> None:
        self.late_load_ns = late_load_ns
        self.paths = paths or HostPaths()
        self._own = os.getpid()
        self.scanned: set[int] = set()  # processes done with: found, or too old
        self._first_seen: dict[int, int] = {}
        self._started = False  # past the first scan

    def due(self, watched: list[int] | None, now_ns: int) -> list[int]:
        """The processes to look at in this scan (watched: None for every process). A
        process looked at now and not marked done is given up when every process is watched
        and it is older than late_load_ns."""
        # Every process but the daemon's own, which maps what it probes to read it.
        everyone = watched is None
        pids = (
            watched if watched is not None else [p for p in proc_pids(self.paths) if p != self._own]
        )
        out = []
        for pid in pids:
            if pid in self.scanned:
                continue
            first = self._first_seen.get(pid)
            if first is None:
                first = now_ns if self._started else self._start(pid, now_ns)
                self._first_seen[pid] = first
            out.append(pid)
            if everyone and now_ns - first > self.late_load_ns:
                self.scanned.add(pid)
        self._started = True
        return out

    def _start(self, pid: int, now_ns: int) -> int:
        """When a process found at the first scan started, on now_ns's clock (0, long ago,
        where its start cannot be read)."""
        age = process_age_ns(self.paths, pid)
        return 0 if age is None else now_ns - age

    def done(self, pid: int) -> None:
        self.scanned.add(pid)

    def forget_exited(self) -> list[int]:
        """Drop processes that exited (a reused pid is looked at afresh); returns them."""
        gone = [p for p in self._first_seen if not alive(self.paths, p)]
        for pid in gone:
            self.forget(pid)
        return gone

    def forget(self, pid: int) -> None:
        """Drop a process known to have exited."""
        self._first_seen.pop(pid, None)
        self.scanned.discard(pid)
