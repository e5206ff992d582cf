"""The JVM-free Delta backend: `BuildEventLog` over a local lake, for a live DataBuild service.

The query process keeps an in-memory replica of the visible log (`log/replica.py`: the SQLite
reference backend's tables, indexes and SQL) and follows the lake's raw_event_log and tombstones
tables by Delta version (`log/delta_follower.py`). Before every read it checks whether either
table has a new commit (one `stat` each) and, if so, applies only those commits, so a read sees
every append and every tombstone committed before it, its own included. Reads never write to
the lake. Appends are one delta-rs commit under the raw log's commit lock, which the Spark jobs
take too (`runtime/commit_lock.py`), deduplicated by event_id against the whole log.

    log = open_event_log("delta:///data/lake")          # no SparkSession: this backend
    log.append_events(events)
    log.get_latest_partition_status("data/date=2024-01-01")
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import deltalake
import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from databuild_assets.events.enums import BuildRequestStatus
from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.events.validation import require_valid
from databuild_assets.log.delta_append import CommitConflictError, append_files, writable_by_fast_append
from databuild_assets.log.delta_follower import DeltaFollower, TableTooLargeError
from databuild_assets.log.interface import (
    ActivitySummary,
    AppendResult,
    BuildEventLog,
    BuildRequestSummary,
    EventFilter,
    EventPage,
    PartitionStatusInfo,
    PartitionSummary,
    canonical_event,
)
from databuild_assets.log.replica import EventLogReplica, event_rows
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.delta_tables import table_properties
from databuild_assets.runtime.lake import RAW_EVENT_LOG, TOMBSTONES, Lake

log = logging.getLogger(__name__)

_EVENT_COLUMNS = list(EVENT_COLUMNS)
_COMMIT_ATTEMPTS = 3
# The replica is held in memory; past this many events, opening refuses and names the Spark
# backend (docs/decisions/0008-query-path-without-jvm.md).
DEFAULT_MAX_EVENTS = 5_000_000
_NS_PER_DAY = 86_400 * 10**9


class ReplicaTooLargeError(RuntimeError):
    """The raw log holds more events than `max_events`: too many to hold in memory here."""


def _values_by_key(records: pa.Table) -> dict[str, set[str]]:
    """{key: values} of every erasure request in the tombstones table (applied or not: an
    applied one still hides an event that arrives again)."""
    values: dict[str, set[str]] = {}
    for record, key, value in zip(
        *(records.column(name).to_pylist() for name in ("record", "key", "value")), strict=True
    ):
        if record == "requested":
            values.setdefault(key, set()).add(value)
    return values


class DeltaRsEventLog(BuildEventLog):
    """The Build Event Log of a local lake, read and appended without a JVM (see the module doc).

    Opening it loads the visible log into memory: more than `max_events` raw log rows is refused
    (ReplicaTooLargeError). One instance per thread; processes share the lake (each follows it).
    `writer` names the appends' source ("writer:<writer>").

        with DeltaRsEventLog(Lake("/data/lake")) as log:
            log.list_build_requests(limit=20)
    """

    def __init__(self, lake: Lake, writer: str = "event-log", max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self.lake = lake
        self.writer = writer
        self.max_events = max_events
        self._log_path = lake.table_path(RAW_EVENT_LOG)
        self._log = DeltaFollower(self._log_path)
        self._tombstones = DeltaFollower(lake.table_path(TOMBSTONES))
        self._hidden_by: dict[str, set[str]] = {}
        self._replica: EventLogReplica | None = EventLogReplica()
        self._arrow_schema: pa.Schema | None = None
        self._table: deltalake.DeltaTable | None = None  # the raw log as delta-rs last saw it, for appends
        self._catch_up()

    def __repr__(self) -> str:
        return f"DeltaRsEventLog({self.lake.root!r})"

    # -- following the lake --------------------------------------------------------------------

    def _store(self) -> EventLogReplica:
        if self._replica is None:
            raise ValueError(f"{self!r} is closed; open the event log again")
        return self._replica

    def _catch_up(self) -> EventLogReplica:
        """The replica, with every commit of the tombstones and the raw log applied (a new one
        when the raw log had to be loaded again)."""
        replica = self._store()
        if self._tombstones.moved():
            values = _values_by_key(self._tombstones.load(["record", "key", "value"]))
            new = {key: found - self._hidden_by.get(key, set()) for key, found in values.items()}
            self._hidden_by = values
            if any(new.values()):
                replica.hide(new)
        if self._log.moved():
            changes = self._log.changes()
            if changes is None:
                self._reload(
                    "opened"
                    if self._log.version is None
                    else "a new protocol or schema, or commits no longer in the log"
                )
            elif not self._apply(changes.added, changes.removed):
                self._reload("a data file of a commit is gone (vacuumed)")
        return self._store()

    def _apply(self, added: list[str], removed: list[str]) -> bool:
        """Apply one run of commits; False when a file is gone and the snapshot must be reloaded."""
        replica = self._store()
        added_events = self._log.read(added, _EVENT_COLUMNS)
        removed_ids = self._log.read(removed, ["event_id"]) if removed else pa.table({"event_id": []})
        if added_events is None or removed_ids is None:
            return False
        if removed_ids.num_rows:
            # Rows that a commit removed and did not add back (a purge rewrites the rest).
            still_there = set(added_events.column("event_id").to_pylist()) if added_events.num_rows else set()
            replica.remove(i for i in removed_ids.column("event_id").to_pylist() if i not in still_there)
        replica.add(event_rows(added_events), self._hidden_by)
        return True

    def _reload(self, reason: str) -> None:
        """A fresh replica from the raw log's snapshot (first open, or a commit not followable)."""
        log.info("%r: loading the raw log's snapshot (%s)", self, reason)
        replica = EventLogReplica()
        if self._log.exists():
            try:
                events = self._log.load(_EVENT_COLUMNS, max_rows=self.max_events)
            except TableTooLargeError as error:
                raise ReplicaTooLargeError(
                    f"{error}: the JVM-free backend holds the whole visible log in memory. Open it through Spark "
                    f"(open_event_log(uri, spark=spark)), or allow more with open_event_log(uri, max_events=N) "
                    "on a machine with the memory for it (docs/decisions/0008-query-path-without-jvm.md)"
                ) from error
            replica.add(event_rows(events), self._hidden_by)
        old, self._replica = self._replica, replica
        self._table = None  # its protocol or schema may have changed: opened again by the next append
        if old is not None:
            old.close()

    # -- writes ---------------------------------------------------------------------------------

    def append_events(self, events: Iterable[Mapping[str, Any]]) -> AppendResult:
        events = list(events)
        for index, event in enumerate(events):
            require_valid(event, f"events[{index}]")
        if not events:
            return AppendResult(0, 0)
        with commit_lock(self._log_path):
            for attempt in range(_COMMIT_ATTEMPTS):
                replica = self._catch_up()
                known = replica.known_event_ids(event["event_id"] for event in events)
                new: dict[str, tuple[int, dict[str, Any]]] = {}
                for index, event in enumerate(events):
                    if event["event_id"] not in known and event["event_id"] not in new:
                        new[event["event_id"]] = (index, canonical_event(event))
                if not new:
                    break
                before = self._log.version
                try:
                    self._commit(self._rows(new.values()))
                except CommitConflictError:
                    if attempt == _COMMIT_ATTEMPTS - 1:
                        raise
                    continue  # a writer that ignores the lock committed first: dedupe again
                changes = self._log.changes()
                if changes is not None and changes.version == before + 1 and not changes.removed:
                    # Ours is the only commit since (the lock keeps other committers out): apply
                    # the events we hold instead of reading back the file we wrote.
                    replica.add_events([event for _, event in new.values()], self._hidden_by)
                elif changes is None or not self._apply(changes.added, changes.removed):
                    self._reload("commits other than this append's could not be followed")
                break
        return AppendResult(accepted=len(new), duplicates=len(events) - len(new))

    def _rows(self, indexed_events: Iterable[tuple[int, dict[str, Any]]]) -> pa.Table:
        """Raw log rows of canonical events, as the Spark writer stores them (source "writer:<name>")."""
        ingested_at = datetime.now(UTC)
        rows = []
        for index, event in indexed_events:
            row = dict(event)
            row.update(
                event_date=datetime.fromtimestamp(event["timestamp"] // _NS_PER_DAY * 86_400, UTC).date(),
                source_file=f"writer:{self.writer}",
                source_line=index + 1,
                ingested_at=ingested_at,
            )
            rows.append(row)
        return pa.Table.from_pylist(rows, schema=self._schema())

    def _schema(self) -> pa.Schema:
        if self._arrow_schema is None:
            self._arrow_schema = pa.schema(deltalake.Schema.from_json(RAW_EVENT_LOG.schema.json()).to_arrow())
        return self._arrow_schema

    def _commit(self, rows: pa.Table) -> None:
        """One append commit of `rows` as the log's next version (the raw log created first when
        the lake has none): by `delta_append` when the table's protocol allows, else delta-rs."""
        if not self._log.exists():
            self._table = deltalake.DeltaTable.create(
                self._log_path,
                schema=deltalake.Schema.from_json(RAW_EVENT_LOG.schema.json()),
                partition_by=list(RAW_EVENT_LOG.partition_by),
                description=RAW_EVENT_LOG.description,
                configuration=table_properties(RAW_EVENT_LOG),
                raise_if_key_not_exists=False,  # our own databuild.schemaVersion property
            )
        elif self._table is None:
            self._table = deltalake.DeltaTable(self._log_path)
        table, user_metadata = self._table, json.dumps({"writer": self.writer})
        latest = self._log.version if self._log.version is not None else table.version()
        stats_columns = table.metadata().configuration.get("delta.dataSkippingStatsColumns")
        if stats_columns and writable_by_fast_append(table.protocol(), table.schema().to_json()):
            partition_by = table.metadata().partition_columns
            append_files(
                self._log_path,
                latest + 1,
                rows,
                partition_by,
                stats_columns.split(","),
                {"userMetadata": user_metadata},
            )
            return
        if table.version() != latest:
            table.update_incremental()  # to the latest commit: the one this append follows
        write_deltalake(
            table,
            rows,
            mode="append",
            commit_properties=CommitProperties(custom_metadata={"userMetadata": user_metadata}),
        )

    # -- reads: the replica's, once it has caught up --------------------------------------------

    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._catch_up().get_build_request_events(build_request_id, since_ns)

    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._catch_up().get_partition_events(partition_ref, since_ns)

    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        return self._catch_up().get_job_run_events(job_run_id)

    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        return self._catch_up().get_events_in_range(start_ns, end_ns)

    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        return self._catch_up().list_events(since, filter, limit)

    def get_latest_partition_status(self, partition_ref: str) -> PartitionStatusInfo | None:
        return self._catch_up().get_latest_partition_status(partition_ref)

    def get_active_builds_for_partition(self, partition_ref: str) -> list[str]:
        return self._catch_up().get_active_builds_for_partition(partition_ref)

    def get_build_request_for_available_partition(self, partition_ref: str) -> str | None:
        return self._catch_up().get_build_request_for_available_partition(partition_ref)

    def list_build_requests(
        self, limit: int = 100, offset: int = 0, status: BuildRequestStatus | int | None = None
    ) -> list[BuildRequestSummary]:
        return self._catch_up().list_build_requests(limit, offset, status)

    def list_recent_partitions(self, limit: int = 100, offset: int = 0) -> list[PartitionSummary]:
        return self._catch_up().list_recent_partitions(limit, offset)

    def get_activity_summary(self) -> ActivitySummary:
        return self._catch_up().get_activity_summary()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def version(self) -> int | None:
        """The raw log version the replica reflects (None when the lake has no log yet)."""
        return self._log.version

    def replica_bytes(self) -> int:
        """The in-memory replica's size in bytes."""
        return self._store().stored_bytes()

    def close(self) -> None:
        replica, self._replica = self._replica, None
        if replica is not None:
            replica.close()


__all__ = ["DEFAULT_MAX_EVENTS", "DeltaRsEventLog", "ReplicaTooLargeError"]
