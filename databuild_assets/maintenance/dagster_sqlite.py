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
from contextlib import closing, contextmanager
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
_SCHEMA = frozenset({"sqlite_schema", "sqlite_master"})

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


def stored_values(path: Path) -> Iterator[tuple[str, str | None, object]]:
    """Every value of every table of the database at `path` as a query reads it (text, a number,
    a blob, NULL), with its table and the run_id of its row (None for a table without one): what
    the file holds as values, read in one read transaction. The schema's own SQL is left out: it
    names Dagster's columns, not stored values."""
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_SECONDS)
    try:
        connection.execute("BEGIN")
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [row[1] for row in connection.execute(f'PRAGMA table_info("{table}")')]
            at = columns.index("run_id") if "run_id" in columns else None
            for row in connection.execute(f'SELECT * FROM "{table}"'):
                run_id = row[at] if at is not None and isinstance(row[at], str) else None
                for value in row:
                    yield table, run_id, value
    finally:
        connection.close()


def unread_bytes(path: Path) -> Iterator[bytes]:
    """The bytes of the database at `path` and of its write-ahead log that no query reads: free
    pages, each page's unallocated space and freed blocks, the unused end of overflow pages, a
    page of the file the log holds a newer version of, and each frame of the log a later frame
    replaced (or past its last commit). What an earlier write left there is a copy no query can
    read as a value, so a search there cannot tell a whole value from a part of a word."""
    data = path.read_bytes()
    if len(data) < 100:
        return
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    usable = page_size - data[20]
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as connection:
        # dbstat: every page of every table and index, as the database now is (log included).
        pages_of = connection.execute("SELECT pageno, pagetype, unused, name FROM dbstat").fetchall()
    kinds = {pageno: (kind, unused, name) for pageno, kind, unused, name in pages_of}
    live, stale = _log_frames(_wal(path), page_size)
    yield from stale
    pages = max(len(data) // page_size, max(live, default=0))
    for pageno in range(1, pages + 1):
        file_page = data[(pageno - 1) * page_size : pageno * page_size]
        if pageno in live:
            yield file_page  # replaced by the log's version
        page = live.get(pageno, file_page)
        if pageno not in kinds:
            yield page  # a free page (or one past the database's end)
            continue
        kind, unused, name = kinds[pageno]
        if name in _SCHEMA:
            # Dagster's table definitions, rewritten by its migrations and by VACUUM itself
            # (measured: old CREATE INDEX text stays in the schema page's free space): never a value.
            continue
        yield page[usable:]  # the bytes each page reserves
        if kind == "overflow":
            yield page[usable - unused : usable]
        else:
            yield from _free_in_btree_page(page, 100 if pageno == 1 else 0, usable)


def _free_in_btree_page(page: bytes, header: int, usable: int) -> Iterator[bytes]:
    """A b-tree page's unallocated space (between its cell pointers and its cells) and its freed
    blocks (SQLite's file format, section 1.6)."""
    leaf = page[header] in (10, 13)
    cells = int.from_bytes(page[header + 3 : header + 5], "big")
    content = int.from_bytes(page[header + 5 : header + 7], "big") or 65536
    pointers_end = header + (8 if leaf else 12) + 2 * cells
    yield page[pointers_end:content]
    block, seen = int.from_bytes(page[header + 1 : header + 3], "big"), set()
    while 0 < block < usable and block not in seen:
        seen.add(block)
        size = int.from_bytes(page[block + 2 : block + 4], "big")
        yield page[block + 4 : block + size]
        block = int.from_bytes(page[block : block + 2], "big")


def _log_frames(wal: Path, page_size: int) -> tuple[dict[int, bytes], list[bytes]]:
    """Of the write-ahead log at `wal`: the newest committed image of each page it holds, and the
    frames no reader sees (replaced by a later frame, past the last commit, or of an older log)."""
    try:
        data = wal.read_bytes()
    except FileNotFoundError:
        return {}, []
    if len(data) < 32:
        return {}, [data]
    salts, frame = data[16:24], 24 + page_size
    frames = [data[at : at + frame] for at in range(32, len(data) - frame + 1, frame)]
    committed = 0
    for number, header in enumerate(frames, 1):
        if header[8:16] != salts:
            break
        if int.from_bytes(header[4:8], "big"):  # a commit frame: the database's size after it
            committed = number
    live: dict[int, bytes] = {}
    newest: dict[int, int] = {}
    for number, frame_bytes in enumerate(frames[:committed]):
        newest[int.from_bytes(frame_bytes[:4], "big")] = number
    stale = [data[:32], data[32 + len(frames) * frame :]]
    for number, frame_bytes in enumerate(frames):
        pageno = int.from_bytes(frame_bytes[:4], "big")
        if newest.get(pageno) == number:
            live[pageno] = frame_bytes[24:]
        else:
            stale.append(frame_bytes)
    return live, stale


def _wal(database: Path) -> Path:
    return database.with_name(database.name + "-wal")
