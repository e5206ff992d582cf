"""The reads of `DeltaRsEventLog` (backend.py): each is the serving index's answer once it has
caught up with the lake, asked again of the lake's current index when a segment the index in
hand names is gone. A process's copy of the index (private, on a lake it cannot write, or a
generation another process has since replaced) can name a segment the lake's refresh rewrote
and removed (decision 0051); the lake's current index names the one that holds those events now.

    class DeltaRsEventLog(IndexAnswers, BuildEventLog): ...
    log.get_build_request_events("br-1")   # -> self._answer(lambda index: index.get_...("br-1"))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from databuild_assets.events.enums import BuildRequestStatus
from databuild_assets.log.interface import (
    ActivitySummary,
    BuildRequestSummary,
    EventFilter,
    EventPage,
    PartitionStatusInfo,
    PartitionSummary,
)
from databuild_assets.log.serving.index import ServingIndex

_T = TypeVar("_T")


class IndexAnswers:
    """The query methods of `BuildEventLog`, answered by `_catch_up()`'s index; the class it is
    mixed into provides `_catch_up` and `_reopen`."""

    def _catch_up(self, fresh: bool = False) -> ServingIndex:
        raise NotImplementedError

    def _reopen(self) -> None:
        raise NotImplementedError

    def _answer(self, read: Callable[[ServingIndex], _T]) -> _T:
        """`read` of the caught-up index; once more, of the lake's current index, when a segment
        that the catch-up (a thaw) or the read needed is gone."""
        try:
            return read(self._catch_up())
        except FileNotFoundError:
            self._reopen()
            return read(self._catch_up(fresh=True))

    def get_build_request_events(self, build_request_id: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._answer(lambda index: index.get_build_request_events(build_request_id, since_ns))

    def get_partition_events(self, partition_ref: str, since_ns: int | None = None) -> list[dict[str, Any]]:
        return self._answer(lambda index: index.get_partition_events(partition_ref, since_ns))

    def get_job_run_events(self, job_run_id: str) -> list[dict[str, Any]]:
        return self._answer(lambda index: index.get_job_run_events(job_run_id))

    def get_events_in_range(self, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
        return self._answer(lambda index: index.get_events_in_range(start_ns, end_ns))

    def list_events(self, since: str | None = None, filter: EventFilter | None = None, limit: int = 1000) -> EventPage:
        return self._answer(lambda index: index.list_events(since, filter, limit))

    def get_latest_partition_status(self, partition_ref: str) -> PartitionStatusInfo | None:
        return self._answer(lambda index: index.get_latest_partition_status(partition_ref))

    def get_active_builds_for_partition(self, partition_ref: str) -> list[str]:
        return self._answer(lambda index: index.get_active_builds_for_partition(partition_ref))

    def get_build_request_for_available_partition(self, partition_ref: str) -> str | None:
        return self._answer(lambda index: index.get_build_request_for_available_partition(partition_ref))

    def list_build_requests(
        self, limit: int = 100, offset: int = 0, status: BuildRequestStatus | int | None = None
    ) -> list[BuildRequestSummary]:
        return self._answer(lambda index: index.list_build_requests(limit, offset, status))

    def list_recent_partitions(self, limit: int = 100, offset: int = 0) -> list[PartitionSummary]:
        return self._answer(lambda index: index.list_recent_partitions(limit, offset))

    def get_activity_summary(self) -> ActivitySummary:
        return self._answer(lambda index: index.get_activity_summary())


__all__ = ["IndexAnswers"]
