"""The serving index: the visible event log in a SQLite file, stamped with the Delta versions it reflects.

`ServingIndex` is the SQLite reference backend on a file of the lake (`<root>/serving_index/`),
so every read answers with the reference's own SQL and indexes, and a process's memory is
SQLite's page cache, not a copy of the history. It is fed events as Arrow tables (the raw log's
Parquet files) and mirrors the raw log exactly: `events` holds the rows no tombstone matches,
`hidden_event_ids` the ids of the rows one does (so that an append deduplicates against the
whole log, as the Spark writer does). `serving_stamp` says which versions of raw_event_log and
tombstones it reflects; the stamp and the rows change in one transaction, so every process that
opens the file agrees on what it holds (docs/decisions/0034-serving-index.md).

Deleted rows are overwritten on disk (`secure_delete`), but that zeroes a deleted cell, not the
copies of cells a page rebuilt by a b-tree rebalance keeps in its unused area: so the index counts
the events it deleted (`deleted_events`), and a file that deleted any is rewritten whole
(`rewrite_into`: VACUUM INTO a new file) before an erasure is called done.

    index = ServingIndex.open("/data/lake/serving_index/index-3.sqlite")
    index.stamp().raw_log.version                # the raw log version it reflects
    index.get_latest_partition_status("data/users/id=41")
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from databuild_assets.events.erasure_rule import (
    ARRAY_FIELDS,
    JSON_TEXT_FIELDS,
    SCALAR_FIELDS,
    json_forms,
    matches,
    names_in_json_text,
)
from databuild_assets.log.serving.cold import COLD_TABLES, HOT_EVENTS_VIEW, SEGMENTS_FOLDER, ColdReads
from databuild_assets.log.serving.cold_ids import known_cold_ids
from databuild_assets.log.serving.thaw import (
    JOB_RUN_EVENT_TYPES,
    cold_build_requests_among,
    cold_build_requests_holding,
    cold_build_requests_matching,
    job_runs_of,
    thaw,
    thaw_job_runs,
)
from databuild_assets.log.sqlite.backend import (
    SqliteEventLog,
    build_event_indexes,
    drop_event_indexes,
    insert_events,
    refresh_dirty_projections,
    transaction,
)
from databuild_assets.log.sqlite.schema import (
    _REFRESH_PARTITION_STATE,
    DIRTY_TABLES,
    EVENT_INDEXES,
    REFRESHES,
    SCHEMA,
    SQLITE_SCHEMA_VERSION,
    select_listed_partitions,
)

# The layout of the index's own tables (hidden_event_ids, serving_stamp) and of what it stores:
# an index of another format is rebuilt, never read. Raise it with any change to that layout.
# 2: serving_stamp.visible_events. 3: the cold tier's tables (cold.py). 4: cold_job_runs.job_events
# (a job run's events pinned no more). 5: cold_job_runs lists only build requests other than the
# job run's own. 6: cold_event_ids in buckets (cold_ids.py). 7: cold_build_requests.partition_counts.
# 8: build_requests WITHOUT ROWID (sqlite/schema.py). 9: a thaw re-pins its segment's still-cold
# rows (thaw.py `_repin`): a stale segment of an older index may miss pins. 10:
# cold_build_requests.row_groups (cold.py).
INDEX_FORMAT = 10

# partition_state.event_count counts the partition's events: those still in `events` and those a
# segment holds (evict.py keeps their count; the pinned copies are in `events` and not counted).
_EVENT_COUNT = "(SELECT COUNT(*) FROM events WHERE partition_ref = dirty.partition_ref) AS event_count"
assert _EVENT_COUNT in _REFRESH_PARTITION_STATE, "the partition_state refresh SQL changed: update _EVENT_COUNT"
_REFRESHES = tuple(
    (
        dirty,
        key,
        projection,
        refresh.replace(
            _EVENT_COUNT,
            "((SELECT COUNT(*) FROM events WHERE partition_ref = dirty.partition_ref) + COALESCE((SELECT SUM(count)"
            " FROM main.cold_partition_events WHERE partition_ref = dirty.partition_ref), 0)) AS event_count",
        ),
    )
    for dirty, key, projection, refresh in REFRESHES
)

_INDEX_TABLES = (
    """
CREATE TABLE IF NOT EXISTS hidden_event_ids (event_id TEXT PRIMARY KEY) WITHOUT ROWID;
-- One row: the Delta versions of raw_event_log and tombstones the index reflects, and how to
-- tell that a table at that path is still the one it followed (its Delta table id and the
-- size and time of that version's commit file).
CREATE TABLE IF NOT EXISTS serving_stamp (
    one                 INTEGER PRIMARY KEY CHECK (one = 1),
    index_format        INTEGER NOT NULL,
    sqlite_schema       INTEGER NOT NULL,
    raw_log_version     INTEGER NOT NULL,  -- -1: no raw log yet
    raw_log_id          TEXT,
    raw_log_commit      TEXT,
    tombstones_version  INTEGER NOT NULL,  -- -1: no tombstones table yet
    tombstones_id       TEXT,
    tombstones_commit   TEXT,
    built_at            TEXT NOT NULL,
    updated_at          TEXT NOT NULL,
    visible_events      INTEGER NOT NULL DEFAULT 0  -- kept with every change: no count of a large table
);
"""
    + COLD_TABLES
)

_JOB_TYPES = f"({', '.join(repr(name) for name in JOB_RUN_EVENT_TYPES)})"
_ROW_COLUMNS = "event_id, timestamp, build_request_id, event_type, payload, partition_ref, job_run_id, status_code"

_WORK_TABLES = """
CREATE TEMP TABLE IF NOT EXISTS staged_events (
    event_id TEXT NOT NULL PRIMARY KEY, timestamp INTEGER NOT NULL, build_request_id TEXT NOT NULL,
    event_type TEXT NOT NULL, payload TEXT NOT NULL, partition_ref TEXT, job_run_id TEXT, status_code INTEGER
);
CREATE TEMP TABLE IF NOT EXISTS leaving (event_id TEXT PRIMARY KEY) WITHOUT ROWID;
"""

# The indexes of `events` the projections' refresh SQL reads (EXPLAIN QUERY PLAN), besides the
# one on event_id.
_PROJECTIONS_READ = ("events_by_build_request", "events_by_partition", "events_by_job_run")

# The events deleted from the file (hidden or purged) since it was last written whole; made on the
# first deletion, so that indexes of this format made before it need no rebuild.
_DELETED_EVENTS = """
CREATE TABLE IF NOT EXISTS main.deleted_events (one INTEGER PRIMARY KEY CHECK (one = 1), count INTEGER NOT NULL)
"""

# The keys whose projection rows an event touches, as the SQLite backend's `_DirtyKeys` notes them.
_MARK_DIRTY = (
    "INSERT OR IGNORE INTO temp.dirty_partition_refs SELECT partition_ref FROM {rows} WHERE partition_ref IS NOT NULL",
    "INSERT OR IGNORE INTO temp.dirty_job_runs SELECT job_run_id FROM {rows}"
    " WHERE event_type IN ('job_event', 'task_cancel_event') AND job_run_id IS NOT NULL",
    "INSERT OR IGNORE INTO temp.dirty_build_requests SELECT build_request_id FROM {rows}",
)


def _json_path_value(path: str) -> str:
    """SQL for a rule field ("payload.field" or a core column) of the event row aliased `e`."""
    payload, dot, field = path.partition(".")
    if not dot:
        return f"e.{path}"
    return f"(CASE WHEN e.event_type = '{payload}' THEN json_extract(e.payload, '$.{field}') END)"


def tombstone_rule_sql(connection: sqlite3.Connection, values_by_key: Mapping[str, Collection[str]]) -> str:
    """The tombstone rule (events/erasure_rule.py) as an SQL condition on an `events` row aliased
    `e`, for `connection`: true for a row that any of the values matches.

    The values go to a temp table and a function of the connection, not into the SQL text: one
    OR per value is past SQLite's expression depth (1,000) at a few hundred tombstones, and its
    parameters past their limit at a few thousand. A JSON text field is matched by
    `erasure_rule.names_in_json_text`, as a function of the connection."""
    values = {key: set(of_key) for key, of_key in values_by_key.items() if of_key}
    connection.execute(
        "CREATE TEMP TABLE IF NOT EXISTS tombstone_values"
        " (key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (key, value))"
    )
    connection.execute("DELETE FROM temp.tombstone_values")
    connection.executemany(
        "INSERT INTO temp.tombstone_values VALUES (?, ?)",
        [(key, value) for key, of_key in values.items() for value in of_key],
    )
    forms = {key: json_forms(of_key) for key, of_key in values.items()}
    connection.create_function(
        "names_a_tombstone_value", 2, lambda key, text: int(names_in_json_text(text, forms[key])), deterministic=True
    )
    conditions: list[str] = []
    for key in values:
        # A lookup in the temp table's primary key per string of the row.
        named = f"EXISTS (SELECT 1 FROM temp.tombstone_values AS t WHERE t.key = '{key}' AND t.value = {{}})"
        for path in SCALAR_FIELDS[key]:
            conditions.append(named.format(_json_path_value(path)))
        for path in ARRAY_FIELDS.get(key, ()):
            payload, _, field = path.partition(".")
            conditions.append(
                f"(e.event_type = '{payload}' AND EXISTS "
                f"(SELECT 1 FROM json_each(e.payload, '$.{field}') AS j WHERE {named.format('j.value')}))"
            )
        for path in JSON_TEXT_FIELDS.get(key, ()):
            conditions.append(f"COALESCE(names_a_tombstone_value('{key}', {_json_path_value(path)}), 0)")
    return " OR ".join(conditions) or "0"


@dataclass(frozen=True)
class TableMark:
    """A followed Delta table as the index last saw it: its version (-1: none yet), its Delta
    table id, and the size and modification time of that version's commit file."""

    version: int = -1
    table_id: str | None = None
    commit: str | None = None


@dataclass(frozen=True)
class Stamp:
    """What the index reflects: the raw log and the tombstones, each at a version."""

    raw_log: TableMark = TableMark()
    tombstones: TableMark = TableMark()


# What SQLite says of a file that is not an index this code can read (as opposed to a lock or an
# I/O error, which says nothing about the file).
_UNUSABLE = ("not a database", "malformed", "no such table", "no such column")


class IndexUnusableError(RuntimeError):
    """The file is not a serving index this code reads (another format, torn, not SQLite)."""


# SQLite copies its write-ahead log into the file once it holds this many pages (default 1,000),
# inside the commit that crossed it. Over a large index each append dirties pages all over its
# B-trees, so at 1,000 the copy landed in the appends' p95: 10.5-13.9 ms against 5.5-5.7 ms at
# 10,000 (one process appending 5 events at a time over 200,000 indexed events, decisions/0034).
# The log is emptied whole after a compaction (`ServingIndex.checkpoint`) whatever its size.
WAL_CHECKPOINT_PAGES = 10_000


# How long a connection waits for another's write transaction before "database is locked".
BUSY_TIMEOUT_MS = 30_000


def _pragmas(connection: sqlite3.Connection, temp_store: str = "MEMORY") -> None:
    connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    connection.execute("PRAGMA secure_delete = ON")
    connection.execute("PRAGMA synchronous = NORMAL")
    connection.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
    connection.execute(f"PRAGMA temp_store = {temp_store}")
    connection.executescript(DIRTY_TABLES + _WORK_TABLES)


def create_index_file(path: str) -> sqlite3.Connection:
    """A new, empty index at `path` (which must not exist), open for a bulk load: no journal
    (a failed build is thrown away whole), temporary tables on disk (bounded memory), and the
    indexes of `events` dropped until `finish_build`. Its pages are read through a memory map
    (SQLite caps it at 2 GB): an eviction reads again pages it just wrote."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = OFF")
    connection.execute("PRAGMA synchronous = OFF")
    connection.execute("PRAGMA cache_size = -65536")
    connection.execute("PRAGMA mmap_size = 2147418112")
    _pragmas(connection, temp_store="FILE")
    connection.executescript(SCHEMA + _INDEX_TABLES)
    connection.execute(f"PRAGMA user_version = {SQLITE_SCHEMA_VERSION}")
    drop_event_indexes(connection)
    return connection


class ServingIndex(ColdReads, SqliteEventLog):
    """The SQLite reference backend on an index file, fed from a Delta raw log: see the module doc.

    Its reads are `SqliteEventLog`'s; `add`, `add_events`, `hide` and `remove` change it, inside
    `updating()`. One per thread; processes share the file (WAL).
    """

    def __init__(self, path: str, connection: sqlite3.Connection, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._connection = connection
        # The folder of the lake's index, whose segments/ this index names (a private copy of
        # the index lives elsewhere: the backend sets it).
        self.index_folder = os.path.dirname(path)
        connection.execute(HOT_EVENTS_VIEW)

    @property
    def segment_folder(self) -> str:
        return os.path.join(self.index_folder, SEGMENTS_FOLDER)

    @classmethod
    def open(cls, path: str, read_only: bool = False) -> ServingIndex:
        """The index at `path` (never created here). Raises FileNotFoundError when it is gone,
        IndexUnusableError when it is not an index of this format (another format, torn, not
        SQLite), and sqlite3's own error for anything else (a lock held too long, I/O)."""
        if not os.path.exists(path):
            raise FileNotFoundError(f"serving index {path} is gone")
        query = "mode=ro" if read_only else "mode=rw"
        try:
            connection = sqlite3.connect(f"file:{quote(path)}?{query}", uri=True, isolation_level=None)
        except sqlite3.OperationalError as error:
            raise FileNotFoundError(f"serving index {path}: {error}") from error
        try:
            _pragmas(connection)
            found = connection.execute("SELECT index_format, sqlite_schema FROM serving_stamp").fetchone()
        except sqlite3.DatabaseError as error:
            connection.close()
            if not any(sign in str(error) for sign in _UNUSABLE):
                raise
            raise IndexUnusableError(f"{path} is not a readable serving index ({error})") from error
        if found != (INDEX_FORMAT, SQLITE_SCHEMA_VERSION):
            connection.close()
            raise IndexUnusableError(
                f"{path} is a serving index of format {found}, this code reads {(INDEX_FORMAT, SQLITE_SCHEMA_VERSION)}"
            )
        return cls(path, connection, read_only)

    def __repr__(self) -> str:
        return f"ServingIndex({self.path!r})"

    # -- the stamp ------------------------------------------------------------------------------

    def stamp(self) -> Stamp:
        row = self._connection.execute(
            "SELECT raw_log_version, raw_log_id, raw_log_commit, tombstones_version, tombstones_id,"
            " tombstones_commit FROM serving_stamp"
        ).fetchone()
        if row is None:
            return Stamp()
        return Stamp(TableMark(*row[:3]), TableMark(*row[3:]))

    def versions(self) -> tuple[int, int]:
        """The raw log's and the tombstones' versions of the stamp: the check before every read."""
        return self._connection.execute("SELECT raw_log_version, tombstones_version FROM serving_stamp").fetchone()

    def set_stamp(self, stamp: Stamp) -> None:
        """Record what the index reflects now (inside the transaction that changed it)."""
        now = datetime.now(UTC).isoformat(timespec="seconds")
        raw, tombstones = stamp.raw_log, stamp.tombstones
        self._connection.execute(
            "INSERT INTO serving_stamp (one, index_format, sqlite_schema, raw_log_version, raw_log_id, raw_log_commit,"
            " tombstones_version, tombstones_id, tombstones_commit, built_at, updated_at)"
            " VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (one) DO UPDATE SET"
            " raw_log_version = excluded.raw_log_version, raw_log_id = excluded.raw_log_id,"
            " raw_log_commit = excluded.raw_log_commit, tombstones_version = excluded.tombstones_version,"
            " tombstones_id = excluded.tombstones_id, tombstones_commit = excluded.tombstones_commit,"
            " updated_at = excluded.updated_at",
            (INDEX_FORMAT, SQLITE_SCHEMA_VERSION, raw.version, raw.table_id, raw.commit)
            + (tombstones.version, tombstones.table_id, tombstones.commit, now, now),
        )

    def set_busy_timeout(self, milliseconds: int = BUSY_TIMEOUT_MS) -> None:
        """How long this connection waits for another's write transaction (default: 30 s)."""
        self._connection.execute(f"PRAGMA busy_timeout = {int(milliseconds)}")

    def updating(self):
        """The write transaction of one update: the stamp read inside it is the one to build on
        (another process may have moved it), and a process killed inside it changes nothing."""
        return transaction(self._connection)

    def load(self, rows: list[tuple]) -> None:
        """A bulk load's next rows (`events` rows; the first of an event_id wins), into an index
        from `create_index_file`, before `finish_build`."""
        with transaction(self._connection):
            self._connection.executemany(
                f"INSERT OR IGNORE INTO main.events ({_ROW_COLUMNS}) VALUES ({', '.join('?' * 8)})", rows
            )

    def finish_build(
        self,
        hidden_by: Mapping[str, Collection[str]],
        progress: Callable[[str], None] | None = None,
        evicting: bool = False,
    ) -> None:
        """After a bulk load (`create_index_file`, `load`): the events `hidden_by` (tombstone
        values by key) matches hidden, the indexes of `events` built once, the projections of
        every key, and the file switched to WAL for sharing; `progress` is told when the indexes
        are built. `evicting`: the build's eviction follows (build.py `evict_building`), which
        lists partitions and builds every index again over the rows that stay and writes the file
        whole, so only the indexes the projections read are built here, and the file is not
        written whole twice."""
        connection, started = self._connection, time.monotonic()
        rule = tombstone_rule_sql(connection, hidden_by)
        with transaction(connection):
            connection.execute(
                f"INSERT OR IGNORE INTO main.hidden_event_ids SELECT event_id FROM main.events AS e WHERE {rule}"
            )
            connection.execute("DELETE FROM main.events WHERE event_id IN (SELECT event_id FROM main.hidden_event_ids)")
            for statement in _MARK_DIRTY:
                connection.execute(statement.format(rows="main.events"))
            if evicting:
                for name in _PROJECTIONS_READ:
                    connection.execute(EVENT_INDEXES[name])
            else:
                build_event_indexes(connection)
            if progress is not None:
                progress(f"serving index: events indexed ({time.monotonic() - started:.0f} s); projecting")
            refresh_dirty_projections(connection, _REFRESHES)
        if not evicting and connection.execute("SELECT COUNT(*) FROM main.hidden_event_ids").fetchone()[0]:
            connection.execute("VACUUM")  # the hidden events' bytes, left in rebuilt pages, go
        connection.execute("PRAGMA journal_mode = WAL")

    def rewrite_into(self, path: str) -> None:
        """A consistent copy of the index at `path` (a new or empty file), in WAL mode, written
        whole: none of the bytes of rows this file deleted (VACUUM INTO reads rows, not pages)."""
        self._connection.execute("VACUUM INTO ?", (path,))
        target = sqlite3.connect(path, isolation_level=None)
        try:
            if target.execute("SELECT 1 FROM sqlite_master WHERE name = 'deleted_events'").fetchone():
                target.execute("DELETE FROM deleted_events")
            target.execute("PRAGMA journal_mode = WAL")
        finally:
            target.close()

    def deleted_events(self) -> int:
        """How many events were deleted from this file (hidden or purged) since it was written
        whole: more than 0 means bytes of them may be left in its pages' unused areas."""
        try:
            row = self._connection.execute("SELECT count FROM main.deleted_events").fetchone()
        except sqlite3.OperationalError:  # no deletion yet in this file
            return 0
        return row[0] if row else 0

    def checkpoint(self) -> bool:
        """Copy the write-ahead log into the file and empty it (the bytes of rows deleted since
        the last checkpoint leave the disk with it). False when a reader kept it from finishing."""
        busy, _, _ = self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return not busy

    def event_count(self) -> int:
        """The visible events it holds (kept in the stamp's row as events come and go)."""
        return self._connection.execute("SELECT visible_events FROM serving_stamp").fetchone()[0]

    def count_events(self) -> None:
        """Count the visible events once (after a build)."""
        self._connection.execute("UPDATE serving_stamp SET visible_events = (SELECT COUNT(*) FROM main.events)")

    def _counted(self, change: int) -> int:
        if change:
            self._connection.execute("UPDATE serving_stamp SET visible_events = visible_events + ?", (change,))
        return change

    def add(self, rows: list[tuple], hidden_by: Mapping[str, Collection[str]] | None = None) -> int:
        """Store the events of `rows` (`events` rows: `event_rows`, `event_row`) not stored yet
        (visible or hidden; the first of an event_id wins), those that `hidden_by` (tombstone
        values by key) matches as hidden. Returns how many became visible."""
        if not rows:
            return 0
        connection = self._connection
        rule = tombstone_rule_sql(connection, hidden_by or {})
        insert = f"VALUES ({', '.join('?' * 8)})"
        with transaction(connection):
            if self.has_cold():  # a late event of a cold build request or job run: they come back hot first
                thaw(connection, self.index_folder, cold_build_requests_among(connection, {row[2] for row in rows}))
                thaw_job_runs(connection, self.index_folder, job_runs_of(rows))
                cold = known_cold_ids(connection, [row[0] for row in rows])
                rows = [row for row in rows if row[0] not in cold]
            connection.executemany(f"INSERT OR IGNORE INTO temp.staged_events {insert}", rows)
            # EXISTS, not `event_id IN (SELECT event_id FROM main.events)`: SQLite runs that IN by
            # walking the whole index of events, a cost that would follow the history's size.
            connection.execute(
                "DELETE FROM temp.staged_events AS s WHERE EXISTS (SELECT 1 FROM main.events AS e"
                " WHERE e.event_id = s.event_id) OR EXISTS (SELECT 1 FROM main.hidden_event_ids AS h"
                " WHERE h.event_id = s.event_id)"
            )
            connection.execute(
                f"INSERT OR IGNORE INTO main.hidden_event_ids SELECT event_id FROM temp.staged_events AS e WHERE {rule}"
            )
            connection.execute(
                "DELETE FROM temp.staged_events AS s WHERE EXISTS (SELECT 1 FROM main.hidden_event_ids AS h"
                " WHERE h.event_id = s.event_id)"
            )
            connection.execute(
                f"INSERT INTO main.events ({_ROW_COLUMNS}) SELECT {_ROW_COLUMNS} FROM temp.staged_events"
            )
            added = "temp.staged_events"
            accepted = self._counted(connection.execute(f"SELECT COUNT(*) FROM {added}").fetchone()[0])
            for statement in _MARK_DIRTY:
                connection.execute(statement.format(rows=added))
            connection.execute("DELETE FROM temp.staged_events")
            refresh_dirty_projections(connection, _REFRESHES)
        return accepted

    def add_events(self, events: list[dict[str, Any]], hidden_by: Mapping[str, Collection[str]]) -> None:
        """Store valid events known to be new to the log (an append this process just committed),
        those that `hidden_by` matches as hidden: the reference backend's own insert."""
        visible, hidden = [], []
        for event in events:
            if matches(event, hidden_by):
                hidden.append((event["event_id"],))
            else:
                visible.append(event)
        if hidden:
            with transaction(self._connection):
                self._connection.executemany("INSERT OR IGNORE INTO main.hidden_event_ids VALUES (?)", hidden)
        if visible:
            with transaction(self._connection):
                if self.has_cold():
                    owners = {event["build_request_id"] for event in visible}
                    thaw(self._connection, self.index_folder, cold_build_requests_among(self._connection, owners))
                    job_runs = {
                        e[e["event_type"]]["job_run_id"] for e in visible if e["event_type"] in JOB_RUN_EVENT_TYPES
                    }
                    thaw_job_runs(self._connection, self.index_folder, job_runs)
                accepted = insert_events(self._connection, visible, validate=False, refreshes=_REFRESHES).accepted
                self._counted(accepted)

    def hide(self, values_by_key: Mapping[str, Collection[str]]) -> int:
        """Hide every stored event that the tombstone values match; returns how many."""
        rule = tombstone_rule_sql(self._connection, values_by_key)
        with transaction(self._connection):
            if self.has_cold():  # the cold build requests holding a matching event come back hot first
                matching = cold_build_requests_matching(self._connection, self.index_folder, rule)
                thaw(self._connection, self.index_folder, matching)
            self._connection.execute(
                f"INSERT OR IGNORE INTO temp.leaving SELECT event_id FROM main.events AS e WHERE {rule}"
            )
            self._connection.execute("INSERT OR IGNORE INTO main.hidden_event_ids SELECT event_id FROM temp.leaving")
            return -self._counted(-self._drop_leaving())

    def remove(self, event_ids: Iterable[str]) -> None:
        """Forget events that left the raw log (compaction purged them): visible or hidden."""
        event_ids = list(event_ids)
        with transaction(self._connection):
            if self.has_cold():
                holding = cold_build_requests_holding(self._connection, self.index_folder, event_ids)
                thaw(self._connection, self.index_folder, holding)
            self._connection.executemany("INSERT OR IGNORE INTO temp.leaving VALUES (?)", ((i,) for i in event_ids))
            self._connection.execute(
                "DELETE FROM main.hidden_event_ids WHERE event_id IN (SELECT event_id FROM temp.leaving)"
            )
            self._counted(-self._drop_leaving())

    def _drop_leaving(self) -> int:
        """Delete the events listed in temp.leaving and refresh the keys they touched."""
        connection = self._connection
        # CROSS JOIN keeps SQLite from walking every event: temp.leaving first, then by event_id.
        joined = "temp.leaving AS l CROSS JOIN main.events AS e ON e.event_id = l.event_id"
        if self.has_cold():  # the job runs losing a job or cancel event: all of theirs hot first
            job_runs = connection.execute(
                f"SELECT DISTINCT e.job_run_id FROM {joined} WHERE e.event_type IN {_JOB_TYPES}"
                " AND e.job_run_id IS NOT NULL"
            ).fetchall()
            thaw_job_runs(connection, self.index_folder, [row[0] for row in job_runs])
        for statement in _MARK_DIRTY:
            connection.execute(statement.format(rows=f"(SELECT e.* FROM {joined})"))
        # By event_listed_partitions' own key: the partitions the leaving events list.
        connection.execute(
            "DELETE FROM event_listed_partitions WHERE (partition_ref, timestamp, event_id) IN ("
            + select_listed_partitions("e", source=f"{joined}, ")
            + ")"
        )
        dropped = connection.execute(
            "DELETE FROM main.events WHERE event_id IN (SELECT event_id FROM temp.leaving)"
        ).rowcount
        if dropped:
            connection.execute(_DELETED_EVENTS)
            connection.execute(
                "INSERT INTO main.deleted_events VALUES (1, ?) ON CONFLICT (one) DO UPDATE SET count = count + ?",
                (dropped, dropped),
            )
        connection.execute("DELETE FROM temp.leaving")
        refresh_dirty_projections(connection, _REFRESHES)
        return dropped

    def known_event_ids(self, event_ids: Iterable[str]) -> set[str]:
        """Which of `event_ids` the raw log holds (visible or hidden): an append's duplicates."""
        wanted = list(dict.fromkeys(event_ids))
        known: set[str] = set()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            known.update(
                row[0]
                for row in self._connection.execute(
                    f"SELECT event_id FROM main.events WHERE event_id IN ({marks})"
                    f" UNION SELECT event_id FROM main.hidden_event_ids WHERE event_id IN ({marks})",
                    chunk + chunk,
                )
            )
        unknown = [event_id for event_id in wanted if event_id not in known]
        if unknown and self.has_cold():  # the events of cold build requests (cold_ids.py)
            known |= known_cold_ids(self._connection, unknown)
        return known

    def stored_bytes(self) -> int:
        """The database's size: its pages, temp tables aside."""
        pages, size = (self._connection.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_count", "page_size"))
        return pages * size


__all__ = [
    "INDEX_FORMAT",
    "IndexUnusableError",
    "ServingIndex",
    "Stamp",
    "TableMark",
    "create_index_file",
    "tombstone_rule_sql",
]
