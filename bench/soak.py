"""A working day of service load, compressed, on Dagster's production shape and the default schedules.

    python -m bench.soak --minutes 60 [--appenders 3 --rate 13 --storage postgres --workdir DIR]

Starts a code server, `dagster-daemon` and `dagster-webserver` as processes of their own
(databuild_assets_tests/dagster_deployment.py), with the instance's storage in a PostgreSQL server
on loopback (or SQLite under DAGSTER_HOME), every sensor running and the schedules as they ship.
Then, for --minutes: --appenders processes append 5-event batches through the JVM-free backend
(--rate appends a second in all; each sends a day of log time, so its build requests finish and
the serving index's hot window bounds it, as a service's would), a reader process asks a recent
partition's status and its build's events (--read-rate a second), a 40-event landing file lands
every minute, and erase_job runs are submitted to the run queue at a third and two thirds of the
time.

Prints a line a minute: append and read p95, runs by status, the raw log's commits since its last
checkpoint, live files and the size of its log, the lake's and the instance's size, the warm Spark
driver's old generation (jstat), and a machine anchor (a fixed Python loop in this process, on the
service's CPUs with --service-cpus, under the soak's load: on a shared host it moves the p95s as
much as the code does). With --service-cpus the appenders and the reader have CPUs of their own,
as a service apart from the pipeline's compute has. At the end:
every run's outcome and duration, and the asset checks in it that did not pass (a run with one
counts as failed); every event sent stored once (erased ones hidden); the
filtered log and the projections equal to a rebuild (Spark,
databuild_assets_tests.reliability_workers.verify_lake); the p95 of every call in the last 10 minutes against
the first 10's (and the worst minute's p95 of each, a stricter reading), the slowest append;
delta-rs's open of the raw log against a freshly
checkpointed copy. Results also go to DIR/soak.json. Taken beside another Spark run, figures
are not comparable.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from bench.query_path import percentile
from bench.soak_load import soak_stream, stream_size
from databuild_assets.log.serving.checkpoints import open_listed
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.spark import SparkSettings
from databuild_assets.runtime.warm_driver import running_hosts
from databuild_assets_tests.dagster_deployment import DagsterDeployment
from databuild_assets_tests.reliability_workers import write_landing_file
from databuild_assets_tests.support import machine_anchor_s

REPO_ROOT = Path(__file__).resolve().parents[1]
LANDING_EVENTS = 40  # a landing file a minute
ANCHOR_STEPS = 1_000_000  # the machine anchor's loop, timed once a minute
SENSORS = ("landing_files_sensor", "event_log_commits_sensor", "compaction_by_file_count_sensor")


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _p95_ms(records: list[dict], since: float, until: float) -> float | None:
    seconds = [r["s"] for r in records if since <= r["at"] < until and "error" not in r]
    return percentile(seconds, 0.95) * 1000 if seconds else None


def _log_state(table: Path) -> tuple[int, int, int | None]:
    """(newest version, its last checkpoint's version, live files) of a local Delta table; files
    None when every listing of the log raced a commit (`_open`): a minute's figure, not the soak."""
    log = table / "_delta_log"
    versions = [int(p.name[:20]) for p in log.glob("*.json") if p.name[:20].isdigit()]
    checkpoint = -1
    if (log / "_last_checkpoint").exists():
        checkpoint = json.loads((log / "_last_checkpoint").read_text())["version"]
    try:
        files = len(_open(str(table)).file_uris()) if versions else 0
    except DeltaError as error:
        print(f"live files not counted this minute: {str(error)[:200]}", flush=True)
        files = None
    return (max(versions) if versions else -1), checkpoint, files


def _open(table: str) -> DeltaTable:
    """delta-rs's open, listed again on a gap (`open_listed`), with more and longer tries than the
    appends' own: the soak met a gap five times in a row while appenders caught up after a stall."""
    return open_listed(table, attempts=10, pause_s=0.2)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _open_seconds(table: str, tries: int = 5) -> float:
    seconds = []
    for _ in range(tries):
        started = time.perf_counter()
        _open(table)
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def _checkpointed_open(table: Path) -> tuple[float, float]:
    """delta-rs's open of `table` as it is, and of a copy with a checkpoint at its newest version."""
    as_is = _open_seconds(str(table))
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "raw"
        shutil.copytree(table, copy)
        DeltaTable(str(copy)).create_checkpoint()
        return as_is, _open_seconds(str(copy))


def _storage(kind: str):
    """The Postgres server to stop (None for SQLite) and dagster.yaml's storage: section for it."""
    if kind == "sqlite":
        return None, None
    from databuild_assets_tests.postgres_server import PostgresServer

    server = PostgresServer().start()
    return server, server.dagster_storage_config()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--appenders", type=int, default=3)
    parser.add_argument("--rate", type=float, default=13, help="appends a second, over all appenders")
    parser.add_argument("--read-rate", type=float, default=5, help="reader loops a second")
    parser.add_argument("--erasures", type=int, default=2)
    parser.add_argument("--storage", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--workdir", default=None)
    parser.add_argument(
        "--pipeline-nice",
        type=int,
        default=0,
        help="CPU niceness of the code server, the daemon and the webserver, and so of the runs: the "
        "pipeline yielding the CPU to the service on a shared host (docs/deployment.md)",
    )
    parser.add_argument(
        "--service-cpus",
        type=_cpus,
        default=None,
        help="CPUs (e.g. 0 or 0-1) the appenders and the reader run on; every other process of the soak "
        "(PostgreSQL, the code server, daemon and webserver, their runs and Spark driver, this monitor) "
        "then runs on the others: the service on compute apart from the pipeline's, as a deployment runs "
        "it. Unset: they all share every CPU",
    )
    args = parser.parse_args(argv)
    service_cpus = _apart(args.service_cpus)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="databuild-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    seconds = args.minutes * 60
    server, storage = _storage(args.storage)
    results: dict = {"settings": vars(args), "minutes": []}
    try:
        # The product's Spark driver memory, not the deployment test's small one: a driver of 1 GB
        # ran out of heap in a purge with 20k live raw-log files.
        spark = {"DATABUILD_SPARK_DRIVER_MEMORY": SparkSettings.driver_memory}
        with DagsterDeployment(workdir, storage=storage, settings=spark, nice=args.pipeline_nice) as deployment:
            results["startup_s"] = {name: s.ready_after_s for name, s in deployment.services.items()}
            for sensor in SENSORS:
                try:
                    deployment.start_sensor(sensor)
                except Exception as error:  # a sensor this release does not have
                    print(f"sensor {sensor} not started: {error}")
            results.update(_load(deployment, workdir, args, seconds, service_cpus))
            results.update(_settle(deployment))
        results.update(_verify(Lake(str(deployment.lake_root)), workdir, results))
        if server is not None:
            results["instance_bytes"] = server.sql("SELECT pg_database_size(current_database())")[0][0]
        else:
            results["instance_bytes"] = _size(deployment.dagster_home)
    finally:
        if server is not None:
            server.stop()
    (workdir / "soak.json").write_text(json.dumps(results, indent=2, default=str))
    _summary(results)
    print(f"results: {workdir / 'soak.json'}; logs in {workdir}")
    return 0 if results.get("ok") else 1


def _cpus(text: str) -> set[int]:
    """`0`, `0,2` or `0-1` as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _apart(service_cpus: set[int] | None) -> set[int] | None:
    """Move this process, and so every process it starts from now on, off `service_cpus`, which
    the appenders and the reader get (`_load`); None when they share the machine."""
    if service_cpus is None:
        return None
    every = os.sched_getaffinity(0)
    if not service_cpus < every:
        raise SystemExit(
            f"--service-cpus {sorted(service_cpus)}: name some of this machine's CPUs {sorted(every)}, "
            "leaving at least one to the pipeline"
        )
    os.sched_setaffinity(0, every - service_cpus)
    return service_cpus


def _load(deployment: DagsterDeployment, workdir: Path, args, seconds: float, service_cpus: set[int] | None) -> dict:
    lake = Lake(str(deployment.lake_root))
    uri = f"delta://{lake.root}"
    env = deployment.environment()
    on_service_cpus = None if service_cpus is None else functools.partial(os.sched_setaffinity, 0, service_cpus)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.soak_load", "append", uri, str(100 + n)]
            + [str(args.rate / args.appenders), str(seconds), str(workdir / f"append-{n}.jsonl")],
            cwd=REPO_ROOT,
            env=env,
            preexec_fn=on_service_cpus,
        )
        for n in range(args.appenders)
    ]
    processes.append(
        subprocess.Popen(
            [sys.executable, "-m", "bench.soak_load", "read", uri, str(args.read_rate), str(seconds)]
            + [str(workdir / "read.jsonl")],
            cwd=REPO_ROOT,
            env=env,
            preexec_fn=on_service_cpus,
        )
    )
    try:
        landing = soak_stream(7, LANDING_EVENTS * (math.ceil(seconds / 60) + 1))
        landed: list[str] = []
        erasures_at = [seconds * (k + 1) / (args.erasures + 1) for k in range(args.erasures)]
        erased: list[str] = []
        started, minutes = time.time(), []
        minute = 0
        while time.time() - started < seconds:
            time.sleep(max(0.0, started + (minute + 1) * 60 - time.time()))
            minute += 1
            events = list(islice(landing, LANDING_EVENTS))
            write_landing_file(Path(lake.landing), f"soak-{minute:04d}.jsonl", events, [], 0)
            landed += [e["event_id"] for e in events]
            if erasures_at and time.time() - started >= erasures_at[0]:
                erasures_at.pop(0)
                sent = _records(workdir / "append-0.jsonl")
                value = sent[len(sent) // 2]["requests"][0]
                config = {"key": "build_request_id", "value": value, "actor": "soak", "reason": "bench.soak"}
                deployment.launch_run("erase_job", {"ops": {"tombstones": {"config": config}}})
                erased.append(value)
            minutes.append(_minute(deployment, workdir, minute, time.time() - 60, time.time(), service_cpus))
        for process in processes:
            process.wait(timeout=600)
    finally:
        for process in processes:  # on an error, the load must not outlive the bench
            if process.poll() is None:
                process.kill()
    return {"minutes": minutes, "landed_ids": landed, "erased": erased}


def _minute(
    deployment: DagsterDeployment, workdir: Path, minute: int, since: float, until: float, service_cpus: set[int] | None
) -> dict:
    appends = [r for path in sorted(workdir.glob("append-*.jsonl")) for r in _records(path)]
    reads = _records(workdir / "read.jsonl")
    version, checkpoint, files = _log_state(deployment.lake_root / "tables" / RAW_EVENT_LOG.name)
    runs: dict[str, int] = {}
    for run in deployment.runs(limit=1000):
        runs[run["status"]] = runs.get(run["status"], 0) + 1
    row = {
        "minute": minute,
        "append_p95_ms": _p95_ms(appends, since, until),
        "read_p95_ms": _p95_ms(reads, since, until),
        "appends": sum(1 for r in appends if since <= r["at"] < until),
        "errors": sum(1 for r in appends + reads if since <= r["at"] < until and "error" in r),
        "runs": runs,
        "commits_since_checkpoint": version - checkpoint,
        "raw_log_files": files,
        "raw_log_log_mb": _size(deployment.lake_root / "tables" / RAW_EVENT_LOG.name / "_delta_log") / 1e6,
        "lake_mb": _size(deployment.lake_root) / 1e6,
        "driver_old_mb": _driver_old_mb(deployment.drivers_dir),
        # The speed of the service's CPUs this minute (under the soak's own load): the p95 ratios
        # are read beside it.
        "anchor_ms": _anchor_ms(service_cpus),
    }
    print(json.dumps(row), flush=True)
    return row


def _anchor_ms(service_cpus: set[int] | None) -> float:
    """The machine anchor's loop, in milliseconds, on the service's CPUs when it has its own."""
    if service_cpus is None:
        return machine_anchor_s(ANCHOR_STEPS) * 1000
    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, service_cpus)
    try:
        return machine_anchor_s(ANCHOR_STEPS) * 1000
    finally:
        os.sched_setaffinity(0, own)


def _driver_old_mb(drivers: Path) -> float | None:
    """The old generation's use in the warm Spark drivers' JVMs (JDK's jstat): what survives the
    runs. None without jstat or a driver."""
    used = None
    for _, host, _ in running_hosts(drivers):
        children = Path(f"/proc/{host.pid}/task/{host.pid}/children")
        for pid in children.read_text().split() if children.exists() else []:
            try:
                out = subprocess.run(["jstat", "-gc", pid], capture_output=True, text=True, timeout=30).stdout
                columns = dict(zip(*(line.split() for line in out.splitlines()[:2]), strict=True))
                used = (used or 0.0) + float(columns["OU"]) / 1024
            except (OSError, subprocess.SubprocessError, KeyError, ValueError):
                continue
    return used


def _settle(deployment: DagsterDeployment, timeout: float = 1800) -> dict:
    """Wait for the sensors' last requests to run; every run's outcome, duration and failed checks."""
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        runs = deployment.runs(limit=1000)
        busy = [r for r in runs if r["status"] not in ("SUCCESS", "FAILURE", "CANCELED")]
        quiet_since = None if busy else (quiet_since or time.monotonic())
        if quiet_since and time.monotonic() - quiet_since > 90:  # two sensor intervals with nothing new
            break
        time.sleep(5)
    runs = deployment.runs(limit=1000)
    return {
        "runs": [
            {
                "job": r["jobName"],
                "status": r["status"],
                "s": (r["endTime"] or 0) - (r["startTime"] or 0),
                "failed_checks": deployment.failed_checks(r["runId"]),
            }
            for r in sorted(runs, key=lambda r: r["creationTime"])
        ]
    }


def _verify(lake: Lake, workdir: Path, results: dict) -> dict:
    from databuild_assets_tests.reliability_workers import _worker_session, matches_build_request, verify_lake

    appended = [r for path in sorted(workdir.glob("append-*.jsonl")) for r in _records(path) if "error" not in r]
    sent = {i for r in appended for i in r["ids"]} | set(results["landed_ids"])
    erased = set(results["erased"])
    events = {}
    for n in range(results["settings"]["appenders"]):
        count = sum(len(r["ids"]) for r in _records(workdir / f"append-{n}.jsonl"))
        settings = results["settings"]
        stream = soak_stream(100 + n, stream_size(settings["rate"] / settings["appenders"], settings["minutes"] * 60))
        events.update((e["event_id"], e) for e in islice(stream, count))
    erased_ids = {i for i, e in events.items() if any(matches_build_request(e, v) for v in erased)}
    spark = _worker_session()
    try:
        verdict = verify_lake(spark, lake, sent, erased, erased_ids, purged=False)
    finally:
        spark.stop()
    table = Path(lake.table_path(RAW_EVENT_LOG))
    # An erased event may be purged already (a compaction ran after its erasure) or not yet: only
    # the others count as lost.
    present = set(_open(str(table)).to_pyarrow_table(columns=["event_id"])["event_id"].to_pylist())
    verdict["lost"] = len((sent - erased_ids) - present)
    verdict["erased_purged"] = len(erased_ids - present)
    as_is, checkpointed = _checkpointed_open(table)
    minutes = results["minutes"]
    first, last = minutes[: min(10, len(minutes))], minutes[-min(10, len(minutes)) :]

    def worst_minute(rows: list[dict], key: str) -> float:
        values = [row[key] for row in rows if row[key] is not None]
        return max(values) if values else float("nan")

    def pooled_ratio(records: list[dict]) -> float:
        """The p95 of every call in the last 10 minutes over that of the first 10 (issue 43's measure)."""
        times = [r["at"] for r in records]
        if not times:
            return float("nan")
        window = 60 * len(first)
        head = _p95_ms(records, min(times), min(times) + window)
        tail = _p95_ms(records, max(times) - window, max(times) + 1)
        return tail / head if head and tail else float("nan")

    reads = _records(workdir / "read.jsonl")
    flat = {
        "append_p95_ratio": pooled_ratio(appended),
        "read_p95_ratio": pooled_ratio(reads),
        # The stricter reading: the worst minute's p95 of the last 10 over the first 10's.
        "append_worst_minute_p95_ratio": worst_minute(last, "append_p95_ms") / worst_minute(first, "append_p95_ms"),
        "read_worst_minute_p95_ratio": worst_minute(last, "read_p95_ms") / worst_minute(first, "read_p95_ms"),
        "append_max_s": max((r["s"] for r in appended), default=float("nan")),
        "max_commits_since_checkpoint": max(m["commits_since_checkpoint"] for m in minutes),
        "max_raw_log_files": max((m["raw_log_files"] for m in minutes if m["raw_log_files"] is not None), default=None),
        "max_raw_log_log_mb": max(m["raw_log_log_mb"] for m in minutes),
        "max_driver_old_mb": max((m["driver_old_mb"] or 0 for m in minutes), default=None),
        # The same ratio for the machine anchor: a host slower at the end than at the start moves
        # the p95 ratios with it.
        "anchor_ratio": statistics.median(m["anchor_ms"] for m in last)
        / statistics.median(m["anchor_ms"] for m in first),
        "open_s": as_is,
        "open_checkpointed_s": checkpointed,
    }
    failed = [r for r in results["runs"] if r["status"] != "SUCCESS" or r["failed_checks"]]
    # Every erased event purged is the expected outcome, not a problem; one left would be `tombstoned_visible`.
    expected = {"sent", "in_log", "erased_purged"}
    problems = {k: v for k, v in verdict.items() if k not in expected and v not in (0, [], {})}
    ok = not failed and not problems
    return {"verdict": verdict, "failed_runs": failed, "problems": problems, **flat, "ok": ok}


def _summary(results: dict) -> None:
    print("\nruns:")
    for run in results.get("runs", []):
        print(f"  {run['job']:28} {run['status']:8} {run['s']:7.1f} s")
        for check in run["failed_checks"]:
            print(f"    check did not pass: {check[:300]}")
    for key in (
        "verdict",
        "problems",
        "append_p95_ratio",
        "read_p95_ratio",
        "append_worst_minute_p95_ratio",
        "read_worst_minute_p95_ratio",
        "append_max_s",
        "max_commits_since_checkpoint",
        "max_raw_log_files",
        "max_raw_log_log_mb",
        "max_driver_old_mb",
        "anchor_ratio",
        "open_s",
        "open_checkpointed_s",
        "instance_bytes",
        "ok",
    ):
        print(f"{key}: {results.get(key)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
