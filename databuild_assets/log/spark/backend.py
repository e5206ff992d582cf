"""The Delta backend of the Build Event Log: `BuildEventLog` over the lake's tables on Spark.

Events are read from the log table with Spark filters, in canonical order; statuses and summaries
from the projection tables, refreshed incrementally from the log before they are read, so every
answer equals the SQLite reference's on the same events (EVENTS.md, The query interface).

    log = open_event_log("delta:///data/lake", spark=spark)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.enums import (
    ACTIVE_PARTITION_STATUSES,
    TERMINAL_BUILD_REQUEST_STATUSES,
    BuildRequestStatus,
    JobStatus,
    PartitionStatus,
)
from databuild_assets.events.schema import EVENT_COLUMNS, event_from_row
from databuild_assets.events.validation import require_valid
from databuild_assets.ingest.writer import append_events as write_events
from databuild_assets.log.interface import (
    ActivitySummary,
    AppendResult,
    BuildEventLog,
    BuildRequestSummary,
    EventFilter,
    EventPage,
    PartitionStatusInfo,
    PartitionSummary,
    check_page,
    decode_cursor,
    encode_cursor,
    status_counts,
)
from databuild_assets.log.spark.time_travel import ReadOnlyEventLogError, resolve_log_version
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import Tombstone, read_tombstones, visible_events
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import RebuildRule, projection_spec, refresh_projections
from databuild_assets.runtime.delta_tables import check_schema_version, current_version, refuse_paths_outside
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, TOMBSTONES, Lake, is_local

# The log table that `_visible_log` reads (minus what tombstones match, at once). Projections are
# refreshed from the filtered log, as the Dagster assets refresh them: one source per table.
_LOG = RAW_EVENT_LOG
_LOG_SUFFIX = f"/tables/{_LOG.name}"

# Payloads that carry a partition_ref, a job_run_id, or list partition_refs (get_partition_events).
_CARRY_PARTITION_REF = ("partition_event", "delegation_event", "partition_invalidation_event")
_CARRY_JOB_RUN_ID = ("partition_event", "job_event", "task_cancel_event")
_LIST_PARTITION_REFS = (("build_request_event", "requested_partitions"), ("job_event", "target_partitions"))

_REQUEST_EVENTS = ("build_request_event", "build_cancel_event")
_ACTIVE_PARTITION = sorted(int(status) for status in ACTIVE_PARTITION_STATUSES)
_TERMINAL_BUILD = sorted(int(status) for status in TERMINAL_BUILD_REQUEST_STATUSES)

_PARTITION_SUMMARY_FIELDS = (
    "partition_ref", "status_code", "is_available", "invalidated", "updated_at", "last_event_id",
    "last_build_request_id", "last_job_run_id", "last_available_at", "last_available_build_request_id",
    "delegated_to_build_request_id", "invalidation_reason", "event_count",
)  # fmt: skip
_BUILD_REQUEST_FIELDS = (
    "build_request_id", "status_code", "cancel_reason", "requested_partitions", "received_at",
    "started_at", "ended_at", "duration_ns", "updated_at", "event_count", "partition_counts", "job_run_counts",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Which events a query wants, as Spark conditions on log rows
# ---------------------------------------------------------------------------------------------


def _any_of(conditions: Iterable[Column]) -> Column:
    combined = F.lit(False)
    for condition in conditions:
        combined = combined | condition
    return combined


def _is(event_type: str) -> Column:
    return F.col("event_type") == event_type


def _concerns_partitions(refs: tuple[str, ...]) -> Column:
    """Events of `get_partition_events` for any of `refs`: those carrying one as partition_ref,
    and build request and job events listing one (docs/decisions/0006-query-semantics.md, Events of a
    partition)."""
    if not refs:
        return F.lit(False)
    wanted = F.array(*(F.lit(ref) for ref in refs))
    carried = (_is(name) & F.col(f"{name}.partition_ref").isin(list(refs)) for name in _CARRY_PARTITION_REF)
    listed = (_is(name) & F.arrays_overlap(F.col(f"{name}.{field}"), wanted) for name, field in _LIST_PARTITION_REFS)
    return _any_of([*carried, *listed])


def _carries_job_runs(job_run_ids: tuple[str, ...]) -> Column:
    """Events of `get_job_run_events` for any of `job_run_ids`
    (docs/decisions/0006-query-semantics.md, Events of a job run)."""
    if not job_run_ids:
        return F.lit(False)
    return _any_of(_is(name) & F.col(f"{name}.job_run_id").isin(list(job_run_ids)) for name in _CARRY_JOB_RUN_ID)


def _in_set(column: str, values: tuple[str, ...]) -> Column:
    return F.col(column).isin(list(values)) if values else F.lit(False)


def _after(timestamp: int, event_id: str) -> Column:
    """Strictly after the position (timestamp, event_id) in canonical order."""
    return (F.col("timestamp") > timestamp) | ((F.col("timestamp") == timestamp) & (F.col("event_id") > event_id))


def _latest_status_by_request(rows: DataFrame | Iterable[Row]) -> dict[str, int | None]:
    """{build_request_id: `status` of its latest row in canonical order} of a few rows with
    build_request_id, timestamp, event_id and status."""
    rows = rows.collect() if isinstance(rows, DataFrame) else rows
    ordered = sorted(rows, key=lambda row: (row["timestamp"], row["event_id"]))
    return {row["build_request_id"]: row["status"] for row in ordered}


def _spark_limit(rows: int) -> int:
    """`rows` as a Spark LIMIT, which is a 32-bit int: no more rows than that can be collected anyway."""
    return min(rows, 2**31 - 1)


def _partition_counts(counts: Mapping[str, int]) -> dict[str, int]:
    return status_counts(PartitionStatus, {PartitionStatus[name].value: count for name, count in counts.items()})


def _job_run_counts(counts: Mapping[str, int]) -> dict[str, int]:
    return status_counts(JobStatus, {JobStatus[name].value: count for name, count in counts.items()})


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------


class DeltaEventLog(BuildEventLog):
    """The Build Event Log in a lake's Delta tables, read and written through `spark`.

    Appends go through the writer API (one MERGE commit on event_id). Event reads filter the raw
    log, leaving out what tombstones match from the moment they commit (`_visible_log`). Status
    and summary reads use the projection tables: a read first brings the filtered log and the
    projections it needs up to the current raw log and tombstones (incrementally), so it sees
    every append and erasure before it, as SQLite does. The instance remembers the versions it
    refreshed to, so reads refresh nothing while neither table moves. `rebuild_rule` says when a
    refresh rebuilds a projection that it could fold into (a small log, a backfill). A lake with
    no log yet answers as an empty log; the first append creates it. Use one instance per thread.

    With `version`, it is the log as it was at that raw log version (`as_of`): read-only, event
    reads read that version, and status and summary reads compute the projections from its
    events with the same functions the projection tables are built with. Events a tombstone
    matches now stay hidden (an erased event stays erased).

        log = DeltaEventLog(spark, Lake("/data/lake"))
        log.append_events(events)
        log.get_latest_partition_status("data/date=2024-01-01")
    """

    def __init__(
        self,
        spark: SparkSession,
        lake: Lake,
        writer: str = "event-log",
        rebuild_rule: RebuildRule = RebuildRule(),
        version: int | None = None,
    ) -> None:
        self.spark: SparkSession | None = spark
        self.lake = lake
        self.writer = writer
        # A raw log version to answer as of (read-only, `as_of`), or None for the live log.
        self.version = version
        self.rebuild_rule = rebuild_rule
        self._log_path = lake.table_path(_LOG)
        self._log_checked = False  # its schema version, once per instance
        # The (raw log version, tombstones version) that the filtered log and each projection are
        # known to reflect: while neither table moves, reads skip the refreshes' own checks (a few
        # Spark jobs each).
        self._filtered_log_state: tuple[int, int] | None = None
        self._projection_states: dict[str, tuple[int, int]] = {}
        self._tombstones: tuple[int | None, list[Tombstone]] = (None, [])

    def __repr__(self) -> str:
        pinned = "" if self.version is None else f".as_of(version={self.version})"
        return f"DeltaEventLog({self.lake.root!r}){pinned}"

    # -- the tables ----------------------------------------------------------------------------

    def _spark(self) -> SparkSession:
        if self.spark is None:
            raise ValueError(f"{self!r} is closed; open the event log again")
        return self.spark

    def _log_version(self) -> int | None:
        """The log's latest version, or None when the lake has no log yet."""
        spark = self._spark()
        if is_local(self.lake.root):
            # The newest version, once every log file Spark would read is checked to name only
            # files inside the table (docs/security.md); a stat when nothing changed.
            version = refuse_paths_outside(self._log_path)
        else:
            version = current_version(spark, self._log_path) if DeltaTable.isDeltaTable(spark, self._log_path) else None
        if version is not None and not self._log_checked:
            check_schema_version(spark, self._log_path)  # refuse a log written by a newer schema
            self._log_checked = True
        return version

    def _tombstones_version(self) -> int | None:
        path = self.lake.table_path(TOMBSTONES)
        if is_local(self.lake.root):
            return refuse_paths_outside(path)
        spark = self._spark()
        return current_version(spark, path) if DeltaTable.isDeltaTable(spark, path) else None

    def _current_tombstones(self) -> list[Tombstone]:
        """Every tombstone, re-read only when the tombstones table has a new commit."""
        version = self._tombstones_version()
        if version is None:
            return []
        if self._tombstones[0] != version:
            self._tombstones = (version, read_tombstones(self._spark(), self.lake, version))
        return self._tombstones[1]

    def _visible_log(self) -> DataFrame:
        """The events every read sees: the one place the log table is read. Events a tombstone
        matches are left out from the moment the tombstone is committed (soft delete)."""
        spark = self._spark()
        if self._log_version() is None:
            return spark.createDataFrame([], _LOG.schema)
        reader = spark.read.format("delta")
        if self.version is not None:
            reader = reader.option("versionAsOf", self.version)
        return visible_events(reader.load(self._log_path), self._current_tombstones())

    def _projections(self, *names: str) -> list[DataFrame]:
        """The projection tables `names`, each first brought up to the current log and tombstones.

        Projections are refreshed from the filtered log (raw log minus tombstones), which is
        refreshed first; the stale ones together (`refresh_projections`).
        """
        spark = self._spark()
        if self.version is not None:
            events = self._visible_log()
            return [PROJECTIONS[name].build(events).select(*PROJECTIONS[name].schema.fieldNames()) for name in names]
        log_version = self._log_version()
        if log_version is None:
            return [spark.createDataFrame([], PROJECTIONS[name].schema) for name in names]
        state = (log_version, self._tombstones_version())
        stale = [name for name in names if self._projection_states.get(name) != state]
        if stale:
            if self._filtered_log_state != state:
                # It may create the tombstones table: the versions it reflects are what it says.
                filtered = refresh_filtered_log(spark, self.lake)
                self._filtered_log_state = (filtered.raw_log_version, filtered.tombstones_version)
            refreshed_state = self._filtered_log_state
            refresh_projections(
                spark, self.lake, [PROJECTIONS[name] for name in stale], FILTERED_EVENT_LOG, rule=self.rebuild_rule
            )
            self._projection_states.update(dict.fromkeys(stale, refreshed_state))
        # The read model's columns only: the tables also keep each row's fold state.
        specs = [projection_spec(PROJECTIONS[name]) for name in names]
        return [
            spark.read.format("delta").load(self.lake.table_path(spec)).select(*spec.schema.fieldNames())
            for spec in specs
        ]

    def projection(self, name: str) -> DataFrame:
        """The projection `name` (partition_state, job_runs or build_requests) as a DataFrame:
        the table brought up to date, or, for a pinned version, computed as of it.

            log.as_of(version=12).projection("partition_state").show()
        """
        [frame] = self._projections(name)
        return frame

    # -- writes ---------------------------------------------------------------------------------

    def append_events(self, events: Iterable[Mapping[str, Any]]) -> AppendResult:
        if self.version is not None:
            raise ReadOnlyEventLogError(
                f"{self!r} is the log as it was at version {self.version}, read-only; append to the log itself "
                "(open_event_log without as_of)"
            )
        events = list(events)
        # Validated here first so the error names the first bad event as every backend does.
        for index, event in enumerate(events):
            require_valid(event, f"events[{index}]")
        result = write_events(self._spark(), self.lake, events, writer=self.writer)
        return AppendResult(accepted=result.accepted, duplicates=result.duplicates)

    # -- events ---------------------------------------------------------------------------------

    def _events(self, condition: Column, limit: int | None = None) -> list[dict[str, Any]]:
        """The events matching `condition` in canonical order (the first `limit` of them)."""
        frame = self._visible_log().where(condition).select(*EVENT_COLUMNS)
        if limit is not None:
            rows = frame.orderBy("timestamp", "event_id").limit(_spark_limit(limit)).collect()  # a top-k: one job
        else:
            # Every match is collected anyway: sorting here saves the sampling job of Spark's global
            # sort. Python orders str by code point, which is the UTF-8 byte order Spark and SQLite use.
            rows = sorted(frame.collect(), key=lambda row: (row["timestamp"], row["event_id"]))
        return [event_from_row(row) for row in rows]

    @staticmethod
    def _since(since_ns: int | None) -> Column:
        return F.lit(True) if since_ns is None else F.col("timestamp") > since_ns

    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._events((F.col("build_request_id") == build_request_id) & self._since(since_ns))

    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._events(_concerns_partitions((partition_ref,)) & self._since(since_ns))

    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        return self._events(_carries_job_runs((job_run_id,)))

    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        if end_ns < start_ns:
            raise ValueError(f"end_ns {end_ns} is before start_ns {start_ns}; the range is [start_ns, end_ns)")
        return self._events((F.col("timestamp") >= start_ns) & (F.col("timestamp") < end_ns))

    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        check_page(limit)
        condition = F.lit(True)
        if since is not None:
            condition = condition & _after(*decode_cursor(since))
        if filter is not None:
            if filter.event_types is not None:
                condition = condition & _in_set("event_type", filter.event_types)
            if filter.build_request_ids is not None:
                condition = condition & _in_set("build_request_id", filter.build_request_ids)
            if filter.job_run_ids is not None:
                condition = condition & _carries_job_runs(filter.job_run_ids)
            if filter.partition_refs is not None:
                condition = condition & _concerns_partitions(filter.partition_refs)
        # One row more than asked tells whether there is another page.
        events = self._events(condition, limit=limit + 1)
        has_more = len(events) > limit
        events = events[:limit]
        next_cursor = encode_cursor(events[-1]["timestamp"], events[-1]["event_id"]) if events else since
        return EventPage(events=events, next_cursor=next_cursor, has_more=has_more)

    # -- projections ----------------------------------------------------------------------------

    def get_latest_partition_status(self, partition_ref: str) -> PartitionStatusInfo | None:
        rows = (
            self.projection("partition_state")
            .where((F.col("partition_ref") == partition_ref) & F.col("status_event_id").isNotNull())
            .select("status_code", "status_timestamp", "status_event_id", "status_build_request_id",
                    "status_job_run_id", "invalidated", "is_available")
            .collect()
        )  # fmt: skip
        if not rows:
            return None
        [row] = rows
        return PartitionStatusInfo(
            partition_ref=partition_ref,
            status_code=row["status_code"],
            status_name=PartitionStatus(row["status_code"]).name,
            timestamp=row["status_timestamp"],
            event_id=row["status_event_id"],
            build_request_id=row["status_build_request_id"],
            job_run_id=row["status_job_run_id"],
            invalidated=row["invalidated"],
            is_available=row["is_available"],
        )

    def get_active_builds_for_partition(self, partition_ref: str) -> list[str]:
        # Two small reads rather than one aggregation over every build request in the log: the
        # ref's partition_events, then the request events of the few requests still building it.
        log = self._visible_log()
        status = F.col("partition_event.status_code").alias("status")
        for_ref = log.where(_is("partition_event") & (F.col("partition_event.partition_ref") == partition_ref))
        latest_for_ref = _latest_status_by_request(for_ref.select("build_request_id", "timestamp", "event_id", status))
        candidates = sorted(request for request, code in latest_for_ref.items() if code in _ACTIVE_PARTITION)
        if not candidates:
            return []
        request_events = log.where(F.col("build_request_id").isin(candidates) & _in_set("event_type", _REQUEST_EVENTS))
        status = F.col("build_request_event.status_code").alias("status")
        rows = request_events.select("build_request_id", "event_type", "timestamp", "event_id", status).collect()
        cancelled = {row["build_request_id"] for row in rows if row["event_type"] == "build_cancel_event"}
        latest_request = _latest_status_by_request(row for row in rows if row["event_type"] == "build_request_event")
        unknown = int(BuildRequestStatus.BUILD_REQUEST_UNKNOWN)
        return [
            request
            for request in candidates
            if request not in cancelled and latest_request.get(request, unknown) not in _TERMINAL_BUILD
        ]

    def get_build_request_for_available_partition(self, partition_ref: str) -> str | None:
        rows = (
            self.projection("partition_state")
            .where((F.col("partition_ref") == partition_ref) & F.col("is_available"))
            .select("status_build_request_id")
            .collect()
        )
        return rows[0]["status_build_request_id"] if rows else None

    @staticmethod
    def _page(frame: DataFrame, order: list[Column], limit: int, offset: int) -> list[Row]:
        """Rows offset..offset+limit of `frame` in `order`: a top-k of offset+limit, one Spark job."""
        return frame.orderBy(*order).limit(_spark_limit(offset + limit)).collect()[offset:]

    def list_build_requests(
        self, limit: int = 100, offset: int = 0, status: BuildRequestStatus | int | None = None
    ) -> list[BuildRequestSummary]:
        check_page(limit, offset)
        status_code = None if status is None else int(BuildRequestStatus(status))
        frame = self.projection("build_requests")
        if status_code is not None:
            frame = frame.where(F.col("status_code") == status_code)
        order = [F.col("received_at").desc(), F.col("build_request_id")]
        summaries = []
        for row in self._page(frame.select(*_BUILD_REQUEST_FIELDS), order, limit, offset):
            fields = row.asDict()
            fields.update(
                status_name=BuildRequestStatus(fields["status_code"]).name,
                requested_partitions=tuple(fields["requested_partitions"]),
                partition_counts=_partition_counts(fields["partition_counts"]),
                job_run_counts=_job_run_counts(fields["job_run_counts"]),
            )
            summaries.append(BuildRequestSummary(**fields))
        return summaries

    def list_recent_partitions(self, limit: int = 100, offset: int = 0) -> list[PartitionSummary]:
        check_page(limit, offset)
        frame = self.projection("partition_state").select(*_PARTITION_SUMMARY_FIELDS)
        order = [F.col("updated_at").desc(), F.col("partition_ref")]
        return [
            PartitionSummary(**row.asDict(), status_name=PartitionStatus(row["status_code"]).name)
            for row in self._page(frame, order, limit, offset)
        ]

    def get_activity_summary(self) -> ActivitySummary:
        # One Spark job: (source, status_code) counts over the three projections and the log.
        # One Spark job: rows by (projection, status_code), over the three projection tables.
        # Every event has a build_request_id, so the build requests' event counts add up to the
        # log's: read from the same refreshed tables, the summary is one consistent snapshot.
        build_requests, partition_state, job_runs = self._projections("build_requests", "partition_state", "job_runs")
        zero = F.lit(0).cast("long")
        columns = ("source", "status_code", "events", "available", "invalidated")
        frame = (
            build_requests.select(F.lit("build_requests"), "status_code", "event_count", zero, zero).toDF(*columns)
            .unionAll(partition_state.select(F.lit("partitions"), "status_code", zero,
                                             F.col("is_available").cast("long"), F.col("invalidated").cast("long")))
            .unionAll(job_runs.select(F.lit("job_runs"), "status_code", zero, zero, zero))
        )  # fmt: skip
        counts: dict[str, dict[int, int]] = {"build_requests": {}, "partitions": {}, "job_runs": {}}
        total_events = available = invalidated = 0
        for row in (
            frame.groupBy("source", "status_code")
            .agg(F.count(F.lit(1)).alias("rows"), *(F.sum(name).alias(name) for name in columns[2:]))
            .collect()
        ):
            counts[row["source"]][row["status_code"]] = row["rows"]
            total_events += row["events"]
            available += row["available"]
            invalidated += row["invalidated"]
        build_requests, partitions, job_runs = counts["build_requests"], counts["partitions"], counts["job_runs"]
        return ActivitySummary(
            total_events=total_events,
            total_build_requests=sum(build_requests.values()),
            total_partitions=sum(partitions.values()),
            total_job_runs=sum(job_runs.values()),
            active_builds=sum(count for code, count in build_requests.items() if code not in _TERMINAL_BUILD),
            available_partitions=available,
            invalidated_partitions=invalidated,
            build_requests_by_status=status_counts(BuildRequestStatus, build_requests),
            partitions_by_status=status_counts(PartitionStatus, partitions),
            job_runs_by_status=status_counts(JobStatus, job_runs),
        )

    # -- time travel ----------------------------------------------------------------------------

    def as_of(self, version: int | None = None, timestamp: datetime | str | None = None) -> DeltaEventLog:
        """A read-only view of this log as of a raw log version, or of the last commit at or before
        `timestamp` (a datetime, naive = UTC, or ISO 8601 text): every query answers as the log did
        then, except that events erased since stay hidden. See `databuild_assets.log.spark.time_travel`.

            log.as_of(version=12).get_activity_summary()
        """
        spark = self._spark()
        pinned = resolve_log_version(spark, self.lake, version, timestamp)
        return DeltaEventLog(spark, self.lake, writer="read-only", rebuild_rule=self.rebuild_rule, version=pinned)

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Forget the session (the caller's: it stays open); the log is unusable afterwards."""
        self.spark = None
        self._projection_states.clear()


__all__ = ["DeltaEventLog"]
