"""Daemon configuration: file < environment < flags, and one-line errors naming the source."""

from __future__ import annotations

import argparse
import os
import re
import threading
from pathlib import Path

import pytest

from gpujitter.cli.options import watch_from_args
from gpujitter.daemon.service.config import SETTINGS, check_node, load_config
from gpujitter.errors import GpujitterError
from gpujitter.probes import registry
from gpujitter.probes.topology import load_override
from gpujitter.units import parse_duration_ns


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpujitter.toml"
    path.write_text(text)
    return path


def test_defaults_without_file_env_or_flags(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, ""), environ={})
    assert cfg["socket.mode"] == 0o660
    assert cfg["log.max_bytes"] == 64 * 1024**2
    assert cfg["watch.gpu_processes"] is True
    assert {src for _, _, src in cfg.explain()} == {"default"}
    assert len(cfg.explain()) == len(SETTINGS)


def test_file_then_env_then_flags_win(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [socket]
        path = "/tmp/a.sock"
        mode = "0640"
        [log]
        max_bytes = "10MiB"
        [probes]
        thresholds = { "sched.offcpu" = "2ms" }
        [watch]
        comms = ["python*", "torchrun"]
    """.replace("\n        ", "\n"),
    )
    env = {
        "GPUJITTER_SOCKET_PATH": "/tmp/b.sock",
        "GPUJITTER_LOG_KEEP": "3",
        "GPUJITTER_UNRELATED": "x",
    }
    flags = {"socket.path": ("--socket", "/tmp/c.sock"), "log.keep": ("--log-keep", None)}
    cfg = load_config(path, environ=env, flags=flags)
    assert cfg["socket.path"] == "/tmp/c.sock"
    assert cfg.origins["socket.path"] == "flag --socket"
    assert cfg["socket.mode"] == 0o640
    assert cfg["log.keep"] == 3 and cfg.origins["log.keep"] == "environment GPUJITTER_LOG_KEEP"
    assert cfg["log.max_bytes"] == 10 * 1024**2
    assert cfg["probes.thresholds"] == (("sched.offcpu", 2_000_000),)
    assert cfg["watch.comms"] == ("python*", "torchrun")


def test_env_lists_and_thresholds_are_comma_separated(tmp_path: Path) -> None:
    env = {"GPUJITTER_WATCH_PIDS": "12, 34", "GPUJITTER_PROBES_THRESHOLDS": "irq.stolen=50us"}
    cfg = load_config(write(tmp_path, ""), environ=env)
    assert cfg["watch.pids"] == (12, 34)
    assert cfg["probes.thresholds"] == (("irq.stolen", 50_000),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[socket]\nmode = "abc"\n', "socket.mode"),
        ('[socket]\nmode = "01777"\n', "octal file mode"),
        # 0o660 arrives as 432: read as octal digits it was 0o432, others may write
        ("[socket]\nmode = 0o660\n", "as a string"),
        ("[socket]\nmode = 660\n", "as a string"),
        ('[log]\nmax_bytes = "lots"\n', "bad size"),
        ('[sockett]\npath = "x"\n', "unknown setting sockett.path"),
        ('[socket]\npaht = "x"\n', "known in [socket]: socket.path"),
        ("[socket\n", "config"),
        ("socket = 3\n", "must be a [table]"),
        ('[watch]\npids = ["a"]\n', "watch.pids"),
        ('[watch]\ngpu_processes = "maybe"\n', "expected true or false"),
        ('[probes]\nthresholds = { "offcpu" = "1ms" }\n', "PROBE.KEY"),
        # tomllib's own words name neither the key nor that it came twice: the line does
        ("[log]\nkeep = 3\nkeep = 4\n", "Cannot overwrite a value (at line 3, column 9): keep = 4"),
        # past int()'s 4,300 digits: an internal error (exit 70)
        pytest.param("[log]\nkeep = " + "9" * 5000 + "\n", "a number too long", id="5000 digits"),
        pytest.param(
            '[log]\nkeep = "' + "9" * 5000 + '"\n', "at most 19 digits", id="5000 in a str"
        ),
        ("[watch]\ncomms = [true, 1]\n", "expected a list of strings"),  # was ('True', '1')
        ('[log]\nmax_bytes = "0.4"\n', "rounds to 0"),  # was 0: no limit
        ('[gaps]\nmin_gap = "0.4ns"\n', "rounds to 0"),
        # `$` matched before a final newline: a pod name that never matches, accepted
        ('[watch]\npods = ["ml/trainer-0\\n"]\n', "expected NAME or NAMESPACE/NAME"),
    ],
)
def test_bad_file_is_one_line_naming_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(GpujitterError) as err:
        load_config(path, environ={})
    assert message in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_bad_env_and_flag_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(GpujitterError, match=r"environment GPUJITTER_LOG_KEEP: log\.keep"):
        load_config(write(tmp_path, ""), environ={"GPUJITTER_LOG_KEEP": "many"})
    with pytest.raises(GpujitterError, match=r"flag --max: record\.max_bytes"):
        load_config(write(tmp_path, ""), environ={}, flags={"record.max_bytes": ("--max", "huge")})


def test_a_typo_in_a_variable_of_ours_is_refused_as_in_the_file(tmp_path: Path) -> None:
    """GPUJITTER_SOCKET_GROUPS in /etc/gpujitter/environment had no effect, without a word
    (the same key in the file stops the daemon)."""
    with pytest.raises(GpujitterError, match="environment GPUJITTER_SOCKET_GROUPS: unknown"):
        load_config(write(tmp_path, ""), environ={"GPUJITTER_SOCKET_GROUPS": "gpu"})
    # other tools' variables (and our own debug switch) are no settings, and left alone
    other = {"GPUJITTER_DEBUG": "1", "GPUJITTER_DRILL_PARENT": "7", "GPUJITTER_X": "y"}
    assert load_config(write(tmp_path, ""), environ=other)["socket.group"] == ""


def test_a_value_in_an_error_line_is_cut_short_and_escaped(tmp_path: Path) -> None:
    for value in ("9" * 5000, "9" * 5000 + "ms", "\x1b[31m" * 40):
        with pytest.raises(GpujitterError) as err:
            load_config(write(tmp_path, ""), environ={"GPUJITTER_GAPS_MIN_GAP": value})
        assert len(str(err.value)) < 300 and "\x1b" not in str(err.value), str(err.value)


def test_a_file_that_begins_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "gpujitter.toml"
    path.write_bytes(b"\xef\xbb\xbf[log]\nkeep = 3\n")  # was "Invalid statement"
    assert load_config(path, environ={})["log.keep"] == 3


def test_a_bare_min_gap_is_ms_after_the_flag_and_needs_a_unit_in_the_variable(
    tmp_path: Path,
) -> None:
    # GPUJITTER_GAPS_MIN_GAP=5 was 5 ns, `--min-gap 5` 5 ms: the variable asks for a unit
    # (silently changing what an installed unit's number means would hide every gap).
    empty = write(tmp_path, "")
    with pytest.raises(GpujitterError, match=r"GPUJITTER_GAPS_MIN_GAP: gaps\.min_gap: give a"):
        load_config(empty, environ={"GPUJITTER_GAPS_MIN_GAP": "5"})
    assert (
        load_config(empty, environ={"GPUJITTER_GAPS_MIN_GAP": "5ms"})["gaps.min_gap"] == 5 * 10**6
    )
    flags = {"gaps.min_gap": ("--min-gap", "7")}
    assert load_config(empty, environ={}, flags=flags)["gaps.min_gap"] == 7 * 10**6
    in_file = write(tmp_path, "[gaps]\nmin_gap = 5000000\n")
    assert load_config(in_file, environ={})["gaps.min_gap"] == 5 * 10**6


def test_something_not_a_file_at_the_default_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory or a dangling link at /etc/gpujitter/gpujitter.toml: defaults, silently.
    from gpujitter.daemon.service import config

    monkeypatch.setattr(config, "DEFAULT_PATH", tmp_path / "gpujitter.toml")
    assert load_config(environ={})["log.keep"] == 8  # nothing there: the defaults
    (tmp_path / "gpujitter.toml").symlink_to(tmp_path / "nowhere")
    with pytest.raises(GpujitterError, match=r"gpujitter\.toml: No such file"):
        load_config(environ={})
    (tmp_path / "gpujitter.toml").unlink()
    (tmp_path / "gpujitter.toml").mkdir()
    with pytest.raises(GpujitterError, match=r"gpujitter\.toml: not a regular file"):
        load_config(environ={})


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(GpujitterError, match="No such file"):
        load_config(tmp_path / "nope.toml", environ={})


def test_probe_selection_plain_names_replace_plus_names_add() -> None:
    defaults = registry.default_names()
    assert registry.select() == defaults
    assert registry.select(["sched", "faults"]) == ["sched", "faults"]
    # all but python_gil are on by default: adding one of them changes nothing, disabling
    # takes it out
    assert set(defaults) == set(registry.specs()) - {"python_gil"}
    assert registry.select(["+faults", "+swap"]) == defaults
    assert registry.select(["sched", "+swap"]) == ["sched", "swap"]
    assert registry.select(["+faults"], ["irq"]) == [n for n in defaults if n != "irq"]
    assert registry.select((), ["faults", "swap", "cstate"]) == [
        "sched", "irq", "malloc", "cuda", "python_gc", "python_stacks"
    ]  # fmt: skip
    with pytest.raises(GpujitterError, match="unknown probe 'fault'"):
        registry.select(["+fault"])
    # `probe` and `record` take names as arguments, `run --probes` a list: either spelling
    assert registry.select(["sched,faults"]) == registry.select(["sched", "faults"])
    assert registry.select(["+python_gil,", "+swap"]) == [*defaults, "python_gil"]


def load_in_time(path: Path) -> str:
    """The error loading `path` gives, within 10 s (a FIFO once hung the load for ever)."""
    result: list[str] = []

    def load() -> None:
        try:
            load_config(path, environ={})
        except GpujitterError as err:
            result.append(str(err))

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    loader.join(10)
    return result[0] if result else "no error in time"


def test_config_names_only_a_regular_file_of_bounded_size(tmp_path: Path) -> None:
    # Read whole, /dev/zero took all the memory there was and a FIFO waited for ever.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    for path, message in [
        (Path("/dev/null"), "not a regular file"),
        (tmp_path, "not a regular file"),
        (fifo, "not a regular file"),
        (big, "larger than 1 MiB; not a configuration"),
    ]:
        assert load_in_time(path) == f"config {path}: {message}"
    with pytest.raises(GpujitterError, match="topology override /dev/null: not a regular file"):
        load_override("/dev/null")


@pytest.mark.parametrize(
    ("environ", "flags"),
    [
        ({"GPUJITTER_LOG_MAX_BYTES": "9" * 400 + "K"}, {}),
        ({"GPUJITTER_GAPS_MIN_GAP": "1" + "0" * 400 + "ms"}, {}),
        ({}, {"probes.thresholds": ("-t", "sched.offcpu=1" + "0" * 400 + "s")}),
    ],
)
def test_numbers_past_a_float_are_too_large_not_an_internal_error(
    tmp_path: Path, environ: dict[str, str], flags: dict[str, tuple[str, str]]
) -> None:
    with pytest.raises(GpujitterError, match="too large"):
        load_config(write(tmp_path, ""), environ=environ, flags=flags)
    with pytest.raises(GpujitterError, match="too large"):
        parse_duration_ns("1" + "0" * 400, "s")  # -d, --min-gap of the other commands


@pytest.mark.parametrize(
    "key", ["log.path", "record.path", "socket.path", "state.dir", "topology.override"]
)
def test_a_path_with_a_nul_is_refused_before_anything_is_made(tmp_path: Path, key: str) -> None:
    # A socket was bound at the path cut short at the NUL, then the daemon died (exit 70).
    section, name = key.split(".")
    path = write(tmp_path, f'[{section}]\n{name} = "{tmp_path}/a\\u0000b"\n')
    with pytest.raises(GpujitterError, match=re.escape(f"{key}: a path cannot contain a NUL")):
        load_config(path, environ={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpujitter.toml"]
    with pytest.raises(GpujitterError, match=r"watch\.cgroups: a path cannot contain a NUL"):
        load_config(write(tmp_path, ""), environ={"GPUJITTER_WATCH_CGROUPS": "/sys/fs/cgroup/a\0b"})


def test_a_socket_path_too_long_to_bind_is_refused_before_its_directory_is_made(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60) / ("s" * 60)
    # the other settings that name places on the node off: nothing else is checked or made
    text = f'[socket]\npath = "{deep}"\n[log]\npath = ""\n[state]\ndir = ""\n'
    config = load_config(write(tmp_path, text), environ={})
    for starting in (True, False):  # --print-config checks it too (it makes no directory)
        with pytest.raises(GpujitterError, match=r"socket\.path: too long for a unix socket"):
            check_node(config, starting=starting)
    assert not deep.parent.exists()


@pytest.mark.parametrize("key", ["watch.cgroups", "log.path", "record.path", "state.dir"])
def test_a_name_too_long_for_the_kernel_is_one_line_not_an_internal_error(
    tmp_path: Path, key: str
) -> None:
    # Path.is_file() and is_dir() answer False only for what is missing: ENAMETOOLONG was
    # raised through check_node, the command's exit an internal error (70).
    long = f"{tmp_path}/{'n' * 300}"
    off = {"log.path": "", "state.dir": "", "socket.path": ""}  # nothing else checked
    env = {f"GPUJITTER_{k.replace('.', '_').upper()}": v for k, v in off.items()}
    name = f"GPUJITTER_{key.replace('.', '_').upper()}"
    config = load_config(write(tmp_path, ""), environ={**env, name: f"{long}/x"})
    with pytest.raises(GpujitterError, match=rf"{re.escape(key)}: .*File name too long") as err:
        check_node(config, starting=True)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400
    with pytest.raises(GpujitterError, match=r"flag --cgroup: .*File name too long"):
        watch_from_args(
            argparse.Namespace(pid=[], pod=[], slurm_job=[], comm=[], cgroup=[Path(long)])
        )
