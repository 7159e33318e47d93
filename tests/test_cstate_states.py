"""Idle-state names and exit latencies from cpuidle sysfs, on recorded trees: a CPU with a
driver's states, and a CPU without a driver (the kernel's default idle: HLT and polling)."""

from __future__ import annotations

from pathlib import Path

from gpujitter.probes.cstate import DEFAULT_IDLE, idle_states
from gpujitter.probes.host import HostPaths
from gpujitter.probes.topology import IdleState


def named(states: dict[int, IdleState]) -> dict[int, tuple[str, int]]:
    """State number -> (name, exit latency in ns as events carry it)."""
    return {n: (s.name, s.exit_latency_ns) for n, s in states.items()}


def write_state(root: Path, cpu: int, n: int, name: str, latency_us: str | None) -> None:
    d = root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{n}"
    d.mkdir(parents=True)
    (d / "name").write_text(name + "\n")
    if latency_us is not None:
        (d / "latency").write_text(latency_us + "\n")


def test_states_come_from_sysfs_per_cpu_with_latency_in_ns(tmp_path: Path) -> None:
    write_state(tmp_path, 0, 0, "POLL", "0")
    write_state(tmp_path, 0, 1, "C1E", "2")
    write_state(tmp_path, 0, 2, "C6", "133")
    write_state(tmp_path, 0, 3, "C10", None)  # a state whose latency file is missing
    states = idle_states(HostPaths.under(tmp_path), [0])
    assert named(states[0]) == {
        0: ("POLL", 0),
        1: ("C1E", 2_000),
        2: ("C6", 133_000),
        3: ("C10", -1),
    }


def test_a_cpu_without_cpuidle_gets_the_default_idle_names(tmp_path: Path) -> None:
    write_state(tmp_path, 0, 1, "haltpoll", "1")
    (tmp_path / "sys/devices/system/cpu/cpu1").mkdir(parents=True)
    states = idle_states(HostPaths.under(tmp_path), [0, 1])
    assert named(states[0]) == {1: ("haltpoll", 1_000)}
    assert states[1] == DEFAULT_IDLE
    assert named(states[1]) == {0: ("POLL", -1), 1: ("HLT", -1)}
