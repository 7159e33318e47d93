"""`gpujitter doctor --load` on this kernel: the core module and every registered probe are
really loaded for a moment, and fentry is really tried. Run as its own process (as the
command is): bcc keeps BPF_TABLE_PUBLIC tables registered process-wide after cleanup, so a
load here would leave stale table fds behind for the probe tests that follow."""

from __future__ import annotations

import json
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
    loaded = {
        name.removeprefix("load "): c for name, c in checks.items() if name.startswith("load ")
    }
    assert set(loaded) == {"core", *registry.specs()}
    # malloc's tracepoints exist on this kernel: it must really run.
    assert (loaded["malloc"]["status"], loaded["malloc"]["detail"]) == ("pass", "running")
    # This kernel refuses tracing programs (ENVIRONMENT.md); either answer must be a real one.
    fentry = checks["fentry"]
    assert fentry["status"] == "info"
    assert fentry["detail"].startswith(("refused (", "available;")), fentry["detail"]
