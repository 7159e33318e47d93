"""`gpujitter report --html`: one self-contained page, rendered by a real browser (headless
Chromium) in the test, with the recording's own text escaped."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpujitter.cli import main
from gpujitter.daemon.sinks.trace import TraceWriter
from tests.fixtures.streams.feeding import FeedingLoop
from tests.fixtures.streams.synthetic import TWO_NODES
from tests.unit.trace_samples import header

KINDS = ("contention", "swap", "irq", "faults", "clean")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """A recording of 60 feeding steps with stalls of several causes."""
    plan = [(k, 10.0 + 3 * i) if k != "clean" else (k, 0.0)
            for i, k in enumerate(KINDS * 12)]  # fmt: skip
    path = tmp_path / "run.gjtrace"
    writer = TraceWriter(path, header(topology=TWO_NODES, host="node<script>alert(1)</script>"))
    for ev in FeedingLoop(plan).build().delivered(seed=2):
        writer.write(ev)
    writer.close()
    return path


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    browser = shutil.which("chromium")
    if browser is None:
        pytest.fail("chromium is missing: `make setup` installs Debian's chromium")
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


def test_the_page_is_self_contained_and_escapes_the_recordings_text(
    trace: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(trace), "--html", str(page)]) == 0
    text = page.read_text()
    assert not re.search(r"(src|href)=|https?://|@import|url\(", text)  # nothing fetched
    assert "<script>" not in text and "node&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_a_real_browser_renders_the_charts_and_tables(trace: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(trace), "--html", str(page)]) == 0
    dom = chromium("--dump-dom", page.as_uri()).stdout
    assert "GPU0: 48 gaps" in dom
    assert dom.count("<rect") > 48  # stacked columns and histogram bars
    for heading in ("Idle time by cause over time", "Gap durations",
                    "Tasks that ran instead of the feeding threads",
                    "Interrupts that stole the feeding threads' time", "longest gaps"):  # fmt: skip
        assert heading in dom
    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", "--window-size=900,1200", page.as_uri())
    assert shot.stat().st_size > 20_000  # a blank page is a few kB
