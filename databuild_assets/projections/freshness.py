"""How far a projection lags the raw event log: since when the raw log holds data the
projection's rows do not reflect yet.

A projection records the filtered-log version it last processed (its refresh commits'
userMetadata, projections/refresh.py), and each filtered-log refresh records the raw-log version
it reflects (maintenance/filtered_log.py). Following both gives the raw-log version a projection
reflects. It is behind from the first later raw-log commit that changed data (appends, purges);
commits that change no rows (OPTIMIZE, vacuum, properties) leave it fresh, as no refresh needs to
follow them.

    lag = projection_lag(spark, lake, PROJECTIONS["job_runs"])
    lag.lag  # timedelta(0) when fresh
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from databuild_assets.projections.projection import Projection
from databuild_assets.projections.refresh import processed_log_version, projection_spec
from databuild_assets.runtime.commits import LogVersionsUnavailable, commit_info, find_commit, log_changes
from databuild_assets.runtime.delta_tables import current_version
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, Lake, is_local


@dataclass(frozen=True)
class ProjectionLag:
    projection: str
    raw_log_version: int | None  # the raw log's latest version; None: no raw log yet
    reflected_raw_version: int | None  # the raw log version its rows reflect; None: none yet
    behind_since_version: int | None  # the first raw log commit with data it does not reflect
    behind_since: datetime | None  # that commit's time (UTC)
    lag: timedelta  # now - behind_since; zero when it reflects every data commit

    @property
    def fresh(self) -> bool:
        return self.behind_since_version is None


def projection_lag(
    spark: SparkSession, lake: Lake, projection: Projection, now: datetime | None = None
) -> ProjectionLag:
    """How far `projection` (refreshed from the filtered log) lags the raw log at `now` (UTC)."""
    now = datetime.now(UTC) if now is None else now
    raw_path = lake.table_path(RAW_EVENT_LOG)
    if not DeltaTable.isDeltaTable(spark, raw_path):
        return ProjectionLag(projection.name, None, None, None, None, timedelta(0))
    raw_version = current_version(spark, raw_path)
    processed = processed_log_version(spark, lake.table_path(projection_spec(projection)), projection.name)
    reflected = None if processed is None else raw_version_reflected(spark, lake, processed)
    behind = first_data_commit_after(spark, raw_path, -1 if reflected is None else reflected, raw_version)
    if behind is None:
        return ProjectionLag(projection.name, raw_version, reflected, None, None, timedelta(0))
    since = commit_time(spark, raw_path, behind)
    return ProjectionLag(projection.name, raw_version, reflected, behind, since, max(now - since, timedelta(0)))


def raw_version_reflected(spark: SparkSession, lake: Lake, filtered_version: int) -> int | None:
    """The raw log version that filtered_event_log at `filtered_version` reflects: the one its
    latest refresh commit at or before that version recorded. None when none did. Read newest
    first from that version down (on a local disk, commit file by commit file): the history of
    every commit the log keeps grows with each refresh, and the answer is almost always the
    newest."""
    path = lake.table_path(FILTERED_EVENT_LOG)
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    found = find_commit(spark, path, lambda metadata: "raw_log_version" in metadata, upto=filtered_version)
    return None if found is None else int(json.loads(found[1]["userMetadata"])["raw_log_version"])


def first_data_commit_after(spark: SparkSession, path: str, version: int, latest: int) -> int | None:
    """The first commit of the table in (version, latest] that added or removed rows, or None.

    Bisects the range, so a projection many maintenance commits behind costs a few reads. When
    some of those commits are gone (log retention), the oldest one still listed is returned:
    the projection is then behind since at least that commit."""

    def changed_data(low: int, high: int) -> bool:
        changes = log_changes(spark, path, low, high)
        return bool(changes.added_files) or changes.removed_data

    try:
        if latest <= version or not changed_data(version, latest):
            return None
        low, high = version, latest  # (version, low] changed nothing; (low, high] changed data
        while high - low > 1:
            middle = (low + high) // 2
            if changed_data(low, middle):
                high = middle
            else:
                low = middle
        return high
    except LogVersionsUnavailable:
        oldest = (
            DeltaTable.forPath(spark, path).history().where(F.col("version") > version).agg(F.min("version")).first()
        )
        return oldest[0]


def commit_time(spark: SparkSession, path: str, version: int) -> datetime:
    """When the table's commit `version` was made (UTC). On a local disk: its commitInfo's
    in-commit timestamp, or the writer's, read from that commit alone, since Delta's history
    reads every commit the log keeps (tens of thousands an hour under a service's appends) to
    give one row. Elsewhere, as Delta's history gives it."""
    if is_local(path):
        info = commit_info(spark, path, version)
        stamp = info.get("inCommitTimestamp", info.get("timestamp"))
        if isinstance(stamp, int):
            return datetime.fromtimestamp(stamp / 1000, UTC)
    millis = (
        DeltaTable.forPath(spark, path)
        .history()
        .where(F.col("version") == version)
        .select(F.unix_millis("timestamp").alias("millis"))
        .first()["millis"]
    )
    return datetime.fromtimestamp(millis / 1000, UTC)
