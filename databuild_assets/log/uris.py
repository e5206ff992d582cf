"""Event log URIs, parsed in one place: which backend a URI names and where its log lives.

sqlite:///var/lib/databuild/bel.db     the SQLite file (sqlite:///:memory: for a private one)
delta:///data/lake                     a lake root on this machine (or .../lake/tables/raw_event_log)
delta+s3://bucket/lake                 a lake root on S3 (delta+s3a:// the same; JVM-free or Spark)
delta+abfss://container@account/lake   a lake root on another Hadoop filesystem (Spark only)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake, is_local
from databuild_assets.runtime.object_store import is_s3

ACCEPTED_URIS = (
    "sqlite:///absolute/path/to/bel.db",
    "sqlite:///:memory:",
    "delta:///absolute/path/to/lake (or .../lake/tables/raw_event_log)",
    "delta+s3a://bucket/path/to/lake (any Hadoop filesystem: delta+abfss://..., delta+gs://...)",
)

_LOG_SUFFIX = f"/tables/{RAW_EVENT_LOG.name}"


class EventLogNotFoundError(ValueError):
    """The URI names no event log there is: a reader would answer from an empty log instead."""


@dataclass(frozen=True)
class EventLogUri:
    """A parsed event log URI: `scheme` ("sqlite" or "delta") and `location` (the SQLite path,
    ":memory:", or the lake root: a local path or a Hadoop filesystem URI)."""

    uri: str
    scheme: str
    location: str

    @property
    def lake(self) -> Lake:
        return Lake(self.location)

    def require_log(self) -> EventLogUri:
        """This URI, once its log is known to exist on this machine: EventLogNotFoundError (or
        LakeRootError for a lake root that is a file, or missing with its parent) otherwise.
        For readers, which must not take a mistyped path for an empty log; a writer may create
        the log instead. Creates nothing; a lake on S3 is checked by one listing, any other remote
        lake is not checked here.

            parse_event_log_uri("delta:///data/lake").require_log()
        """
        if self.scheme == "sqlite":
            if self.location != ":memory:" and not os.path.isfile(self.location):
                raise EventLogNotFoundError(
                    f"no SQLite event log at {self.location} (in {self.uri!r}): no such file; check the path "
                    "(a SQLite log is created by its first writer)"
                )
        elif is_local(self.location):
            log_path = self.lake.check_root().table_path(RAW_EVENT_LOG)
            if not os.path.isdir(os.path.join(log_path, "_delta_log")):
                raise EventLogNotFoundError(
                    f"no event log in the lake {self.location} (in {self.uri!r}): {log_path} is not a Delta table; "
                    "check the path (a lake root holds tables/raw_event_log; its first ingestion or append creates it)"
                )
        elif is_s3(self.location):
            from databuild_assets.log.serving.follower import follower_for

            log_path = self.lake.table_path(RAW_EVENT_LOG)
            if not follower_for(log_path).exists():
                raise EventLogNotFoundError(
                    f"no event log in the lake {self.location} (in {self.uri!r}): {log_path} is not a Delta table; "
                    "check the bucket and prefix (a lake root holds tables/raw_event_log)"
                )
        return self


def parse_event_log_uri(uri: str) -> EventLogUri:
    """The backend and location `uri` names; ValueError naming the accepted forms otherwise.

    parse_event_log_uri("delta:///data/lake/tables/raw_event_log").location  # "/data/lake"
    """
    scheme, separator, rest = uri.partition("://") if isinstance(uri, str) else ("", "", "")
    backend = scheme.lower().partition("+")[0]
    if not separator or backend not in ("sqlite", "delta"):
        raise ValueError(f"cannot open event log {uri!r}: expected one of {', '.join(ACCEPTED_URIS)}")
    if backend == "sqlite":
        return EventLogUri(uri, "sqlite", _sqlite_path(uri, rest))
    return EventLogUri(uri, "delta", _lake_root(uri, scheme.lower(), rest))


def _sqlite_path(uri: str, rest: str) -> str:
    # "sqlite:///a/b.db": the rest is "/a/b.db", an absolute path, as in a file:// URI.
    if rest == "/:memory:":
        return ":memory:"
    if not rest.startswith("/") or rest == "/":
        raise ValueError(
            f"{uri!r} does not name an absolute file path; write sqlite:// followed by the absolute "
            "path, e.g. sqlite:///var/lib/databuild/bel.db (three slashes), or sqlite:///:memory:"
        )
    return rest


def _lake_root(uri: str, scheme: str, rest: str) -> str:
    """The lake root a `delta://` URI names: its root, or its raw log table `<root>/tables/raw_event_log`."""
    path = rest.rstrip("/")
    if scheme.startswith("delta+"):
        filesystem = scheme[len("delta+") :]
        if not filesystem or not path:
            raise ValueError(
                f"{uri!r} does not name a lake on a Hadoop filesystem; write delta+ followed by the root's "
                "URI, e.g. delta+s3a://bucket/databuild (the lake root s3a://bucket/databuild)"
            )
        path = f"{filesystem}://{path}"
    elif not rest.startswith("/") or not path:
        raise ValueError(
            f"{uri!r} does not name an absolute path; write delta:// followed by the absolute path of the lake "
            f"root or of its raw log table, e.g. delta:///data/lake or delta:///data/lake{_LOG_SUFFIX}"
        )
    if path.endswith(_LOG_SUFFIX):
        return path[: -len(_LOG_SUFFIX)] or "/"
    if os.path.isdir(os.path.join(path, "_delta_log")):
        raise ValueError(
            f"{uri!r} is a Delta table, not a lake root nor its raw log table ({_LOG_SUFFIX.lstrip('/')}); "
            "point the URI at the lake root or at that table"
        )
    return path


__all__ = ["ACCEPTED_URIS", "EventLogNotFoundError", "EventLogUri", "parse_event_log_uri"]
