"""The status line: where the data comes from and whether that works (daemon connected, or
silent for a while, retrying and why, embedded, replay position), what a non-root client is
shown of the node, the current view's filter, probe health, events lost, the daemon's own
CPU, the gaps it caused itself (self-inflicted), records dropped on the way (by the daemon
for this client, and by this app's inbox), lines and records skipped as unreadable, and a
wall clock set while it played or ran (every time shown moved with it)."""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from gpujitter.probes.events import CORE_PROBE
from gpujitter.text import printable
from gpujitter.tui.inbox import Connection, ReplayPosition
from gpujitter.tui.model import NodeModel

STATE_STYLE = {"running": "green", "degraded": "yellow", "unavailable": "red", "off": "dim"}
PROBE_STATES = ("running", "degraded", "unavailable", "off", "stopped")
# The daemon sends its status once a second: past this with none, the line says how long.
SILENT_S = 3.0


def connection_text(
    conn: Connection | None,
    model: NodeModel,
    pos: ReplayPosition | None,
    silent_s: float | None = None,
) -> Text:
    if conn is None:
        return Text("○ starting", style="dim")
    if conn.state == "connected":
        pid = f" pid {model.hello.pid}" if model.hello.pid else ""
        if silent_s is not None and silent_s > SILENT_S:  # stopped, wedged: not live
            return Text(f"● daemon{pid} (silent {silent_s:.0f} s)", style="bold yellow")
        return Text(f"● daemon{pid}", style="bold green")
    if conn.state == "waiting":
        return Text(f"○ {printable(conn.detail or 'no daemon, retrying')}", style="bold yellow")
    if conn.state == "embedded":
        return Text("● embedded", style="bold cyan")
    if conn.state == "replay" and pos is not None:
        mark = "▶" if pos.playing else "⏸"
        span = max(pos.end_ns - pos.start_ns, 1)
        done = 100 * (pos.at_ns - pos.start_ns) / span
        speed = f"×{pos.speed:g}" if pos.speed != 1 else ""
        end = " end" if pos.done else ""
        return Text(
            f"{mark} replay {model.clock.time(pos.at_ns, 1)} {done:.0f}%{end} {speed}".rstrip(),
            style="bold magenta",
        )
    if conn.state == "failed":
        return Text(f"✗ feed failed: {printable(conn.detail)}", style="bold red")
    return Text(f"○ {conn.state}", style="dim")


def probes_text(model: NodeModel) -> Text:
    """The probes by state (the core module's status, CORE_PROBE, is no probe)."""
    states: Counter[str] = Counter(p.state for p in model.probes.values() if p.probe != CORE_PROBE)
    if not states:
        return Text("probes ?", style="dim")
    out = Text("probes ")
    for state in PROBE_STATES:
        if states[state]:
            label = {"running": "on", "degraded": "degr", "unavailable": "unavail"}.get(
                state, state
            )
            out.append(f"{states[state]} {label}", style=STATE_STYLE.get(state, ""))
            out.append(" ")
    other = sum(n for state, n in states.items() if state not in PROBE_STATES)
    if other:  # states a newer daemon knows: counted, so that every probe is in the line
        out.append(f"{other} other", style="yellow")
    out.rstrip()
    return out


def bpf_cost_text(model: NodeModel) -> Text | None:
    """The kernel CPU time of the probes' and the core's BPF programs as a share of one CPU,
    and the dearest one's share, `~` in front where a figure is from a sampled second
    (cost_from `sampled`: the kernel's statistics are off); None until a cost was measured."""
    measured = [p for p in model.probes.values() if p.bpf_ns_per_s >= 0]
    if not measured:
        return None
    top = max(measured, key=lambda p: p.bpf_ns_per_s)
    total = sum(p.bpf_ns_per_s for p in measured)
    sampled = "~" if any(p.cost_from == "sampled" for p in measured) else ""
    return Text(f"bpf {sampled}{total / 1e7:.2f}% ({top.probe} {top.bpf_ns_per_s / 1e7:.2f}%)")


def status_text(
    model: NodeModel,
    conn: Connection | None,
    pos: ReplayPosition | None,
    *,
    inbox_dropped: int,
    paused: bool,
    filter_text: str = "",
    bad_lines: int = 0,
    silent_s: float | None = None,
) -> Text:
    """`bad_lines`: the feed's lines that were no record (not JSON, too long); `silent_s`:
    seconds since the daemon's status last arrived (None: not a daemon's feed)."""
    # Most telling first: at 80 columns the probe list is what gets cut.
    parts = [connection_text(conn, model, pos, silent_s)]
    if model.hello.scope not in ("", "all"):  # a non-root client sees its own processes only
        parts.append(Text(f"scope {model.hello.scope}", style="bold yellow"))
    if model.damage:  # what is played lacks what the damage took: `gpujitter trace` says what
        parts.append(Text(f"damaged recording: {len(model.damage)} note(s), see gpujitter trace",
                          style="bold red"))  # fmt: skip
    if model.clock_set:  # every time shown is by the clock as it was last set
        at_ns, moved = model.clock_set[-1]
        times = f"{len(model.clock_set)}×, last " if len(model.clock_set) > 1 else ""
        parts.append(Text(f"clock set {times}{moved / 1e9:+.3f} s at {model.clock.time(at_ns)}",
                          style="bold yellow"))  # fmt: skip
    if filter_text:  # a narrowed view never passes for the whole picture
        parts.append(Text(f'filter "{printable(filter_text)}"', style="bold yellow"))
    lost = model.lost_events()
    parts.append(Text(f"lost {lost}", style="bold red" if lost else "dim"))
    dropped = inbox_dropped + model.daemon_dropped
    parts.append(Text(f"dropped {dropped}", style="bold red" if dropped else "dim"))
    skipped = bad_lines + sum(model.ignored.values())
    if skipped:  # unreadable lines, records of unknown types or malformed: model.ignored
        parts.append(Text(f"skipped {skipped}", style="yellow"))
    if model.status is not None:
        who = "self" if conn is not None and conn.state == "embedded" else "daemon"
        parts.append(Text(f"{who} cpu {model.status.cpu_percent:.1f}%"))
        own = model.status.self_inflicted
        if own >= 0:
            parts.append(Text(f"self-inflicted {own}", style="bold red" if own else "dim"))
        # Either means a gap may have been attributed without some of its events.
        if model.status.late_events:
            parts.append(Text(f"late {model.status.late_events}", style="yellow"))
        if model.status.attributed_early:
            parts.append(Text(f"attributed early {model.status.attributed_early}",
                              style="yellow"))  # fmt: skip
    parts.append(probes_text(model))
    cost = bpf_cost_text(model)
    if cost is not None:
        parts.append(cost)
    out = Text(" │ ", style="dim", no_wrap=True, overflow="ellipsis").join(parts)
    if paused:
        out = Text.assemble(Text(" PAUSED ", style="bold reverse yellow"), " ", out)
    return out
