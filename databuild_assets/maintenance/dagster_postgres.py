"""Direct SQL on Dagster's PostgreSQL storage (dagster-postgres), for erasure: the one module that
knows its engines, its tables as values, the server's data folder, and what makes an old row
version leave that folder.

Dagster has no API to change a stored record, so erasure rewrites the records in Dagster's tables
through the storages' own SQLAlchemy engines: the same tables and text columns as its SQLite
storage (dagster_sqlite.STORED_TEXT; dagster-postgres 0.29.27 creates the same schema). An UPDATE
in PostgreSQL writes a new row version and leaves the old one on disk as a dead tuple, which a
plain VACUUM marks reusable but does not zero. `reclaim` therefore rewrites each table it touched
with VACUUM FULL (a new file of live rows; the old one is emptied at commit), ANALYZEs it again
(pg_statistic keeps sampled column values) and rewrites pg_statistic, then ends the WAL segment
and checkpoints so that the segments holding the old writes are no longer needed: with the server
setting `wal_recycle = off` they are removed, with the default they are renamed for reuse and keep
their bytes until overwritten. Measured in docs/decisions/0048-postgres-instance-storage.md.

What no scrub on the server can reach: WAL archives (archive_command), base backups, replicas'
copies, and a managed service's snapshots and point-in-time-recovery logs keep what they copied
until their own retention ends (`OUTSIDE_THE_SERVER`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from dagster import DagsterInstance
from sqlalchemy.engine import Engine

from databuild_assets.maintenance.dagster_sqlite import STORED_TEXT, Rewrite

# The local server's data folder, when `SHOW data_directory` names one this process cannot read
# (another user's folder) or the server is reached through a forwarded port.
DATA_FOLDER_SETTING = "DATABUILD_POSTGRES_DATA_FOLDER"
OUTSIDE_THE_SERVER = (
    "PostgreSQL storage: WAL archives, base backups, replicas and a managed service's snapshots and "
    "point-in-time-recovery logs keep the values they copied until their own retention ends; "
    "no scrub on the server reaches them"
)
_VALUES_PER_STATEMENT = 400
_POSTGRES_STORAGES = ("PostgresRunStorage", "PostgresEventLogStorage", "PostgresScheduleStorage")


def postgres_engines(instance: DagsterInstance) -> tuple[list[Engine], list[str]]:
    """The SQLAlchemy engines of the instance's storages in PostgreSQL, one per database, and the
    class names of those storages. A storage of another kind is not this module's."""
    engines: dict[str, Engine] = {}
    kinds = []
    for storage in (instance.run_storage, instance.event_log_storage, instance.schedule_storage):
        if type(storage).__name__ in _POSTGRES_STORAGES:
            engine = storage._engine  # the storage's own engine: its URL, auth provider and options
            engines.setdefault(engine.url.render_as_string(hide_password=True), engine)
            kinds.append(type(storage).__name__)
    return list(engines.values()), kinds


def _stored_text_columns(connection: sa.Connection) -> Iterator[tuple[str, str, bool]]:
    """(table, column, whether the table has run_id) for each STORED_TEXT column this database has."""
    rows = connection.execute(
        sa.text(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ANY(:tables)"
        ),
        {"tables": list(STORED_TEXT)},
    ).all()
    columns: dict[str, set[str]] = {}
    for table, column in rows:
        columns.setdefault(table, set()).add(column)
    for table in sorted(columns):
        for column in STORED_TEXT[table]:
            if column in columns[table]:
                yield table, column, "run_id" in columns[table]


def stored_text_tables(engine: Engine) -> list[str]:
    """The STORED_TEXT tables this database has."""
    with engine.connect() as connection:
        return list(dict.fromkeys(table for table, _, _ in _stored_text_columns(connection)))


def rewrite_stored_text(engine: Engine, holding: tuple[str, ...], rewrite: Rewrite) -> tuple[int, list[str]]:
    """Rewrite each STORED_TEXT cell that contains any of `holding` to what `rewrite` returns for
    it. Returns the cells changed and the tables they are in. Each table's rows are read again
    and locked (FOR UPDATE) in the transaction that rewrites them: the daemon and the runs write
    to these tables meanwhile."""
    if not holding:
        return 0, []
    changed, tables = 0, []
    with engine.connect() as connection:
        columns = list(_stored_text_columns(connection))
        connection.rollback()  # end the catalog read's transaction: each table gets one of its own
        for table, column, has_run_id in columns:
            run_id = "run_id" if has_run_id else "NULL"
            touched = 0
            with connection.begin():
                for start in range(0, len(holding), _VALUES_PER_STATEMENT):
                    some = holding[start : start + _VALUES_PER_STATEMENT]
                    matches = " OR ".join(f'strpos("{column}", :v{i}) > 0' for i in range(len(some)))
                    rows = connection.execute(
                        sa.text(f'SELECT ctid, {run_id}, "{column}" FROM "{table}" WHERE {matches} FOR UPDATE'),
                        {f"v{i}": value for i, value in enumerate(some)},
                    ).all()
                    for ctid, row_run_id, text in rows:
                        if not isinstance(text, str):
                            continue
                        erased = rewrite(table, row_run_id, text)
                        if erased != text:
                            # ctid names the row version this transaction locked; no one else changes it.
                            connection.execute(
                                sa.text(f'UPDATE "{table}" SET "{column}" = :text WHERE ctid = :ctid'),
                                {"text": erased, "ctid": ctid},
                            )
                            touched += 1
            if touched:
                changed += touched
                tables.append(table)
    return changed, tables


@dataclass(frozen=True)
class Reclaimed:
    """What `reclaim` did: the tables rewritten by VACUUM FULL, and what it could not do (a
    statement the server refused this role, by its reason)."""

    tables: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()


def reclaim(engine: Engine, tables: list[str]) -> Reclaimed:
    """Leave no old version of a rewritten row in the database's files: VACUUM FULL of `tables`
    (a new file of the live rows, indexes rebuilt; it holds an ACCESS EXCLUSIVE lock on each table
    while it copies it), ANALYZE again and VACUUM FULL of pg_statistic (the planner's samples of
    column values), then the WAL: switch to a new segment and CHECKPOINT, so the segments holding
    the old writes are not needed any more. Statements this role may not run (pg_statistic,
    pg_switch_wal and CHECKPOINT need a superuser or pg_checkpoint) are reported, not raised, and
    so is the server setting wal_recycle = on (PostgreSQL's default), under which the old segments
    stay on disk."""
    refused = []
    with engine.connect() as connection:
        autocommit = connection.execution_options(isolation_level="AUTOCOMMIT")
        for table in dict.fromkeys(tables):
            autocommit.execute(sa.text(f'VACUUM (FULL, ANALYZE) "{table}"'))
        for statement in ("VACUUM FULL pg_catalog.pg_statistic", "SELECT pg_switch_wal()", "CHECKPOINT"):
            try:
                autocommit.execute(sa.text(statement))
            except sa.exc.DBAPIError as error:
                reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
                refused.append(f"{statement}: {reason}")
        if autocommit.execute(sa.text("SHOW wal_recycle")).scalar() == "on":
            refused.append(
                "wal_recycle = on: the server renames WAL segments it no longer needs for reuse, and they keep "
                "the old writes until overwritten; set wal_recycle = off in postgresql.conf and compact again"
            )
    return Reclaimed(tuple(dict.fromkeys(tables)), tuple(refused))


def stored_values(engine: Engine) -> Iterator[tuple[str, str | None, object]]:
    """Every value of every table of Dagster's schema as a query reads it (text, a number, bytes,
    NULL), with its table and the run_id of its row (None for a table without one), read in one
    repeatable-read transaction."""
    with engine.connect() as connection:
        connection = connection.execution_options(isolation_level="REPEATABLE READ")
        with connection.begin():
            tables = connection.execute(
                sa.text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1")
            ).scalars()
            for table in list(tables):
                result = connection.execute(sa.text(f'SELECT * FROM "{table}"'))
                columns = list(result.keys())
                at = columns.index("run_id") if "run_id" in columns else None
                for row in result:
                    run_id = row[at] if at is not None and isinstance(row[at], str) else None
                    for value in row:
                        yield table, run_id, bytes(value) if isinstance(value, memoryview) else value


def data_folder(engine: Engine) -> Path | None:
    """The server's data folder when this process can read it: DATABUILD_POSTGRES_DATA_FOLDER, else
    what the server says (`SHOW data_directory`, which needs a superuser or pg_read_all_settings).
    None for a server whose files are elsewhere (another machine, a managed service)."""
    configured = os.environ.get(DATA_FOLDER_SETTING)
    if configured:
        folder = Path(configured)
        if not folder.is_dir() or not os.access(folder, os.R_OK | os.X_OK):
            raise ValueError(
                f"{DATA_FOLDER_SETTING}={configured} is not a folder this process can read; "
                "set it to the PostgreSQL server's data directory, or unset it"
            )
        return folder
    try:
        with engine.connect() as connection:
            shown = connection.execute(sa.text("SHOW data_directory")).scalar()
    except sa.exc.DBAPIError:
        return None
    folder = Path(shown) if shown else None
    if folder is None or not folder.is_dir() or not os.access(folder, os.R_OK | os.X_OK):
        return None
    return folder


def data_folder_files(folder: Path) -> list[Path]:
    """Every file under the data folder (relation files, pg_wal's segments, pg_xact, the server's
    own logs), in path order. A file the server removes while it is listed is left out."""
    return sorted(path for path in folder.rglob("*") if path.is_file())
