"""NVML faults are reported per GPU and never crash: no NVML at all (recorded on this CI
machine, which has no NVIDIA driver), and, injected into the real H200 recordings at a chosen
call because a healthy GPU never shows them, a GPU lost mid-run and readings the driver does
not support."""

from __future__ import annotations

import json

import pynvml
import pytest

from gpujitter.cli import main
from gpujitter.probes.events import GpuProcesses, GpuSample, ProbeStatus
from gpujitter.probes.nvml import SAMPLE_TYPES, NvmlUnavailable, open_nvml
from gpujitter.probes.nvml_session import NvmlPlayback, load
from tests.conftest import FIXTURES
from tests.unit.test_nvml_playback import IDLE, TRAINING, playback_sampler

NO_DRIVER = FIXTURES / "nvml" / "no-driver.jsonl"


def test_no_driver_is_one_line_why() -> None:
    with pytest.raises(NvmlUnavailable) as err:
        open_nvml(NvmlPlayback(NO_DRIVER))
    assert str(err.value) == (
        "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this node"
    )


def test_gpus_without_a_gpu_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--nvml-replay", str(NO_DRIVER)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith("no NVIDIA GPU usable: NVML library")
    assert main(["gpus", "--json", "--nvml-replay", str(NO_DRIVER)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == [] and "not found" in doc["reason"]


def test_gpus_shows_placement_readings_and_problems(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpus", "--nvml-replay", str(IDLE)]) == 0
    header, row, problem = capsys.readouterr().out.splitlines()
    assert header.split() == ["GPU", "NAME", "PCI", "NODE", "CPUS", "UTIL", "POWER", "PROCESSES"]
    assert row.split() == ["0", "NVIDIA", "H200", "0000:00:06.0", "?", "0-15", "0%", "80W", "-"]
    assert problem == "GPU 0: nvmlDeviceGetNumaNodeId: Not Supported"
    assert main(["gpus", "--json", "--nvml-replay", str(IDLE)]) == 0
    (gpu,) = json.loads(capsys.readouterr().out)["gpus"]
    assert gpu["local_cpus"] == "0-15" and gpu["numa_node"] is None
    assert gpu["processes"] == [] and gpu["persistence_mode"] is True


def test_no_gpu_listed_when_nvml_cannot_count_them() -> None:
    nvml = open_nvml(NvmlPlayback(IDLE, refuse={("nvmlDeviceGetCount", None)}))
    assert nvml.device_count() == 0
    assert nvml.gpus(cpu_count=16) == []
    assert nvml.problems[(None, "nvmlDeviceGetCount")] == "Not Supported"


def test_gpu_lost_mid_run_stops_that_gpu_and_nothing_else() -> None:
    played = playback_sampler(TRAINING, lose_gpu={0: 40})
    playback, sampler, events = played.playback, played.sampler, played.events
    played.run(polls=30)
    calls_after_loss = playback.gpu_calls(0)
    for _ in range(10):
        played.clock.sleep(0.5)
        sampler.poll()
    assert playback.gpu_calls(0) == calls_after_loss  # a lost GPU is not asked again
    assert any(isinstance(e, GpuSample) for e in events)  # what came before the loss stays
    final = sampler.status(0)
    assert final.state == "unavailable"
    assert "GPU is lost" in final.reason
    states = [e.state for e in events if isinstance(e, ProbeStatus)]
    assert states[0] == "running" and states[-1] == "unavailable"
    assert sampler.gpu_processes() == []  # nothing is known to run on a lost GPU


def test_unsupported_sample_streams_degrade_to_processes_only() -> None:
    played = playback_sampler(TRAINING, refuse={("nvmlDeviceGetSamples", 0)})
    played.run(polls=10)
    sampler, events = played.sampler, played.events
    assert not any(isinstance(e, GpuSample) for e in events)
    assert any(isinstance(e, GpuProcesses) and e.pids for e in events)
    status = sampler.status(0)
    assert status.state == "degraded"
    assert status.reason == "GPU 0: nvmlDeviceGetSamples: Not Supported"


def test_unsupported_process_utilisation_keeps_the_process_list() -> None:
    refused = {("nvmlDeviceGetProcessUtilization", 0)}
    played = playback_sampler(TRAINING, refuse=refused)
    played.run(polls=10)
    sampler, events = played.sampler, played.events
    listed = [e for e in events if isinstance(e, GpuProcesses)]
    assert listed and all(e.pids and e.sm_util == () for e in listed)
    assert any(isinstance(e, GpuSample) for e in events)
    assert "nvmlDeviceGetProcessUtilization: Not Supported" in sampler.status(0).reason


def test_a_ring_the_recording_could_not_read_is_refused_in_playback() -> None:
    """A ring whose every recorded read failed fails in playback too, with the recorded
    error, not as an empty ring. Injected: the H200 recording with its power reads refused."""
    header, entries = load(TRAINING)
    for e in entries:
        if e["fn"] == "nvmlDeviceGetSamples" and e["args"][0] == SAMPLE_TYPES["power"]:
            e.pop("ret", None)
            e["err"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    played = playback_sampler((header, entries))
    played.run(polls=10)
    samples = [e for e in played.events if isinstance(e, GpuSample)]
    assert samples and {e.metric for e in samples} == {"util"}
    assert played.sampler.status(0).reason == "GPU 0: nvmlDeviceGetSamples: Not Supported"
