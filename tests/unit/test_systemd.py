"""The systemd unit and the example configuration: the unit passes `systemd-analyze verify`
without a word, its directories are the configuration's default paths, the example config
shows every setting and loads, and `make install` stages an idempotent install."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpujitter.daemon.service.config import DEFAULT_PATH, SETTINGS, load_config
from gpujitter.daemon.service.sdnotify import Notifier
from gpujitter.units import parse_duration_ns

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "gpujitter.service"
EXAMPLE_CONFIG = REPO / "systemd" / "gpujitter.toml"
OPERATIONS = REPO / "docs" / "operations.md"
INSTALLED_COMMAND = "/usr/local/bin/gpujitter"


def read_unit(path: Path = UNIT) -> dict[str, dict[str, list[str]]]:
    """{section: {key: [values, in order]}}. An empty assignment resets the key, as in systemd;
    a trailing backslash continues a line."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        if value.strip():
            current.setdefault(key.strip(), []).append(value.strip())
        else:
            current.pop(key.strip(), None)
    return sections


def service() -> dict[str, list[str]]:
    return read_unit()["Service"]


def one(key: str) -> str:
    (value,) = service()[key]
    return value


def seconds(value: str) -> float:
    """A systemd time span ("30s", "3min", "10ms") in seconds."""
    return parse_duration_ns(value.replace("min", "m")) / 1e9


def verifiable_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's venv: `systemd-analyze verify`
    refuses a unit whose command does not exist, and /usr/local/bin/gpujitter is not
    installed on a test machine."""
    venv_command = Path(sys.executable).with_name("gpujitter")
    text = UNIT.read_text().replace(f"ExecStart={INSTALLED_COMMAND} ", f"ExecStart={venv_command} ")
    assert text != UNIT.read_text(), "ExecStart no longer names /usr/local/bin/gpujitter"
    copy = tmp_path / UNIT.name
    copy.write_text(text)
    return copy


def test_systemd_analyze_verify_is_silent(tmp_path: Path) -> None:
    out = subprocess.run(
        ["systemd-analyze", "verify", str(verifiable_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def test_verify_would_report_a_broken_unit(tmp_path: Path) -> None:
    """The silence above means something: verify speaks up about an unknown key and about a
    missing command."""
    copy = verifiable_copy(tmp_path)
    copy.write_text(copy.read_text().replace("UMask=0027", "UMask=0027\nProtectEverything=yes"))
    out = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert "Unknown key 'ProtectEverything'" in out.stderr
    copy.write_text(UNIT.read_text())
    out = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0 and "is not executable" in out.stderr


def test_unit_is_a_notify_service_with_watchdog_restart_limits_and_reload() -> None:
    s = service()
    unit = read_unit()["Unit"]
    assert one("Type") == "notify" and one("NotifyAccess") == "main"
    assert s["ExecStart"] == [f"{INSTALLED_COMMAND} run"]
    assert one("Restart") == "on-failure"
    assert int(unit["StartLimitBurst"][0]) >= 3
    # Five slow failures (each up to TimeoutStartSec) must fit in the interval, or the start
    # limit never trips.
    start_s, restart_s = seconds(one("TimeoutStartSec")), seconds(one("RestartSec"))
    assert int(unit["StartLimitBurst"][0]) * restart_s < seconds(unit["StartLimitIntervalSec"][0])
    assert start_s >= 60  # clang compiles one program per probe before READY=1
    assert one("RestartPreventExitStatus") == "2"  # GpujitterError: config or environment
    assert one("SuccessExitStatus") == "130"  # a stop while the probes compile
    # A fault of gpujitter's own (exit 70) is restarted, and its traceback reaches the
    # journal: on a terminal it would be one line (gpujitter.cli.entry).
    assert one("Environment") == "GPUJITTER_DEBUG=1"


def test_watchdog_interval_reaches_the_daemon_as_half_the_timeout() -> None:
    """systemd passes WatchdogSec as WATCHDOG_USEC; the daemon's notifier pets at half of it."""
    usec = int(seconds(one("WatchdogSec")) * 1e6)
    n = Notifier({"NOTIFY_SOCKET": "@unused", "WATCHDOG_USEC": str(usec)})
    assert n.watchdog_interval_s == seconds(one("WatchdogSec")) / 2


def test_exec_reload_sends_sighup_to_the_main_pid(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, pathlib\n"
            "signal.signal(signal.SIGHUP, lambda *_: sys.exit(42))\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "signal.pause()\n",
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        command = one("ExecReload").replace("$MAINPID", str(child.pid)).split()
        subprocess.run(command, check=True, timeout=10)
        assert child.wait(timeout=10) == 42
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()


def test_config_default_paths_live_in_the_units_directories() -> None:
    defaults = {s.key: s.default for s in SETTINGS}
    assert Path(defaults["log.path"]).parent == Path("/var/log") / one("LogsDirectory")
    assert Path(defaults["socket.path"]).parent == Path("/run") / one("RuntimeDirectory")
    assert DEFAULT_PATH.parent == Path("/etc") / one("ConfigurationDirectory")
    # The unit reads GPUJITTER_* variables from the configuration directory too.
    assert service()["EnvironmentFile"] == [f"-{DEFAULT_PATH.parent}/environment"]


def test_umask_gives_0640_logs_and_0750_directories() -> None:
    umask = int(one("UMask"), 8)
    assert 0o666 & ~umask == 0o640
    assert 0o777 & ~umask == 0o750
    assert one("LogsDirectoryMode") == one("StateDirectoryMode") == "0750"


def test_example_config_shows_every_setting_with_its_default() -> None:
    cfg = load_config(EXAMPLE_CONFIG, environ={})
    from_file = {key for key, _, source in cfg.explain() if source == f"config {EXAMPLE_CONFIG}"}
    assert from_file == {s.key for s in SETTINGS}
    assert {s.key: cfg[s.key] for s in SETTINGS} == {s.key: s.default for s in SETTINGS}


def test_example_config_record_suggestion_is_in_the_state_directory() -> None:
    text = EXAMPLE_CONFIG.read_text()
    assert f'path = "/var/lib/{one("StateDirectory")}/' in text


def test_every_unit_option_is_in_the_operations_hardening_table() -> None:
    """docs/operations.md has a row for every [Service] sandbox or resource option the unit
    sets and for every option the unit's closing comment leaves out."""
    doc = OPERATIONS.read_text()
    section = doc[doc.index("## Hardening") :]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    left_out = [
        line.split()[1].split("=")[0]
        for line in UNIT.read_text().splitlines()
        if line.startswith("#   ") and "=" in line.split()[1]
    ]
    from tests.kernel.test_hardening import SANDBOX

    kept = [key for key in service() if key in SANDBOX]
    assert kept and left_out
    for key in kept + left_out:
        assert f"`{key}=`" in table, key


def staged_install(destdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "install-files", f"DESTDIR={destdir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def tree(root: Path) -> dict[str, tuple[int, str]]:
    """path -> (mode, content or link target), for comparing two installs."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = (0, os.readlink(path))
        elif path.is_file():
            out[rel] = (path.stat().st_mode & 0o7777, path.read_text())
        else:
            out[rel] = (path.stat().st_mode & 0o7777, "")
    return out


def test_make_install_stages_the_command_unit_config_and_docs(tmp_path: Path) -> None:
    # The daemon cannot write .pyc files under the unit's read-only filesystem: the
    # install byte-compiles the checkout (one module's cache removed first to see it).
    module = REPO / "probes" / "demangle.py"
    cached = Path(importlib.util.cache_from_source(str(module)))
    cached.unlink(missing_ok=True)
    out = staged_install(tmp_path)
    assert out.returncode == 0, out.stderr
    assert cached.stat().st_mtime >= module.stat().st_mtime
    command = tmp_path / INSTALLED_COMMAND.lstrip("/")
    assert os.readlink(command) == str(REPO / ".venv" / "bin" / "gpujitter")
    assert (tmp_path / "etc/systemd/system/gpujitter.service").read_text() == UNIT.read_text()
    config = tmp_path / str(DEFAULT_PATH).lstrip("/")
    assert config.read_text() == EXAMPLE_CONFIG.read_text()
    assert (tmp_path / "usr/local/share/doc/gpujitter/operations.md").is_file()
    first = tree(tmp_path)

    # Idempotent, and an operator's edited config survives a re-install (an upgrade).
    config.write_text(config.read_text().replace('group = ""', 'group = "gpujitter"'))
    edited = tree(tmp_path)
    out = staged_install(tmp_path)
    assert out.returncode == 0, out.stderr
    assert tree(tmp_path) == edited
    assert set(first) == set(edited)
