"""The BuildEventLog query interface, run against every backend, plus the backend-specific parts
(opening by URI, the SQLite bulk loader).

The shared specification is `bel_cases.py`. To run it on another backend, add its factory to
`BACKEND_FACTORIES`: it gets the pytest request (for fixtures such as `spark`) and an empty
directory of its own, and returns an open, empty log.

The Delta logs share their lakes between tests (`SharedDeltaLakes`): a Delta commit takes
seconds, and many cases start with the same appends (`_one_build`). A test still sees exactly the
log its own append calls made.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from databuild_assets.events.enums import BuildRequestStatus
from databuild_assets.events.validation import InvalidEventError
from databuild_assets.ingest.landing import ensure_ingest_tables
from databuild_assets.log import (
    AppendResult,
    BuildEventLog,
    EventFilter,
    SqliteEventLog,
    load_events,
    open_event_log,
    parse_event_log_uri,
)
from databuild_assets.log.interface import (
    ActivitySummary,
    BuildRequestSummary,
    EventPage,
    PartitionStatusInfo,
    PartitionSummary,
)
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.log.spark.backend import DeltaEventLog
from databuild_assets.runtime.lake import Lake
from databuild_assets_tests import bel_cases
from databuild_assets_tests.bel_cases import P, partition_event

BackendFactory = Callable[[pytest.FixtureRequest, Path], BuildEventLog]


def _sqlite_log(request: pytest.FixtureRequest, directory: Path) -> BuildEventLog:
    return SqliteEventLog(directory / "bel.db")


def _delta_log(request: pytest.FixtureRequest, directory: Path) -> BuildEventLog:
    return SharedDeltaLog(request.getfixturevalue("shared_delta_lakes"))


def _delta_rs_log(request: pytest.FixtureRequest, directory: Path) -> BuildEventLog:
    return DeltaRsEventLog(Lake(str(directory / "lake")))


class _RefreshedAfterEveryAppend(DeltaRsEventLog):
    """The JVM-free log whose index the pipeline refreshes after every append, with a hot window:
    the events of finished build requests older than it are then read from segments."""

    def append_events(self, events: Iterable[Mapping[str, Any]]) -> AppendResult:
        result = super().append_events(events)
        self.refresh_index()
        return result


def _delta_rs_tiered_log(window_s: float | None) -> BackendFactory:
    def factory(request: pytest.FixtureRequest, directory: Path) -> BuildEventLog:
        (directory / "lake").mkdir()  # a lake it can write: its index is the lake's, which evicts
        return _RefreshedAfterEveryAppend(Lake(str(directory / "lake")), hot_window_s=window_s)

    return factory


BACKEND_FACTORIES: dict[str, BackendFactory] = {
    "sqlite": _sqlite_log,
    "delta": _delta_log,
    "delta-rs": _delta_rs_log,
    # Every finished build request cold; and those whose last event is 40 ns of log time older
    # than the newest (the cases' timestamps are small integers).
    "delta-rs-cold-0": _delta_rs_tiered_log(0),
    "delta-rs-cold-40ns": _delta_rs_tiered_log(40e-9),
    # The default window (an hour): every case's events are hot, and each append is refreshed.
    "delta-rs-default-window": _delta_rs_tiered_log(None),
}


# ---------------------------------------------------------------------------------------------
# Delta lakes shared by the tests that make the same appends
# ---------------------------------------------------------------------------------------------


@dataclass
class _Lake:
    log: DeltaEventLog
    result: AppendResult | None  # of the append call that made it
    owner: object | None  # the SharedDeltaLog that made it
    shared: bool = False  # some other SharedDeltaLog has it too


class SharedDeltaLakes:
    """Delta lakes keyed by the sequence of append calls that made them, for one test module.

    The first test to make a sequence of calls writes it; a later test making the same calls gets
    the same lake (with its projections already refreshed) without writing again. Only the log
    that made a lake appends to it in place, and only while no other log has it; otherwise the
    append goes to a copy, so a lake never changes under a test that reads it. Every lake starts
    as a copy of one whose log and projection tables exist and are empty.
    """

    def __init__(self, spark: Any, directory: Path) -> None:
        self._spark, self._directory, self._made = spark, directory, 0
        empty = self._new_log()
        ensure_ingest_tables(spark, empty.lake)
        empty.get_activity_summary()  # creates the three projection tables
        self._lakes: dict[tuple[str, ...], _Lake] = {(): _Lake(empty, None, owner=None, shared=True)}

    def _new_log(self, copy_of: DeltaEventLog | None = None) -> DeltaEventLog:
        self._made += 1
        root = self._directory / f"lake-{self._made}"
        if copy_of is not None:
            shutil.copytree(copy_of.lake.root, root)
        return DeltaEventLog(self._spark, Lake(str(root)))

    def log_of(self, calls: tuple[str, ...]) -> DeltaEventLog:
        return self._lakes[calls].log

    def append(
        self, calls: tuple[str, ...], events: list[Mapping[str, Any]], owner: object
    ) -> tuple[tuple[str, ...], DeltaEventLog, AppendResult]:
        """Append `events` to the lake that `calls` made; returns the calls now made, their lake's
        log and the append's result."""
        after = (*calls, json.dumps(events, sort_keys=True, default=repr))
        known = self._lakes.get(after)
        if known is not None:
            known.shared = True
            return after, known.log, known.result
        current = self._lakes[calls]
        in_place = current.owner is owner and not current.shared
        # In place, it is about to hold more than `calls` made: it is no longer their lake.
        log = self._lakes.pop(calls).log if in_place else self._new_log(copy_of=current.log)
        try:
            result = log.append_events(events)
        except InvalidEventError:
            if in_place:  # refused before anything was written: still the lake of `calls`
                self._lakes[calls] = current
            raise
        self._lakes[after] = _Lake(log, result, owner=owner)
        return after, log, result


@pytest.fixture(scope="module")
def shared_delta_lakes(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> SharedDeltaLakes:
    return SharedDeltaLakes(spark, tmp_path_factory.mktemp("delta-lakes"))


class SharedDeltaLog(BuildEventLog):
    """A `DeltaEventLog` on a lake of `SharedDeltaLakes`: reads go to the lake its appends made."""

    def __init__(self, lakes: SharedDeltaLakes) -> None:
        self._lakes = lakes
        self._calls: tuple[str, ...] = ()
        self._log = lakes.log_of(())

    def append_events(self, events: Iterable[Mapping[str, Any]]) -> AppendResult:
        calls, log, result = self._lakes.append(self._calls, list(events), owner=self)
        self._calls, self._log = calls, log
        return result

    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._log.get_build_request_events(build_request_id, since_ns)

    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._log.get_partition_events(partition_ref, since_ns)

    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        return self._log.get_job_run_events(job_run_id)

    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        return self._log.get_events_in_range(start_ns, end_ns)

    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        return self._log.list_events(since, filter, limit)

    def get_latest_partition_status(self, partition_ref: str) -> PartitionStatusInfo | None:
        return self._log.get_latest_partition_status(partition_ref)

    def get_active_builds_for_partition(self, partition_ref: str) -> list[str]:
        return self._log.get_active_builds_for_partition(partition_ref)

    def get_build_request_for_available_partition(self, partition_ref: str) -> str | None:
        return self._log.get_build_request_for_available_partition(partition_ref)

    def list_build_requests(
        self, limit: int = 100, offset: int = 0, status: BuildRequestStatus | int | None = None
    ) -> list[BuildRequestSummary]:
        return self._log.list_build_requests(limit, offset, status)

    def list_recent_partitions(self, limit: int = 100, offset: int = 0) -> list[PartitionSummary]:
        return self._log.list_recent_partitions(limit, offset)

    def get_activity_summary(self) -> ActivitySummary:
        return self._log.get_activity_summary()


# The Spark backend answers each case through Delta commits and projection refreshes on Spark: a
# tenth of the suite's time. `make test` checks its answers against SQLite's on a random workload
# after every batch (test_backend_parity.py); the extended tier runs every case on it.
@pytest.fixture(
    params=[
        pytest.param(name, marks=pytest.mark.extended) if name == "delta" else name
        for name in sorted(BACKEND_FACTORIES)
    ]
)
def make_event_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], BuildEventLog]]:
    """Opens fresh, empty logs of one backend (each in its own directory); closes them after."""
    factory = BACKEND_FACTORIES[request.param]
    opened: list[BuildEventLog] = []

    def make() -> BuildEventLog:
        directory = tmp_path / f"log-{len(opened)}"
        directory.mkdir()
        opened.append(factory(request, directory))
        return opened[-1]

    yield make
    for log in opened:
        log.close()


@pytest.fixture
def event_log(make_event_log: Callable[[], BuildEventLog]) -> BuildEventLog:
    return make_event_log()


# ---------------------------------------------------------------------------------------------
# The shared specification, on every backend
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", bel_cases.CASES, ids=lambda case: case.__name__)
def test_shared_case(event_log: BuildEventLog, case: Callable[[BuildEventLog], None]) -> None:
    case(event_log)


# Arrival orders tried per backend, in batches of this many events. On Spark's Delta backend each
# batch is a commit of seconds, so it takes one order in three batches; test_backend_parity.py
# compares many more Delta batchings with SQLite.
SHUFFLE_SEEDS = {"sqlite": range(3), "delta": range(1), "delta-rs": range(3)}
SHUFFLE_SEEDS |= {"delta-rs-cold-0": range(3), "delta-rs-cold-40ns": range(2), "delta-rs-default-window": range(1)}
BATCH_SIZES = {"sqlite": 4, "delta": 10, "delta-rs": 4} | dict.fromkeys(
    ("delta-rs-cold-0", "delta-rs-cold-40ns", "delta-rs-default-window"), 4
)


def test_answers_do_not_depend_on_how_events_were_batched_or_in_what_order_they_arrived(
    make_event_log: Callable[[], BuildEventLog], request: pytest.FixtureRequest
) -> None:
    events = bel_cases.mixed_scenario()
    keys = bel_cases.keys_of(events)
    in_one_batch = make_event_log()
    in_one_batch.append_events(events)
    expected = bel_cases.answers(in_one_batch, *keys)

    backend = request.node.callspec.params["make_event_log"]
    for seed in SHUFFLE_SEEDS[backend]:
        shuffled = list(events)
        random.Random(seed).shuffle(shuffled)
        log = make_event_log()
        size = BATCH_SIZES[backend]
        results = [log.append_events(shuffled[start : start + size]) for start in range(0, len(shuffled), size)]
        assert len(results) >= 3
        assert sum(result.accepted for result in results) == len(events)
        assert bel_cases.answers(log, *keys) == expected, f"shuffle seed {seed}"
        if backend == "delta-rs-cold-0":  # the finished build requests were read from segments
            assert log._store().cold_facts()["cold_build_requests"] == 3  # br-1, br-7, br-8
        if backend == "delta-rs-default-window":  # the cases' nanoseconds are all within the hour
            assert log._store().cold_facts()["cold_build_requests"] == 0

    # A few of those answers, written out.
    assert in_one_batch.get_active_builds_for_partition("data/x") == []  # br-7 FAILED, br-8 DELEGATED
    assert in_one_batch.get_active_builds_for_partition("data/z") == ["br-9"]
    assert in_one_batch.get_build_request_for_available_partition("data/x") is None  # invalidated by m10
    assert in_one_batch.get_build_request_for_available_partition("data/y") == "br-9"


# ---------------------------------------------------------------------------------------------
# Arguments checked before any backend is involved
# ---------------------------------------------------------------------------------------------


def test_event_filter_refuses_a_bare_string_and_unknown_event_types() -> None:
    with pytest.raises(TypeError, match="got the string 'partition_event'"):
        EventFilter(event_types="partition_event")
    with pytest.raises(ValueError, match=r"unknown event type\(s\) \['partition'\]"):
        EventFilter(event_types=["partition"])
    assert EventFilter(partition_refs=iter(["data/a"])).partition_refs == ("data/a",)


# ---------------------------------------------------------------------------------------------
# Opening by URI
# ---------------------------------------------------------------------------------------------


def test_a_sqlite_uri_opens_the_file_at_its_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "bel.db"

    with open_event_log(f"sqlite://{path}") as log:
        assert isinstance(log, SqliteEventLog)
        assert log.path == str(path)
        log.append_event(partition_event("e1", 100, "br-1", "data/a", P.PARTITION_AVAILABLE))

    with open_event_log(f"sqlite://{path}") as reopened:
        assert bel_cases.ids(reopened.get_build_request_events("br-1")) == ["e1"]


def test_a_sqlite_memory_uri_opens_an_empty_log_in_memory() -> None:
    with open_event_log("sqlite:///:memory:") as log:
        assert log.path == ":memory:"
        assert log.get_activity_summary().total_events == 0


def test_a_sqlite_file_that_is_not_an_event_log_is_refused_and_left_alone(tmp_path: Path) -> None:
    other_app = tmp_path / "other.db"
    with sqlite3.connect(other_app) as connection:
        connection.execute("CREATE TABLE accounts (id INTEGER)")
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database, just long enough to have a header " * 4)

    with pytest.raises(ValueError, match=r"other.db is a SQLite database but not an event log"):
        SqliteEventLog(other_app)
    with pytest.raises(ValueError, match=r"cannot open SQLite event log .*notes.txt: file is not a database"):
        SqliteEventLog(not_sqlite)
    with sqlite3.connect(other_app) as connection:
        assert connection.execute("SELECT name FROM sqlite_master").fetchall() == [("accounts",)]


def test_an_event_log_written_by_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bel.db"
    SqliteEventLog(path).close()
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA user_version = 99")

    with pytest.raises(ValueError, match="schema version 99, this code reads version 1"):
        SqliteEventLog(path)


def test_a_relative_sqlite_uri_is_refused_with_the_form_to_use() -> None:
    with pytest.raises(ValueError, match=r"does not name an absolute file path.*sqlite:///var/lib"):
        open_event_log("sqlite://bel.db")


def test_a_delta_uri_without_a_spark_session_opens_the_jvm_free_backend_for_a_local_lake(tmp_path: Path) -> None:
    with open_event_log(f"delta://{tmp_path}/lake") as log:
        assert isinstance(log, DeltaRsEventLog)
        assert log.lake == Lake(str(tmp_path / "lake"))
    # A lake on S3 opens JVM-free too (test_object_store.py); any other object store needs Spark.
    with pytest.raises(ValueError, match=r"follows lakes on this machine's disks and on S3 only.*spark=spark"):
        open_event_log("delta+abfss://container@account.dfs.core.windows.net/lake")


def test_opening_a_sqlite_or_jvm_free_delta_log_starts_no_jvm(tmp_path: Path) -> None:
    # Each in a fresh interpreter: no SparkSession may exist, and no Java process may be started.
    script = (
        "import sys\n"
        "from databuild_assets.log import open_event_log\n"
        f"with open_event_log('delta://{tmp_path}/lake') as log:\n"
        "    log.append_event({'event_id': 'e1', 'timestamp': 1, 'build_request_id': 'b',\n"
        "                      'event_type': 'build_cancel_event', 'build_cancel_event': {'reason': 'r'}})\n"
        "    print(log.get_activity_summary().total_events)\n"
        "from pyspark import SparkContext\n"
        "print(SparkContext._jvm is None and SparkContext._active_spark_context is None)\n"
    )
    repo = Path(__file__).resolve().parents[1]
    output = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, check=True).stdout

    assert output.split() == ["1", "True"]


def test_a_delta_uri_opens_the_lake_at_its_root_or_at_its_raw_log_table(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    with open_event_log(f"delta://{root}", spark=spark) as log:
        assert isinstance(log, DeltaEventLog)
        assert log.lake == Lake(str(root))
        # A lake with no log yet answers as an empty log, and reading it creates nothing.
        assert log.list_events() == EventPage(events=[], next_cursor=None, has_more=False)
        assert log.get_latest_partition_status("data/a") is None
        assert not root.exists()
        available = partition_event("e1", 100, "br-1", "data/a", P.PARTITION_AVAILABLE)
        assert log.append_event(available) == AppendResult(accepted=1, duplicates=0)
    with pytest.raises(ValueError, match="is closed"):
        log.list_events()

    with open_event_log(f"delta://{root}/tables/raw_event_log/", spark=spark) as reopened:
        assert reopened.lake == Lake(str(root))
        assert bel_cases.ids(reopened.get_build_request_events("br-1")) == ["e1"]


def test_a_delta_plus_uri_opens_a_lake_on_any_hadoop_filesystem(spark: Any, tmp_path: Path) -> None:
    # delta+<scheme>://... names a lake root by its filesystem URI (s3a, abfss, gs, file, ...).
    assert parse_event_log_uri("delta+s3a://bucket/databuild").lake == Lake("s3a://bucket/databuild")
    assert parse_event_log_uri("delta+s3a://b/lake/tables/raw_event_log").lake == Lake("s3a://b/lake")
    with pytest.raises(ValueError, match=r"does not name a lake on a Hadoop filesystem.*delta\+s3a://bucket"):
        open_event_log("delta+s3a://", spark=spark)

    root = tmp_path / "lake"
    with open_event_log(f"delta+file://{root}", spark=spark) as log:
        assert log.lake == Lake(f"file://{root}") == Lake(str(root))
        log.append_event(partition_event("e1", 100, "br-1", "data/a", P.PARTITION_AVAILABLE))
    with open_event_log(f"delta://{root}", spark=spark) as same_lake:
        assert bel_cases.ids(same_lake.get_build_request_events("br-1")) == ["e1"]


def test_a_delta_uri_must_be_absolute_and_name_a_lake_or_its_raw_log_table(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"does not name an absolute path.*delta:///data/lake"):
        open_event_log("delta://lake", spark=spark)
    (tmp_path / "tables" / "partition_state" / "_delta_log").mkdir(parents=True)
    with pytest.raises(ValueError, match="is a Delta table, not a lake root nor its raw log table"):
        open_event_log(f"delta://{tmp_path}/tables/partition_state", spark=spark)
    with pytest.raises(TypeError, match="takes spark= and writer=, got mode"):
        open_event_log(f"delta://{tmp_path}", spark=spark, mode="append")


def test_an_unknown_uri_is_refused_naming_it_and_the_accepted_forms() -> None:
    with pytest.raises(ValueError, match=r"cannot open event log 'postgres://db/bel'.*sqlite:///absolute/path"):
        open_event_log("postgres://db/bel")
    with pytest.raises(ValueError, match="cannot open event log '/tmp/bel.db'"):
        open_event_log("/tmp/bel.db")


# ---------------------------------------------------------------------------------------------
# The SQLite bulk loader
# ---------------------------------------------------------------------------------------------


def test_load_events_gives_the_same_answers_as_append_events(tmp_path: Path) -> None:
    events = bel_cases.mixed_scenario()
    keys = bel_cases.keys_of(events)

    result = load_events(tmp_path / "loaded.db", iter(events + events[:3]))

    assert result == AppendResult(accepted=len(events), duplicates=3)
    with SqliteEventLog(tmp_path / "loaded.db") as loaded, SqliteEventLog(tmp_path / "appended.db") as appended:
        appended.append_events(events)
        assert bel_cases.answers(loaded, *keys) == bel_cases.answers(appended, *keys)
        # The bulk load rebuilt every index and the trigger it dropped.
        assert _schema_of(loaded) == _schema_of(appended)
        late = bel_cases.build_request_event("late", 1, "br-late", bel_cases.BR.BUILD_REQUEST_RECEIVED, ["data/a"])
        loaded.append_event(late)
        assert bel_cases.ids(loaded.get_partition_events("data/a"))[0] == "late"


def _schema_of(log: SqliteEventLog) -> list[tuple[str, str, str]]:
    return log._connection.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_stat%' ORDER BY name"
    ).fetchall()


def test_load_events_into_a_log_that_has_events_adds_to_it(tmp_path: Path) -> None:
    path = tmp_path / "bel.db"
    load_events(path, [partition_event("e1", 100, "br-1", "data/a", P.PARTITION_BUILDING)])

    result = load_events(
        path,
        [
            partition_event("e1", 100, "br-1", "data/a", P.PARTITION_BUILDING),
            partition_event("e2", 200, "br-1", "data/a", P.PARTITION_AVAILABLE),
        ],
    )

    assert result == AppendResult(accepted=1, duplicates=1)
    with SqliteEventLog(path) as log:
        assert log.get_build_request_for_available_partition("data/a") == "br-1"


def test_load_events_rolls_everything_back_when_one_event_is_invalid(tmp_path: Path) -> None:
    def events() -> Iterator[dict]:
        for index in range(1000):
            yield partition_event(f"e{index}", index, "br-1", "data/a", P.PARTITION_BUILDING)
        yield {"event_id": "bad", "timestamp": 1}

    with pytest.raises(InvalidEventError, match=r"events\[1000\]: missing required field 'build_request_id'"):
        load_events(tmp_path / "bel.db", events())

    with SqliteEventLog(tmp_path / "bel.db") as log:
        assert log.get_activity_summary().total_events == 0
        assert log.list_recent_partitions() == []
