"""`gpujitter doctor --load` on this kernel: the core module and every registered probe are
really loaded for a moment, and fentry is really tried. Run as its own process (as the
command is): bcc keeps BPF_TABLE_PUBLIC tables registered process-wide after cleanup, so a
load here would leave stale table fds behind for the probe tests that follow."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from gpujitter.probes import registry


def test_doctor_load_core_every_probe_and_fentry() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpujitter", "doctor", "--load", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["check"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["load core"]["status"] == "pass"
    # The core's own programs (fork, exec, exit) are costed too, on its line.
    core = checks["load core"]["detail"]
    assert re.search(r"; BPF \d+ runs/s, \d+ ns/run, ", core), core
    loaded = {
        name.removeprefix("load "): c for name, c in checks.items() if name.startswith("load ")
    }
    assert set(loaded) == {"core", *registry.specs()}
    # malloc's tracepoints exist on this kernel: it must really run, and say what it cost.
    assert loaded["malloc"]["status"] == "pass"
    assert loaded["malloc"]["detail"].startswith("running; BPF "), loaded["malloc"]["detail"]
    # sched runs on every context switch, the doctor's own waits included: a real stretch
    # measured cannot read none (two reads microseconds apart read 0 for most probes and
    # tens of thousands a second for one that ran once).
    runs = {name: re.search(r"BPF (\d+) runs/s, ", c["detail"]) for name, c in loaded.items()}
    for name in ("sched", "irq", "cstate"):  # programs that run on an idle node too
        assert runs[name], loaded[name]["detail"]
    assert int(runs["sched"][1]) > 0, loaded["sched"]["detail"]
    # swap's programs are faults': its cost is said to be there, not "not measured".
    assert "BPF cost counted with faults" in loaded["swap"]["detail"], loaded["swap"]["detail"]
    # The daemon's own scheduling is applied to the doctor's threads and read back.
    assert checks["own scheduling"]["status"] == "pass", checks["own scheduling"]
    assert "batch nice 10" in checks["own scheduling"]["detail"]
    # This kernel refuses tracing programs (ENVIRONMENT.md); either answer must be a real one.
    fentry = checks["fentry"]
    assert fentry["status"] == "info"
    assert fentry["detail"].startswith(("refused (", "available;")), fentry["detail"]


def test_without_capabilities_probing_says_it_needs_root() -> None:
    """Root's uid with every capability dropped (setpriv): the probes cannot load, and the
    command says why in one line instead of bcc's compile errors."""
    drop = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    proc = subprocess.run(
        [*drop, sys.executable, "-m", "gpujitter", "probe", "sched", "--duration", "1s"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "gpujitter probe: error: loading the probes needs root (CAP_BPF and CAP_PERFMON, or "
        "CAP_SYS_ADMIN); run it with sudo (`gpujitter doctor` lists what is missing)"
    )
    doctor = subprocess.run([*drop, sys.executable, "-m", "gpujitter", "doctor", "--json"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert doctor.returncode == 1
    checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["privileges"]["status"] == "fail"
