"""Prometheus metrics: what a scrape shows after the daemon observed gaps, attributions and
probe health and engine loss, served over real HTTP on localhost."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from gpujitter.daemon.metrics import DaemonMetrics
from gpujitter.daemon.recorder import EventQueue
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import ProbeStatus


def scrape_value(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        mname, _, mlabels = metric.partition("{")
        got = ",".join(sorted(mlabels.rstrip("}").split(","))) if mlabels else ""
        if mname == name and got == want:
            return float(value)
    raise AssertionError(f"{name}{{{want}}} not in scrape")


def test_gaps_attributions_and_probe_health_are_exposed() -> None:
    m = DaemonMetrics()
    m.observe_gap(0, 0.038)
    m.observe_gap(0, 0.012)
    m.observe_attribution(0, [("swap_in", 0.029), ("irq", 0.006), ("unexplained", 0.003)])
    m.observe_probe(
        ProbeStatus(ts_ns=1, probe="irq", state="running", events=10, lost_kernel=2, lost_user=1)
    )
    m.observe_probe(ProbeStatus(ts_ns=1, probe="swap", state="unavailable", reason="x"))
    m.observe_stream(clients=3, dropped_total=7)
    text = m.exposition().decode()
    assert scrape_value(text, "gpujitter_gaps_total", gpu="0") == 2
    assert scrape_value(text, "gpujitter_gap_seconds_total", gpu="0") == pytest.approx(0.05)
    assert scrape_value(
        text, "gpujitter_attributed_seconds_total", gpu="0", cause="swap_in"
    ) == pytest.approx(0.029)
    assert scrape_value(text, "gpujitter_probe_state", probe="irq", state="running") == 1
    assert scrape_value(text, "gpujitter_probe_state", probe="swap", state="running") == 0
    assert scrape_value(text, "gpujitter_probe_state", probe="swap", state="unavailable") == 1
    assert scrape_value(text, "gpujitter_probe_lost_events", probe="irq", where="kernel") == 2
    assert scrape_value(text, "gpujitter_stream_dropped_records") == 7
    assert scrape_value(text, "gpujitter_process_resident_memory_bytes") > 0


def test_served_over_http_on_localhost() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = DaemonMetrics()
    m.observe_gap(1, 0.5)
    m.serve(f"127.0.0.1:{port}")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert scrape_value(body, "gpujitter_gaps_total", gpu="1") == 1


@pytest.mark.parametrize("listen", ["9464", "localhost:http", "127.0.0.1:"])
def test_bad_listen_address_is_one_line(listen: str) -> None:
    with pytest.raises(GpujitterError, match="want HOST:PORT"):
        DaemonMetrics().serve(listen)


def test_engine_dropped_events_count_what_the_queue_dropped() -> None:
    m = DaemonMetrics()
    q = EventQueue(maxsize=2)
    for ts in range(5):
        q.emit(ProbeStatus(ts_ns=ts, probe="irq", state="running"))
    m.observe_engine(q.dropped)
    assert scrape_value(m.exposition().decode(), "gpujitter_engine_dropped_events_total") == 3
    q.emit(ProbeStatus(ts_ns=5, probe="irq", state="running"))
    m.observe_engine(q.dropped)
    m.observe_engine(q.dropped)  # a tick with no new drops adds nothing
    assert scrape_value(m.exposition().decode(), "gpujitter_engine_dropped_events_total") == 4
