"""The drills' undo log (daemon/drill/system.py): what a drill that died without cleaning up
left changed is put back by the next one, and only where that drill is gone."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gpujitter.daemon.drill import system


def killed_drill(root: Path, name: str, pid: int, started: float, *changes: dict) -> Path:
    folder = root / f"gpujitter-drill-{name}"
    folder.mkdir()
    lines = [{"pid": pid, "started": started}, *changes]
    (folder / system.UNDO_LOG).write_text("".join(json.dumps(c) + "\n" for c in lines))
    return folder


def test_a_dead_drills_changes_are_put_back_and_its_folder_removed(tmp_path: Path) -> None:
    setting = tmp_path / "read_ahead_kb"
    setting.write_text("4096\n")  # what the drill set; it found 128
    gone = _a_dead_pid()
    folder = killed_drill(tmp_path, "a", gone, 1.0, {"write": str(setting), "value": "128"})
    notes = system.recover_killed(tmp_path)
    assert setting.read_text() == "128"
    assert notes == [f"a killed drill (pid {gone}) left {setting} changed: put back to 128"]
    assert not folder.exists()


def test_a_running_drill_and_a_foreign_folder_are_left_alone(tmp_path: Path) -> None:
    setting = tmp_path / "page-cluster"
    setting.write_text("0")
    me = os.getpid()
    running = killed_drill(tmp_path, "b", me, system._started(me),
                           {"write": str(setting), "value": "3"})  # fmt: skip
    foreign = tmp_path / "gpujitter-drill-c"
    foreign.mkdir()
    (foreign / system.UNDO_LOG).write_text("not json\n")
    assert system.recover_killed(tmp_path) == []
    assert setting.read_text() == "0" and running.exists() and foreign.exists()


def test_the_same_pid_started_again_is_another_process(tmp_path: Path) -> None:
    """A pid is reused: the log's start time tells the drill from a later process."""
    setting = tmp_path / "page-cluster"
    setting.write_text("0")
    killed_drill(tmp_path, "d", os.getpid(), 1.0, {"write": str(setting), "value": "3"})
    assert len(system.recover_killed(tmp_path)) == 1 and setting.read_text() == "3"


def _a_dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
