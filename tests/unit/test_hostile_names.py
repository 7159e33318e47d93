"""Names chosen by other processes reach the terminal inert on every text surface: the
attribution line (run's console, report, drill), report, probe, audit, the tables, and JSON
printed to a terminal; and names differing in one invalid byte stay distinct."""

from __future__ import annotations

import io
from pathlib import Path

import orjson
import pytest

from gpujitter.cli import main
from gpujitter.cli.output import print_json, print_ndjson, table
from gpujitter.cli.probe import describe
from gpujitter.daemon.analysis.describe import one_line
from gpujitter.daemon.service.service import Console
from gpujitter.daemon.sinks.trace import TraceWriter
from gpujitter.probes.base import comm_str
from gpujitter.probes.events import ClockRef, OffCpu
from tests.fixtures.streams.synthetic import TWO_NODES, Stream
from tests.unit.conftest import MakeTree
from tests.unit.trace_samples import header

# What any local user can call a process (comm is 15 bytes; the kernel keeps any but NUL):
# a terminal title, CSI sequences, the 8-bit CSI, a bidi override, markup, invalid UTF-8.
TITLE = comm_str(b"\x1b]0;pwned\x07")
NAMES = [
    TITLE,
    comm_str(b"\x1b[2J\x1b[1A"),
    comm_str("\x9b6n".encode()),
    comm_str("gpt\u202etxt.sh".encode()),
    comm_str(b"[bold red]x[/]"),
    comm_str(b"nl\nfix: rm -rf"),
    comm_str(b"ab\xff"),
    comm_str(b"ab\xfe"),
]


def controls(text: str) -> list[str]:
    """Characters a terminal would act on or hide (line breaks between lines aside)."""
    return [ch for line in text.split("\n") for ch in line if not ch.isprintable()]


def attribution_behind(name: str, irq_name: str = "nvme0q3"):
    """A gap whose run-queue wait names `name` and whose IRQ time names `irq_name`."""
    s = Stream().offcpu(100, 125, runnable=100, state="preempted", other=555, other_comm=name)
    s.irq(126, 132, irq=36, name=irq_name, count=3, total=6)
    return s.ran(0, 1000).gap(100, 140)


def test_kernel_names_that_differ_in_an_invalid_byte_stay_distinct() -> None:
    # errors="replace" made both "ab\ufffd".
    assert comm_str(b"ab\xff\0\0") == "ab\\xff"
    assert comm_str(b"ab\xff") != comm_str(b"ab\xfe")


def test_the_attribution_line_shows_names_inert_and_distinct() -> None:
    lines = {name: one_line(attribution_behind(name, irq_name=name).one()) for name in NAMES}
    for line in lines.values():
        assert controls(line) == [], line
    assert "behind \\x1b]0;pwned\\x07 (tid 555)" in lines[TITLE]
    assert "\\u009b6n" in lines[comm_str("\x9b6n".encode())]
    assert "gpt\\u202etxt.sh" in lines[comm_str("gpt\u202etxt.sh".encode())]
    assert "nl\\x0afix: rm -rf" in lines[comm_str(b"nl\nfix: rm -rf")]
    assert len(set(lines.values())) == len(NAMES)


def test_runs_console_prints_names_inert_as_text_and_as_json() -> None:
    attr = attribution_behind(TITLE).one()
    text, as_json = io.StringIO(), io.StringIO()
    bidi = attribution_behind(comm_str("\x9b\u202e".encode())).one()
    for out, attrs in ((text, [attr]), (as_json, [attr, bidi])):
        console = Console(out, as_json=out is as_json, clock=None)
        for a in attrs:
            console.attribution(a)
        console.close()  # its thread has written everything
    assert controls(text.getvalue()) == [] and "\\x1b]0;pwned\\x07" in text.getvalue()
    assert controls(as_json.getvalue()) == []
    first, second = (orjson.loads(line) for line in as_json.getvalue().splitlines())
    assert first["parts"][0]["evidence"][0]["comm"] == TITLE  # JSON keeps the name itself
    assert second["parts"][0]["evidence"][0]["comm"] == "\x9b\u202e"


def hostile_trace(path: Path) -> Path:
    """A recording whose host, task and IRQ names are control sequences."""
    writer = TraceWriter(path, header(topology=TWO_NODES, host="node\x1b[8m-7"))
    for ev in attribution_behind(TITLE, irq_name="\x9bq").in_emission_order():
        writer.write(ev)
    writer.close()
    return path


def test_report_prints_names_inert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = hostile_trace(tmp_path / "hostile.gjtrace")
    assert main(["report", str(trace)]) == 0
    out = capsys.readouterr().out
    assert controls(out) == []
    assert "behind \\x1b]0;pwned\\x07 (tid 555)" in out and "node\\x1b[8m-7" in out
    assert main(["report", "--json", str(trace)]) == 0
    out = capsys.readouterr().out
    assert controls(out) == [] and "\\u009bq" in out


def test_trace_and_error_lines_show_what_a_file_holds_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = hostile_trace(tmp_path / "hostile.gjtrace")
    assert main(["trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert controls(out) == [] and "host node\\x1b[8m-7" in out
    assert main(["report", str(tmp_path / "\x1b]0;pwned\x07.gjtrace")]) == 2
    err = capsys.readouterr().err
    assert controls(err) == [] and "\\x1b]0;pwned\\x07.gjtrace" in err


def test_probe_lines_show_names_inert() -> None:
    ev = OffCpu(ts_ns=10, end_ns=20, tid=1, tgid=1, cpu=0, cpu_in=0, state="preempted",
                runnable_ns=10, other_tid=555, other_comm=TITLE,
                comm="gpt\u202etxt.sh")  # fmt: skip
    line = describe(ev, ClockRef(ts_ns=0, realtime_ns=1_700_000_000_000_000_000))
    assert controls(line) == []
    assert "other_comm=\\x1b]0;pwned\\x07" in line and "comm=gpt\\u202etxt.sh" in line


def test_tables_show_cells_inert_and_keep_their_columns() -> None:
    text = table(["PID", "NAME", "N"], [(1, TITLE, 2), (3, "ab\\xff", 4)])
    assert controls(text) == []
    header_line, first, second = text.split("\n")
    assert first.rindex("2") == second.rindex("4") == header_line.rindex("N")


def test_json_printed_to_a_terminal_is_inert(capsys: pytest.CaptureFixture[str]) -> None:
    value = {"comm": "\x9b\u202e\x7f\x1b"}
    print_json(value)
    print_ndjson(value)
    out = capsys.readouterr().out
    assert controls(out) == []
    assert [orjson.loads(x) for x in (out[: out.rindex("{")], out[out.rindex("{") :])] == [
        value,
        value,
    ]


def test_audit_shows_a_gpu_process_name_inert_and_lossless(
    host_tree: MakeTree, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = host_tree("two-node-gpu", "two-node-gpu-bad")
    (paths.proc / "4242" / "comm").write_bytes(b"\x1b]0;pwned\x07\xff\n")
    main(["audit", "--root", str(paths.proc.parent), "--no-nvml"])
    out = capsys.readouterr().out
    assert controls(out) == []
    assert "pid 4242 (\\x1b]0;pwned\\x07\\xff)" in out
    main(["audit", "--root", str(paths.proc.parent), "--no-nvml", "--json"])
    procs = orjson.loads(capsys.readouterr().out)["processes"]
    assert {p["pid"]: p["comm"] for p in procs}[4242] == "\x1b]0;pwned\x07\\xff"
