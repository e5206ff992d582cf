"""Keeping a projection up to date with the event log: by folding the new commits in when it
can, by rebuilding it when it must.

Beside each row of its read model, a projection table keeps the row's fold state (`STATE`: the
mergeable aggregates the row is finished from, see `Projection`) and the log version the row was
last computed at (`STATE_LOG_VERSION`). Incrementally, a refresh reads the rows that the log's
commits since the last processed version added (their add actions), aggregates them per key,
merges those states into the stored states of the same keys and MERGEs the finished rows in.
It never reads the rest of the log, so its cost follows the new commits, not the log's size. A
late event (an older timestamp in a newer commit) gives the same rows as a full rebuild: "latest"
and "first" compare canonical positions, not arrival.

Each commit range is folded in exactly once. The processed log version is written in the MERGE
commit's own userMetadata (atomic with the rows it describes). The stored states are read at the
table version that recorded it, and the MERGE replaces a row only if that row is still the one
read (same `STATE_LOG_VERSION`, no newer than the processed version); if another refresh changed
it meanwhile, the MERGE fails before it commits and this refresh rebuilds in full instead. A
refresh that changes no rows gets no data commit (Delta skips empty ones), so it records the
version in a metadata-only commit (a table property); otherwise every later refresh would redo it.

Commits that removed events (an erasure's delete) cannot be folded in: a state cannot take an
event out. Then the refresh reads the files they removed (still on disk until vacuum) and added,
finds the events taken out or put in, and computes the rows of the keys those touch again from
all of those keys' events in the log (`Projection.affected`, `Projection.events_of`); a key with
no event left loses its row. Its cost follows those keys and a scan of the log, not a rebuild's
aggregate and write of every row.

A full rebuild happens when asked, when the projection is missing or records no version, when
its table predates the fold state or holds one of another layout (another release's), when the
commits since then are no longer readable (log cleanup), when the files removed data was in are
gone, when a rebuild is the cheaper way to the same rows (`RebuildRule`: a small log, or a
backfill), or when a concurrent refresh got in the way (above).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import NamedTuple

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, LongType, MapType, StructField, StructType

from databuild_assets.events.schema import EVENT_SCHEMA
from databuild_assets.projections.projection import STATE, STATE_LOG_VERSION, Projection, column, stored_states_of
from databuild_assets.runtime.commits import (
    LogChanges,
    LogVersionsUnavailable,
    latest_commit_metadata,
    latest_commit_metadata_at,
    log_changes,
    read_rows_added,
    read_rows_removed,
)
from databuild_assets.runtime.delta_tables import (
    USER_METADATA,
    current_version,
    ensure_table,
    reset_table,
    retry_on_conflict,
    session_settings,
    table_bytes,
    upgrade_table,
)
from databuild_assets.runtime.lake import Lake, TableSpec
from databuild_assets.runtime.schema_upgrade import schema_additions

log = logging.getLogger(__name__)

MiB = 1024 * 1024


@dataclass(frozen=True)
class RebuildRule:
    """When a refresh that could fold the new commits in rebuilds instead, because a rebuild is
    then the cheaper way to the same rows. A fold has a fixed cost (a MERGE and a commit per
    projection) and reads every stored state; a rebuild reads the whole log, and writes a whole
    new copy of each table (kept until vacuum) where a fold rewrites the files holding changed
    rows (keys are spread over every file, so a batch of any size touches most of them).

    - A log under `small_log_bytes`: the fold's fixed cost is more than reading the whole log.
      The floor sits well under the measured crossover so that a copy per refresh stays small
      (docs/decisions/0012-rebuild-rule.md).
    - A backfill: new commits of at least `backfill_share` of the log's bytes and at least
      `backfill_min_bytes`. The share is set where the fold was never measured faster; the
      floor keeps small batches on the fold, which does not write a whole new copy of the table
      for each (docs/decisions/0012-rebuild-rule.md).

    - Commits that removed data from files holding at least `recompute_share` of the log's
      bytes (an overwrite, an erasure of most of the log): a recompute of the keys they touch
      would read most of the log twice and touch most keys. An erasure's delete rewrites the
      files (dates) holding the erased events, whatever their size, so the bar is high.

    `RebuildRule(small_log_bytes=0, recompute_share=math.inf)` folds into a log of any size and
    recomputes after any removal (the tests of both use it).
    """

    small_log_bytes: int = 1 * MiB
    backfill_share: float = 0.10
    backfill_min_bytes: int = 16 * MiB
    recompute_share: float = 0.5

    def reason_to_rebuild(self, added_bytes: int, log_bytes: int, commits: str) -> str | None:
        """Why new commits (`commits`, e.g. "log commits 4..6") adding `added_bytes` to a log of
        `log_bytes` are better rebuilt than folded; None when folding them is cheaper."""
        if log_bytes < self.small_log_bytes:
            return (
                f"the log holds {log_bytes:,} bytes, under {self.small_log_bytes / MiB:g} MiB: "
                "a rebuild is cheaper than a fold"
            )
        if added_bytes >= self.backfill_min_bytes and added_bytes >= self.backfill_share * log_bytes:
            return (
                f"{commits} added {added_bytes:,} of the log's {log_bytes:,} bytes, at least "
                f"{self.backfill_share:.0%}: a rebuild is cheaper than a fold"
            )
        return None

    def reason_not_to_recompute(self, removed_bytes: int, log_bytes: int, commits: str) -> str | None:
        """Why commits (`commits`) that removed data from files of `removed_bytes` are better
        rebuilt than recomputed key by key; None when a recompute is cheaper."""
        if log_bytes < self.small_log_bytes:
            return self.reason_to_rebuild(0, log_bytes, commits)
        if removed_bytes >= self.recompute_share * log_bytes:
            return (
                f"they removed files of {removed_bytes:,} bytes, at least {self.recompute_share:.0%} of the "
                f"log's {log_bytes:,}: a rebuild is cheaper than a recompute"
            )
        return None


# What the MERGE raises (and fails with, uncommitted) when a row it would replace is not the one read.
ROW_CHANGED = "databuild: a projection row changed since this refresh read it"


class ConcurrentRefresh(RuntimeError):
    """Another refresh changed rows this one was folding into; nothing was committed."""


class ProjectionRefreshError(RuntimeError):
    """Some of the projections `refresh_projections` was given failed to refresh; the others
    did. `results` has the refreshes that succeeded, `failures` each error by projection."""

    def __init__(self, results: dict[str, RefreshResult], failures: dict[str, BaseException]) -> None:
        self.results, self.failures = results, failures
        errors = "; ".join(f"{name}: {type(error).__name__}: {error}" for name, error in failures.items())
        super().__init__(
            f"{len(failures)} of {len(results) + len(failures)} projection refreshes failed ({errors}). "
            f"The others ({', '.join(results) or 'none'}) are up to date; a failed one commits nothing "
            "and its next refresh starts again from the log version it last recorded."
        )


@dataclass(frozen=True)
class RefreshResult:
    projection: str
    mode: str  # "full", "incremental" or "up-to-date"
    reason: str
    from_version: int | None  # log version processed before (None: never)
    to_version: int  # log version processed now
    keys_refreshed: int | None  # incremental: keys recomputed; full: rows written
    projection_version: int
    # What the refresh changed first in a table of an earlier release (`upgrade_table`), in words.
    upgrades: tuple[str, ...] = ()


def projection_spec(projection: Projection) -> TableSpec:
    """The projection's table: its name, read-model columns and description (`table_spec` has
    the columns it is written with). No deletion vectors, like every table of ours: a refresh's
    MERGE rewrites the files holding the rows it replaces, and delta-rs can read the table
    (docs/decisions/0015-every-table-readable-by-delta-rs.md)."""
    return TableSpec(
        projection.name,
        partial(getattr, projection, "schema"),
        (),
        f"Projection {projection.name}, one row per {projection.key}.",
    )


_STATE_TYPES: dict[str, DataType] = {}


def table_spec(spark: SparkSession, projection: Projection) -> TableSpec:
    """`projection_spec` with every column of the table: the read model, then the fold state and
    the log version each row was computed at."""
    if projection.name not in _STATE_TYPES:  # planned once per process: it depends on the code only
        empty = spark.createDataFrame([], EVENT_SCHEMA)
        _STATE_TYPES[projection.name] = nullable(projection.aggregate(empty).schema[STATE].dataType)
    state_type = _STATE_TYPES[projection.name]
    internal = [
        column(STATE, state_type, True,
               "Internal: the mergeable aggregates this row is computed from, which refreshes fold new events "
               "into. Not part of the read model; its layout may change between releases."),
        column(STATE_LOG_VERSION, LongType(), True, "Internal: the log version this row was last computed at."),
    ]  # fmt: skip
    schema = StructType([*projection.schema.fields, *internal])
    return replace(projection_spec(projection), schema_of=partial(_given, schema))


def _given(schema: StructType) -> StructType:
    return schema


def nullable(data_type: DataType) -> DataType:
    """`data_type` with every nested field, element and value nullable. A state's "latest" struct
    is null when no event qualifies, and Delta would check NOT NULL on its fields even then."""
    if isinstance(data_type, StructType):
        return StructType([StructField(f.name, nullable(f.dataType), True, f.metadata) for f in data_type.fields])
    if isinstance(data_type, ArrayType):
        return ArrayType(nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(data_type.keyType, nullable(data_type.valueType), True)
    return data_type


def processed_log_version(spark: SparkSession, path: str, projection: str) -> int | None:
    """The log version the projection's latest refresh commit recorded, or None."""
    return recorded_log_version(latest_commit_metadata(spark, path, lambda m: m.get("projection") == projection))


def recorded_log_version(metadata: dict | None) -> int | None:
    """The log version a projection commit's metadata records; None for none (no commit, or a
    `reset`)."""
    return None if metadata is None or metadata.get("log_version") is None else int(metadata["log_version"])


def _commit_metadata(projection: Projection, log_version: int, mode: str) -> str:
    return json.dumps({"projection": projection.name, "log_version": log_version, "mode": mode})


def record_processed_version(
    session: SparkSession, path: str, projection: Projection, log_version: int, mode: str
) -> None:
    """Record `log_version` as processed in a commit that changes no rows (for refreshes that had
    none to change): a table property set under the same userMetadata that data commits carry."""
    with session_settings(session, {USER_METADATA: _commit_metadata(projection, log_version, mode)}):
        retry_on_conflict(
            lambda: session.sql(
                f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('databuild.processed_log_version' = '{log_version}')"
            ),
            what=f"record log version {log_version} for {projection.name} at {path}",
        )


def table_rows(projection: Projection, states: DataFrame, log_version: int) -> DataFrame:
    """The table's rows of `states` (`key`, `STATE`): the read model, the state, `log_version`."""
    return states.select(
        F.col(projection.key),
        *projection.finish(F.col(STATE)),
        F.col(STATE),
        F.lit(log_version).cast(LongType()).alias(STATE_LOG_VERSION),
    )


def state_layout_changed(spark: SparkSession, projection: Projection, table_schema: StructType) -> bool:
    """Whether the table's fold state column has another layout than this code's (another
    release wrote it): its states cannot be folded into, nor its column altered in place."""
    expected = table_spec(spark, projection).schema[STATE].dataType
    return STATE in table_schema.fieldNames() and table_schema[STATE].dataType.simpleString() != expected.simpleString()


def reset(spark: SparkSession, path: str, projection: Projection) -> None:
    """Empty the projection's table and give it this code's schema, in a commit that records no
    log version: if the process stops before a rebuild writes the rows, the next refresh
    rebuilds again instead of folding into an empty table."""
    with session_settings(spark, {USER_METADATA: json.dumps({"projection": projection.name, "mode": "reset"})}):
        reset_table(spark, path, table_spec(spark, projection))


def rebuild(
    spark: SparkSession, path: str, projection: Projection, log_at_version: DataFrame, log_version: int
) -> None:
    """Replace the projection (an existing table) with its build from the whole log, in one
    commit; two when the table's fold state has another layout (`state_layout_changed`)."""
    current = spark.read.format("delta").load(path).schema
    if STATE not in current.fieldNames():  # written before the fold state
        columns = ", ".join(
            addition.sql() for addition in schema_additions(current, table_spec(spark, projection).schema)
        )
        retry_on_conflict(
            lambda: spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})"),
            what=f"add the fold state columns to {projection.name} at {path}",
        )
    elif state_layout_changed(spark, projection, current):
        reset(spark, path, projection)  # Delta can add a struct's fields in place, not drop or retype them
    rows = table_rows(projection, projection.aggregate(log_at_version), log_version)
    # Redone on a conflict (compaction's bin-packing, another refresh): the rows stay those of
    # `log_version`. Should another refresh have recorded a later version meanwhile, the next
    # refresh folds from this one's.
    retry_on_conflict(
        lambda: (
            rows.write.format("delta")
            .mode("overwrite")
            .option("userMetadata", _commit_metadata(projection, log_version, "full"))
            .save(path)
        ),
        what=f"rebuild {projection.name} at {path}",
    )


def fold_in(
    session: SparkSession,
    path: str,
    projection: Projection,
    table_version: int,
    states_of: Callable[[DataFrame], DataFrame],
    processed: int,
    log_version: int,
) -> int:
    """MERGE the states `states_of(stored)` computes from the projection's stored states as of
    `table_version` (the version that recorded `processed`) into its rows as log version
    `log_version`; a key whose new state is null has no event left: its row is deleted. Returns
    how many keys it changed. Raises ConcurrentRefresh, having committed nothing, when a row to
    replace is no longer the one read."""
    key = projection.key
    # Not kept: a by-key fold reads it once; build_requests' fold keeps what it reads more than once.
    stored = session.read.format("delta").option("versionAsOf", table_version).load(path)
    stored = stored.select(key, STATE, STATE_LOG_VERSION)
    read = stored.select(F.col(key), F.col(STATE_LOG_VERSION).alias("_read_log_version"))
    # Not kept either: MERGE materializes its source once itself (it is not a plain Delta read),
    # and reports the rows it wrote.
    rows = table_rows(projection, states_of(stored), log_version).join(read, key, "left")
    read_version = F.col("fresh._read_log_version")
    unchanged = F.col(f"current.`{STATE_LOG_VERSION}`").eqNullSafe(read_version) & (read_version <= processed)
    gone = F.col(f"fresh.`{STATE}`").isNull()
    inserted_version = F.when(read_version.isNull(), F.col(f"fresh.`{STATE_LOG_VERSION}`")).otherwise(
        F.raise_error(F.lit(ROW_CHANGED))  # the row was there when read, and is gone
    )
    columns = [name for name in rows.columns if name not in ("_read_log_version", STATE_LOG_VERSION)]
    values = {f"`{name}`": F.col(f"fresh.`{name}`") for name in columns}
    with session_settings(session, {USER_METADATA: _commit_metadata(projection, log_version, "incremental")}):
        try:
            metrics = retry_on_conflict(
                lambda: (
                    DeltaTable.forPath(session, path)
                    .alias("current")
                    .merge(rows.alias("fresh"), f"current.`{key}` = fresh.`{key}`")
                    # The first clause whose condition holds applies: a changed row fails the MERGE.
                    .whenMatchedUpdate(~unchanged, set={f"`{STATE_LOG_VERSION}`": F.raise_error(F.lit(ROW_CHANGED))})
                    .whenMatchedDelete(gone)
                    .whenMatchedUpdate(set={**values, f"`{STATE_LOG_VERSION}`": F.col(f"fresh.`{STATE_LOG_VERSION}`")})
                    .whenNotMatchedInsert(~gone, values={**values, f"`{STATE_LOG_VERSION}`": inserted_version})
                    .execute()
                    .first()
                ),
                what=f"refresh {projection.name} at {path}",
            )
        except Exception as error:
            if ROW_CHANGED in str(error):
                raise ConcurrentRefresh(
                    f"rows of {projection.name} changed after version {table_version} (another refresh)"
                ) from error
            raise
    return int(metrics["num_affected_rows"])


def recompute(projection: Projection, stored: DataFrame, log: DataFrame, changed: DataFrame) -> DataFrame:
    """(key, STATE) of every key whose row the events `changed` (added to or removed from the
    log, which is now `log`) can change, computed from all of its events in `log`; STATE null
    for a key that has none left."""
    keys = projection.affected(stored, log, changed).localCheckpoint()  # read more than once below
    if "event_date" in log.columns:
        # Which dates hold those events: a scan of the columns that pick them (Spark reads no
        # others), so that the events themselves are read from those date partitions only.
        dates = [row.event_date for row in projection.events_of(log, keys).select("event_date").distinct().collect()]
        log = log.where(F.col("event_date").isin(dates))
    states = stored_states_of(projection.aggregate(projection.events_of(log, keys)), keys)
    return keys.join(states, projection.key, "left")


def changed_events(removed: DataFrame, added: DataFrame) -> DataFrame:
    """The events that `removed` (the rows of files a range of commits removed) and `added` (of
    the files it added) do not have in common: those it took out of the log and put in. A delete
    rewrites whole files, so both hold every row it kept."""
    return removed.join(added.select("event_id"), "event_id", "left_anti").unionByName(
        added.join(removed.select("event_id"), "event_id", "left_anti")
    )


def refresh_projections(
    spark: SparkSession,
    lake: Lake,
    projections: Iterable[Projection],
    source: TableSpec,
    full: bool = False,
    rule: RebuildRule = RebuildRule(),
) -> dict[str, RefreshResult]:
    """`refresh_projection` for each of `projections`, all at once, one thread each; their
    results by name. Raises ProjectionRefreshError once all have finished if any failed (the
    others' refreshes stand).

    They can run side by side: each refresh pins the source version it reads, works in a Spark
    session of its own and writes only its own table. It is worth it because a refresh of a small
    batch spends most of its time in the driver (planning, reading and writing the Delta log)
    and in jobs too small to use every core
    (docs/decisions/0013-projections-refresh-side-by-side.md).

        results = refresh_projections(spark, lake, PROJECTIONS.values(), FILTERED_EVENT_LOG)
    """
    projections = list(projections)
    if not projections:
        return {}

    def attempt(projection: Projection) -> RefreshResult | BaseException:
        try:
            return refresh_projection(spark, lake, projection, source, full=full, rule=rule)
        except Exception as error:  # reported with the others' results below
            return error

    with ThreadPoolExecutor(max_workers=len(projections), thread_name_prefix="refresh-projection") as pool:
        outcomes = dict(zip((p.name for p in projections), pool.map(attempt, projections), strict=True))
    results = {name: outcome for name, outcome in outcomes.items() if isinstance(outcome, RefreshResult)}
    failures = {name: outcome for name, outcome in outcomes.items() if not isinstance(outcome, RefreshResult)}
    if failures:
        raise ProjectionRefreshError(results, failures) from next(iter(failures.values()))
    return results


class RefreshPlan(NamedTuple):
    """What a refresh will do ("full", "incremental" or "up-to-date") and why; an incremental plan
    carries the log changes it folds in."""

    mode: str
    reason: str
    changes: LogChanges | None = None


def plan_refresh(
    session: SparkSession,
    path: str,
    projection: Projection,
    source_path: str,
    processed: int | None,
    log_version: int,
    full: bool,
    rule: RebuildRule,
) -> RefreshPlan:
    """The first reason, in order, for the projection at `path` (which recorded `processed`) to
    rebuild, skip, or fold in the log's commits up to `log_version` (the module docstring lists
    the reasons)."""
    if full:
        return RefreshPlan("full", "full rebuild requested")
    if processed is None:
        return RefreshPlan("full", "projection has no recorded log version")
    if processed > log_version:
        return RefreshPlan(
            "full", f"recorded log version {processed} is newer than the log's {log_version} (log replaced?)"
        )
    if processed == log_version:
        return RefreshPlan("up-to-date", "no new log commits")
    table_schema = session.read.format("delta").load(path).schema
    if STATE not in table_schema.fieldNames():
        return RefreshPlan("full", "the table has no fold state yet (written by an earlier release)")
    if state_layout_changed(session, projection, table_schema):
        return RefreshPlan("full", "the table's fold state has another layout (written by another release)")
    try:
        changes = log_changes(session, source_path, processed, log_version)
    except LogVersionsUnavailable as error:
        return RefreshPlan("full", str(error))
    commits = f"log commits {processed + 1}..{log_version}"
    if changes.removed_data:
        if cheaper := rule.reason_not_to_recompute(changes.removed_bytes, table_bytes(session, source_path), commits):
            return RefreshPlan("full", f"{commits} removed data; {cheaper}")
        return RefreshPlan("recompute", f"{commits} removed data: the keys they touch recomputed", changes)
    if not changes.added_files:  # e.g. only compaction commits (dataChange=false)
        return RefreshPlan("up-to-date", f"{commits} added no data")
    if cheaper := rule.reason_to_rebuild(changes.added_bytes, table_bytes(session, source_path), commits):
        return RefreshPlan("full", cheaper)
    return RefreshPlan("incremental", f"{len(changes.added_files)} files added", changes)


def refresh_projection(
    spark: SparkSession,
    lake: Lake,
    projection: Projection,
    source: TableSpec,
    full: bool = False,
    rule: RebuildRule = RebuildRule(),
) -> RefreshResult:
    """Bring `projection` up to the current version of the `source` log table: fold the new
    commits in, or rebuild it when it must or when `rule` says a rebuild is cheaper.

        result = refresh_projection(spark, lake, PROJECTIONS["partition_state"], RAW_EVENT_LOG)
    """
    # userMetadata is a session setting: a session of our own keeps it off other threads' commits.
    session = spark.newSession()
    source_path, path = lake.table_path(source), lake.table_path(projection_spec(projection))
    log_version = current_version(session, source_path)
    log_at_version = session.read.format("delta").option("versionAsOf", log_version).load(source_path)
    table_version, metadata = latest_commit_metadata_at(session, path, lambda m: m.get("projection") == projection.name)
    processed = recorded_log_version(metadata)
    spec = table_spec(session, projection)
    if DeltaTable.isDeltaTable(session, path):
        upgrades = upgrade_table(session, path, spec)  # e.g. an earlier release's deletion vectors dropped
    else:
        ensure_table(session, path, spec)
        upgrades = ()
    version_before = current_version(session, path) if table_version is None or upgrades else table_version

    def done(mode: str, reason: str, keys: int | None) -> RefreshResult:
        if mode == "up-to-date" and processed == log_version and not upgrades:
            version = version_before  # nothing to do, nothing done
        else:
            version = current_version(session, path)
            # A fold that changed keys committed its MERGE. Otherwise there may be no commit recording
            # `log_version` yet: Delta skips empty ones (a rebuild of an empty table, an empty MERGE).
            committed = mode == "incremental" and keys
            if processed != log_version and not committed and version == version_before:
                record_processed_version(session, path, projection, log_version, mode)  # no rows changed
                version = current_version(session, path)
        result = RefreshResult(projection.name, mode, reason, processed, log_version, keys, version, upgrades)
        log.info(
            "%s: %s refresh (%s), log version %s -> %d, %s keys%s",
            projection.name,
            mode,
            reason,
            processed,
            log_version,
            keys,
            "".join(f"; first {upgrade}" for upgrade in upgrades),
        )
        return result

    plan = plan_refresh(session, path, projection, source_path, processed, log_version, full, rule)
    if plan.mode == "up-to-date":
        return done("up-to-date", plan.reason, 0)
    reason = plan.reason
    states_of: Callable[[DataFrame], DataFrame] | None = None
    new_events = None
    if plan.mode == "recompute":
        removed = read_rows_removed(session, source_path, log_at_version.schema, plan.changes)
        if removed is None:
            reason = (
                f"log commits {processed + 1}..{log_version} removed data, in files no longer readable as they were"
            )
        else:
            changed = changed_events(removed, read_rows_added(session, source_path, log_at_version, plan.changes))
            states_of = lambda stored: recompute(projection, stored, log_at_version, changed)  # noqa: E731
    elif plan.mode == "incremental":
        # Kept: a fold reads the new events more than once (build_requests: three times).
        new_events = read_rows_added(session, source_path, log_at_version, plan.changes).persist()
        states_of = lambda stored: projection.fold(stored, new_events)  # noqa: E731
    if states_of is not None:
        try:
            keys = fold_in(session, path, projection, table_version, states_of, processed, log_version)
        except ConcurrentRefresh as error:
            reason = str(error)
        else:
            return done("incremental", plan.reason, keys)
        finally:
            if new_events is not None:
                new_events.unpersist()
    rebuild(session, path, projection, log_at_version, log_version)
    return done("full", reason, session.read.format("delta").load(path).count())
