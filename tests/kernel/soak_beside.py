"""The short soak (tests/kernel/test_soak.py) runs beside the tests after the last one that
attaches probes, instead of alone: it is 100 s of wall time that mostly waits, and other
load on the node is load it welcomes (Makefile `soak`). Its plan and checks are unchanged;
its test, moved to the end of the session, waits for its verdict."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

SOAK_TEST = (
    "tests/kernel/test_soak.py::test_short_soak_accounts_for_every_attribution_and_never_hangs"
)
SOAK_S = 100.0
NAME = "soak-beside"


def attaches_probes(item: pytest.Item) -> bool:
    return item.nodeid.startswith("tests/kernel/") or item.get_closest_marker("kernel") is not None


def interruptible() -> None:
    """SIGINT ends the soak through its clean-up, even where the tests' own run ignores it
    (started in the background by a shell)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class SoakBeside:
    """Starts `python -m bench.soak --short` (its own process: no test's patching reaches
    it) as the first item after the last probe-attaching one sets up."""

    def __init__(self, start_before: pytest.Item) -> None:
        self.start_before = start_before
        self.work = Path(tempfile.mkdtemp(prefix="gpujitter-soak-beside-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is None:
            with (self.work / "stderr").open("wb") as stderr:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "bench.soak", "--short", "--minutes",
                     str(SOAK_S / 60), "--json", str(self.work / "result.json")],
                    cwd=Path(__file__).parents[2], stdout=subprocess.DEVNULL, stderr=stderr,
                    preexec_fn=interruptible,
                )  # fmt: skip

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if item is self.start_before:
            self.start()

    def result(self, timeout_s: float) -> dict[str, Any]:
        """The soak's result (started now if no earlier test did), once it has ended."""
        self.start()
        assert self.proc is not None
        self.proc.wait(timeout_s)
        found = self.work / "result.json"
        assert found.exists(), (self.work / "stderr").read_text()[-4000:]
        return json.loads(found.read_text())  # type: ignore[no-any-return]

    def pytest_sessionfinish(self) -> None:
        if self.proc is not None and self.proc.poll() is None:  # the session was cut short
            self.proc.send_signal(signal.SIGINT)  # its clean-up runs: the daemon, the tmpfs
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.work, ignore_errors=True)


def plan_beside(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the soak's test to the end and have it start after the last probe-attaching
    test (at once if there is none), when it is selected."""
    soak = next((i for i in items if i.nodeid == SOAK_TEST), None)
    if soak is None:
        return
    items.remove(soak)
    last = max((n for n, i in enumerate(items) if attaches_probes(i)), default=-1)
    items.append(soak)
    config.pluginmanager.register(SoakBeside(items[last + 1]), NAME)


def running(config: pytest.Config) -> SoakBeside:
    beside = config.pluginmanager.get_plugin(NAME)
    assert isinstance(beside, SoakBeside)
    return beside
