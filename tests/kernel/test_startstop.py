"""Starting and stopping as a service, on this kernel: a stop leaves no uprobe behind in the
watched process (both ways the cuda probe attaches), the probes of a set compiled as one
module still run when one part of it does not compile, and a compile started ahead (`gpujitter
run`'s) is the one the set takes. The times are bench/startstop.py's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.drill.build import build_stub
from gpujitter.probes import registry
from gpujitter.probes.base import ProbeContext, ProbeUnavailable
from gpujitter.probes.bundle import Bundle, ModulePart, compile_ahead
from gpujitter.probes.cstate import CstateProbe
from gpujitter.probes.cuda import armed_sites
from gpujitter.probes.host import HostPaths
from gpujitter.probes.runner import ProbeThread
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import CoreBpf, WatchSpec
from tests.kernel.test_cuda import FEED

GPUJITTER = Path(sys.executable).with_name("gpujitter")


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stubcuda"))


@pytest.fixture
def holder(stub: Path) -> subprocess.Popen[str]:
    """A process that maps the stub libcuda and waits."""
    child = subprocess.Popen(
        [sys.executable, *FEED, str(stub), "[]"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert child.stdout is not None
    yield child
    child.kill()
    child.wait()


def mapped(pid: int, stub: Path) -> dict[str, bool]:
    """The stub's traced functions in process `pid`, once its loader has mapped it."""
    deadline = time.monotonic() + 30
    while not (sites := armed_sites(pid, str(stub))):
        assert time.monotonic() < deadline, "the stub was never mapped"
        time.sleep(0.05)
    return sites


def test_sigterm_detaches_every_uprobe(
    stub: Path, holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    assert not any(mapped(holder.pid, stub).values())
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(120)
    (tmp_path / "empty.toml").touch()
    daemon = subprocess.Popen(
        [str(GPUJITTER), "run", "--no-nvml", "--pid", str(holder.pid), "--probes", "sched,cuda",
         "--log", str(tmp_path / "a.jsonl"), "--socket", "",
         "--config", str(tmp_path / "empty.toml")],
        stdout=subprocess.DEVNULL, env={**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")},
    )  # fmt: skip
    try:
        assert notify.recv(4096).startswith(b"READY=1")
        armed = armed_sites(holder.pid, str(stub))
        assert armed and all(armed.values())  # every traced function of the stub
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=120) == 0
        notify.close()
    assert not any(armed_sites(holder.pid, str(stub)).values())


def test_per_address_uprobes_are_detached_too(stub: Path, holder: subprocess.Popen[str]) -> None:
    """Where the kernel has no uprobe-multi links (forced here), one uprobe per address."""
    mapped(holder.pid, stub)
    with ProbeThread(
        ["cuda"], topology=load_topology(), watch=WatchSpec(pids={holder.pid}),
        emit=lambda ev: True, options={"cuda": {"uprobe_multi": False}},
    ) as probes:  # fmt: skip
        assert [s.state for s in probes.statuses] == ["running"]
        armed = armed_sites(holder.pid, str(stub))
        assert armed and all(armed.values())
    assert not any(armed_sites(holder.pid, str(stub)).values())


def test_a_part_that_does_not_compile_leaves_the_others_running(tmp_path: Path) -> None:
    broken = tmp_path / "broken.bpf.c"
    broken.write_text(
        '#include "gpujitter.h"\nRAW_TRACEPOINT_PROBE(sched_switch) { return nope; }\n'
    )
    topology = load_topology()
    core = CoreBpf(WatchSpec(), topology, HostPaths())
    core.start(lambda ev: None)  # the maps every part refers to
    try:
        ctx = ProbeContext(topology=topology, emit=lambda ev: True)
        cstate = CstateProbe(registry.get("cstate"))
        ctx.bundle = Bundle([ModulePart("broken", broken), *cstate.parts(ctx)])
        with pytest.raises(ProbeUnavailable, match=r"broken\.bpf\.c.*nope.*the others run"):
            ctx.bundle.view("broken")
        cstate.start(ctx)
        ctx.bundle.release()
        try:
            assert cstate.state == "running" and cstate.programs()
            assert cstate.bpf.raw_tracepoint_fds  # its hooks attached
        finally:
            cstate.close()
    finally:
        core.close()


# The head of a script run in a fresh process: each bcc module it makes is listed in
# `made` as (the thread that made it, its text's sha256, its options).
MODULES_MADE = """
import hashlib, sys, threading
import bcc

made = []
real = bcc.BPF
class Counted(real):
    def __init__(self, *args, **kwargs):
        made.append((threading.current_thread().name,
                     hashlib.sha256(kwargs["text"]).hexdigest(), kwargs["cflags"]))
        super().__init__(*args, **kwargs)
bcc.BPF = Counted
"""

# A fresh process (the test session's core may be loaded already): each bcc module it
# compiles is counted, and a second probe set runs after the first.
ONE_COMPILE = (
    MODULES_MADE
    + """
from gpujitter.probes.runner import ProbeThread
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

kwargs = {"topology": load_topology(nvml=False), "watch": WatchSpec(pids={1})}
with ProbeThread(["sched", "irq"], emit=lambda ev: True, **kwargs) as first:
    states = [s.state for s in first.statuses]
print("first", len(made), *states)
with ProbeThread(["malloc"], emit=lambda ev: True, **kwargs) as second:
    states = [s.state for s in second.statuses]
print("second", len(made), *states)
"""
)


def test_the_core_compiles_in_the_first_probe_sets_module() -> None:
    out = subprocess.run(
        [sys.executable, "-c", ONE_COMPILE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.splitlines()[-2:]
    assert first.split() == ["first", "1", "running", "running"]
    # The second set compiles its own module and borrows the first's core.
    assert second.split() == ["second", "2", "running"]


def test_a_core_that_does_not_compile_leaves_no_part_running(tmp_path: Path) -> None:
    broken = tmp_path / "core.bpf.c"
    broken.write_text(
        '#include "gpujitter.h"\nRAW_TRACEPOINT_PROBE(sched_switch) { return nope; }\n'
    )
    ctx = ProbeContext(topology=load_topology(), emit=lambda ev: True)
    bundle = Bundle(
        [
            ModulePart("core", broken, essential=True),
            *CstateProbe(registry.get("cstate")).parts(ctx),
        ]
    )
    try:
        for part in bundle.parts:
            with pytest.raises(ProbeUnavailable, match=r"core\.bpf\.c.*nope"):
                bundle.view(part)
    finally:
        bundle.release()


def test_an_error_that_names_no_part_leaves_the_essential_part_running(tmp_path: Path) -> None:
    # Neither part is the real core (its maps are exported once per process) nor uses it.
    essential = tmp_path / "essential.bpf.c"
    essential.write_text("RAW_TRACEPOINT_PROBE(sched_waking) { return 0; }\n")
    # A map the kernel refuses (no entries): its error names the map, not the file.
    big = tmp_path / "big.bpf.c"
    big.write_text(
        "BPF_ARRAY(empty, u64, 0);\n"
        "RAW_TRACEPOINT_PROBE(sched_switch) {\n"
        "    int k = 0;\n"
        "    return empty.lookup(&k) ? 1 : 0;\n}\n"
    )
    bundle = Bundle([ModulePart("essential", essential, essential=True), ModulePart("big", big)])
    try:
        with pytest.raises(ProbeUnavailable, match="could not open bpf map: empty"):
            bundle.view("big")
        bundle.view("essential").cleanup()  # it compiled, alone
    finally:
        bundle.release()


def bpf_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.bpf.c"
    path.write_text(text)
    return path


def counted_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first line of the text of each bcc module made from now on."""
    import bcc

    texts: list[str] = []
    real = bcc.BPF

    class Counted(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            texts.append(kwargs["text"].decode().splitlines()[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(bcc, "BPF", Counted)
    return texts


def test_a_compile_started_ahead_is_the_one_its_parts_bundle_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiles = counted_compiles(monkeypatch)
    part = ModulePart(
        "ahead",
        bpf_file(tmp_path, "ahead", "RAW_TRACEPOINT_PROBE(sched_waking) { return 0; }\n"),
        essential=True,
    )
    compile_ahead([part])
    # The module is the file as it was then: a compile made now would fail.
    part.bpf_file.write_text("RAW_TRACEPOINT_PROBE(sched_waking) { return nope; }\n")
    bundle = Bundle([part])
    try:
        bundle.view("ahead").cleanup()
    finally:
        bundle.release()
    assert len(compiles) == 1


def test_a_compile_ahead_of_other_parts_is_freed_and_one_that_failed_is_not_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiles = counted_compiles(monkeypatch)
    good = ModulePart(
        "good",
        bpf_file(tmp_path, "good", "RAW_TRACEPOINT_PROBE(sched_waking) { return 0; }\n"),
        essential=True,
    )
    broken = ModulePart(
        "broken",
        bpf_file(tmp_path, "broken", "RAW_TRACEPOINT_PROBE(sched_switch) { return nope; }\n"),
    )
    compile_ahead([good])  # other parts than the bundle's: freed, not taken
    other = Bundle([good, broken])  # compiles both, then the good one alone
    assert len(compiles) == 3
    compile_ahead([good, broken])  # these parts, and the compile fails: its error is taken
    failed = Bundle([good, broken])  # compiles only the good one alone
    assert len(compiles) == 5
    try:
        for bundle in (other, failed):
            with pytest.raises(ProbeUnavailable, match=r"broken\.bpf\.c.*nope"):
                bundle.view("broken")
            bundle.view("good").cleanup()  # compiled without the broken part
    finally:
        other.release()
        failed.release()


# A fresh process each: the bcc modules made, by which thread, from which text and options:
# `gpujitter run` (its compile started ahead, before the daemon's imports), or the same
# probes' set started alone, as every other command starts it.
COMPILES = (
    MODULES_MADE
    + """
if sys.argv[1] == "run":
    from gpujitter.cli import main
    assert main(["run", "--no-nvml", "--quiet", "--pid", "1", "--probes", "sched,irq",
                 "--duration", "1", "--log", "", "--socket", "", "--config", sys.argv[2]]) == 0
else:
    from gpujitter.probes.runner import ProbeThread
    from gpujitter.probes.topology import load_topology
    from gpujitter.probes.watch import WatchSpec
    with ProbeThread(["sched", "irq"], emit=lambda ev: True, watch=WatchSpec(pids={1}),
                     topology=load_topology(nvml=False)):
        pass
print(repr(made))
"""
)


def test_run_compiles_once_ahead_from_the_text_and_options_of_a_start_without(
    tmp_path: Path,
) -> None:
    import ast

    (tmp_path / "empty.toml").touch()
    made = {}
    for how in ("run", "set"):
        out = subprocess.run(
            [sys.executable, "-c", COMPILES, how, str(tmp_path / "empty.toml")],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        made[how] = ast.literal_eval(out.stdout.splitlines()[-1])
    (ahead,) = made["run"]  # one compile, on its own thread
    (alone,) = made["set"]
    assert ahead[0] == "gpujitter-compile" and alone[0] == "gpujitter-probes"
    assert ahead[1:] == alone[1:]
