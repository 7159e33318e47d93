"""pyproject's package list and package data against the tree: the folders map onto
gpujitter.* by hand (package-dir), so a package folder missing from the list would be left
out of a wheel while the editable install still finds it."""

from __future__ import annotations

import fnmatch
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
