"""Direct SQL on Dagster's SQLite storage, for erasure: the one module that knows its files and tables.

Dagster has an API to delete a run's whole history, none to change a stored record. Erasing a
value from run configs, event logs (materialization previews, log messages) and sensor ticks
while keeping the runs therefore means rewriting those records in the SQLite files themselves.
This relies on Dagster 1.13's SQLite storage (dagster/_core/storage/{runs,event_log,schedules}/
schema.py and their sqlite/ backends): the tables and text columns in STORED_TEXT, a `run_id`
column where a record belongs to a run, and where each storage keeps its files
(`sqlite_databases`). Bytes a rewrite frees are overwritten (secure_delete), the write-ahead log
is emptied into the file (checkpoint TRUNCATE), and `rebuild` (VACUUM) rewrites a file whose free
pages still hold what an earlier write left there.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.storage.event_log.sqlite.consolidated_sqlite_event_log import ConsolidatedSqliteEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from sqlalchemy.engine import make_url

# The text columns of Dagster's tables that hold serialized records or free values, by table.
# Keys and indexed identifiers (run_id, asset_key, step_key, partition names) are left alone.
STORED_TEXT: dict[str, tuple[str, ...]] = {
    # run storage (history/runs.db)
    "runs": ("run_body",),  # a DagsterRun: its run config, tags
    "run_tags": ("value",),
    "bulk_actions": ("body",),  # backfills
    "backfill_tags": ("value",),
    "kvs": ("value",),
    "daemon_heartbeats": ("body",),
    # event log storage (history/runs/index.db, and history/runs/<run_id>.db per run)
    "event_logs": ("event",),  # an EventLogEntry: metadata (previews), log messages, errors
    "asset_keys": ("last_materialization", "cached_status_data", "asset_details"),
    "asset_event_tags": ("value",),
    "asset_check_executions": ("evaluation_event",),
    # schedule storage (schedules/schedules.db)
    "jobs": ("job_body",),
    "instigators": ("instigator_body",),
    "job_ticks": ("tick_body",),  # sensor and schedule ticks: run requests, cursors, errors
    "asset_daemon_asset_evaluations": ("asset_evaluation_body",),
}
# Another process (the webserver, the daemon) may hold a write lock for a moment: wait for it.
BUSY_TIMEOUT_SECONDS = 60.0
_VALUES_PER_STATEMENT = 400

# (table, run_id of the record or None, text) -> the text to store instead (the same text: no change)
Rewrite = Callable[[str, str | None, str], str]


def sqlite_databases(instance: DagsterInstance) -> tuple[list[Path], list[str]]:
    """The SQLite files of the instance's run, event log and schedule storage that exist, and the
    storages of other kinds (Postgres, MySQL), which this module cannot rewrite, by class name."""
    files, other = [], []
    for storage in (instance.run_storage, instance.event_log_storage, instance.schedule_storage):
        if isinstance(storage, SqliteEventLogStorage):
            shards = [*storage.get_all_run_ids(), INDEX_SHARD_NAME]
            files += [Path(storage.path_for_shard(shard)) for shard in shards]
        elif isinstance(storage, SqliteRunStorage | SqliteScheduleStorage | ConsolidatedSqliteEventLogStorage):
            files.append(Path(make_url(storage._conn_string).database))  # one file, named by its URL
        else:
            other.append(type(storage).__name__)
    return [path for path in dict.fromkeys(files) if path.is_file()], other


@contextmanager
def _connection(path: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    try:
        # Deleted and overwritten content is zeroed, not left in the page's free space.
        connection.execute("PRAGMA secure_delete = ON")
        yield connection
    finally:
        connection.close()


def _stored_text_columns(connection: sqlite3.Connection) -> Iterator[tuple[str, str, bool]]:
    """(table, column, whether the table has run_id) for each STORED_TEXT column this file has."""
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table in sorted(tables & STORED_TEXT.keys()):
        columns = {row[1] for row in connection.execute(f'PRAGMA table_info("{table}")')}
        for column in STORED_TEXT[table]:
            if column in columns:
                yield table, column, "run_id" in columns


def rewrite_stored_text(path: Path, holding: tuple[str, ...], rewrite: Rewrite) -> int:
    """Rewrite each STORED_TEXT cell of the database at `path` that contains any of `holding`
    to what `rewrite` returns for it, then empty the write-ahead log into the file. Returns the
    cells changed. The rows are found first, then rewritten in one write transaction, each row
    read again inside it: other processes write to the file meanwhile."""
    if not holding:
        return 0
    changed = 0
    with _connection(path) as connection:
        for table, column, has_run_id in list(_stored_text_columns(connection)):
            run_id = "run_id" if has_run_id else "NULL"
            select = f'SELECT rowid, {run_id}, "{column}" FROM "{table}"'
            candidates = set()
            # A few hundred values per statement: one OR per value, and SQLite refuses an
            # expression deeper than 1,000.
            for start in range(0, len(holding), _VALUES_PER_STATEMENT):
                some = holding[start : start + _VALUES_PER_STATEMENT]
                matches = " OR ".join(f'instr("{column}", ?) > 0' for _ in some)
                candidates.update(row[0] for row in connection.execute(f"{select} WHERE {matches}", some))
            if not candidates:
                continue
            connection.execute("BEGIN IMMEDIATE")
            try:
                for rowid in sorted(candidates):
                    row = connection.execute(f"{select} WHERE rowid = ?", (rowid,)).fetchone()
                    if row is None or not isinstance(row[2], str):
                        continue
                    text = rewrite(table, row[1], row[2])
                    if text != row[2]:
                        connection.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE rowid = ?', (text, rowid))
                        changed += 1
                connection.execute("COMMIT")
            except BaseException:
                connection.execute("ROLLBACK")
                raise
        _checkpoint(connection, path)
    return changed


def rebuild(path: Path) -> None:
    """VACUUM the database at `path`: a new file holding only its live records, so nothing an
    earlier write freed (old versions of rewritten rows, deleted runs) is left in free pages."""
    with _connection(path) as connection:
        connection.execute("VACUUM")
        _checkpoint(connection, path)


def _checkpoint(connection: sqlite3.Connection, path: Path) -> None:
    """Copy the write-ahead log into the file and truncate it: the log keeps each page's older
    versions, overwritten bytes included, until then."""
    busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        raise sqlite3.OperationalError(
            f"{path}: another process kept reading during the write-ahead log's checkpoint, so its older pages "
            "may still hold erased values; run compaction_job again"
        )
