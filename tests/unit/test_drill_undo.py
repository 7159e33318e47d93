"""The drills' undo log (daemon/drill/system.py): what a drill that died without cleaning up
left changed is put back by the next one; only a dead drill's (its log no longer locked),
only changes a drill makes, and only from a folder no one else could have written."""

from __future__ import annotations

import fcntl
import json
import re
from pathlib import Path

import pytest

from gpujitter.daemon.drill import system


@pytest.fixture(autouse=True)
def settings_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # settings under tmp_path stand in for /proc/sys and /sys (the log names only those)
    monkeypatch.setattr(system, "_WRITABLE", re.compile(re.escape(str(tmp_path)) + r"/set-\w+"))


def drill_folder(root: Path, name: str, *lines: object) -> Path:
    folder = root / f"gpujitter-drill-{name}"
    folder.mkdir(mode=0o700)
    (folder / system.UNDO_LOG).write_text("".join(
        line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines))  # fmt: skip
    return folder


def setting(root: Path, name: str, value: str) -> Path:
    path = root / f"set-{name}"
    path.write_text(value + "\n")
    return path


def test_a_dead_drills_changes_are_put_back_and_its_folder_removed(tmp_path: Path) -> None:
    first, second = setting(tmp_path, "a", "0"), setting(tmp_path, "b", "4096")
    cut_short = '{"write": "/proc/sys/vm/swa'  # the drill killed while it wrote: dropped
    folder = drill_folder(tmp_path, "x", {"pid": 4121}, {"write": str(first), "value": "3"},
                          {"write": str(second), "value": "128"}, cut_short)  # fmt: skip
    notes = system.recover_killed(tmp_path)
    assert (first.read_text(), second.read_text()) == ("3", "128")
    assert notes == [  # most recent first
        f"a killed drill (pid 4121) left {second} changed: put back to 128",
        f"a killed drill (pid 4121) left {first} changed: put back to 3",
    ]
    assert not folder.exists()
    assert system.recover_killed(tmp_path) == []


def test_a_running_drill_is_left_alone(tmp_path: Path) -> None:
    value = setting(tmp_path, "a", "0")
    folder = drill_folder(tmp_path, "x", {"pid": 4121}, {"write": str(value), "value": "3"})
    with open(folder / system.UNDO_LOG) as held:  # the drill's own lock, as undo_log holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        assert system.recover_killed(tmp_path) == []
    assert value.read_text() == "0\n" and folder.exists()


def test_a_log_anyone_could_have_written_is_not_acted_on(tmp_path: Path) -> None:
    """/var/tmp is everyone's: a log that names a file no drill changes, or sits in a folder
    others may write, changes nothing, however it got there."""
    value = setting(tmp_path, "a", "0")
    strange = drill_folder(tmp_path, "x", {"pid": 1}, {"write": "/etc/sudoers", "value": "x"},
                           {"write": str(value), "value": "3"})  # fmt: skip
    notes = system.recover_killed(tmp_path)
    assert notes == [f"{strange / system.UNDO_LOG}: line 2 is not a change a drill makes; "
                     "left alone"]  # fmt: skip
    open_to_all = drill_folder(tmp_path, "y", {"pid": 1}, {"write": str(value), "value": "3"})
    open_to_all.chmod(0o777)
    for junk in ([1], {"pid": "1"}):
        drill_folder(tmp_path, f"z{len(str(junk))}", junk)
    notes = system.recover_killed(tmp_path)
    assert [n.split(": ", 1)[1] for n in notes] == [
        "line 2 is not a change a drill makes; left alone",
        "no drill named in its first line; left alone",
        "no drill named in its first line; left alone",
    ]
    assert value.read_text() == "0\n" and strange.exists() and open_to_all.exists()


def test_what_cannot_be_put_back_stays_for_the_next_drill(tmp_path: Path) -> None:
    first = setting(tmp_path, "a", "0")
    broken = tmp_path / "set-b"
    broken.mkdir()  # reads as no setting: this change cannot be put back
    folder = drill_folder(tmp_path, "x", {"pid": 4121}, {"write": str(first), "value": "3"},
                          {"write": str(broken), "value": "128"})  # fmt: skip
    (note,) = system.recover_killed(tmp_path)
    assert note == (f"a killed drill (pid 4121) left {broken} changed: could not put it back "
                    "(Is a directory)")  # fmt: skip
    assert first.read_text() == "0\n"  # the earlier change waits behind it, in order
    broken.rmdir()
    setting(tmp_path, "b", "4096")
    assert len(system.recover_killed(tmp_path)) == 2 and not folder.exists()


def test_doctor_shows_what_a_killed_drill_left(tmp_path: Path) -> None:
    from gpujitter.daemon.checks.doctor import DoctorEnv
    from gpujitter.daemon.checks.doctor.host import check_drill_leftovers
    from gpujitter.probes.host import HostPaths

    env = DoctorEnv(paths=HostPaths.under(tmp_path))
    assert list(check_drill_leftovers(env)) == []  # nothing to say: no line
    (tmp_path / "var/tmp").mkdir(parents=True)
    value = setting(tmp_path, "a", "0")
    folder = drill_folder(tmp_path / "var/tmp", "x", {"pid": 4121},
                          {"write": str(value), "value": "3"},
                          {"swap": "/var/tmp/gpujitter-drill-x/swap"})  # fmt: skip
    (result,) = check_drill_leftovers(env)
    assert result.status == "warn"
    assert result.detail == ("a killed drill (pid 4121) left: swap file "
                             f"/var/tmp/gpujitter-drill-x/swap; {value} changed")  # fmt: skip
    assert "gpujitter drill" in result.fix
    with open(folder / system.UNDO_LOG) as held:  # a drill that runs has left nothing
        fcntl.flock(held, fcntl.LOCK_EX)
        assert list(check_drill_leftovers(env)) == []
    assert folder.exists()  # looked at only
