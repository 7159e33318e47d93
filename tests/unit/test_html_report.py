"""`gpujitter report --html`: one self-contained page, rendered by a real browser (headless
Chromium) in the test, with the recording's own text escaped."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpujitter.cli import main
from gpujitter.daemon.analysis.pipeline import Pipeline
from gpujitter.daemon.offline.html_report import Page
from gpujitter.daemon.sinks.trace import TraceWriter
from gpujitter.probes.clock import Clocks
from gpujitter.probes.events import ClockRef
from tests.fixtures.streams.feeding import FeedingLoop
from tests.fixtures.streams.synthetic import TWO_NODES
from tests.unit.test_cli_report import attributions
from tests.unit.trace_samples import header, one_gap_trace

KINDS = ("contention", "swap", "irq", "faults", "clean")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """A recording of 60 feeding steps with stalls of several causes."""
    plan = [(k, 10.0 + 3 * i) if k != "clean" else (k, 0.0)
            for i, k in enumerate(KINDS * 12)]  # fmt: skip
    path = tmp_path / "run.gjtrace"
    writer = TraceWriter(path, header(topology=TWO_NODES, host="node<script>alert(1)</script>"))
    for ev in FeedingLoop(plan).build().delivered(seed=2):
        # the loop's clock reference is the header's to give: in a trace's events one is a
        # clock set during the run, which moves the times of the gaps after it
        if not isinstance(ev, ClockRef):
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


# sha256 and length of the pages the renderer wrote when it held every attribution and made
# its passes over all of them (before it took them one at a time), in UTC: the page it
# writes now must be the same, byte for byte. (The hostile pages since cd0ed04 write a file
# name's byte that is not UTF-8, caf\udce9, as caf\xe9: 2 bytes fewer at each.)
EARLIER = {
    "feeding": ("4d976033544f718691e2cb8df23bb355236b7e64ab20f1620677a126f7e7737b", 29739),
    "feeding_top3_gpu0": (
        "7f2a86a50b152845f7a58985e3046d9e6edb97095f60e6d5e4fec84e9f89e2e7",
        28465,
    ),
    "feeding_from_to": ("d1fca6fbf55864936773fce3d31d9e51ca11b2ec36cae7b0ab063fb8a70977cd", 25021),
    "feeding_none": ("94b0d0ba616b35ac88b63d0ee105232f7937cd699fdc7c51e790de7fbcbecb46", 1281),
    "hostile": ("9cd89b21a4d250e1358f38b0da44618ad8be00eb9e5f2d159babba7dec373232", 21656),
    "hostile_top0": ("116b360b45a354d6013fb9b848d6216eb6b02f92c82f81b185cb8b95766e23f2", 16951),
    "hostile_top40": ("d4b32efc27c81389af63cd8961720de2bad630cd17da5feb25901b665f9645c6", 25832),
}
CASES = {  # what to read (the feeding loop's recording, or 250 hostile attributions), options
    "feeding": ("feeding", []),
    "feeding_top3_gpu0": ("feeding", ["--top", "3", "--gpu", "0"]),
    "feeding_from_to": ("feeding", ["--from", "+996s", "--to", "+997500ms"]),
    "feeding_none": ("feeding", ["--gpu", "7"]),
    "hostile": ("hostile", []),
    "hostile_top0": ("hostile", ["--top", "0"]),
    "hostile_top40": ("hostile", ["--top", "40", "--from", "+995s", "--to", "+996.5s"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_page_is_what_it_was_when_every_attribution_was_held(
    case: str, trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, utc: None
) -> None:
    """The page is made of sums, counts and the longest gaps taken as the attributions come,
    and of a few ints per gap for the chart over time (whose columns are known only at the
    end): several GPUs (and the unknown one), ties in duration and start, hostile names and
    causes, --top 0, --from/--to, none in range. Each is the page it was, to the byte."""
    source, options = CASES[case]
    if source == "hostile":

        def attributed(events, topology, config):
            for _ in events:  # read (the charts span the events), then the attributions
                pass
            yield from attributions(250, hostile=True)

        monkeypatch.setattr(Pipeline, "run", lambda _, events: attributed(events, None, None))
        trace = one_gap_trace(tmp_path / "one.gjtrace")
    page = tmp_path / "report.html"
    assert main(["report", str(trace), *options, "--html", str(page)]) == 0
    got = page.read_bytes()
    assert (hashlib.sha256(got).hexdigest(), len(got)) == EARLIER[case]


def test_the_recordings_span_is_said_by_the_clock_of_each_end(utc: None) -> None:
    """The page said the recording's end by its first clock: a clock set +5 s during the run
    (NTP's first sync) left the end 5 s off what the journal and the log had said."""
    s = 1_000_000_000
    clocks = Clocks(ClockRef(ts_ns=0, realtime_ns=1_767_268_800 * s))  # 2026-01-01 12:00:00
    clocks.add(ClockRef(ts_ns=30 * s, realtime_ns=(1_767_268_800 + 35) * s))
    text = Page(clocks).render(title="t", meta=[], start_ns=10 * s, end_ns=60 * s)
    assert "Recorded from 2026-01-01 12:00:10.000000 +0000 to 2026-01-01 12:01:05.000000" in text
