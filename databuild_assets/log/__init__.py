"""The Build Event Log's query interface (EVENTS.md) and its backends, opened by URI.

    log = open_event_log("sqlite:///var/lib/databuild/bel.db")

Backends register a factory per URI scheme in `BACKENDS`. The "delta" entry imports
`databuild_assets.log.delta_backend` (and so Spark) on first use only; that module registers its
own factory for the scheme when imported.

    log = open_event_log("delta:///data/lake", spark=spark)
    log = open_event_log("delta+s3a://bucket/databuild", spark=spark)   # a lake on object storage
"""

from __future__ import annotations

from collections.abc import Callable
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
from databuild_assets.log.sqlite_backend import SqliteEventLog, load_events

# A factory gets the whole URI, the part after "scheme://", and the caller's keyword options
# (e.g. spark=SparkSession for Delta), and returns an open log.
BackendFactory = Callable[..., BuildEventLog]

ACCEPTED_URIS = (
    "sqlite:///absolute/path/to/bel.db",
    "sqlite:///:memory:",
    "delta:///absolute/path/to/lake (or .../lake/tables/raw_event_log)",
    "delta+s3a://bucket/path/to/lake (any Hadoop filesystem: delta+abfss://..., delta+gs://...)",
)


def _open_sqlite(uri: str, location: str, **options: Any) -> BuildEventLog:
    if options:
        raise TypeError(f"{uri}: the SQLite backend takes no options, got {', '.join(sorted(options))}")
    # "sqlite:///a/b.db": the location is "/a/b.db", an absolute path, as in a file:// URI.
    if location == "/:memory:":
        return SqliteEventLog(":memory:")
    if not location.startswith("/") or location == "/":
        raise ValueError(
            f"{uri!r} does not name an absolute file path; write sqlite:// followed by the absolute "
            "path, e.g. sqlite:///var/lib/databuild/bel.db (three slashes), or sqlite:///:memory:"
        )
    return SqliteEventLog(location)


def _open_delta(uri: str, location: str, **options: Any) -> BuildEventLog:
    # Imported here: opening a SQLite log should not import Spark and Delta.
    from databuild_assets.log.delta_backend import open_delta_event_log

    return open_delta_event_log(uri, location, **options)


BACKENDS: dict[str, BackendFactory] = {
    "sqlite": _open_sqlite,
    "delta": _open_delta,
}


def register_backend(scheme: str, factory: BackendFactory) -> None:
    """Make `open_event_log` open `scheme://...` URIs with `factory(uri, location, **options)`;
    replaces any factory registered for that scheme before."""
    BACKENDS[scheme.lower()] = factory


def open_event_log(uri: str, **options: Any) -> BuildEventLog:
    """Open the Build Event Log at `uri`, choosing the backend by its scheme.

    `options` go to the backend's factory (the Delta backend takes `spark=`). Raises ValueError
    for a URI no backend accepts, naming the accepted forms.

        with open_event_log("sqlite:///var/lib/databuild/bel.db") as log:
            log.list_build_requests(limit=20)
    """
    scheme, separator, location = uri.partition("://") if isinstance(uri, str) else ("", "", "")
    # "delta+s3a://bucket/lake": the Delta backend on the lake root "s3a://bucket/lake".
    backend = scheme.lower().partition("+")[0]
    factory = BACKENDS.get(backend) if separator else None
    if factory is None:
        raise ValueError(
            f"cannot open event log {uri!r}: expected one of {', '.join(ACCEPTED_URIS)} "
            f"(registered schemes: {', '.join(sorted(BACKENDS))})"
        )
    return factory(uri, location, **options)


__all__ = [
    "ACCEPTED_URIS",
    "BACKENDS",
    "ActivitySummary",
    "AppendResult",
    "BackendFactory",
    "BuildEventLog",
    "BuildRequestSummary",
    "EventFilter",
    "EventPage",
    "PartitionStatusInfo",
    "PartitionSummary",
    "SqliteEventLog",
    "load_events",
    "open_event_log",
    "register_backend",
]
