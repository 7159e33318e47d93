"""What ships for Prometheus and Grafana (monitoring/): the alert rules pass promtool's check
and its unit tests, the metrics the daemon serves pass `promtool check metrics`, and every
gpujitter series the rules and the dashboard query is one the daemon exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpujitter.daemon.sinks.metrics import DaemonMetrics
from gpujitter.probes.events import ProbeStatus
from gpujitter.probes.nvml import GpuInfo

MONITORING = Path(__file__).parents[2] / "monitoring"
RULES = MONITORING / "prometheus" / "gpujitter.rules.yml"
DASHBOARD = MONITORING / "grafana" / "gpujitter.json"


def promtool(*args: str, stdin: bytes = b"", cwd: Path | None = None) -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is missing: `make setup` installs Debian's prometheus package")
    done = subprocess.run(
        [tool, *args], input=stdin, capture_output=True, timeout=60, cwd=cwd, check=False
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    return done.stdout.decode() + done.stderr.decode()


def busy_metrics() -> DaemonMetrics:
    """Every series the daemon can export, with values."""
    m = DaemonMetrics()
    m.set_gpus([GpuInfo(0, "NVIDIA H200", "GPU-a", "0000:3b:00.0", 0, (), True)])
    m.observe_gap(0, 0.07)
    m.observe_attribution(0, [("runq_wait", 0.05), ("unexplained", 0.02)])
    m.observe_probe(ProbeStatus(ts_ns=1, probe="sched", state="running", events=9, lost_user=1))
    m.observe_stream(clients=1, dropped_total=2)
    m.observe_engine(3)
    m.observe_sink("log", 4, failing=True)
    return m


def exported_names() -> set[str]:
    text = busy_metrics().exposition().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def queried_names(text: str) -> set[str]:
    return set(re.findall(r"\bgpujitter_[a-z_]+", text))


def test_alert_rules_pass_promtool_and_their_unit_tests() -> None:
    assert "SUCCESS: 6 rules found" in promtool("check", "rules", str(RULES))
    promtool("test", "rules", "gpujitter.rules.test.yml", cwd=RULES.parent)


def test_the_daemons_metrics_pass_promtool() -> None:
    out = promtool("check", "metrics", stdin=busy_metrics().exposition())
    assert out.strip() == ""  # no lint findings either


def test_rules_and_dashboard_query_only_what_the_daemon_exports() -> None:
    exported = exported_names()
    dashboard = json.loads(DASHBOARD.read_text())
    for text in (RULES.read_text(), json.dumps(dashboard)):
        queried = queried_names(text)
        assert queried and queried <= exported, queried - exported
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
