"""The Audit view's adapter to `gpujitter audit`: its --json document (daemon/checks/audit, see
`gpujitter audit --help`) decoded into findings. Live, the audit runs as that command in a
worker thread (it reads /proc and /sys and may ask NVML: a second or so); a saved document
(`gpujitter audit --json > FILE`, e.g. from the node a trace was recorded on) loads as is.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

from gpujitter.daemon.checks.audit.model import Finding, Reading, Severity
from gpujitter.errors import GpujitterError
from gpujitter.files import read_regular
from gpujitter.text import printable

SEVERITY_ORDER = ("critical", "warn", "info", "ok")
AUDIT_TIMEOUT_S = 120
# A node's audit is tens of KiB; a bigger file is no audit (and would be read whole).
MAX_AUDIT_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class AuditReport:
    findings: tuple[Finding, ...] = ()
    origin: str = ""  # where the findings come from, as the view's title says it
    note: str = ""  # the GPU source, the topology override in force
    error: str = ""  # why there are no findings


def parse(doc: Any, origin: str) -> AuditReport:
    """`gpujitter audit --json`'s document; findings worst first, in rule order within.
    Its text quotes the node (process names, command lines, files): made printable here."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("findings"), list):
        return AuditReport(origin=origin, error="not the output of `gpujitter audit --json`")
    findings = [
        Finding(
            rule=printable(str(f.get("rule", ""))),
            # As sent: a newer audit may know more severities; the view shows them as they are.
            severity=cast(Severity, printable(str(f.get("severity", "info")))),
            subject=printable(str(f.get("subject", ""))),
            message=printable(str(f.get("message", ""))),
            evidence=tuple(
                Reading(printable(str(e.get("file", ""))), printable(str(e.get("value", ""))))
                for e in (f["evidence"] if isinstance(f.get("evidence"), list) else ())
                if isinstance(e, Mapping)
            ),
            fix=printable(str(f.get("fix", ""))),
        )
        for f in doc["findings"]
        if isinstance(f, Mapping)
    ]
    rank = {s: n for n, s in enumerate(SEVERITY_ORDER)}
    findings.sort(key=lambda f: rank.get(f.severity, len(rank)))
    notes = [f"GPUs from {doc['gpu_source']}"] if doc.get("gpu_source") else []
    if doc.get("topology_override"):
        notes.append(f"topology override {doc['topology_override']}")
    return AuditReport(tuple(findings), printable(origin), printable("; ".join(notes)))


def load_file(path: Path) -> AuditReport:
    # Only a regular file: a FIFO's open would hold the worker thread, and with it the app's
    # exit, for ever; /dev/zero would never end.
    data = read_regular(Path(path), "cannot read", MAX_AUDIT_BYTES, "not `gpujitter audit --json`")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise GpujitterError(f"{path}: not JSON (want `gpujitter audit --json` output)") from None
    return parse(doc, Path(path).name)


def run_audit(argv: tuple[str, ...] = ()) -> AuditReport:
    """Run `gpujitter audit --json` on this node (blocking: call it from a worker)."""
    cmd = [sys.executable, "-m", "gpujitter", "audit", "--json", *argv]
    origin = "this node, now"
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=AUDIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return AuditReport(origin=origin, error=f"gpujitter audit did not run: {err}")
    # Exit 1 is --fail-on's verdict, still a complete document.
    if done.returncode not in (0, 1):
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        error = printable(lines[-1]) if lines else f"exit {done.returncode}"
        return AuditReport(origin=origin, error=error)
    try:
        return parse(orjson.loads(done.stdout), origin)
    except orjson.JSONDecodeError:
        return AuditReport(origin=origin, error="gpujitter audit printed no JSON")
