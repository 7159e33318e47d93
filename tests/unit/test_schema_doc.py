"""docs/schema.md documents every event kind and every field: a kind or field added without
its documentation fails here, naming what is missing."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gpujitter.probes.events import event_kinds
from tests.unit.trace_samples import header

DOCS = Path(__file__).parents[2] / "docs"


def sections(text: str) -> dict[str, str]:
    """Each kind's section: from its **`kind`** title line to the next title or heading."""
    found: dict[str, str] = {}
    kind = None
    for line in text.splitlines():
        title = re.match(r"\*\*`([a-z0-9_.]+)`\*\*", line)
        if title or line.startswith("#"):
            kind = title.group(1) if title else None
        if kind:
            found[kind] = found.get(kind, "") + line + "\n"
    return found


def test_every_event_kind_and_field_is_documented() -> None:
    documented = sections((DOCS / "schema.md").read_text())
    missing = []
    for kind, cls in sorted(event_kinds().items()):
        body = documented.get(kind)
        if body is None:
            missing.append(kind)
            continue
        missing += [
            f"{kind}.{f.name}" for f in dataclasses.fields(cls) if f"`{f.name}`" not in body
        ]
    assert missing == [], f"docs/schema.md lacks: {', '.join(missing)}"


def test_every_header_key_is_documented() -> None:
    text = (DOCS / "trace-format.md").read_text()
    keys = header().to_record()
    assert [k for k in keys if f"| `{k}` |" not in text] == []
