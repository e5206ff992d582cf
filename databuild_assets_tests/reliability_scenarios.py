"""The runner side of the reliability scenarios: worker subprocesses
(`reliability_workers.py`) started in their own process group, killed with a real SIGKILL at a
random moment or left racing each other, and their reports gathered into a `ScenarioResult`.
No JVM runs here.

    result = run_crash_scenario("crash-ingest", crash_points=2, workdir=tmp_path, seed=3, per_batch=40)
    assert (result.lost, result.duplicates, result.problems) == (0, 0, [])

`python -m bench.reliability` runs them at full scale; `test_reliability.py` runs them small.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from databuild_assets_tests.reliability_workers import CRASH_SCENARIOS, MARK
from databuild_assets_tests.support import REPO_ROOT

SCENARIOS = (*CRASH_SCENARIOS, "concurrency")


def processes_in_group(group: int) -> list[int]:
    """Pids in process group `group` that still run (a zombie has ended; only its entry is left)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


class Worker:
    """A worker subprocess in its own process group (so a kill takes its JVM too)."""

    def __init__(self, argv: list[str], log_path: Path):
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "databuild_assets_tests.reliability_workers", *argv],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=self.log,
            start_new_session=True,
        )
        self.messages: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.process.stdout:
            line = raw.decode("utf-8", errors="replace")
            if line.startswith(MARK):
                self.messages.put(json.loads(line[len(MARK) :]))
        self.messages.put({"event": "exit"})

    def next_message(self, timeout: float) -> dict:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            return {"event": "timeout"}

    def wait_for(self, wanted: str, timeout: float, seen: list | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            message = self.next_message(max(0.1, deadline - time.monotonic()))
            if seen is not None:
                seen.append(message)
            if message["event"] in (wanted, "exit", "timeout"):
                return message

    def kill(self, timeout: float = 60) -> None:
        """SIGKILL the whole process group: the driver, its JVM and Spark's Python workers.

        Returns only once no process of the group runs any more. The driver is our child and
        `wait` reaps it, but its JVM is reparented to init when the driver dies and can take a
        moment (seconds on a loaded machine: gigabytes of heap to unmap) to go; a "crash" whose
        JVM still runs could keep writing while the recovery starts.
        """
        group = self.process.pid
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        deadline = time.monotonic() + timeout
        while (left := processes_in_group(group)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.reader.join(timeout=10)
        self.log.close()
        if left:
            raise RuntimeError(
                f"processes {left} of killed worker group {group} still run {timeout:.0f} s after SIGKILL"
            )

    def finish(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
        self.reader.join(timeout=10)
        self.log.close()
        return code


@dataclass
class ScenarioResult:
    scenario: str
    runs: int = 0  # crash points (workers killed), or writer processes
    sent: int = 0
    in_log: int = 0
    duplicates: int = 0
    lost: int = 0
    failures_surfaced: int = 0
    conflicts_retried: int = 0
    problems: list[str] = field(default_factory=list)  # anything else that did not hold
    kill_steps: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def absorb(self, verdict: dict, where: str = "") -> None:
        self.sent, self.in_log = verdict["sent"], verdict["in_log"]
        self.duplicates = max(self.duplicates, verdict["duplicates"])
        self.lost = max(self.lost, verdict["lost"])
        self.conflicts_retried += verdict.get("conflicts_retried", 0)
        for name in (
            "unexpected",
            "reappeared",
            "tombstones_missing",
            "tombstoned_visible",
            "filtered_mismatch",
            "quarantine_mismatch",
        ):
            if verdict.get(name):
                self.problems.append(f"{where}{name}={verdict[name]}")
        if verdict.get("projection_mismatches"):
            self.problems.append(f"{where}projections differ from a rebuild: {verdict['projection_mismatches']}")
        if verdict.get("unreadable"):
            self.problems.append(f"{where}unreadable tables: {verdict['unreadable']}")

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.problems)


def run_crash_scenario(
    scenario: str,
    crash_points: int,
    workdir: Path,
    seed: int,
    per_batch: int,
    startup_timeout: float = 300,
    kill_window: float = 1.0,
    log=print,
) -> ScenarioResult:
    """Cycle 0 runs whole (it also measures the work); each later cycle is killed at a random
    delay within the first `kill_window` of the work's last measured duration, until
    `crash_points` kills have landed mid-work (a cycle whose work finished before its kill does
    not count; at most 3 x crash_points cycles); a last worker recovers and verifies."""
    result = ScenarioResult(scenario)
    lake, rng = workdir / scenario / "lake", random.Random(seed)
    lake.mkdir(parents=True, exist_ok=True)
    max_cycles = 3 * crash_points
    batches = max_cycles + 2
    base = ["--lake", str(lake), "--seed", str(seed), "--per-batch", str(per_batch), "--batches", str(batches)]
    work_seconds = None
    started = time.monotonic()
    cycle = 0
    while True:
        last = cycle > 0 and (result.runs >= crash_points or cycle > max_cycles)
        cycle_started = time.monotonic()
        worker = Worker(
            [scenario, *base, "--cycle", str(cycle), *(["--verify-only"] if last else [])],
            workdir / scenario / f"worker-{cycle:03d}.log",
        )
        seen: list[dict] = []
        verdict = worker.wait_for("verified", startup_timeout + 600, seen) if cycle > 0 else None
        if verdict is not None:
            if verdict["event"] != "verified":
                result.problems.append(
                    f"cycle {cycle}: recovery did not finish ({verdict['event']}); see {worker.log.name}"
                )
                worker.kill()
                break
            result.absorb(verdict, f"cycle {cycle}: ")
        if last:
            worker.finish(60)
            break
        message = worker.wait_for("working", startup_timeout, seen)
        if message["event"] != "working":
            result.problems.append(
                f"cycle {cycle}: worker did not start its work ({message['event']}); see {worker.log.name}"
            )
            worker.kill()
            break
        work_started = time.monotonic()
        if cycle == 0 or work_seconds is None:
            done = worker.wait_for("done", 1800, seen)
            work_seconds = done.get("seconds", time.monotonic() - work_started)
            worker.finish(60)
            log(
                f"  {scenario} cycle {cycle}: ran whole in {work_seconds:.1f}s"
                f" (worker {time.monotonic() - cycle_started:.0f}s)"
            )
        else:
            delay = rng.uniform(0.02, kill_window) * work_seconds
            deadline = work_started + delay
            step, finished = "start", False
            while time.monotonic() < deadline:
                message = worker.next_message(max(0.01, deadline - time.monotonic()))
                if message["event"] == "step":
                    step = message["name"]
                elif message["event"] in ("done", "exit"):
                    finished = True
                    work_seconds = message.get("seconds", work_seconds)  # the latest whole run: the next window
                    break
            worker.kill()
            while not worker.messages.empty():  # a step reported just before the kill
                message = worker.messages.get()
                if message["event"] == "step":
                    step = message["name"]
                elif message["event"] == "done":
                    finished = True
            if finished:
                result.kill_steps["finished before the kill"] = result.kill_steps.get("finished before the kill", 0) + 1
            else:
                result.runs += 1
                result.kill_steps[step] = result.kill_steps.get(step, 0) + 1
            log(
                f"  {scenario} cycle {cycle} ({time.monotonic() - cycle_started:.0f}s): "
                f"{'finished before the kill' if finished else f'killed after {delay:.1f}s in {step!r}'}"
                + (
                    f"; previous crash verified: lost={verdict['lost']} dup={verdict['duplicates']}, "
                    f"problems so far {len(result.problems)}"
                    if verdict
                    else ""
                )
            )
        cycle += 1
    result.seconds = time.monotonic() - started
    return result


def run_concurrency_scenario(
    writers: int, workdir: Path, per_batch: int, calls: int, startup_timeout: float = 300, log=print
) -> ScenarioResult:
    result = ScenarioResult("concurrency")
    lake = workdir / "concurrency" / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    stop_file = workdir / "concurrency" / "stop"
    base = ["--lake", str(lake), "--per-batch", str(per_batch), "--batches", str(calls), "--writers", str(writers)]
    started = time.monotonic()
    maintenance = Worker(
        ["maintenance", *base, "--stop-file", str(stop_file)], workdir / "concurrency" / "maintenance.log"
    )
    if maintenance.wait_for("ready", startup_timeout)["event"] != "ready":
        maintenance.kill()
        result.problems.append("maintenance worker did not start")
        return result
    pool = [
        Worker(["writer", *base, "--writer-id", str(w)], workdir / "concurrency" / f"writer-{w}.log")
        for w in range(writers)
    ]
    for w, worker in enumerate(pool):
        done = worker.wait_for("done", startup_timeout + 1800)
        code = worker.finish(120)
        if done["event"] != "done" or code != 0:
            result.problems.append(f"writer {w} ended without reporting ({done['event']}, exit {code})")
            continue
        result.failures_surfaced += len(done["surfaced"])
        result.conflicts_retried += done["conflicts_retried"]
        if done["gave_up"]:
            result.problems.append(f"writer {w} gave up {done['gave_up']} calls after 5 surfaced failures each")
        for failure in done["surfaced"]:
            log(f"  writer {w} surfaced: {failure}")
    result.runs = writers
    stop_file.touch()
    done = maintenance.wait_for("done", 1800)
    maintenance.finish(120)
    if done["event"] == "done":
        result.failures_surfaced += len(done["surfaced"])
        result.conflicts_retried += done["conflicts_retried"]
        for failure in done["surfaced"]:
            log(f"  maintenance surfaced: {failure}")
        log(f"  maintenance: {done['iterations']} iterations of ingest, refresh, compact while the writers ran")
    else:
        result.problems.append(f"maintenance worker ended without reporting ({done['event']})")
    verifier = Worker(["verify-concurrency", *base], workdir / "concurrency" / "verify.log")
    verdict = verifier.wait_for("verified", startup_timeout + 900)
    verifier.finish(60)
    if verdict["event"] == "verified":
        result.absorb(verdict)
    else:
        result.problems.append(f"verification did not finish ({verdict['event']})")
    result.seconds = time.monotonic() - started
    return result


def format_table(results: list[ScenarioResult]) -> str:
    header = (
        "scenario",
        "runs",
        "events sent",
        "events in log",
        "duplicates",
        "lost",
        "failures surfaced",
        "conflicts retried",
        "other problems",
        "seconds",
    )
    rows = [header] + [
        (
            r.scenario,
            str(r.runs),
            f"{r.sent:,}",
            f"{r.in_log:,}",
            str(r.duplicates),
            str(r.lost),
            str(r.failures_surfaced),
            str(r.conflicts_retried),
            str(len(r.problems)),
            f"{r.seconds:.0f}",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
