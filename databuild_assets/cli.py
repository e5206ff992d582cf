"""Command line: `databuild-assets demo` runs the main job on the embedded default lake;
`migrate` copies a SQLite log into the lake; `query` asks either backend one question; `check`
finds damaged files and tables that disagree, and `repair` mends them;
`spark-driver status|stop` lists or stops the warm Spark drivers of Dagster's runs.

It generates a realistic workload into the landing folder (when that folder is empty), runs
every asset through Dagster in this process, and prints what the lake now holds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from databuild_assets.runtime.file_modes import restrict_umask
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG, Lake, LakeRootError, is_local
from databuild_assets.runtime.object_store import is_s3

if TYPE_CHECKING:  # Dagster is imported by the commands that run it, not by `query` or `check`
    from dagster import DagsterInstance

# Exit codes: 0 done; 1 the work failed (a run, Spark); 2 what the command was given is wrong (an
# argument, a URI, a log or a lake root that is not there, Spark settings Spark cannot start with):
# one line on stderr says what and how to fix it.
EXIT_BAD_INPUT = 2
# `check` found damage (each problem on a line of its own, with the command that repairs it), or
# a reader met a damaged file (one line naming the table, the file, and `check` and `repair`).
EXIT_DAMAGE = 1


def _refuse(command: str, problem: object) -> int:
    print(f"databuild-assets {command}: {problem}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _spark_or_refusal(command: str):
    """(SparkSession, None) from the environment's settings, or (None, exit code) once a bad
    setting, no Java or no Delta jars is reported in one line."""
    from databuild_assets.runtime.delta_jars import DeltaJarsMissingError
    from databuild_assets.runtime.spark import SparkSettings, SparkStartError, build_spark_session

    try:
        return build_spark_session(SparkSettings.from_env()), None
    except (ValueError, SparkStartError, DeltaJarsMissingError) as error:
        return None, _refuse(command, error)


def _instance() -> DagsterInstance:
    """The DAGSTER_HOME instance when set (runs then show in the UI), else a throwaway one."""
    from dagster import DagsterInstance

    return DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else DagsterInstance.ephemeral()


def _landing_has_files(lake: Lake) -> bool:
    if is_s3(lake.landing):
        from databuild_assets.ingest.landing_state import landing_state

        return landing_state(lake.landing) is not None
    landing = Path(lake.landing)
    return landing.is_dir() and any(not p.name.startswith((".", "_")) for p in landing.iterdir())


def _write_landing(lake: Lake, events: int, seed: int):
    """The demo's workload as landing files: written into a local landing folder; for a lake on
    S3 written aside, then put as objects (each appears whole), as a writer would."""
    from databuild_assets.workload import write_landing_files

    settings = {"seed": seed, "events_per_file": max(1, events // 8), "bad_line_rate": 0.001, "duplicate_rate": 0.002}
    if not is_s3(lake.landing):
        return write_landing_files(lake.landing, events, **settings)
    from databuild_assets.runtime.files import ObjectFiles

    with tempfile.TemporaryDirectory(prefix="databuild-demo-") as staging:
        summary = write_landing_files(staging, events, **settings)
        objects = ObjectFiles()
        for file in summary.files:
            with open(file, "rb") as source, objects.open_new(f"{lake.landing}/{file.name}") as target:
                shutil.copyfileobj(source, target, 8 << 20)
    return summary


def demo(events: int, seed: int) -> int:
    try:  # as the Dagster resource checks it: a mistyped root is refused, not created with its parents
        lake = Lake.from_env().ensure_root()
    except LakeRootError as error:
        return _refuse("demo", error)
    # The demo is one process: a JVM of its own, gone when it ends (the warm driver is for runs).
    os.environ.setdefault("DATABUILD_SPARK_DRIVER", "own")
    from databuild_assets.definitions import all_assets_job, defs

    started = time.monotonic()
    if not (is_local(lake.root) or is_s3(lake.root)):
        print(f"lake root {lake.root} is remote: not generating a workload; ingesting what is in {lake.landing}")
    elif _landing_has_files(lake):
        print(f"{lake.landing} already has landing files: ingesting only what is new")
    else:
        summary = _write_landing(lake, events, seed)
        print(
            f"generated {summary.events_written:,} events in {len(summary.files)} landing files "
            f"(+{summary.bad_lines_written} bad lines, +{summary.duplicate_lines_written} redelivered) "
            f"in {time.monotonic() - started:.1f}s"
        )
    result = defs.resolve_job_def(all_assets_job.name).execute_in_process(instance=_instance())
    if not result.success:
        print("the main job failed; see the Dagster log above", file=sys.stderr)
        return 1
    metadata = {
        event.asset_key.to_user_string(): {
            k: v.value for k, v in event.step_materialization_data.materialization.metadata.items()
        }
        for event in result.get_asset_materialization_events()
        if event.asset_key is not None
    }
    raw, quarantine = metadata[RAW_EVENT_LOG.name], metadata[EVENT_QUARANTINE.name]
    print()
    print("DataBuild BEL lakehouse: summary")
    print(f"  run                 {result.run_id} ({time.monotonic() - started:.1f}s in all)")
    print(f"  lines read          {raw['lines_read']:,}")
    print(f"  events accepted     {raw['accepted']:,}")
    print(f"  duplicates skipped  {raw['duplicates_skipped']:,}")
    print(f"  lines quarantined   {raw['quarantined']:,}")
    print(
        f"  raw_event_log       version {raw['delta_version']}, {raw['dagster/row_count']:,} events, "
        f"{raw['num_files']} files, {raw['size_bytes'] / 1e6:.1f} MB"
    )
    print(f"  event_quarantine    version {quarantine['delta_version']}, {quarantine['dagster/row_count']:,} lines")
    for name, noun in (
        ("filtered_event_log", "visible events"),
        ("partition_state", "partitions"),
        ("job_runs", "job runs"),
        ("build_requests", "build requests"),
    ):
        if name in metadata:
            table = metadata[name]
            mode = f", {table['refresh_mode']} refresh" if "refresh_mode" in table else ""
            print(f"  {name:19} version {table['delta_version']}, {table['dagster/row_count']:,} {noun}{mode}")
    if "tombstones" in metadata:
        print(
            f"  tombstones          {metadata['tombstones']['tombstones']}"
            f" ({metadata['tombstones']['pending']} pending)"
        )
    if "raw_log_version" in metadata.get("serving_index", {}):  # none for a lake on an object store
        index = metadata["serving_index"]
        segments = index.get("segments", 0)
        print(
            f"  serving_index       raw_event_log v{index['raw_log_version']}, {index['events']:,} visible events, "
            f"{index['bytes'] / 1e6:.1f} MB; {index.get('cold_build_requests', 0):,} finished build requests in "
            f"{segments} segment{'' if segments == 1 else 's'}, {index.get('segment_bytes', 0) / 1e6:.1f} MB"
        )
    print(f"  tables under        {lake.path('tables')}")
    print(f"  landing folder      {lake.landing}")
    return 0


def migrate(sqlite_uri: str) -> int:
    import logging

    from databuild_assets.log import open_event_log, parse_event_log_uri
    from databuild_assets.log.migrate import migrate_sqlite_to_delta

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if not sqlite_uri.lower().startswith("sqlite:"):
            raise ValueError(f"migrate copies a SQLite BEL (sqlite:///path/to/bel.db), not {sqlite_uri!r}")
        with open_event_log(parse_event_log_uri(sqlite_uri).require_log().uri):
            pass  # a file that is no event log, or one of another schema version, is refused before Spark starts
        lake = Lake.from_env().ensure_root()
    except (ValueError, LakeRootError) as error:
        return _refuse("migrate", error)
    spark, refused = _spark_or_refusal("migrate")
    if spark is None:
        return refused
    result = migrate_sqlite_to_delta(spark, sqlite_uri, lake)
    print(f"migrated {sqlite_uri} -> {lake.table_path(RAW_EVENT_LOG)}")
    print(f"  events read         {result.read:,}")
    print(f"  new in the log      {result.accepted:,}")
    print(f"  already there       {result.duplicates:,}")
    print(f"  commits             {result.commits} (raw_event_log now at version {result.log_version})")
    return 0


def query(uri: str, method: str, arguments: list[str]) -> int:
    from databuild_assets.log import open_event_log, parse_event_log_uri
    from databuild_assets.log.commands import parse_arguments, to_json
    from databuild_assets.runtime.damage import DamagedTableError

    # What the command line can get wrong is checked before the log is opened (and, but for a
    # lake on object storage, before Spark starts): the URI, the method, its arguments, and that
    # the log exists (a reader never creates one: a mistyped path is an error, not an empty log).
    try:
        parsed = parse_event_log_uri(uri).require_log()
        keywords = parse_arguments(method, arguments)
    except (ValueError, LakeRootError) as error:
        return _refuse("query", error)
    options = {}
    if parsed.scheme == "delta" and not (is_local(parsed.location) or is_s3(parsed.location)):
        # A lake on another object store is read through Spark; a local one or one on S3 without a JVM.
        from delta.tables import DeltaTable

        options["spark"], refused = _spark_or_refusal("query")
        if options["spark"] is None:
            return refused
        log_path = parsed.lake.table_path(RAW_EVENT_LOG)
        if not DeltaTable.isDeltaTable(options["spark"], log_path):
            return _refuse("query", f"no event log in the lake {parsed.location}: {log_path} is not a Delta table")
    try:
        log = open_event_log(uri, **options)
    except DamagedTableError as error:
        return _damaged("query", error)
    except ValueError as error:  # a file that is no event log, or one of another schema version
        return _refuse("query", error)
    try:
        with log:
            answer = getattr(log, method)(**keywords)
    except DamagedTableError as error:
        return _damaged("query", error)
    try:
        print(to_json(answer), flush=True)
    except BrokenPipeError:  # the reader stopped early (`| head`): what it read was right
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush would raise again
        return 141  # as a tool killed by SIGPIPE (128 + 13)
    return 0


def _damaged(command: str, error: Exception) -> int:
    """A damaged or missing file met on the way: its one line, and exit 1 (the work failed)."""
    print(f"databuild-assets {command}: {error}", file=sys.stderr)
    return EXIT_DAMAGE


def _lake_of(command: str, uri: str) -> tuple[Lake | None, int]:
    """The local lake a delta:/// URI names (its raw log must be there), or (None, exit code) once
    the refusal is printed."""
    from databuild_assets.log import parse_event_log_uri

    try:
        parsed = parse_event_log_uri(uri)
        if parsed.scheme != "delta" or not is_local(parsed.location):
            raise ValueError(f"{command} reads a lake on this machine (delta:///path/to/lake), not {uri!r}")
        parsed.require_log()
    except (ValueError, LakeRootError) as error:
        return None, _refuse(command, error)
    return parsed.lake, 0


def check(uri: str, deep: bool) -> int:
    from databuild_assets.maintenance.check import check_lake, format_check

    lake, refused = _lake_of("check", uri)
    if lake is None:
        return refused
    report = check_lake(lake, deep=deep, progress=lambda line: print(f"  ... {line}", file=sys.stderr))
    print(format_check(report))
    return 0 if report.ok else EXIT_DAMAGE


def repair(uri: str) -> int:
    import logging

    lake, refused = _lake_of("repair", uri)
    if lake is None:
        return refused
    os.environ.setdefault("DATABUILD_SPARK_DRIVER", "own")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    spark, refused = _spark_or_refusal("repair")
    if spark is None:
        return refused
    from databuild_assets.maintenance.repair import format_repair, repair_lake

    result = repair_lake(spark, lake, progress=lambda line: print(f"  ... {line}", file=sys.stderr))
    print(format_repair(result))
    return 0 if result.after is None or result.after.ok else EXIT_DAMAGE


def spark_driver(action: str) -> int:
    from databuild_assets.runtime.private_folders import UnsafeFolderError
    from databuild_assets.runtime.warm_driver import drivers_dir, running_hosts, stop_hosts

    try:
        if action == "stop":
            stopped = stop_hosts()
            print(
                f"stopped {len(stopped)} warm Spark driver(s)"
                + (f": {', '.join(map(str, stopped))}" if stopped else "")
            )
            return 0
        hosts = running_hosts()
        registry = None if hosts else drivers_dir()
    except UnsafeFolderError as error:  # a registry someone else made: none of its pids is signalled
        return _refuse(f"spark-driver {action}", error)
    if not hosts:
        print(f"no warm Spark driver is running (registry: {registry})")
    for key, host, attached in hosts:
        age = (time.time() - host.started_at) / 60
        print(
            f"{key}  pid {host.pid}  master {host.master}  up {age:.0f} min  "
            f"attached {', '.join(map(str, attached)) or 'none'}  log {host.log}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    restrict_umask()  # what a command writes is its owner's alone (runtime/file_modes.py)
    parser = argparse.ArgumentParser(prog="databuild-assets", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_demo = commands.add_parser("demo", help="generate a workload (if landing is empty) and materialize every asset")
    run_demo.add_argument("--events", type=int, default=200_000, help="events to generate (default 200,000)")
    run_demo.add_argument("--seed", type=int, default=7)
    run_migrate = commands.add_parser("migrate", help="copy a SQLite BEL into the Delta event log, exactly once")
    run_migrate.add_argument("sqlite_uri", help="sqlite:///absolute/path/to/bel.db")
    run_query = commands.add_parser(
        "query",
        help="ask the event log (either backend) one question; prints the answer as JSON",
        description="Call one BuildEventLog method: arguments in the method's order or as name=value; "
        "a status by name; filter as a JSON object. Example: databuild-assets query delta:///data/lake "
        "get_latest_partition_status data/date=2024-01-01",
    )
    run_query.add_argument("uri", help="sqlite:///path/bel.db, delta:///path/to/lake or delta+s3a://bucket/lake")
    run_query.add_argument("method", help="a query method, e.g. get_activity_summary or list_events")
    run_query.add_argument("arguments", nargs="*", help="its arguments: values in order, or name=value")
    run_check = commands.add_parser(
        "check",
        help="check that every table of a lake reads whole and agrees with the others; exit 1 on damage",
        description="Reads every table's Delta log and every data file it references (no JVM), and checks the "
        "versions the derived tables and the serving index recorded. Each problem names the table and the file, "
        "what it costs and the command that repairs it. Example: databuild-assets check delta:///data/lake",
    )
    run_check.add_argument("uri", help="delta:///path/to/lake")
    run_check.add_argument(
        "--deep", action="store_true", help="also run SQLite's quick_check over the serving index (reads all of it)"
    )
    run_repair = commands.add_parser(
        "repair",
        help="mend what check finds: restore, move aside, ingest again, rebuild; exit 1 if damage remains",
        description="Restores a damaged source table to its newest version that reads whole and removes its damaged "
        "files (moved aside under <root>/repair/, never deleted), ingests again the landing files still kept for the "
        "events that lost, rebuilds the derived tables and the serving index, then checks again. "
        "Example: databuild-assets repair delta:///data/lake",
    )
    run_repair.add_argument("uri", help="delta:///path/to/lake")
    run_driver = commands.add_parser(
        "spark-driver", help="list (status) or stop the warm Spark drivers Dagster's runs attach to"
    )
    run_driver.add_argument("action", choices=["status", "stop"])
    args = parser.parse_args(argv)
    if args.command == "spark-driver":
        return spark_driver(args.action)
    if args.command == "demo":
        return demo(args.events, args.seed)
    if args.command == "migrate":
        return migrate(args.sqlite_uri)
    if args.command == "check":
        return check(args.uri, args.deep)
    if args.command == "repair":
        return repair(args.uri)
    if args.command == "query":
        return query(args.uri, args.method, args.arguments)
    return 2


if __name__ == "__main__":
    sys.exit(main())
