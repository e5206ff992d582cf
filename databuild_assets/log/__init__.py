"""The Build Event Log's query interface (EVENTS.md) and its backends, opened by URI.

    log = open_event_log("sqlite:///var/lib/databuild/bel.db")     # the SQLite reference
    log = open_event_log("delta:///data/lake")                     # a local lake, no JVM (delta-rs)
    log = open_event_log("delta:///data/lake", spark=spark)        # a lake through Spark
    log = open_event_log("delta+s3://bucket/databuild")            # a lake on S3, no JVM (delta-rs)
    log = open_event_log("delta+s3a://bucket/databuild", spark=spark)   # any Hadoop filesystem, through Spark

The backend modules are imported on first use: opening a SQLite log imports neither delta-rs
nor Spark's backend.
"""

from __future__ import annotations

from typing import Any

from databuild_assets.log.interface import (
    ActivitySummary,
    AppendResult,
    BuildEventLog,
    BuildRequestSummary,
    EventFilter,
    EventPage,
    PartitionStatusInfo,
    PartitionSummary,
)
from databuild_assets.log.sqlite.backend import SqliteEventLog, load_events
from databuild_assets.log.uris import ACCEPTED_URIS, EventLogNotFoundError, parse_event_log_uri
from databuild_assets.runtime.lake import is_local
from databuild_assets.runtime.object_store import is_s3


def open_event_log(uri: str, **options: Any) -> BuildEventLog:
    """Open the Build Event Log at `uri`, choosing the backend by its scheme.

    A `delta` URI opens the JVM-free backend (`DeltaRsEventLog`, a local lake or one on S3, answered
    from its serving index under `<root>/serving_index/`, for S3 in this machine's cache) unless
    `spark=` (a SparkSession with Delta configured) is given, which opens the Spark backend
    (`DeltaEventLog`, any Hadoop filesystem). Both take `writer=`, the name appends are recorded under;
    the JVM-free backend takes `max_staleness=` too (seconds a read may lag other processes'
    commits: 0 on a local lake and 1 on S3 unless given; `DeltaRsEventLog`).
    Raises ValueError for a URI no backend accepts, naming the accepted forms, and LakeRootError
    for a local lake root that is a file or is missing with its parent folder (nothing is created).

        with open_event_log("sqlite:///var/lib/databuild/bel.db") as log:
            log.list_build_requests(limit=20)
    """
    parsed = parse_event_log_uri(uri)
    if parsed.scheme == "sqlite":
        if options:
            raise TypeError(f"{uri}: the SQLite backend takes no options, got {', '.join(sorted(options))}")
        return SqliteEventLog(parsed.location)
    if is_local(parsed.location):
        parsed.lake.check_root()  # a mistyped root must not become a fresh, empty lake
    spark = options.pop("spark", None)
    writer = options.pop("writer", "event-log")
    if spark is not None:
        if options:
            raise TypeError(f"{uri}: the Delta backend takes spark= and writer=, got {', '.join(sorted(options))}")
        from databuild_assets.log.spark.backend import DeltaEventLog

        return DeltaEventLog(spark, parsed.lake, writer=writer)
    max_staleness = options.pop("max_staleness", None)
    if options:
        raise TypeError(
            f"{uri}: the JVM-free Delta backend takes writer= and max_staleness= (spark= chooses the Spark backend), "
            f"got {', '.join(sorted(options))}"
        )
    if not (is_local(parsed.location) or is_s3(parsed.location)):
        raise ValueError(
            f"{uri!r}: the JVM-free Delta backend follows lakes on this machine's disks and on S3 only; for a "
            f"lake on another store pass a SparkSession with Delta configured: open_event_log({uri!r}, spark=spark)"
        )
    from databuild_assets.log.serving.backend import DeltaRsEventLog

    return DeltaRsEventLog(parsed.lake, writer=writer, max_staleness=max_staleness)


__all__ = [
    "ACCEPTED_URIS",
    "ActivitySummary",
    "AppendResult",
    "BuildEventLog",
    "BuildRequestSummary",
    "EventFilter",
    "EventLogNotFoundError",
    "EventPage",
    "PartitionStatusInfo",
    "PartitionSummary",
    "SqliteEventLog",
    "load_events",
    "open_event_log",
    "parse_event_log_uri",
]
