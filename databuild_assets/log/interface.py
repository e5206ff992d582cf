"""The query interface of the Build Event Log (EVENTS.md), shared by every backend.

`BuildEventLog` mirrors DataBuild's BuildEventLog trait. Everything a backend returns is a plain
Python value fully determined by the events (dicts, ints, strings, tuples, frozen dataclasses), in
the canonical order (timestamp, event_id), so that the SQLite and the Delta backends can be held to
one test suite (`databuild_assets_tests/bel_cases.py`).
"""

from __future__ import annotations

import base64
import binascii
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from databuild_assets.events.enums import BuildRequestStatus, PartitionStatus
from databuild_assets.events.schema import EVENT_COLUMNS, EVENT_TYPES, PAYLOADS

# ---------------------------------------------------------------------------------------------
# Result and argument types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendResult:
    """What an append did: `accepted` events written, `duplicates` skipped (event_id already in
    the log, or repeated within the same call: the first one wins)."""

    accepted: int
    duplicates: int


@dataclass(frozen=True)
class EventFilter:
    """Which events `list_events` returns. Fields combine with AND, values of a field with OR.

    None means "no constraint"; an empty collection matches no event. `partition_refs` and
    `job_run_ids` match the same events as `get_partition_events` and `get_job_run_events`.

        EventFilter(event_types=["partition_event"], partition_refs=["data/date=2024-01-01"])
    """

    event_types: tuple[str, ...] | None = None
    build_request_ids: tuple[str, ...] | None = None
    partition_refs: tuple[str, ...] | None = None
    job_run_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("event_types", "build_request_ids", "partition_refs", "job_run_ids"):
            values = getattr(self, name)
            if values is None:
                continue
            if isinstance(values, (str, bytes)):
                # A bare string would silently become a set of one-character values.
                raise TypeError(f"EventFilter.{name} must be a collection of strings, got the string {values!r}")
            values = tuple(values)
            for value in values:
                if not isinstance(value, str):
                    raise TypeError(f"EventFilter.{name} must hold strings, got {value!r}")
            object.__setattr__(self, name, values)
        unknown = sorted(set(self.event_types or ()) - set(EVENT_TYPES))
        if unknown:
            known = ", ".join(EVENT_TYPES)
            raise ValueError(f"EventFilter.event_types: unknown event type(s) {unknown}; known: {known}")


@dataclass(frozen=True)
class EventPage:
    """One page of `list_events`.

    `next_cursor` is the cursor to pass as `since` for the next page: after the last event of
    this page or, when the page is empty, the `since` it was asked with (None if that was None),
    so a poller can keep asking with it. `has_more` says whether more matching events existed
    past this page when it was read.
    """

    events: list[dict[str, Any]]
    next_cursor: str | None
    has_more: bool


@dataclass(frozen=True)
class PartitionStatusInfo:
    """The latest partition_event of a partition_ref, and whether a later invalidation voids it."""

    partition_ref: str
    status_code: int
    status_name: str
    timestamp: int
    event_id: str
    build_request_id: str
    job_run_id: str | None
    invalidated: bool
    is_available: bool

    @property
    def status(self) -> PartitionStatus:
        return PartitionStatus(self.status_code)


@dataclass(frozen=True)
class PartitionSummary:
    """One row of the partition_state projection (EVENTS.md).

    A ref seen only in delegation or invalidation events has status PARTITION_UNKNOWN (0) and
    no status_* fields. `updated_at`, `last_event_id` and `last_build_request_id` describe the
    latest partition, delegation or invalidation event of the ref; `last_job_run_id` is the
    latest non-null job_run_id of its partition_events; `last_available_*` describe its latest
    PARTITION_AVAILABLE event, even if later events superseded it; `invalidation_reason` is set
    only while `invalidated`.
    """

    partition_ref: str
    status_code: int
    status_name: str
    is_available: bool
    invalidated: bool
    updated_at: int
    last_event_id: str
    last_build_request_id: str
    last_job_run_id: str | None
    last_available_at: int | None
    last_available_build_request_id: str | None
    delegated_to_build_request_id: str | None
    invalidation_reason: str | None
    event_count: int

    @property
    def status(self) -> PartitionStatus:
        return PartitionStatus(self.status_code)


@dataclass(frozen=True)
class BuildRequestSummary:
    """One row of the build_requests projection (EVENTS.md).

    - status: the latest build_request_event's; a build_cancel_event later than it (or with no
      build_request_event at all) makes it BUILD_REQUEST_CANCELLED with `cancel_reason`;
      BUILD_REQUEST_UNKNOWN when the request has neither;
    - requested_partitions: of the latest build_request_event that carries them, else ();
    - received_at: its earliest event of any type; started_at: its first EXECUTING event;
      ended_at: its first terminal event (COMPLETED, FAILED, CANCELLED or a build_cancel_event);
      duration_ns = ended_at - received_at; updated_at: its latest event;
    - partition_counts: its partitions (refs of its partition_events) by the status of its own
      latest partition_event for each; job_run_counts: its job runs by job_runs status. Both
      keyed by status name, every status of the enum present, in code order.
    """

    build_request_id: str
    status_code: int
    status_name: str
    cancel_reason: str | None
    requested_partitions: tuple[str, ...]
    received_at: int
    started_at: int | None
    ended_at: int | None
    duration_ns: int | None
    updated_at: int
    event_count: int
    partition_counts: dict[str, int]
    job_run_counts: dict[str, int]

    @property
    def status(self) -> BuildRequestStatus:
        return BuildRequestStatus(self.status_code)


@dataclass(frozen=True)
class ActivitySummary:
    """Counts over the whole log, for a dashboard's front page.

    The *_by_status dicts are keyed by status name, every status of the enum present (zeros
    included), in code order. `active_builds` counts build requests whose status is not
    terminal (not COMPLETED, FAILED or CANCELLED).
    """

    total_events: int
    total_build_requests: int
    total_partitions: int
    total_job_runs: int
    active_builds: int
    available_partitions: int
    invalidated_partitions: int
    build_requests_by_status: dict[str, int]
    partitions_by_status: dict[str, int]
    job_runs_by_status: dict[str, int]


# ---------------------------------------------------------------------------------------------
# Helpers every backend shares, so that their answers agree to the byte
# ---------------------------------------------------------------------------------------------


def canonical_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """`event` (already valid) in the form every read returns: all of `EVENT_COLUMNS` present,
    the other seven payloads None, and every field of its payload present (None when unset)."""
    canonical: dict[str, Any] = dict.fromkeys(EVENT_COLUMNS)
    canonical["event_id"] = event["event_id"]
    canonical["timestamp"] = event["timestamp"]
    canonical["build_request_id"] = event["build_request_id"]
    event_type = event["event_type"]
    canonical["event_type"] = event_type
    payload = event[event_type]
    fields: dict[str, Any] = {}
    for field in PAYLOADS[event_type]:
        value = payload.get(field.name)
        fields[field.name] = list(value) if isinstance(value, list) else value  # no aliasing of the caller's list
    canonical[event_type] = fields
    return canonical


_CURSOR_PREFIX = "bel1."


def encode_cursor(timestamp: int, event_id: str) -> str:
    """The opaque `list_events` cursor that points just after the event (timestamp, event_id)."""
    position = json.dumps([timestamp, event_id], separators=(",", ":"), ensure_ascii=False)
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(position.encode("utf-8")).decode("ascii")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """(timestamp, event_id) of a cursor from `encode_cursor`; ValueError for anything else."""
    problem = f"cursor {cursor!r} is not one this log issued; pass None or an EventPage.next_cursor"
    if not isinstance(cursor, str) or not cursor.startswith(_CURSOR_PREFIX):
        raise ValueError(problem)
    try:
        position = json.loads(base64.urlsafe_b64decode(cursor[len(_CURSOR_PREFIX) :].encode("ascii")))
    except (binascii.Error, UnicodeError, ValueError) as error:
        raise ValueError(f"{problem} ({error})") from error
    if (
        not isinstance(position, list)
        or len(position) != 2
        or not isinstance(position[0], int)
        or isinstance(position[0], bool)
        or not 0 <= position[0] < 2**63
        or not isinstance(position[1], str)
    ):
        raise ValueError(problem)
    return position[0], position[1]


def status_counts(enum: type[IntEnum], counts_by_code: Mapping[int, int]) -> dict[str, int]:
    """{status name: count} for every member of `enum` in code order, zeros included."""
    return {member.name: counts_by_code.get(member.value, 0) for member in enum}


def check_page(limit: int, offset: int = 0) -> None:
    """Reject a page size below 1 or a negative offset, naming the bad argument."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")


# ---------------------------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------------------------


class BuildEventLog(ABC):
    """The Build Event Log: append events, read them back, and ask the projections.

    Every read returns events as dicts in `canonical_event` form, in the canonical order
    (timestamp, event_id); "latest" and "first" mean last and first in that order. Open one
    with `databuild_assets.log.open_event_log(uri)`.
    """

    # -- writes ---------------------------------------------------------------------------------

    def append_event(self, event: Mapping[str, Any]) -> AppendResult:
        """Append one event; the same as `append_events([event])`.

        log.append_event({"event_id": "e1", "timestamp": 1, "build_request_id": "br1", ...})
        """
        return self.append_events([event])

    @abstractmethod
    def append_events(self, events: Iterable[Mapping[str, Any]]) -> AppendResult:
        """Validate every event, then append them all atomically.

        Raises `InvalidEventError` naming the first bad one (`events[3]: ...`) and writes
        nothing. An event whose event_id is already in the log is skipped and counted as a
        duplicate, which makes retrying a failed append safe.

            result = log.append_events(events)  # AppendResult(accepted=10, duplicates=0)
        """

    # -- events ---------------------------------------------------------------------------------

    @abstractmethod
    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        """Every event whose build_request_id is `build_request_id` (strictly after `since_ns`
        when given): the full history of one build request, e.g. for its detail page.

        Delegation events of other requests that name it as `delegated_to_build_request_id`
        are not included: they belong to the request that delegated.
        """

    @abstractmethod
    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        """Every event that concerns `partition_ref` (strictly after `since_ns` when given): the
        partition, delegation and partition_invalidation events with that partition_ref, the
        build_request_events whose requested_partitions contain it and the job_events whose
        target_partitions contain it. Answers "who asked for, built, delegated or invalidated
        this partition, and when".
        """

    @abstractmethod
    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        """Every event that carries `job_run_id`: its job_events and task_cancel_events, and the
        partition_events its job reported. The full story of one job run."""

    @abstractmethod
    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        """Every event with start_ns <= timestamp < end_ns: what happened in a time window.
        Raises ValueError if end_ns < start_ns."""

    @abstractmethod
    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        """Up to `limit` events matching `filter`, after the cursor `since` (from the start when
        None): page through, or tail, the log.

        The cursor is a position in the canonical order, not in arrival order: an event that
        arrives late with a timestamp before the cursor is not returned by later pages. Raises
        ValueError for a cursor this log did not issue.

            page = log.list_events(filter=EventFilter(event_types=["job_event"]), limit=100)
            page = log.list_events(since=page.next_cursor, limit=100)
        """

    # -- projections ----------------------------------------------------------------------------

    @abstractmethod
    def get_latest_partition_status(self, partition_ref: str) -> PartitionStatusInfo | None:
        """The latest partition_event of `partition_ref` (None when it has none), flagged
        `invalidated` when a partition_invalidation_event came later: "is this partition built?"
        """

    @abstractmethod
    def get_active_builds_for_partition(self, partition_ref: str) -> list[str]:
        """Sorted ids of the build requests building `partition_ref` now: their own latest
        partition_event for it is REQUESTED, SCHEDULED or BUILDING, their latest
        build_request_event (if any) is not COMPLETED, FAILED or CANCELLED, and they have no
        build_cancel_event. A new request can delegate to one of these instead of rebuilding.
        """

    @abstractmethod
    def get_build_request_for_available_partition(self, partition_ref: str) -> str | None:
        """The build request whose partition_event made `partition_ref` available, if it is
        available now (latest status PARTITION_AVAILABLE and not invalidated), else None."""

    @abstractmethod
    def list_build_requests(
        self, limit: int = 100, offset: int = 0, status: BuildRequestStatus | int | None = None
    ) -> list[BuildRequestSummary]:
        """A page of the build_requests projection, newest first (received_at descending, then
        build_request_id ascending), optionally only those whose status is `status`."""

    @abstractmethod
    def list_recent_partitions(self, limit: int = 100, offset: int = 0) -> list[PartitionSummary]:
        """A page of the partition_state projection, most recently updated first (updated_at
        descending, then partition_ref ascending)."""

    @abstractmethod
    def get_activity_summary(self) -> ActivitySummary:
        """Counts of events, build requests, partitions and job runs by status."""

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:  # noqa: B027 (optional: a backend holding nothing has nothing to release)
        """Release the backend's resources; the log is unusable afterwards."""

    def __enter__(self) -> BuildEventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = [
    "ActivitySummary",
    "AppendResult",
    "BuildEventLog",
    "BuildRequestSummary",
    "EventFilter",
    "EventPage",
    "PartitionStatusInfo",
    "PartitionSummary",
    "canonical_event",
    "check_page",
    "decode_cursor",
    "encode_cursor",
    "status_counts",
]
