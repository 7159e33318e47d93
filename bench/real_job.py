"""gpujitter beside a real training job (bench/train_job.py) on a GPU node, as root: the
daemon (`gpujitter run` with its defaults, plus --log/--record/--json) attached and
restarted under the running job, scored the way the drills score (daemon/drill/score.py).

    python3 -P -m bench.real_job accuracy --out DIR --summary FILE --budget-s 520
    python3 -P -m bench.real_job cost --out DIR --summary FILE --budget-s 520

accuracy: the job starts and is GPU-bound before the daemon first attaches; the daemon is
then started ATTACHES times (the first start and the restarts), each counting the gaps it
reports in the first WINDOW seconds after it attached (the job is clean then: each is a
false gap); the last clean attach stays for whatever the budget leaves (the clean
stretch); the last attach adds the probes the injected scenarios need (--scenario-probes)
and, after its own clean window, runs the job's scenarios (bench/train_parts.py), each
scored: stalls found, top cause right, attributed vs truth.
cost: the job's step times with and without the daemon, rounds of ROUND seconds
interleaved (order flipping each round), the daemon's CPU % and resident memory in each
round with it; then the daemon attached for the rest of the budget (a clean stretch).
Every phase ends by rewriting the summary (JSON), so a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.drill.score import Stall, named_frames, score
from gpujitter.daemon.drill.system import interrupted_by_signals
from gpujitter.daemon.sinks.jsonlog import JsonLogReader
from gpujitter.probes.events import from_record

S = 1_000_000_000
READY_LINE = "probes attached"
JOB_READY_TIMEOUT_S = 240.0
DAEMON_READY_TIMEOUT_S = 90.0
DAEMON_STOP_TIMEOUT_S = 30.0
SETTLE_S = 4.0  # after the last stall: the detector holds a gap until power covers it (3 s)
WRAP_S = 20.0  # stopping the job and writing the results
SCENARIO_SETUP_S = 4.0  # a scenario's set-up, before its first stall (swap: more)
SCENARIO_EXTRA_S = {"swap": 12.0, "readahead": 4.0, "gc": 6.0}  # the heap grown first
MIN_IDLE_NS = 5_000_000  # the daemon's default min_gap: the job's own idle that long counts
JOB_IDLE_SLACK_NS = 1_000_000  # a gap's part outside the job's own idle it may still have


def now_ns() -> int:
    return time.monotonic_ns()


# -- pieces --------------------------------------------------------------------------------


class JobProcess:
    """The training job: its records (stdout, JSON lines) kept and saved to job.jsonl."""

    def __init__(self, out: Path, job_args: list[str]) -> None:
        self.out = out
        self.records: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        with open(out / "job.err", "w") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-P", "-m", "bench.train_job", "--out", str(out), *job_args],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True,
            )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.out / "job.jsonl", "w") as saved:
            for line in self.proc.stdout:
                saved.write(line)
                saved.flush()
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                with self._cond:
                    self.records.append(rec)
                    self._cond.notify_all()
        with self._cond:
            self.records.append({"exited": self.proc.wait()})
            self._cond.notify_all()

    def wait_for(self, key: str, timeout_s: float, after: int = 0) -> dict[str, Any] | None:
        """The first record with `key` from index `after` on; None on timeout or exit."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for rec in self.records[after:]:
                    if key in rec:
                        return rec
                    if "exited" in rec:
                        return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> int:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                return self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGINT)  # the job restores swap, cgroups
                try:
                    return self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


@dataclass
class Attach:
    """One start of the daemon: when it started, attached, was asked to stop and stopped
    (CLOCK_MONOTONIC ns), what it cost, where its log and trace are."""

    index: int
    probes: str  # "" for the defaults
    log: Path
    record: Path
    start_ns: int = 0
    ready_ns: int = 0
    stop_ns: int = 0
    stopped_ns: int = 0
    exit: int | None = None
    cpu: list[dict[str, float]] = field(default_factory=list)  # windows: cpu %, rss MB
    proc: subprocess.Popen[bytes] | None = None

    def start(self, out: Path) -> bool:
        cmd = [sys.executable, "-P", "-m", "gpujitter", "run", "--json",
               "--log", str(self.log), "--record", str(self.record)]  # fmt: skip
        if self.probes:
            cmd += ["--probes", self.probes]
        err_path = out / f"daemon-{self.index}.err"
        self.start_ns = now_ns()
        with open(out / f"daemon-{self.index}.out", "wb") as o, open(err_path, "wb") as e:
            self.proc = subprocess.Popen(cmd, stdout=o, stderr=e, start_new_session=True)
        deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if READY_LINE in err_path.read_text(errors="replace"):
                self.ready_ns = now_ns()
                return True
            time.sleep(0.05)
        return False

    def usage(self) -> tuple[float, int]:
        """(CPU seconds so far, resident bytes) of the daemon process; zeros once gone."""
        assert self.proc is not None
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return 0.0, 0
        fields = stat.rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu_s = (int(fields[11]) + int(fields[12])) / ticks
        return cpu_s, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")

    def measure(self, seconds: float) -> dict[str, float]:
        """Sleep `seconds`, sampling the daemon: its CPU % over them, peak resident MB."""
        t0, (cpu0, rss) = time.monotonic(), self.usage()
        cpu1, peak = cpu0, rss
        while (left := seconds - (time.monotonic() - t0)) > 0:
            time.sleep(min(1.0, left))
            cpu_s, rss = self.usage()
            cpu1, peak = max(cpu1, cpu_s), max(peak, rss)
        got = {"seconds": round(time.monotonic() - t0, 1),
               "cpu_pct": round(100 * (cpu1 - cpu0) / max(1e-9, time.monotonic() - t0), 2),
               "rss_mb": round(peak / (1 << 20), 1)}  # fmt: skip
        self.cpu.append(got)
        return got

    def stop(self) -> None:
        if self.proc is None:
            return
        self.stop_ns = now_ns()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=DAEMON_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.exit = self.proc.wait()
        self.stopped_ns = now_ns()

    def to_record(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "probes": self.probes or "defaults",
            "start_s": round((self.ready_ns - self.start_ns) / S, 2) if self.ready_ns else None,
            "stop_s": round((self.stopped_ns - self.stop_ns) / S, 2) if self.stopped_ns else None,
            "ready_ns": self.ready_ns,
            "stop_ns": self.stop_ns,
            "exit": self.exit,
            "usage": self.cpu,
        }


def attributions(log: Path) -> list[Attribution]:
    """The attributions of a daemon's log (and its rotated files)."""
    if not log.exists():
        return []
    out = []
    for rec in JsonLogReader(log, rotated=True):
        if rec.get("type") == "gpu.attribution":
            ev = from_record(rec)
            assert isinstance(ev, Attribution)
            out.append(ev)
    return out


def read_steps(path: Path) -> list[tuple[int, int, int]]:
    """The job's steps: (start, batch in hand, end) in CLOCK_MONOTONIC ns."""
    steps = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                steps.append((int(parts[1]), int(parts[2]), int(parts[3])))
    return steps


def job_idle(
    steps: list[tuple[int, int, int]], t0: int, t1: int, min_ns: int = MIN_IDLE_NS
) -> list[tuple[int, int]]:
    """The job's own measure of the GPU's idle stretches of `min_ns` or more inside
    [t0, t1): from a step's loss.item() return (queue empty) to the next step's batch in
    hand (its first copy is launched right after)."""
    out = []
    for (_, _, end), (_, fetched, _) in itertools.pairwise(steps):
        if t0 <= end < t1 and fetched - end >= min_ns:
            out.append((end, fetched))
    return out


def on_job_idle(
    gaps: list[dict[str, Any]], steps: list[tuple[int, int, int]]
) -> list[dict[str, Any]]:
    """The gaps (score records) that are idle the job measured itself: all of the gap but
    JOB_IDLE_SLACK_NS between a step's end and the next batch in hand, whatever that
    stretch's length. The job's measure runs from loss.item()'s return to the batch, the
    GPU's idle from the last kernel's end to the first copy: 0.1-0.6 ms longer on an H100
    host (12-05), where a 5.1 ms gap held 4.5 ms of the job's own idle, under MIN_IDLE_NS.
    That stretch holds the harness's work between steps too (a scenario's set-up): the
    test is that the GPU really was idle there, not who made it so."""
    stretches = job_idle(steps, 0, 1 << 62, min_ns=1)
    out = []
    for g in gaps:
        a, b = g["ts_ns"], g["end_ns"]
        inside = sum(max(0, min(b, y) - max(a, x)) for x, y in stretches)
        if inside > 0 and b - a - inside <= JOB_IDLE_SLACK_NS:
            out.append(g)
    return out


def step_stats(steps: list[tuple[int, int, int]], t0: int, t1: int) -> dict[str, Any]:
    inside = [end - start for start, _, end in steps if t0 <= start and end < t1]
    if not inside:
        return {"steps": 0}
    return {
        "steps": len(inside),
        "median_ms": round(statistics.median(inside) / 1e6, 3),
        "mean_ms": round(statistics.fmean(inside) / 1e6, 3),
        "p99_ms": round(sorted(inside)[int(0.99 * (len(inside) - 1))] / 1e6, 3),
        "steps_per_s": round(len(inside) / ((t1 - t0) / S), 2),
    }


def clean_window(
    attrs: list[Attribution], steps: list[tuple[int, int, int]], t0: int, t1: int
) -> dict[str, Any]:
    """A stretch where nothing was injected: every gap reported in it is a false gap (as the
    drills count them); `real` says how many of those are idle the job itself measured."""
    result = score("", [], attrs, (t0, t1)).to_record()
    idle = job_idle(steps, t0, t1)
    real = on_job_idle(result["false"], steps)
    return {
        "window_s": result["window_s"],
        "false_gaps": result["false_gaps"],
        "false_gap_ms": result["false_gap_ms"],
        "false_on_job_idle": len(real),
        "job_idle_5ms": len(idle),
        "false": result["false"],
        "steps": step_stats(steps, t0, t1),
    }


def scenario_score(
    spec: dict[str, Any],
    stalls: list[dict[str, Any]],
    end_ns: int,
    attrs: list[Attribution],
    steps: list[tuple[int, int, int]],
) -> dict[str, Any]:
    """A scenario's score over [its start, end_ns]. end_ns is when the job began taking the
    injector down (killing the hog, swapoff, leaving the memory cgroup) on its training
    thread: the gap that holds it is the harness's own stall, not a false gap, and is
    counted apart (teardown_gaps). A gap outside the stalls on idle the job measured itself
    (on_job_idle) is counted as such and misses no target: the job's, not invented."""
    teardown = [a for a in attrs if a.ts_ns <= end_ns <= a.end_ns]
    kept = [a for a in attrs if a not in teardown]
    result = score(spec["cause"], [Stall.from_record(s) for s in stalls], kept,
                   (spec["start_ns"], end_ns)).to_record()  # fmt: skip
    real = on_job_idle(result["false"], steps)
    result["false_on_job_idle"] = len(real)
    result["targets"]["no_false_gaps"] = len(real) == result["false_gaps"]
    result["passed"] = all(result["targets"].values())
    return {"scenario": spec["name"], "truth": spec["truth"], "where": spec["where"],
            "stall_ms": spec["stall_ms"], "notes": spec.get("notes", []),
            **result, "teardown_gaps": [{"ms": round(a.dur_ns / 1e6, 1),
                                         "top_cause": a.top_cause} for a in teardown],
            **({"frames": named_frames(stalls, kept)} if stalls and "func" in stalls[0] else {}),
            "loop": {"stalls": stalls}}  # fmt: skip


# -- the run -------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t_start = time.monotonic()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "traces").mkdir(exist_ok=True)
        self.summary: dict[str, Any] = {"mode": args.mode, "budget_s": args.budget_s,
                                        "notes": [], "attaches": []}  # fmt: skip
        self.job: JobProcess | None = None
        self.daemon: Attach | None = None
        self.attaches: list[Attach] = []

    def left_s(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t_start)

    def note(self, text: str) -> None:
        print(f"==> {text} (at {time.monotonic() - self.t_start:.0f}s)", flush=True)
        self.summary["notes"].append(f"{time.monotonic() - self.t_start:.0f}s: {text}")

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.t_start, 1)
        self.summary["attaches"] = [a.to_record() for a in self.attaches]
        tmp = Path(str(self.args.summary) + ".tmp")
        tmp.write_text(json.dumps(self.summary, indent=1))
        tmp.replace(self.args.summary)

    def steps(self) -> list[tuple[int, int, int]]:
        return read_steps(self.out / "steps.tsv")

    def start_job(self) -> bool:
        job_args = ["--batch", str(self.args.batch), "--workers", str(self.args.workers)]
        if self.args.target_step_ms:
            job_args += ["--target-step-ms", str(self.args.target_step_ms)]
        self.job = JobProcess(self.out, job_args)
        rec = self.job.wait_for("ready", min(JOB_READY_TIMEOUT_S, self.left_s()))
        if rec is None:
            self.note("the job did not get ready: see job.err")
            return False
        self.summary["job"] = rec["ready"]
        self.note(f"job ready: {rec['ready']['params'] / 1e6:.1f}M parameters, batch "
                  f"{rec['ready']['batch']}, {rec['ready']['step_ms']:.1f} ms a step, "
                  f"GPU-bound: {rec['ready']['gpu_bound']}")  # fmt: skip
        self.save()
        return True

    def attach(self, probes: str = "") -> Attach | None:
        k = len(self.attaches) + 1
        a = Attach(k, probes, self.out / f"attach-{k}.jsonl", self.out / "traces" / f"attach-{k}")
        self.attaches.append(a)
        self.daemon = a
        if not a.start(self.out):
            self.note(f"attach {k}: the daemon did not attach (see daemon-{k}.err)")
            a.stop()
            self.daemon = None
            return None
        self.note(f"attach {k} ({probes or 'defaults'}): attached in "
                  f"{(a.ready_ns - a.start_ns) / S:.1f}s")  # fmt: skip
        return a

    def detach(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.note(f"attach {self.daemon.index}: stopped in "
                      f"{(self.daemon.stopped_ns - self.daemon.stop_ns) / S:.1f}s, "
                      f"exit {self.daemon.exit}")  # fmt: skip
            self.daemon = None

    def attach_cost_s(self) -> float:
        """Start plus stop of the daemon, as measured so far (a guess before the first)."""
        seen = [(a.ready_ns - a.start_ns + a.stopped_ns - a.stop_ns) / S
                for a in self.attaches if a.ready_ns and a.stopped_ns]  # fmt: skip
        return max(seen) + 2 if seen else 20.0

    def close(self) -> None:
        self.detach()
        if self.job is not None:
            self.summary["job_exit"] = self.job.stop()
            done = self.job.wait_for("done", 1)
            if done:
                self.summary["job_done"] = done["done"]
        self.save()

    # accuracy ---------------------------------------------------------------------------

    def scenarios_s(self) -> float:
        a = self.args
        return sum(SCENARIO_SETUP_S + SCENARIO_EXTRA_S.get(n, 0) + (a.stalls + 1) * a.spacing_s
                   for n in a.scenarios) + SETTLE_S  # fmt: skip

    def accuracy(self) -> None:
        a = self.args
        windows: list[dict[str, Any]] = []
        self.summary["clean"] = windows
        clean_attaches = a.attaches - 1
        for i in range(clean_attaches):
            reserve = self.attach_cost_s() + a.window_s + self.scenarios_s() + WRAP_S
            need = self.attach_cost_s() + a.window_s
            if self.left_s() < need + reserve:
                self.note(f"clean attach {i + 1} of {clean_attaches} skipped: "
                          f"{self.left_s():.0f}s left")  # fmt: skip
                break
            last = i == clean_attaches - 1 or self.left_s() < 2 * need + reserve
            stay = max(a.window_s, self.left_s() - reserve - self.attach_cost_s()) if last else 0
            d = self.attach(a.clean_probes)
            if d is None:
                continue
            d.measure(a.window_s)
            first = d.ready_ns, d.ready_ns + round(a.window_s * S)
            if stay > a.window_s:
                self.note(f"attach {d.index}: the clean stretch, {stay:.0f}s in all")
                d.measure(stay - a.window_s)
            end = now_ns()
            self.detach()
            attrs = attributions(d.log)
            steps = self.steps()
            windows.append({"attach": d.index, "first": clean_window(attrs, steps, *first),
                            "whole": clean_window(attrs, steps, d.ready_ns, end)})  # fmt: skip
            self.note(f"attach {d.index}: {windows[-1]['first']['false_gaps']} false gaps in "
                      f"its first {a.window_s:.0f}s, {windows[-1]['whole']['false_gaps']} in "
                      f"{(end - d.ready_ns) / S:.0f}s")  # fmt: skip
            self.save()
            if last:
                break
        self.run_scenarios(windows)

    def run_scenarios(self, windows: list[dict[str, Any]]) -> None:
        a = self.args
        d = self.attach(a.scenario_probes)
        if d is None:
            return
        assert self.job is not None
        window = max(10.0, min(a.window_s, self.left_s() - self.scenarios_s() - WRAP_S - 15))
        d.measure(window)
        first_end = now_ns()
        results: list[dict[str, Any]] = []
        self.summary["scenarios"] = results
        runs: list[tuple[dict[str, Any], list[dict[str, Any]], int]] = []
        for name in a.scenarios:
            need = SCENARIO_SETUP_S + SCENARIO_EXTRA_S.get(name, 0) + (a.stalls + 1) * a.spacing_s
            if self.left_s() < need + SETTLE_S + WRAP_S + 10:
                self.note(f"scenario {name} skipped: {self.left_s():.0f}s left")
                continue
            mark = len(self.job.records)
            self.job.send(f"scenario {name} {a.stalls} {a.stall_ms} {a.spacing_s}")
            rec = self.job.wait_for("scenario", 60 + SCENARIO_EXTRA_S.get(name, 0), mark)
            if rec is None or "error" in rec["scenario"]:
                why = "no answer" if rec is None else rec["scenario"]["error"]
                self.note(f"scenario {name} failed to start: {why}")
                results.append({"scenario": name, "error": why})
                self.job.wait_for("scenario_end", 10, mark)
                continue
            ended = self.job.wait_for("scenario_end", need + 30, mark)
            stalls = [r["stall"] for r in self.job.records[mark:] if "stall" in r]
            end_ns = ended["scenario_end"]["end_ns"] if ended else now_ns()
            runs.append((rec["scenario"], stalls, end_ns))
            lengths = ", ".join(f"{(s['t1_ns'] - s['t0_ns']) / 1e6:.1f}" for s in stalls)
            self.note(f"scenario {name}: {len(stalls)} stalls, {lengths} ms")
        time.sleep(SETTLE_S)
        end = now_ns()
        self.detach()
        attrs = attributions(d.log)
        steps = self.steps()
        first = d.ready_ns, min(first_end, d.ready_ns + round(a.window_s * S))
        windows.append({"attach": d.index, "first": clean_window(attrs, steps, *first),
                        "whole": None})  # fmt: skip
        for spec, stalls, end_ns in runs:
            results.append(scenario_score(spec, stalls, end_ns, attrs, steps))
        self.summary["scenario_attach_s"] = round((end - d.ready_ns) / S, 1)
        self.save()

    # cost -------------------------------------------------------------------------------

    def cost(self) -> None:
        a = self.args
        rounds: list[dict[str, Any]] = []
        self.summary["rounds"] = rounds
        self.summary["round_s"] = a.round_s
        for r in range(a.rounds):
            if self.left_s() < 2 * a.round_s + self.attach_cost_s() + WRAP_S:
                self.note(f"round {r + 1} of {a.rounds} skipped: {self.left_s():.0f}s left")
                break
            got: dict[str, Any] = {"round": r + 1}
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                got[mode] = self.cost_half(mode)
            rounds.append(got)
            self.save()
        self.summary["cost"] = cost_summary(rounds)
        stay = self.left_s() - self.attach_cost_s() - WRAP_S
        if stay >= 30:
            d = self.attach()
            if d is not None:
                d.measure(stay)
                end = now_ns()
                self.detach()
                self.summary["clean"] = [{"attach": d.index, "first": None, "whole":
                                          clean_window(attributions(d.log), self.steps(),
                                                       d.ready_ns, end)}]  # fmt: skip
        self.save()

    def cost_half(self, mode: str) -> dict[str, Any]:
        a = self.args
        if mode == "off":
            t0 = now_ns()
            time.sleep(a.round_s)
            return {**step_stats(self.steps(), t0, now_ns())}
        d = self.attach()
        if d is None:
            return {"steps": 0}
        time.sleep(a.settle_s)
        t0 = now_ns()
        usage = d.measure(a.round_s)
        t1 = now_ns()
        self.detach()
        clean = clean_window(attributions(d.log), self.steps(), d.ready_ns, t1)
        return {
            **step_stats(self.steps(), t0, t1),
            "daemon": usage,
            "false_gaps": clean["false_gaps"],
            "false_on_job_idle": clean["false_on_job_idle"],
            "attach": d.index,
        }


PHASES = {"accuracy": Run.accuracy, "cost": Run.cost}


def cost_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds: step time without and with the daemon, the paired
    difference per round, the daemon's CPU % and peak resident MB."""
    pairs = [(r["off"]["median_ms"], r["on"]["median_ms"]) for r in rounds
             if r["off"].get("steps") and r["on"].get("steps")]  # fmt: skip
    if not pairs:
        return {"rounds": 0}
    on_usage = [r["on"]["daemon"] for r in rounds if "daemon" in r["on"]]
    return {
        "rounds": len(pairs),
        "off_ms": round(statistics.median(p[0] for p in pairs), 3),
        "on_ms": round(statistics.median(p[1] for p in pairs), 3),
        "cost_pct": round(statistics.median(100 * (on / off - 1) for off, on in pairs), 2),
        "cost_pct_range": [round(min(100 * (on / off - 1) for off, on in pairs), 2),
                           round(max(100 * (on / off - 1) for off, on in pairs), 2)],
        "daemon_cpu_pct": round(statistics.median(u["cpu_pct"] for u in on_usage), 2)
        if on_usage else None,
        "daemon_rss_mb": max((u["rss_mb"] for u in on_usage), default=None),
    }  # fmt: skip


def main() -> int:
    from bench.train_parts import JOB_SCENARIOS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("accuracy", "cost"))
    p.add_argument("--out", type=Path, required=True, help="work folder (logs, traces, steps)")
    p.add_argument("--summary", type=Path, required=True, help="the results (JSON), kept current")
    p.add_argument("--budget-s", type=float, default=520.0, help="wall seconds for everything")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--target-step-ms", type=float, default=50.0)
    p.add_argument("--attaches", type=int, default=6, help="daemon starts (accuracy)")
    p.add_argument("--window-s", type=float, default=60.0, help="clean window after an attach")
    p.add_argument("--scenarios", type=lambda t: [n for n in t.split(",") if n],
                   default=list(JOB_SCENARIOS), help="comma-separated")  # fmt: skip
    p.add_argument(
        "--clean-probes",
        default="",
        help="probes beyond the defaults for the clean attaches (e.g. +python_gil, to count "
        "its false attributions on the clean job)",
    )
    p.add_argument(
        "--scenario-probes",
        default="+python_gil",
        help="the probes the scenarios need beyond the defaults",
    )
    p.add_argument("--stalls", type=int, default=5)
    p.add_argument("--stall-ms", type=float, default=30.0)
    p.add_argument("--spacing-s", type=float, default=0.8)
    p.add_argument("--rounds", type=int, default=5, help="cost rounds")
    p.add_argument("--round-s", type=float, default=30.0)
    p.add_argument("--settle-s", type=float, default=2.0, help="after an attach, before a round")
    args = p.parse_args()
    unknown = [n for n in args.scenarios if n not in JOB_SCENARIOS]
    if unknown:
        p.error(f"unknown scenarios {unknown}; known: {', '.join(JOB_SCENARIOS)}")
    run = Run(args)
    try:
        with interrupted_by_signals():
            if run.start_job():
                PHASES[args.mode](run)
    except KeyboardInterrupt:
        run.note("interrupted")
    finally:
        run.close()
    print(json.dumps({k: v for k, v in run.summary.items() if k in ("cost", "notes")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
