"""The Build Event Log as it was: the query API at a Delta version (or a timestamp) of the raw
log, and the diff of the log between two of its versions.

An erased event stays erased: a past view and a diff leave out, and never show the contents of,
every event a tombstone matches now, even one recorded after that version (the tombstones
table is append-only, so today's tombstones include every earlier one).

    past = DeltaEventLog(spark, lake).as_of(version=12)      # or as_of(timestamp="2026-11-18T09:00:00Z"),
                                                             # i.e. DeltaEventLog(spark, lake, version=12)
    past.get_latest_partition_status("data/sales/date=2026-11-18")
    diff = log_diff(spark, lake, 12, 15)                     # events added, event ids purged
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.schema import EVENT_COLUMNS, event_from_row
from databuild_assets.maintenance.tombstones import event_matches, read_tombstones, with_erasure_data
from databuild_assets.runtime.delta_tables import missing_files
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, Lake


class TimeTravelError(ValueError):
    """The version or timestamp asked for is not in the raw log's retained history, or vacuum
    removed the files of that version."""


class ReadOnlyEventLogError(RuntimeError):
    """A past view of the log was asked to append events."""


def _epoch_ms(moment: datetime | str) -> int:
    """Milliseconds since the epoch of `moment`: a datetime (naive means UTC) or ISO 8601 text."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def log_commits(spark: SparkSession, lake: Lake) -> list[tuple[int, int]]:
    """(version, commit time in epoch milliseconds) of every raw log commit still in its history,
    oldest first; raises TimeTravelError when the lake has no raw log."""
    path = lake.table_path(RAW_EVENT_LOG)
    if not DeltaTable.isDeltaTable(spark, path):
        raise TimeTravelError(f"{path} is not a Delta table yet: the lake has no event log to travel in")
    rows = DeltaTable.forPath(spark, path).history().select("version", F.unix_millis("timestamp").alias("ms")).collect()
    return sorted((row["version"], row["ms"]) for row in rows)


def resolve_log_version(
    spark: SparkSession, lake: Lake, version: int | None = None, timestamp: datetime | str | None = None
) -> int:
    """The raw log version to read: `version` itself once checked, or the last commit made at or
    before `timestamp` (naive datetimes are UTC). Exactly one of the two must be given.

        resolve_log_version(spark, lake, timestamp="2026-11-18T09:00:00Z")
    """
    if (version is None) == (timestamp is None):
        raise ValueError(
            "give exactly one of version= (a raw log version) and timestamp= (a datetime or ISO 8601 text)"
        )
    commits = log_commits(spark, lake)
    first, last = commits[0], commits[-1]
    available = (
        f"versions {first[0]}..{last[0]} are in its history, committed "
        f"{_iso(first[1])} .. {_iso(last[1])} (older ones are cleaned up after delta.logRetentionDuration)"
    )
    path = lake.table_path(RAW_EVENT_LOG)
    if version is not None:
        if version not in {v for v, _ in commits}:
            raise TimeTravelError(f"{path} has no version {version} to read: {available}")
    else:
        wanted = _epoch_ms(timestamp)
        before = [v for v, ms in commits if ms <= wanted]
        if not before:
            raise TimeTravelError(f"{path} had no commit yet at {_iso(wanted)}: {available}")
        version = before[-1]
    if gone := _vacuumed_files(spark, path, version):
        raise TimeTravelError(
            f"{path} version {version} cannot be read: vacuum removed {len(gone)} of its data files "
            f"(e.g. {gone[0]}). Read a more recent version (vacuum keeps the files of its last retention_hours) "
            f"or the live log; {available}"
        )
    return version


def _vacuumed_files(spark: SparkSession, path: str, version: int) -> list[str]:
    """The data files of `version` no longer on disk. The files it shares with the current
    version are there (vacuum removes only files no longer in the table), so only the others are
    looked up: none for a recent version, one `exists` each otherwise."""
    then = set(spark.read.format("delta").option("versionAsOf", version).load(path).inputFiles())
    now = set(spark.read.format("delta").load(path).inputFiles())
    return missing_files(spark, sorted(then - now))


def _iso(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class LogDiff:
    """What changed in the raw log from `from_version` to `to_version`, by event_id.

    - `added`: events in `to_version` and not in `from_version`, in canonical order, minus those a
      tombstone matches now;
    - `hidden_event_ids`: events added that a tombstone matches now: only their ids are given;
    - `removed_event_ids`: events in `from_version` and not in `to_version`. The raw log only
      loses events to compaction's purge, so these are the events erased in between.
    """

    from_version: int
    to_version: int
    added: tuple[dict[str, Any], ...]
    hidden_event_ids: tuple[str, ...]
    removed_event_ids: tuple[str, ...]


def log_diff(spark: SparkSession, lake: Lake, from_version: int, to_version: int) -> LogDiff:
    """The events added and the events removed (by erasure) between two raw log versions.

    Compares the two versions' event_id sets, so an event appended and purged in between
    appears in neither list; a compaction's rewrite of files that moves rows is no change.

        diff = log_diff(spark, lake, 3, 7)
        [event["event_id"] for event in diff.added], diff.removed_event_ids
    """
    for version in (from_version, to_version):
        resolve_log_version(spark, lake, version=version)
    if from_version > to_version:
        raise ValueError(f"from_version {from_version} is after to_version {to_version}; give the older version first")
    path = lake.table_path(RAW_EVENT_LOG)
    before, after = (spark.read.format("delta").option("versionAsOf", v).load(path) for v in (from_version, to_version))
    tombstones_path = lake.table_path(TOMBSTONES)
    tombstones = read_tombstones(spark, lake) if DeltaTable.isDeltaTable(spark, tombstones_path) else []
    added = (
        with_erasure_data(after.join(before.select("event_id"), "event_id", "left_anti"), tombstones)
        .select(*EVENT_COLUMNS, event_matches(tombstones).alias("_hidden"))
        .collect()
    )
    added = sorted(added, key=lambda row: (row["timestamp"], row["event_id"]))
    removed = before.select("event_id").join(after.select("event_id"), "event_id", "left_anti").collect()
    return LogDiff(
        from_version,
        to_version,
        tuple(event_from_row(row) for row in added if not row["_hidden"]),
        tuple(sorted(row["event_id"] for row in added if row["_hidden"])),
        tuple(sorted(row["event_id"] for row in removed)),
    )


__all__ = [
    "LogDiff",
    "ReadOnlyEventLogError",
    "TimeTravelError",
    "log_commits",
    "log_diff",
    "resolve_log_version",
]
