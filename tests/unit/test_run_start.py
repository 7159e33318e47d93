"""`gpujitter run` starts its probes' compile before it imports the daemon (whose ~0.1-0.4 s of
imports then run beside the compile: docs/performance.md, "The compile started ahead"), and
the CLI loads only the module of the command it was given."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

# A fresh process: what was imported when the compile would have started (it is stopped
# there), and which commands' modules the CLI loaded.
SCRIPT = """
import sys
from gpujitter.daemon.service import head_start

def stop_here(names, **kwargs):
    loaded = sorted(m for m in sys.modules if m.startswith(("gpujitter.daemon.service.service",
                                                            "gpujitter.cli.")))
    print(repr((list(names), loaded)))
    raise SystemExit(0)

head_start.compile_ahead = stop_here
from gpujitter.cli import main
main(["run", "--no-nvml", "--probes", "sched,irq", "--log", "", "--socket", "",
      "--config", sys.argv[1]])
"""


def test_run_starts_its_compile_before_it_imports_the_daemon(tmp_path: Path) -> None:
    (tmp_path / "empty.toml").touch()
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "empty.toml")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    names, loaded = ast.literal_eval(out.stdout.splitlines()[-1])
    assert names == ["sched", "irq"]
    # No daemon yet, and of the commands only `run` (and the helpers it uses).
    assert "gpujitter.daemon.service.service" not in loaded
    commands = {"gpujitter.cli." + c for c in ("top", "record", "probe", "gaps", "drill")}
    assert "gpujitter.cli.run" in loaded and not commands & set(loaded)
