"""DataBuild's status enums: the one place their codes and names are defined.

The code is authoritative (EVENTS.md); a name that disagrees with its code makes an event bad.
"""

from __future__ import annotations

from enum import IntEnum


class BuildRequestStatus(IntEnum):
    BUILD_REQUEST_UNKNOWN = 0
    BUILD_REQUEST_RECEIVED = 1
    BUILD_REQUEST_PLANNING = 2
    BUILD_REQUEST_EXECUTING = 3
    BUILD_REQUEST_COMPLETED = 4
    BUILD_REQUEST_FAILED = 5
    BUILD_REQUEST_CANCELLED = 6
    BUILD_REQUEST_ANALYSIS_COMPLETED = 7


class PartitionStatus(IntEnum):
    PARTITION_UNKNOWN = 0
    PARTITION_REQUESTED = 1
    PARTITION_SCHEDULED = 2
    PARTITION_BUILDING = 3
    PARTITION_AVAILABLE = 4
    PARTITION_FAILED = 5
    PARTITION_DELEGATED = 6


class JobStatus(IntEnum):
    JOB_UNKNOWN = 0
    JOB_SCHEDULED = 1
    JOB_RUNNING = 2
    JOB_COMPLETED = 3
    JOB_FAILED = 4
    JOB_CANCELLED = 5
    JOB_SKIPPED = 6


TERMINAL_JOB_STATUSES = frozenset(
    {JobStatus.JOB_COMPLETED, JobStatus.JOB_FAILED, JobStatus.JOB_CANCELLED, JobStatus.JOB_SKIPPED}
)
TERMINAL_BUILD_REQUEST_STATUSES = frozenset(
    {
        BuildRequestStatus.BUILD_REQUEST_COMPLETED,
        BuildRequestStatus.BUILD_REQUEST_FAILED,
        BuildRequestStatus.BUILD_REQUEST_CANCELLED,
    }
)
# A partition is "being built" by a request while its latest event for that request is one of these.
ACTIVE_PARTITION_STATUSES = frozenset(
    {PartitionStatus.PARTITION_REQUESTED, PartitionStatus.PARTITION_SCHEDULED, PartitionStatus.PARTITION_BUILDING}
)


def enum_range(enum: type[IntEnum]) -> str:
    """`"0..6"`: the valid codes of `enum`, for error messages."""
    codes = [member.value for member in enum]
    return f"{min(codes)}..{max(codes)}"
