"""The worker side of the reliability scenarios (`reliability_scenarios.py` starts and kills
them): each role runs in a subprocess with its own SparkSession and reports on stdout, one
protocol line per step, so that a SIGKILL at any moment is a real crash of a DataBuild service.

    python -m databuild_assets_tests.reliability_workers crash-ingest --lake /tmp/lake --cycle 2

Roles: the crash scenarios (`crash-ingest`, `crash-refresh`, `crash-compact`: recover what the
previous cycle was doing, verify the lake, then work until killed), `writer`, `maintenance` and
`verify-concurrency` (the concurrency scenario). `verify_lake` is the oracle: what was sent
against what the lake holds. The databuild_assets modules are imported inside the roles, so the
runner that imports this module for its protocol starts no JVM.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from pathlib import Path

CRASH_SCENARIOS = ("crash-ingest", "crash-refresh", "crash-compact")
MARK = "@@reliability "  # prefix of the worker's protocol lines on stdout


def say(event: str, **fields) -> None:
    print(MARK + json.dumps({"event": event, **fields}), flush=True)


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

    spark = build_spark_session(
        SparkSettings(
            app_name="databuild-reliability-worker",
            shuffle_partitions=2,
            driver_memory="1g",
            extra_config={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
        )
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def batch_events(seed: int, batch: int, per_batch: int, batches: int) -> list[dict]:
    """Batch `batch` of a deterministic workload of `per_batch * batches` events."""
    return _workload(seed, per_batch * batches)[batch * per_batch : (batch + 1) * per_batch]


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


def verify_lake(
    spark,
    lake,
    expected_ids: set[str],
    erased_values: set[str],
    erased_ids: set[str],
    purged: bool,
    quarantined_lines: int | None = None,
    derived: bool = True,
) -> dict:
    """Check the lake against what was sent; returns counts (all zero when everything holds).

    expected_ids: every event_id sent; erased_values: build_request_ids tombstoned; erased_ids:
    the sent events those match; purged: compaction ran, so the raw log must no longer hold them;
    derived: check the filtered log and the projections against a full rebuild.
    """
    from databuild_assets.maintenance.tombstones import matching_events, read_tombstones, visible_events
    from databuild_assets.projections import PROJECTIONS
    from databuild_assets.projections.refresh import projection_spec
    from databuild_assets.runtime.lake import EVENT_QUARANTINE, FILTERED_EVENT_LOG, RAW_EVENT_LOG

    unreadable = []
    tables = Path(lake.path("tables"))
    for table in sorted(tables.iterdir()) if tables.is_dir() else []:
        if table.name.startswith(("_", ".")) or not table.is_dir():  # scratch space, commit-lock files
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
    tombstoned_visible = matching_events(filtered, tombstones).count() if tombstones else 0
    projection_mismatches = {}
    for name, projection in PROJECTIONS.items():
        columns, key = projection.schema.fieldNames(), projection.key
        stored = spark.read.format("delta").load(lake.table_path(projection_spec(projection))).select(*columns)
        rebuilt = projection.build(visible).select(*columns)
        stored_rows = sorted((r.asDict(recursive=True) for r in stored.collect()), key=lambda r: r[key])
        rebuilt_rows = sorted((r.asDict(recursive=True) for r in rebuilt.collect()), key=lambda r: r[key])
        if stored_rows != rebuilt_rows:
            projection_mismatches[name] = sum(
                1 for a, b in zip(stored_rows, rebuilt_rows, strict=False) if a != b
            ) + abs(len(stored_rows) - len(rebuilt_rows))
    return {
        **verdict,
        "tombstoned_visible": tombstoned_visible,
        "filtered_mismatch": int(filtered_ids != visible_ids),
        "projection_mismatches": projection_mismatches,
    }


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
    say("ready")

    def tombstone(batch: int) -> str:
        value = tombstone_value(batch_events(seed, batch, per_batch, batches))
        if not any(t.reason == f"cycle {batch}" for t in read_tombstones(spark, lake)):
            request_erasure(spark, lake, "build_request_id", value, actor="reliability", reason=f"cycle {batch}")
        return value

    def work(batch: int, step=say) -> None:
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
            verdict = verify_lake(
                spark, lake, {e["event_id"] for e in sent}, erased, erased_ids, purged=scenario == "crash-compact"
            )
        say("verified", seconds=round(time.monotonic() - started, 1), conflicts_retried=counter.retried, **verdict)
    if args.verify_only:
        return
    say("working")
    started = time.monotonic()
    work(cycle)
    say("done", seconds=round(time.monotonic() - started, 1))


def _writer_worker(args) -> None:
    from databuild_assets.ingest.writer import append_events
    from databuild_assets.runtime.lake import Lake

    lake = Lake(args.lake)
    counter = _ConflictCounter()
    logging.getLogger("databuild_assets").addHandler(counter)
    spark = _worker_session()
    calls = [
        batch_events(1000 + w, c, args.per_batch, args.batches) for w in (args.writer_id,) for c in range(args.batches)
    ]
    calls.append(batch_events(1000 + (args.writer_id + 1) % args.writers, 0, args.per_batch, args.batches))  # overlap
    say("ready")
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
    say("done", surfaced=surfaced, gave_up=gave_up, conflicts_retried=counter.retried)


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
    request_erasure(
        spark, lake, "build_request_id", tombstone_value(seed_events), actor="reliability", reason="concurrency"
    )
    refresh_everything(spark, lake)
    say("ready")
    surfaced, iterations = [], 0
    stop = Path(args.stop_file)
    while True:
        iterations += 1
        if iterations <= args.batches:
            write_landing_file(
                Path(lake.landing),
                f"landed-{iterations:05d}.jsonl",
                batch_events(2000, iterations - 1, args.per_batch, args.batches),
                [],
                bad_lines=2,
            )
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
    say("done", surfaced=surfaced, iterations=iterations, conflicts_retried=counter.retried)


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
    say("verified", **verdict)


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m databuild_assets_tests.reliability_workers")
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
    {
        "writer": _writer_worker,
        "maintenance": _maintenance_worker,
        "verify-concurrency": _verify_concurrency_worker,
    }.get(args.role, _crash_worker)(args)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
