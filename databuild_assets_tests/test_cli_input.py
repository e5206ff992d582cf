"""Bad input at the command line's front door: a mistyped lake or log, an argument that does not
fit its method, a URI no backend accepts, a lake root whose parent is missing. Each is refused
with exit 2 and one line on stderr that names what is wrong and what to do, never a traceback,
and creates nothing on disk (docs/query-api.md, The command line). A query imports neither
Dagster nor pyspark, nor Arrow when the serving index holds its answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from databuild_assets.log import EventLogNotFoundError, SqliteEventLog, open_event_log
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.runtime.lake import LakeRootError
from databuild_assets.workload import generate_events
from databuild_assets_tests.bel_cases import one_build_events
from databuild_assets_tests.support import REPO_ROOT, tree


def databuild_assets(*arguments: str, **environ: str) -> subprocess.CompletedProcess:
    """The command line as a user runs it: a process of its own, from the repo."""
    return subprocess.run(
        [sys.executable, "-m", "databuild_assets.cli", *arguments],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **environ},
        timeout=120,
    )


def assert_refused(run: subprocess.CompletedProcess, *named: str) -> None:
    """Exit 2, nothing on stdout, and one line on stderr naming each of `named`."""
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for text in named:
        assert text in lines[0], (text, lines[0])


@pytest.fixture
def sqlite_uri(tmp_path: Path) -> str:
    with SqliteEventLog(tmp_path / "bel.db") as log:
        log.append_events(one_build_events())
    return f"sqlite://{tmp_path}/bel.db"


def test_querying_a_path_whose_parent_folder_is_missing_is_refused_not_answered_as_an_empty_log(tmp_path):
    before = tree(tmp_path)

    run = databuild_assets("query", f"delta://{tmp_path}/a/path/that/is/not/a/lake", "get_activity_summary")

    assert_refused(run, f"lake root {tmp_path}/a/path/that/is/not/a/lake does not exist", "mkdir -p")
    assert tree(tmp_path) == before


def test_querying_a_folder_that_holds_no_event_log_is_refused_and_left_alone(tmp_path):
    (tmp_path / "lake").mkdir()
    before = tree(tmp_path)

    run = databuild_assets("query", f"delta://{tmp_path}/lake", "get_activity_summary")

    assert_refused(run, "no event log in the lake", f"{tmp_path}/lake/tables/raw_event_log is not a Delta table")
    assert tree(tmp_path) == before


def test_querying_a_sqlite_file_that_does_not_exist_is_refused_and_not_created(tmp_path):
    before = tree(tmp_path)

    missing_file = databuild_assets("query", f"sqlite://{tmp_path}/typo.db", "get_activity_summary")
    missing_folder = databuild_assets("query", f"sqlite://{tmp_path}/var/lib/databuild/bel.db", "get_activity_summary")

    assert_refused(missing_file, f"no SQLite event log at {tmp_path}/typo.db")
    assert_refused(missing_folder, f"no SQLite event log at {tmp_path}/var/lib/databuild/bel.db")
    assert tree(tmp_path) == before


def test_opening_a_sqlite_log_in_a_missing_folder_names_the_folder_to_create(tmp_path):
    folder = tmp_path / "var" / "lib" / "databuild"
    with pytest.raises(EventLogNotFoundError, match=rf"its folder {folder} does not exist.*mkdir -p {folder}"):
        open_event_log(f"sqlite://{tmp_path}/var/lib/databuild/bel.db")
    assert not (tmp_path / "var").exists()


def test_opening_a_lake_whose_parent_folder_is_missing_is_refused_and_nothing_is_created(tmp_path):
    before = tree(tmp_path)

    with pytest.raises(LakeRootError, match="nor does its parent folder"):
        open_event_log(f"delta://{tmp_path}/mnt/data/lake")

    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["list_events", "bogus=1"], ["list_events: no argument named 'bogus'", "since, filter, limit"]),
        (["list_events", "since=garbage"], ["since='garbage' is not a cursor", "next_cursor"]),
        (["list_events", "limit=0"], ["limit='0' is not a positive integer"]),
        (["list_events", "filter=[1]"], ["filter='[1]' is not valid", "event_types"]),
        (["get_events_in_range", "10", "5"], ["end_ns 5 is before start_ns 10"]),
        (["get_events_in_range", "10"], ["get_events_in_range: missing end_ns"]),
        (["list_build_requests", "bogus=1"], ["no argument named 'bogus'", "limit, offset, status"]),
        (["list_build_requests", "status=NOPE"], ["status='NOPE'", "BUILD_REQUEST_FAILED", "BUILD_REQUEST_RECEIVED"]),
        (["list_build_requests", "status=99"], ["status='99' is not a build request status"]),
        (["get_partition_events", "date=2026-11-18"], ["no argument named 'date'", "partition_ref=date=2026-11-18"]),
        (["get_activity_summary", "extra"], ["get_activity_summary: too many arguments"]),
        (["append_events", "[]"], ["no query method 'append_events'", "get_activity_summary"]),
    ],
)
def test_a_query_argument_that_does_not_fit_exits_2_naming_it(sqlite_uri, arguments, named):
    assert_refused(databuild_assets("query", sqlite_uri, *arguments), *named)


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("sqlite://bel.db", ["does not name an absolute file path", "sqlite:///var/lib/databuild/bel.db"]),
        ("sqlite::memory:", ["cannot open event log", "sqlite:///:memory:"]),
        ("postgres:///bel", ["cannot open event log 'postgres:///bel'", "delta:///absolute/path/to/lake"]),
        ("delta://s3a://bucket/lake", ["does not name an absolute path", "delta:///data/lake"]),
    ],
)
def test_a_uri_no_backend_accepts_exits_2_naming_the_accepted_forms(uri, named):
    assert_refused(databuild_assets("query", uri, "get_activity_summary"), *named)


def test_a_partition_ref_holding_an_equals_sign_is_still_a_positional_value(sqlite_uri):
    run = databuild_assets("query", sqlite_uri, "get_latest_partition_status", "data/sales/date=2026-11-18")

    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "null"


def test_a_query_whose_reader_stops_early_exits_quietly(tmp_path):
    # `databuild-assets query ... | head`: a long answer into a pipe closed after its first bytes.
    with SqliteEventLog(tmp_path / "bel.db") as log:
        log.append_events(generate_events(2000, seed=4))
    query = [sys.executable, "-m", "databuild_assets.cli", "query", f"sqlite://{tmp_path}/bel.db", "list_events"]
    run = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | head -c 100 > /dev/null', "query", *query],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert run.stderr == ""
    assert run.returncode == 141


# What a query of an answer the index holds does without: the orchestrator, Spark, Arrow, and
# what only appends, builds and publications use (OpenSSL's init, thread pools, checkpoints).
_HEAVY = (
    "dagster", "pyspark", "pyarrow", "numpy", "deltalake",
    "hashlib", "concurrent.futures", "databuild_assets.runtime.delta_checkpoint",
)  # fmt: skip


def _query_imports(uri: str) -> tuple[dict, list[str]]:
    """`query <uri> get_activity_summary` in a process of its own: its answer, and which of
    `_HEAVY` it imported."""
    program = (
        "import sys; from databuild_assets.cli import main; "
        f"code = main(['query', {uri!r}, 'get_activity_summary']); "
        f"print([name for name in {_HEAVY!r} if name in sys.modules], file=sys.stderr); sys.exit(code)"
    )
    # Without coverage's start-up variables: its tracer imports hashlib in the process it measures.
    env = {name: value for name, value in os.environ.items() if not name.startswith("COVERAGE_PROCESS_")}
    run = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout), json.loads(run.stderr.strip().splitlines()[-1].replace("'", '"'))


def test_a_query_answers_without_importing_dagster_pyspark_or_arrow(sqlite_uri, lake):
    # A query serves a live service's reader: it pays neither a JVM nor the orchestrator's
    # import, nor pyspark's (Spark schemas it never reads), and an answer the serving index
    # holds, on a lake, needs no Arrow (imported on first use, runtime/deferred.py).
    answer, imported = _query_imports(sqlite_uri)
    assert answer["total_events"] == len(one_build_events()) and imported == []
    with DeltaRsEventLog(lake) as log:
        log.append_events(one_build_events())
    answer, imported = _query_imports(f"delta://{lake.root}")
    assert answer["total_events"] == len(one_build_events()) and imported == []


@pytest.mark.parametrize("command", [["demo", "--events", "10"], ["migrate", "sqlite:///:memory:"]])
def test_demo_and_migrate_refuse_a_lake_root_whose_parent_folder_is_missing(tmp_path, command):
    root = tmp_path / "mnt" / "data" / "lake"
    before = tree(tmp_path)

    run = databuild_assets(*command, DATABUILD_LAKE_ROOT=str(root))

    assert_refused(run, f"lake root {root} does not exist, nor does its parent folder", "DATABUILD_LAKE_ROOT")
    assert tree(tmp_path) == before


def test_migrate_refuses_a_sqlite_log_that_does_not_exist(tmp_path):
    run = databuild_assets("migrate", f"sqlite://{tmp_path}/typo.db", DATABUILD_LAKE_ROOT=str(tmp_path / "lake"))

    assert_refused(run, f"no SQLite event log at {tmp_path}/typo.db")
    assert not (tmp_path / "typo.db").exists()


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"DATABUILD_SPARK_MASTER": "bogus"}, "Spark master URL 'bogus' is not one Spark knows"),
        ({"DATABUILD_SPARK_CONF": "no-equals-sign"}, "DATABUILD_SPARK_CONF: 'no-equals-sign' is not key=value"),
    ],
)
def test_migrate_refuses_spark_settings_spark_cannot_start_with(tmp_path, sqlite_uri, setting, named):
    run = databuild_assets("migrate", sqlite_uri, DATABUILD_LAKE_ROOT=str(tmp_path / "lake"), **setting)

    assert_refused(run, named)


@pytest.mark.parametrize("command", ["query", "migrate"])
def test_a_sqlite_file_that_is_no_event_log_is_refused_and_left_alone(tmp_path, command):
    (tmp_path / "notes.db").write_text("not a database")
    arguments = ["get_activity_summary"] if command == "query" else []
    before = tree(tmp_path)

    run = databuild_assets(
        command, f"sqlite://{tmp_path}/notes.db", *arguments, DATABUILD_LAKE_ROOT=str(tmp_path / "lake")
    )

    assert_refused(run, f"cannot open SQLite event log {tmp_path}/notes.db: file is not a database")
    assert tree(tmp_path) == before
