"""Reliability runner: crash anywhere (SIGKILL) and concurrent writers, then check nothing is lost.

    python -m bench.reliability --crash-points 50 --writers 4
    python -m bench.reliability --scenarios crash-ingest --crash-points 6   # a quick look

Every piece of work runs in a worker subprocess with its own SparkSession (`python -m
bench.reliability worker ...`), so a kill is a real SIGKILL of the Python driver, its JVM and its
Python workers (the whole process group) at a random moment.

Crash scenarios (`crash-ingest`, `crash-refresh`, `crash-compact`): cycle k's worker first
*recovers* (re-runs what cycle k-1 was doing when it was killed: ingestion, the writer's append,
the tombstone request, refresh or compaction), then *verifies* the lake (every event sent is in
the raw log exactly once, no tombstoned event is visible, or left after compaction; the filtered
log and each projection equal a full rebuild; every table reads), then starts cycle k's work, and
the runner kills it after a random delay within that work's expected duration.

Concurrency scenario: `--writers` processes append through `append_events` (each also re-sends
another writer's first call, so event_ids race) while one maintenance process loops over
landing-file ingestion, filtered-log and projection refresh and compaction (a tombstone pending);
a last worker verifies. A failure a process sees (Delta's retries exhausted) is counted as
surfaced and the call is retried by the caller, as a DataBuild service would.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CRASH_SCENARIOS = ("crash-ingest", "crash-refresh", "crash-compact")
SCENARIOS = (*CRASH_SCENARIOS, "concurrency")
_MARK = "@@reliability "  # prefix of the worker's protocol lines on stdout


# ----------------------------------------------------------------------------------------------
# Worker side: runs in a subprocess with its own SparkSession.
# ----------------------------------------------------------------------------------------------

def _say(event: str, **fields) -> None:
    print(_MARK + json.dumps({"event": event, **fields}), flush=True)


class _ConflictCounter(logging.Handler):
    """Counts retry_on_conflict's "retrying" warnings: conflicts Delta reported and we retried."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.retried = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying in" in record.getMessage():
            self.retried += 1


def _worker_session():
    from databuild_assets.runtime.spark import SparkSettings, build_spark_session

    spark = build_spark_session(SparkSettings(
        app_name="databuild-reliability-worker", shuffle_partitions=2, driver_memory="1g",
        extra_config={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
    ))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def batch_events(seed: int, batch: int, per_batch: int, batches: int) -> list[dict]:
    """Batch `batch` of a deterministic workload of `per_batch * batches` events."""
    return _workload(seed, per_batch * batches)[batch * per_batch:(batch + 1) * per_batch]


@functools.lru_cache(maxsize=8)
def _workload(seed: int, size: int) -> list[dict]:
    from databuild_assets.workload import generate_events

    return list(generate_events(size, seed=seed))


def tombstone_value(events: list[dict]) -> str:
    """The build request a cycle erases: the one of its batch's middle event."""
    return events[len(events) // 2]["build_request_id"]


def matches_build_request(event: dict, value: str) -> bool:
    """The tombstone rule for key build_request_id (maintenance/tombstones.py), for the oracle."""
    delegation = event.get("delegation_event") or {}
    return event["build_request_id"] == value or delegation.get("delegated_to_build_request_id") == value


def write_landing_file(landing: Path, name: str, events: list[dict], redeliver: list[dict], bad_lines: int) -> None:
    """A landing file as writers should make it: written under a hidden name, then renamed."""
    lines = [json.dumps(e) for e in events] + [json.dumps(e) for e in redeliver]
    for i in range(bad_lines):
        lines.insert((i * 7919) % (len(lines) + 1), '{"event_id": "bad-' + name + f'-{i}", "timestamp": "soon"}}')
    landing.mkdir(parents=True, exist_ok=True)
    hidden = landing / f".{name}.tmp"
    hidden.write_text("\n".join(lines) + "\n")
    os.replace(hidden, landing / name)


def landed_expectation(landing: Path) -> tuple[set[str], int, int]:
    """(distinct good event_ids, good lines, bad lines) of every complete landing file: the oracle."""
    from databuild_assets.events.validation import parse_line

    ids, good, bad = set(), 0, 0
    for path in sorted(landing.glob("*.jsonl")):
        for line in path.read_bytes().split(b"\n")[:-1]:
            event, reason = parse_line(line)
            if reason is None:
                ids.add(event["event_id"])
                good += 1
            else:
                bad += 1
    return ids, good, bad


def refresh_everything(spark, lake) -> None:
    """The filtered log, then every projection from it: what an operator's refresh runs."""
    from databuild_assets.maintenance.filtered_log import refresh_filtered_log
    from databuild_assets.projections.refresh_all import refresh_all_projections

    refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake)


def verify_lake(spark, lake, expected_ids: set[str], erased_values: set[str], erased_ids: set[str], purged: bool,
                quarantined_lines: int | None = None, derived: bool = True) -> dict:
    """Check the lake against what was sent; returns counts (all zero when everything holds).

    expected_ids: every event_id sent; erased_values: build_request_ids tombstoned; erased_ids:
    the sent events those match; purged: compaction ran, so the raw log must no longer hold them;
    derived: check the filtered log and the projections against a full rebuild.
    """
    from databuild_assets.maintenance.tombstones import event_matches, read_tombstones, visible_events
    from databuild_assets.projections import PROJECTIONS
    from databuild_assets.projections.refresh import projection_spec
    from databuild_assets.runtime.lake import EVENT_QUARANTINE, FILTERED_EVENT_LOG, RAW_EVENT_LOG

    unreadable = []
    tables = Path(lake.path("tables"))
    for table in sorted(tables.iterdir()) if tables.is_dir() else []:
        if table.name.startswith("_"):
            continue
        try:
            spark.read.format("delta").load(str(table)).count()
        except Exception as error:  # reported: a table that does not read is a failure of the run
            unreadable.append(f"{table.name}: {type(error).__name__}: {str(error)[:200]}")

    raw = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    tombstones = read_tombstones(spark, lake)
    raw_ids = [row.event_id for row in raw.select("event_id").collect()]
    present = set(raw_ids)
    if purged:
        lost, reappeared = len((expected_ids - erased_ids) - present), len(present & erased_ids)
    else:
        lost, reappeared = len(expected_ids - present), 0
    verdict = {
        "sent": len(expected_ids),
        "in_log": len(raw_ids),
        "duplicates": len(raw_ids) - len(present),
        "lost": lost,
        "unexpected": len(present - expected_ids),
        "reappeared": reappeared,
        "tombstones_missing": len(erased_values - {t.value for t in tombstones}),
        "unreadable": unreadable,
    }
    if quarantined_lines is not None:
        quarantine_count = spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).count()
        verdict["quarantine_mismatch"] = abs(quarantine_count - quarantined_lines)
    if not derived:
        return verdict
    filtered = spark.read.format("delta").load(lake.table_path(FILTERED_EVENT_LOG))
    visible = visible_events(raw, tombstones)
    filtered_ids = sorted(r.event_id for r in filtered.select("event_id").collect())
    visible_ids = sorted(r.event_id for r in visible.select("event_id").collect())
    tombstoned_visible = filtered.where(event_matches(tombstones)).count() if tombstones else 0
    projection_mismatches = {}
    for name, projection in PROJECTIONS.items():
        columns, key = projection.schema.fieldNames(), projection.key
        stored = spark.read.format("delta").load(lake.table_path(projection_spec(projection))).select(*columns)
        rebuilt = projection.build(visible).select(*columns)
        stored_rows = sorted((r.asDict(recursive=True) for r in stored.collect()), key=lambda r: r[key])
        rebuilt_rows = sorted((r.asDict(recursive=True) for r in rebuilt.collect()), key=lambda r: r[key])
        if stored_rows != rebuilt_rows:
            projection_mismatches[name] = sum(1 for a, b in zip(stored_rows, rebuilt_rows) if a != b) + abs(
                len(stored_rows) - len(rebuilt_rows))
    return {**verdict, "tombstoned_visible": tombstoned_visible, "filtered_mismatch": int(filtered_ids != visible_ids),
            "projection_mismatches": projection_mismatches}


def _crash_worker(args) -> None:
    from databuild_assets.ingest.landing import ingest_landing_files
    from databuild_assets.ingest.writer import append_events
    from databuild_assets.maintenance.compaction import compact
    from databuild_assets.maintenance.tombstones import read_tombstones, request_erasure
    from databuild_assets.runtime.lake import Lake

    scenario, cycle, seed, per_batch, batches = args.role, args.cycle, args.seed, args.per_batch, args.batches
    lake = Lake(args.lake)
    landing = Path(lake.landing)
    counter = _ConflictCounter()
    logging.getLogger("databuild_assets").addHandler(counter)
    spark = _worker_session()
    _say("ready")

    def tombstone(batch: int) -> str:
        value = tombstone_value(batch_events(seed, batch, per_batch, batches))
        if not any(t.reason == f"cycle {batch}" for t in read_tombstones(spark, lake)):
            request_erasure(spark, lake, "build_request_id", value, actor="reliability", reason=f"cycle {batch}")
        return value

    def work(batch: int, step=_say) -> None:
        if scenario == "crash-ingest":
            events = batch_events(seed, batch, per_batch, batches)
            earlier = batch_events(seed, batch - 1, per_batch, batches)[:5] if batch else []
            if not (landing / f"events-{batch:05d}.jsonl").exists():
                step("step", name="land file")
                write_landing_file(landing, f"events-{batch:05d}.jsonl", events, earlier, bad_lines=3)
            step("step", name="ingest")
            ingest_landing_files(spark, lake)
            return
        step("step", name="append")
        append_events(spark, lake, batch_events(seed, batch, per_batch, batches), writer=f"cycle-{batch}")
        step("step", name="tombstone")
        tombstone(batch)
        if scenario == "crash-refresh":
            step("step", name="refresh")
            refresh_everything(spark, lake)
        else:
            step("step", name="compact")
            compact(spark, lake)
            step("step", name="refresh")
            refresh_everything(spark, lake)

    started = time.monotonic()
    if cycle > 0:  # recover: redo what the killed worker was doing, as an operator's re-run would
        work(cycle - 1, step=lambda *a, **k: None)
        if scenario == "crash-ingest":
            ids, _good, bad = landed_expectation(landing)
            verdict = verify_lake(spark, lake, ids, set(), set(), purged=False, quarantined_lines=bad, derived=False)
        else:
            sent = [e for b in range(cycle) for e in batch_events(seed, b, per_batch, batches)]
            erased = {tombstone_value(batch_events(seed, b, per_batch, batches)) for b in range(cycle)}
            erased_ids = {e["event_id"] for e in sent if any(matches_build_request(e, v) for v in erased)}
            verdict = verify_lake(spark, lake, {e["event_id"] for e in sent}, erased, erased_ids,
                                  purged=scenario == "crash-compact")
        _say("verified", seconds=round(time.monotonic() - started, 1), conflicts_retried=counter.retried, **verdict)
    if args.verify_only:
        return
    _say("working")
    started = time.monotonic()
    work(cycle)
    _say("done", seconds=round(time.monotonic() - started, 1))


def _writer_worker(args) -> None:
    from databuild_assets.ingest.writer import append_events
    from databuild_assets.runtime.lake import Lake

    lake = Lake(args.lake)
    counter = _ConflictCounter()
    logging.getLogger("databuild_assets").addHandler(counter)
    spark = _worker_session()
    calls = [batch_events(1000 + w, c, args.per_batch, args.batches) for w in (args.writer_id,) for c in range(args.batches)]
    calls.append(batch_events(1000 + (args.writer_id + 1) % args.writers, 0, args.per_batch, args.batches))  # overlap
    _say("ready")
    surfaced, gave_up = [], 0
    for index, events in enumerate(calls):
        for attempt in range(5):
            try:
                append_events(spark, lake, events, writer=f"writer-{args.writer_id}")
                break
            except Exception as error:  # surfaced to the caller, who retries the same call
                surfaced.append(f"call {index} attempt {attempt}: {type(error).__name__}: {str(error)[:160]}")
        else:
            gave_up += 1
    _say("done", surfaced=surfaced, gave_up=gave_up, conflicts_retried=counter.retried)


def _maintenance_worker(args) -> None:
    from databuild_assets.ingest.landing import ingest_landing_files
    from databuild_assets.ingest.writer import append_events
    from databuild_assets.maintenance.compaction import compact
    from databuild_assets.maintenance.tombstones import request_erasure
    from databuild_assets.runtime.lake import Lake

    lake = Lake(args.lake)
    counter = _ConflictCounter()
    logging.getLogger("databuild_assets").addHandler(counter)
    spark = _worker_session()
    seed_events = batch_events(999, 0, args.per_batch, 1)
    append_events(spark, lake, seed_events, writer="seed")
    request_erasure(spark, lake, "build_request_id", tombstone_value(seed_events), actor="reliability", reason="concurrency")
    refresh_everything(spark, lake)
    _say("ready")
    surfaced, iterations = [], 0
    stop = Path(args.stop_file)
    while True:
        iterations += 1
        if iterations <= args.batches:
            write_landing_file(Path(lake.landing), f"landed-{iterations:05d}.jsonl",
                               batch_events(2000, iterations - 1, args.per_batch, args.batches), [], bad_lines=2)
        for name, operation in (
            ("ingest", lambda: ingest_landing_files(spark, lake)),
            ("refresh", lambda: refresh_everything(spark, lake)),
            ("compact", lambda: compact(spark, lake)),
        ):
            try:
                operation()
            except Exception as error:  # surfaced: counted and reported; the loop goes on
                surfaced.append(f"{name}: {type(error).__name__}: {str(error)[:160]}")
        if stop.exists() and iterations >= 2:
            break
    _say("done", surfaced=surfaced, iterations=iterations, conflicts_retried=counter.retried)


def _verify_concurrency_worker(args) -> None:
    from databuild_assets.ingest.landing import ingest_landing_files
    from databuild_assets.maintenance.compaction import compact
    from databuild_assets.runtime.lake import Lake

    lake = Lake(args.lake)
    spark = _worker_session()
    ingest_landing_files(spark, lake)
    compact(spark, lake)
    refresh_everything(spark, lake)
    seed_events = batch_events(999, 0, args.per_batch, 1)
    value = tombstone_value(seed_events)
    sent = list(seed_events)
    for w in range(args.writers):
        sent += [e for c in range(args.batches) for e in batch_events(1000 + w, c, args.per_batch, args.batches)]
    landed_ids, _good, bad = landed_expectation(Path(lake.landing))
    expected = {e["event_id"] for e in sent} | landed_ids
    erased_ids = {e["event_id"] for e in sent if matches_build_request(e, value)}
    verdict = verify_lake(spark, lake, expected, {value}, erased_ids, purged=True, quarantined_lines=bad)
    _say("verified", **verdict)


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.reliability worker")
    parser.add_argument("role", choices=(*CRASH_SCENARIOS, "writer", "maintenance", "verify-concurrency"))
    parser.add_argument("--lake", required=True)
    parser.add_argument("--cycle", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-batch", type=int, default=100)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--writer-id", type=int, default=0)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--verify-only", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    {"writer": _writer_worker, "maintenance": _maintenance_worker,
     "verify-concurrency": _verify_concurrency_worker}.get(args.role, _crash_worker)(args)


# ----------------------------------------------------------------------------------------------
# Runner side: no JVM; starts workers, kills them, collects their reports.
# ----------------------------------------------------------------------------------------------

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
            [sys.executable, "-m", "bench.reliability", "worker", *argv],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=self.log, start_new_session=True,
        )
        self.messages: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for raw in self.process.stdout:
            line = raw.decode("utf-8", errors="replace")
            if line.startswith(_MARK):
                self.messages.put(json.loads(line[len(_MARK):]))
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
            raise RuntimeError(f"processes {left} of killed worker group {group} still run {timeout:.0f} s after SIGKILL")

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
        for name in ("unexpected", "reappeared", "tombstones_missing", "tombstoned_visible", "filtered_mismatch",
                     "quarantine_mismatch"):
            if verdict.get(name):
                self.problems.append(f"{where}{name}={verdict[name]}")
        if verdict.get("projection_mismatches"):
            self.problems.append(f"{where}projections differ from a rebuild: {verdict['projection_mismatches']}")
        if verdict.get("unreadable"):
            self.problems.append(f"{where}unreadable tables: {verdict['unreadable']}")

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.problems)


def run_crash_scenario(scenario: str, crash_points: int, workdir: Path, seed: int, per_batch: int,
                       startup_timeout: float = 300, kill_window: float = 1.0, log=print) -> ScenarioResult:
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
        worker = Worker([scenario, *base, "--cycle", str(cycle), *(["--verify-only"] if last else [])],
                        workdir / scenario / f"worker-{cycle:03d}.log")
        seen: list[dict] = []
        verdict = worker.wait_for("verified", startup_timeout + 600, seen) if cycle > 0 else None
        if verdict is not None:
            if verdict["event"] != "verified":
                result.problems.append(f"cycle {cycle}: recovery did not finish ({verdict['event']}); see {worker.log.name}")
                worker.kill()
                break
            result.absorb(verdict, f"cycle {cycle}: ")
        if last:
            worker.finish(60)
            break
        message = worker.wait_for("working", startup_timeout, seen)
        if message["event"] != "working":
            result.problems.append(f"cycle {cycle}: worker did not start its work ({message['event']}); see {worker.log.name}")
            worker.kill()
            break
        work_started = time.monotonic()
        if cycle == 0 or work_seconds is None:
            done = worker.wait_for("done", 1800, seen)
            work_seconds = done.get("seconds", time.monotonic() - work_started)
            worker.finish(60)
            log(f"  {scenario} cycle {cycle}: ran whole in {work_seconds:.1f}s (worker {time.monotonic() - cycle_started:.0f}s)")
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
            log(f"  {scenario} cycle {cycle} ({time.monotonic() - cycle_started:.0f}s): "
                f"{'finished before the kill' if finished else f'killed after {delay:.1f}s in {step!r}'}"
                + (f"; previous crash verified: lost={verdict['lost']} dup={verdict['duplicates']}, "
                   f"problems so far {len(result.problems)}" if verdict else ""))
        cycle += 1
    result.seconds = time.monotonic() - started
    return result


def run_concurrency_scenario(writers: int, workdir: Path, per_batch: int, calls: int,
                             startup_timeout: float = 300, log=print) -> ScenarioResult:
    result = ScenarioResult("concurrency")
    lake = workdir / "concurrency" / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    stop_file = workdir / "concurrency" / "stop"
    base = ["--lake", str(lake), "--per-batch", str(per_batch), "--batches", str(calls), "--writers", str(writers)]
    started = time.monotonic()
    maintenance = Worker(["maintenance", *base, "--stop-file", str(stop_file)], workdir / "concurrency" / "maintenance.log")
    if maintenance.wait_for("ready", startup_timeout)["event"] != "ready":
        maintenance.kill()
        result.problems.append("maintenance worker did not start")
        return result
    pool = [Worker(["writer", *base, "--writer-id", str(w)], workdir / "concurrency" / f"writer-{w}.log") for w in range(writers)]
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
    header = ("scenario", "runs", "events sent", "events in log", "duplicates", "lost", "failures surfaced",
              "conflicts retried", "other problems", "seconds")
    rows = [header] + [
        (r.scenario, str(r.runs), f"{r.sent:,}", f"{r.in_log:,}", str(r.duplicates), str(r.lost),
         str(r.failures_surfaced), str(r.conflicts_retried), str(len(r.problems)), f"{r.seconds:.0f}")
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        worker_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crash-points", type=int, default=50, help="kills that land mid-work, in total over the crash scenarios")
    parser.add_argument("--writers", type=int, default=4, help="concurrent writer processes")
    parser.add_argument("--events-per-batch", type=int, default=100, help="events per cycle, per writer call, per landing file")
    parser.add_argument("--writer-calls", type=int, default=4, help="append_events calls per writer")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the working folder (lakes, worker logs)")
    args = parser.parse_args(argv)

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-reliability-"))
    crash = [s for s in scenarios if s in CRASH_SCENARIOS]
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores; workdir {workdir}", flush=True)
    results = []
    for index, scenario in enumerate(crash):
        points = args.crash_points // len(crash) + (1 if index < args.crash_points % len(crash) else 0)
        print(f"{scenario}: {points} crash points", flush=True)
        results.append(run_crash_scenario(scenario, points, workdir, args.seed + index, args.events_per_batch))
        print(f"  kill points by step: {results[-1].kill_steps}", flush=True)
    if "concurrency" in scenarios:
        print(f"concurrency: {args.writers} writer processes, ingestion, refresh and compaction", flush=True)
        results.append(run_concurrency_scenario(args.writers, workdir, args.events_per_batch, args.writer_calls))
    print(f"load average at end: {os.getloadavg()}")
    print(format_table(results))
    for result in results:
        for problem in result.problems:
            print(f"{result.scenario}: {problem}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
