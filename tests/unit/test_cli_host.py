"""Live smoke tests of `gpujitter doctor`, `audit` and `topo` on this host: valid JSON,
doctor's exit status, the override named wherever it is used, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HOSTS = Path(__file__).parents[1] / "fixtures" / "hosts"


def gpujitter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpujitter", *args], capture_output=True, text=True, timeout=120
    )


def test_doctor_json_exits_0_here() -> None:
    proc = gpujitter("doctor", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["topology_override"] is None
    checks = {c["check"]: c for c in report["checks"]}
    assert {"kernel", "btf", "tracefs", "bcc", "headers", "privileges", "nvml"} <= set(checks)
    assert all(c["status"] in ("pass", "warn", "info") for c in report["checks"])


def test_doctor_text_has_one_line_per_check_and_fixes() -> None:
    proc = gpujitter("doctor")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("PASS  kernel")
    warned = [n for n, line in enumerate(lines) if line.startswith("WARN")]
    assert warned and all(lines[n + 1].strip().startswith("fix: ") for n in warned)
    assert lines[-1].startswith("profiling can run: ")


def test_audit_json_here() -> None:
    proc = gpujitter("audit", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    rules = {f["rule"] for f in report["findings"]}
    assert {"memory.swappiness", "cpu.idle_states", "irq.affinity", "gpu.persistence"} <= rules
    assert all(f["evidence"] for f in report["findings"])


def test_audit_fail_on_and_rule_filter() -> None:
    clean = gpujitter("audit", "--root", str(HOSTS / "two-node-gpu"), "--fail-on", "warn")
    assert clean.returncode == 0, clean.stdout
    only = gpujitter("audit", "--json", "--root", str(HOSTS / "two-node-gpu"), "--rule", "memory")
    assert {f["rule"].split(".")[0] for f in json.loads(only.stdout)["findings"]} == {"memory"}


def test_topo_json_here() -> None:
    proc = gpujitter("topo", "--json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["override"] is None and record["cpu_node"]
    assert record["idle"]["states"] and record["irqs"]


def test_override_is_named_by_topo_audit_and_doctor(tmp_path: Path) -> None:
    override = tmp_path / "split.toml"
    cpus = json.loads(gpujitter("topo", "--json").stdout)["cpu_node"]
    first = min(int(c) for c in cpus)
    rest = ",".join(c for c in cpus if int(c) != first) or str(first)
    nodes = f'0 = "{first}"\n1 = "{rest}"\n' if len(cpus) > 1 else f'0 = "{first}"\n'
    override.write_text("[nodes]\n" + nodes)
    banner = f"TOPOLOGY OVERRIDE {override} in force"
    topo = gpujitter("topo", "--topology-override", str(override))
    assert topo.stdout.startswith(banner)
    assert json.loads(gpujitter("topo", "--json", "--topology-override", str(override)).stdout)[
        "override"
    ] == str(override)
    audit = gpujitter("audit", "--topology-override", str(override))
    assert audit.stdout.startswith(banner)
    assert json.loads(gpujitter("audit", "--json", "--topology-override", str(override)).stdout)[
        "topology_override"
    ] == str(override)
    doctor = json.loads(gpujitter("doctor", "--json", "--topology-override", str(override)).stdout)
    assert doctor["topology_override"] == str(override)
    (line,) = [c for c in doctor["checks"] if c["check"] == "topology"]
    assert f"OVERRIDE {override} in force" in line["detail"]


def test_gpu_minus_1_placed_by_the_override_is_named_by_topo_and_doctor(tmp_path: Path) -> None:
    override = tmp_path / "placed.toml"
    cpus = ",".join(json.loads(gpujitter("topo", "--json").stdout)["cpu_node"])
    override.write_text(f'[nodes]\n0 = "{cpus}"\n[gpus]\nunknown = 0\n')
    said = "GPU -1 (no bus id) placed on node 0 by the override"
    topo = gpujitter("topo", "--no-nvml", "--topology-override", str(override)).stdout
    assert topo.splitlines()[1] == said
    topo_json = gpujitter("topo", "--json", "--no-nvml", "--topology-override", str(override))
    assert json.loads(topo_json.stdout)["unknown_gpu_node"] == 0
    doctor = json.loads(gpujitter("doctor", "--json", "--topology-override", str(override)).stdout)
    (line,) = [c for c in doctor["checks"] if c["check"] == "topology"]
    assert said in line["detail"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("topo", "--root", "/nonexistent"), "--root /nonexistent: not a recorded tree"),
        (("audit", "--pid", "999999999"), "--pid 999999999: no such process"),
        # kthreadd: its memlock and allocator findings counted as real (--fail-on warn: 1)
        (("audit", "--pid", "2"), "--pid 2: a kernel thread (kthreadd), not a GPU process"),
        (("topo", "--topology-override", "/nonexistent.toml"), "No such file or directory"),
        # An unknown rule audited nothing and exited 0: a typo looked like a clean node.
        (("audit", "--rule", "nosuchrule"), "no audit rule 'nosuchrule'"),
        (("audit", "--rule", "memory.swapiness"), "families: cpu, gpu, irq, memory, process"),
        # A recording of another command ended in a NvmlPlaybackMissing traceback.
        (
            ("gpus", "--nvml-replay", "tests/fixtures/nvml/h200-training.jsonl"),
            "not recorded by `gpujitter gpus --nvml-record`",
        ),
        (("run", "--print-config", "--min-gap", "0"), "gaps.min_gap: expected a time above 0"),
        # --print-config is how a unit's command line is checked: all of it, -d too
        (("run", "--print-config", "-d", "bogus"), "bad duration 'bogus'"),
        # an empty value (an unset variable in a script) is a mistake, not "not given"
        (("run", "--print-config", "-d", ""), "bad duration ''"),
        (("report", "examples/h200-training.gjtrace", "--from", ""), "bad time ''"),
        # An empty path (an unset variable in a script) was read as this directory.
        (("topo", "--root", ""), "argument --root: an empty path was given"),
        (("top", "--replay", ""), "argument --replay: an empty path was given"),
        (("gaps", "--replay-events", ""), "argument --replay-events: an empty path was given"),
        (("run", "--print-config", "--config", ""), "argument --config: an empty path"),
        # told by the top parser (`gpujitter: error:`), unlike every other usage error
        (("doctor", "--bogus"), "unrecognized arguments: --bogus (see gpujitter doctor --help)"),
        # options that contradict each other, or do nothing where they are given
        (("gaps", "--no-nvml", "--nvml-record", "/tmp/x.jsonl"), "--no-nvml with --nvml-"),
        (
            ("top", "--replay", "examples/h200-training.gjtrace", "--pid", "1"),
            "--replay plays a recording: --pid would do nothing with it",
        ),
        # a saved audit that cannot be read opened the app, its Audit view saying why (exit 0)
        (
            ("top", "--replay", "examples/h200-training.gjtrace", "--audit", "/nonexistent"),
            "--audit: cannot read /nonexistent: No such file or directory",
        ),
        (("top", "--audit", "/tmp"), "--audit: cannot read /tmp: not a regular file"),
        (("top", "--audit", "/dev/zero"), "--audit: cannot read /dev/zero: not a regular file"),
        (("top", "--audit", "README.md"), "--audit: README.md: not JSON"),
        # the live view has no playback: taken, and they did nothing
        (("top", "--paused"), "--paused would do nothing without --replay"),
        (("top", "--at", "end", "--speed", "2"), "--at, --speed would do nothing without --replay"),
        # the daemon's snapshot as it is: they were taken, unchecked, and did nothing
        (
            ("top", "--json", "--probes", "nosuch", "--audit", "x.json", "--at", "bogus"),
            "--json prints the daemon's snapshot as it is: --probes, --audit, --at would do",
        ),
        # checked after the drill ran (8-60 s), its score then lost
        (
            ("drill", "clean", "--duration", "5s", "--keep-trace", "/nonexistent/x.gjtrace"),
            "--keep-trace /nonexistent/x.gjtrace: no folder /nonexistent",
        ),
        # a folder root may "access" that takes no file: found after the drill before
        (
            ("drill", "clean", "--duration", "5s", "--keep-trace", "/proc/x.gjtrace"),
            "--keep-trace /proc/x.gjtrace: folder /proc takes no new file",
        ),
        (("gpus", "--json", "--nvml-record", "/sys/x.jsonl"), "folder /sys takes no new file"),
        # a name the system refuses was an internal error (exit 70), in the record's case
        # after the work
        (("topo", "--root", "/" + "r" * 300), "cannot read /rrr"),
        (("audit", "--root", "/" + "r" * 300), "File name too long"),
        (("record", "-o", "/tmp/" + "o" * 300, "-d", "1s"), "File name too long"),
    ],
)
def test_bad_input_is_one_line(args: tuple[str, ...], said: str) -> None:
    proc = gpujitter(*args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and said in proc.stderr
    assert proc.stderr.startswith(f"gpujitter {args[0]}: error: ")


def test_a_replay_speed_of_0_is_refused() -> None:
    """Speed 0 (or below) froze the replay."""
    proc = gpujitter("top", "--replay", "x.gjtrace", "--speed", "0")
    assert proc.returncode == 2
    assert proc.stderr == (
        "gpujitter top: error: argument --speed: want a speed above 0 and at most 1000, "
        "not '0' (see gpujitter top --help)\n"
    )


@pytest.mark.parametrize("command", ["doctor", "audit", "topo"])
def test_help_has_examples(command: str) -> None:
    proc = gpujitter(command, "--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and f"gpujitter {command}" in proc.stdout
    assert "--json" in proc.stdout


@pytest.mark.parametrize(("given", "ns"), [("5", 5_000_000), ("0.5", 500_000), ("200us", 200_000)])
def test_run_reads_a_bare_min_gap_in_ms_as_gaps_does(given: str, ns: int) -> None:
    """`run --min-gap 5` meant 5 ns (the file's unit for a bare number), `gaps --min-gap 5`
    5 ms: one flag, two meanings."""
    proc = gpujitter("run", "--print-config", "--json", "--min-gap", given)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gaps.min_gap"] == {"value": ns, "source": "flag --min-gap"}


@pytest.mark.parametrize(
    ("at", "said"),
    [
        ("99:00:00", "cannot seek to '99:00:00': hour must be in 0..23"),
        ("12:61", "cannot seek to '12:61': minute must be in 0..59"),
        ("nan%", "bad position 'nan%': want 0% to 100%"),
        ("inf%", "bad position 'inf%': want 0% to 100%"),
    ],
)
def test_a_replay_position_past_the_clock_is_one_line(at: str, said: str) -> None:
    """--at 99:00:00 ended in an internal error (ValueError from datetime.replace); inf% in
    an OverflowError."""
    proc = gpujitter("top", "--replay", "examples/h200-training.gjtrace", "--at", at)
    assert proc.returncode == 2
    assert proc.stderr == f"gpujitter top: error: {said}\n"


def test_ctrl_c_before_the_command_runs_is_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while a command's module was still importing (the first ~60 ms) printed a
    40-line KeyboardInterrupt traceback."""
    import gpujitter.cli as cli

    def interrupted() -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    monkeypatch.setattr(cli.gc, "freeze", lambda: None)  # the test process's heap stays as is
    with pytest.raises(SystemExit) as ended:
        cli.entry()
    assert ended.value.code == 130 and capsys.readouterr().err == ""
