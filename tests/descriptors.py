"""The suite's descriptor guard: a test during which a descriptor that was open before it
started is closed or made to point at another file fails, naming the descriptor and what
it pointed to. A close of a number its caller does not own (a double close, a stale or an
uninitialised number) takes whatever holds that number now; twice that was pytest's own
capture file, and the run died without its report.

tests/conftest.py takes the fixture and the hook from here; `-p tests.descriptors` loads
them into any pytest session (tests/unit/test_descriptor_guard.py runs one)."""

from __future__ import annotations

import fcntl
import gc
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import pytest

# Where the copies of pytest's own descriptors live: above what tests open, below the
# usual limit of 1024 open files.
COPIES_FROM_FD = 900
# The descriptors pytest's capture points at its files while a test runs, and a test
# (capfd, the probes' captured_output) may point elsewhere for a while: checked only once
# the test's fixtures have put them back.
STANDARD_FDS = frozenset({0, 1, 2})


@dataclass(frozen=True, slots=True)
class Opened:
    """What one descriptor pointed to: the file's identity, and its name for a message."""

    dev: int
    ino: int
    name: str


def open_fds() -> dict[int, Opened]:
    """This process's descriptors (one listing of /proc/self/fd)."""
    table = {}
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        try:
            st = os.fstat(fd)
            name = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        table[fd] = Opened(st.st_dev, st.st_ino, name)
    return table


def lost_fds(before: dict[int, Opened], skip: frozenset[int] = frozenset()) -> dict[int, str]:
    """Each descriptor of `before` (but `skip`) that is closed or points elsewhere, said."""
    now = open_fds()
    lost = {}
    for fd, was in sorted(before.items()):
        is_ = now.get(fd)
        if fd in skip or (is_ is not None and (is_.dev, is_.ino) == (was.dev, was.ino)):
            continue
        lost[fd] = f"fd {fd} ({was.name}), open before the test, " + (
            "was closed" if is_ is None else f"now points to {is_.name}"
        )
    return lost


class PytestFds:
    """The descriptors open when the first test started (pytest's capture files, its copy
    of the terminal or report file), each with a copy kept high up: a test that closes one
    gets it back and fails with a report, instead of pytest dying at its next write."""

    def __init__(self) -> None:
        self.opened = {fd: o for fd, o in open_fds().items() if fd not in STANDARD_FDS}
        self.copies = {fd: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, COPIES_FROM_FD)
                       for fd in self.opened}  # fmt: skip

    def restore(self) -> dict[int, str]:
        """Put back any that a test closed or replaced, and say which."""
        lost = lost_fds(self.opened)
        for fd in lost:
            os.dup2(self.copies[fd], fd, inheritable=False)
        return lost


PYTEST_FDS = pytest.StashKey[PytestFds]()
BEFORE = pytest.StashKey[dict[int, Opened]]()  # a test's descriptors as its setup began


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """pytest's descriptors, taken before any test or fixture runs."""
    session.config.stash[PYTEST_FDS] = PytestFds()


@pytest.fixture(autouse=True)
def descriptors_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if a descriptor open before it was closed or replaced by its end
    (the test's own descriptors, and lazily opened session fixtures', may come and go)."""
    # A file or socket an earlier test left open, in a reference cycle, is closed whenever
    # the collector next runs: collected now, not blamed on this test. What lives on is
    # frozen, so each collection scans only what the last test made (~2 ms, not ~35).
    gc.collect()
    gc.freeze()
    request.node.stash[BEFORE] = open_fds()
    yield
    _check(request.node)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """The check right after the test's body (the fixture's runs after the teardown too),
    inside pytest's capture (trylast: innermost), so that a closed capture file is put back
    before pytest reads it; a failure of the test's own is then the context of this one."""
    try:
        return (yield)
    finally:
        _check(item, skip=STANDARD_FDS)


def _check(item: pytest.Item, skip: frozenset[int] = frozenset()) -> None:
    """Fail `item` for the descriptors lost since its setup began; each is said once."""
    pytest_fds = item.config.stash.get(PYTEST_FDS, None)
    lost = pytest_fds.restore() if pytest_fds is not None else {}
    before = item.stash.get(BEFORE, None)
    if before is not None and not lost:
        lost = lost_fds(before, skip)
        item.stash[BEFORE] = {fd: o for fd, o in before.items() if fd not in lost}
    if lost:
        pytest.fail("\n".join(lost.values()), pytrace=False)
