"""pyproject's package list and package data against the tree: the folders map onto
gpujitter.* by hand (package-dir), so a package folder missing from the list would be left
out of a wheel while the editable install still finds it."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def folder_of(package: str) -> Path:
    """Where a package's files live, through the longest package-dir prefix that maps it."""
    base = max((p for p in SETUP["package-dir"] if package == p or package.startswith(p + ".")),
               key=len)  # fmt: skip
    rest = package.removeprefix(base).lstrip(".").split(".")
    return ROOT / SETUP["package-dir"][base] / Path(*filter(None, rest))


def package_folders() -> set[Path]:
    return {
        init.parent
        for top in set(SETUP["package-dir"].values())
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_every_package_folder_is_in_the_package_list() -> None:
    listed = {folder_of(p) for p in SETUP["packages"]}
    assert package_folders() - listed == set()
    assert all(folder.is_dir() for folder in listed)


def test_every_file_a_package_ships_besides_python_is_package_data() -> None:
    data = SETUP["package-data"]
    for package in SETUP["packages"]:
        folder = folder_of(package)
        for path in folder.iterdir():
            if path.is_file() and path.suffix not in (".py", ".pyc"):
                name = path.relative_to(folder).as_posix()
                assert any(fnmatch.fnmatch(name, g) for g in data.get(package, [])), path


def test_the_console_script_exits_with_the_commands_code_and_a_frozen_heap(
    tmp_path: Path,
) -> None:
    """The script and `python -m gpujitter` go through cli.entry: the command's exit code,
    and the heap frozen before the interpreter's teardown (its last collections of the
    whole heap are what made a long-running daemon's exit slow)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"gpujitter": "gpujitter.cli:entry"}
    probe = (
        "import atexit, gc, runpy, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['gpujitter', 'report', sys.argv[1]]\n"
        "runpy.run_module('gpujitter', run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "none.gjtrace")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # report's one-line error for a missing file
    assert proc.stderr.startswith("gpujitter report: error:")
    assert proc.stdout.strip() == "frozen True"
