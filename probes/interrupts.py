"""/proc/interrupts and /proc/softirqs: the one reader of the kernel's per-CPU interrupt tables
(topology, the irq probe, the drills and the TUI's /proc fallback all read them here).

A header names the CPU of each column (an offline CPU has none); a numbered IRQ's row is
`N: <counts> <chip> <hwirq> <handler names>`, a vector's `LOC: <counts> <legend>`, and a
system-wide counter's `ERR: <one count>`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpujitter.probes.host import HostPaths, decimal, read_text


@dataclass(frozen=True, slots=True)
class IrqRow:
    """One row. per_cpu: the count of each CPU ({} for a system-wide counter: ERR, MIS);
    total: all of them; words: what follows the counts."""

    label: str  # "36", "LOC", "NET_RX"
    per_cpu: dict[int, int]
    total: int
    words: tuple[str, ...]

    @property
    def numbered(self) -> bool:
        return decimal(self.label) is not None

    @property
    def name(self) -> str:
        """A numbered IRQ's handler names ("a, b" when shared; its chip and hwirq dropped),
        else the row's legend."""
        return " ".join(self.words[2:] if self.numbered else self.words)


def read_table(paths: HostPaths, name: str = "interrupts") -> dict[str, IrqRow]:
    """/proc/<name> by row label, in the file's order ({} when it cannot be read)."""
    lines = (read_text(paths.proc / name) or "").splitlines()
    if not lines:
        return {}
    cpus = [
        n for c in lines[0].split() if c.startswith("CPU") and (n := decimal(c[3:])) is not None
    ]
    rows = {}
    for line in lines[1:]:
        label, sep, tail = line.partition(":")
        if not sep:
            continue
        fields = tail.split()
        numbers: list[int] = []
        while fields and len(numbers) < len(cpus) and (n := decimal(fields[0])) is not None:
            fields.pop(0)
            numbers.append(n)
        per_cpu = dict(zip(cpus, numbers, strict=False)) if len(numbers) == len(cpus) else {}
        rows[label.strip()] = IrqRow(label.strip(), per_cpu, sum(numbers), tuple(fields))
    return rows
