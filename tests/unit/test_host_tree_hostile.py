"""`audit --root` and `topo --root` on recorded trees whose files hold what a numeric check
let through and int() then refused (superscript digits, 5000-digit numbers, names that only
begin with digits), or a CPU mask long enough to stall the audit: each ended in an internal
error (exit 70) or ran for minutes. Found by fuzzing recorded trees. Every command must still
answer, in valid JSON, reading what it can."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpujitter import cli
from gpujitter.daemon.checks.audit.irqs import _mask
from tests.unit.conftest import MakeTree

HUGE = "9" * 5000
CPU0 = "sys/devices/system/cpu/cpu0/cpuidle"
GPU_FN = "sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0"


def _edit(rel: str, change: Callable[[str], str]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / rel
        path.write_text(change(path.read_text()))

    return apply


def _write(rel: str, text: str) -> Callable[[Path], None]:
    return lambda root: (root / rel).write_text(text) and None


def _second_row_label(label: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        lines = text.splitlines()
        lines[1] = label + ":" + lines[1].partition(":")[2]
        return "\n".join(lines) + "\n"

    return change


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "memlock not a number": _write("proc/4242/limits", "Max locked memory abc abc bytes\n"),
    "idle state folder state1x": lambda root: (root / CPU0 / "state1").rename(
        root / CPU0 / "state1x"
    ),
    "MSI vector folder 1x": lambda root: (root / GPU_FN / "msi_irqs/1x").write_text(""),
    "interrupts header CPU0 NUL": _edit(
        "proc/interrupts", lambda t: t.replace("CPU0", "CPU0\0", 1)
    ),
    "interrupts label superscript": _edit("proc/interrupts", _second_row_label("²")),
    "interrupts count of 5000 digits": _edit(
        "proc/interrupts", lambda t: t.replace(" 100 ", f" {HUGE} ", 1)
    ),
    "node distance of 5000 digits": _write(
        "sys/devices/system/node/node0/distance", f"10 {HUGE}\n"
    ),
    "swappiness superscript": _write("proc/sys/vm/swappiness", "²\n"),
    "swappiness of 5000 digits": _write("proc/sys/vm/swappiness", HUGE + "\n"),
    "numa_maps count of 5000 digits": _edit(
        "proc/4242/numa_maps", lambda t: t + f"7f0000000000 default anon=1 N0={HUGE}\n"
    ),
    "maps /dev/nvidia of 5000 digits": _edit(
        "proc/4242/maps",
        lambda t: t + f"7f0000000000-7f0000001000 rw-s 00000000 00:05 1 /dev/nvidia{HUGE}\n",
    ),
    "irqbalance mask of 1 MB": _write(
        "etc/default/irqbalance", "IRQBALANCE_BANNED_CPUS=" + "f" * (1 << 20) + "\n"
    ),
}


def _json_of(argv: list[str]) -> object:
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # the JSON writers write bytes
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
        out.flush()
    return json.loads(out.buffer.getvalue())  # type: ignore[attr-defined]


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_audit_and_topo_answer_whatever_the_tree_holds(host_tree: MakeTree, mutation: str) -> None:
    paths = host_tree("two-node-gpu", "two-node-gpu-bad")
    root = paths.proc.parent
    MUTATIONS[mutation](root)
    for command in ("audit", "topo"):
        assert _json_of([command, "--json", "--root", str(root)])


def test_topo_shows_the_idle_driver_and_governor_names_escaped(host_tree: MakeTree) -> None:
    # Its one line outside a table printed them raw (audit escaped them): a tree from
    # another machine, or sysfs itself, is not the user's own text.
    paths = host_tree("two-node-gpu")
    idle = paths.sys / "devices/system/cpu/cpuidle"
    (idle / "current_driver").write_text("\x1b]0;pwn\x07intel_idle\n")
    (idle / "current_governor").write_text("menu\x1b[31m\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["topo", "--no-nvml", "--root", str(paths.proc.parent)]) == 0
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    assert "driver \\x1b]0;pwn\\x07intel_idle, governor menu\\x1b[31m" in out.getvalue()


def test_a_cpu_mask_is_read_digit_by_digit() -> None:
    assert _mask("00000033") == [0, 1, 4, 5]
    assert _mask("1,00000000") == [32]
    assert _mask("f" * 16384) == list(range(65536))  # every CPU a kernel may have
    for bad in ("f" * 16385, "xyz"):
        with pytest.raises(ValueError):
            _mask(bad)
