"""Copy a SQLite BEL (DataBuild's embedded backend) into the Delta event log, exactly once.

Events are read in canonical order, page by page through the backend's own `list_events`,
and appended through the writer API, whose MERGE on event_id skips what the log already has:
running the migration again, or after it stopped half-way, adds nothing twice.

    databuild-assets migrate sqlite:///var/lib/databuild/bel.db
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from databuild_assets.ingest.writer import append_events
from databuild_assets.log import open_event_log
from databuild_assets.runtime.delta_tables import current_version
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake

log = logging.getLogger(__name__)

# Events per Delta commit: big enough that commit overhead is small, small enough to hold in memory.
DEFAULT_CHUNK = 100_000


@dataclass(frozen=True)
class MigrationResult:
    source: str
    read: int
    accepted: int
    duplicates: int
    commits: int  # appends that committed to the raw log; 0 when it held every event already
    log_version: int  # the raw log's version after the migration; -1 when there is no raw log


def _log_version(spark: SparkSession, path: str) -> int:
    return current_version(spark, path) if DeltaTable.isDeltaTable(spark, path) else -1


def migrate_sqlite_to_delta(
    spark: SparkSession, sqlite_uri: str, lake: Lake, chunk: int = DEFAULT_CHUNK
) -> MigrationResult:
    """Append every event of the SQLite log at `sqlite_uri` to the lake's raw event log."""
    if not sqlite_uri.startswith("sqlite:"):
        raise ValueError(f"migrate reads a SQLite BEL (sqlite:///path/to/bel.db), not {sqlite_uri!r}")
    read = accepted = duplicates = commits = 0
    log_path = lake.table_path(RAW_EVENT_LOG)
    version = _log_version(spark, log_path)
    with open_event_log(sqlite_uri) as source:
        cursor = None
        while True:
            page = source.list_events(since=cursor, limit=chunk)
            if page.events:
                result = append_events(spark, lake, page.events, writer=f"migrate:{sqlite_uri}")
                read, accepted, duplicates = (
                    read + len(page.events),
                    accepted + result.accepted,
                    duplicates + result.duplicates,
                )
                # A chunk the log already holds whole makes no commit, and is not counted as one.
                before, version = version, _log_version(spark, log_path)
                commits += version != before
                log.info("migrated %d events so far (%d new, %d already in the log)", read, accepted, duplicates)
            cursor = page.next_cursor
            if not page.has_more:
                break
    return MigrationResult(sqlite_uri, read, accepted, duplicates, commits, version)
