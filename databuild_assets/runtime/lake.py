"""Where the lakehouse keeps things: the one place table paths and table properties are defined.

The root is a local folder by default and any Hadoop filesystem URI otherwise
(`s3a://bucket/databuild`, `abfss://...`), so the same code runs on a laptop and a cluster.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from databuild_assets.events.schema import SCHEMA_VERSION, event_schema
from databuild_assets.runtime.file_modes import folder_mode, restrict_umask

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LAKE_ROOT = str(REPO_ROOT / ".lake")


class LakeRootError(RuntimeError):
    """The lake root cannot be used (its parent is missing, it is not a folder, not writable);
    nothing was created."""


SCHEMA_VERSION_PROPERTY = "databuild.schemaVersion"

# Properties every table of ours carries, chosen so an erased value leaves no copy behind
# (EVENTS.md, Tombstones; docs/operations.md, Erasure, compaction and vacuum;
# maintenance/erasure_report.py):
# - no change data feed: change files would keep copies of rows a tombstone later erases;
# - no deletion vectors, on any table: a delete or an update rewrites the files, so the rows leave
#   the live Parquet at once, and readers without them (delta-rs, Polars, dagster-deltalake) can
#   read every table (docs/decisions/0015-every-table-readable-by-delta-rs.md);
# - statistics only on columns that cannot hold an erasable value (min/max of string columns
#   would copy event ids and partition refs into the Delta log and its checkpoints);
# - the Delta log's own history kept 7 days (default 30), the same as vacuum's retention.
COMMON_TABLE_PROPERTIES: dict[str, str] = {
    SCHEMA_VERSION_PROPERTY: str(SCHEMA_VERSION),
    "delta.enableChangeDataFeed": "false",
    "delta.enableDeletionVectors": "false",
    "delta.logRetentionDuration": "interval 7 days",
}


@dataclass(frozen=True)
class TableSpec:
    """A table of the lake. Its Spark schema is given as a function, called (cached) on first
    use of `schema`: the query path names tables without importing pyspark."""

    name: str
    schema_of: Callable[[], StructType] = field(compare=False, repr=False)
    partition_by: tuple[str, ...] = ()
    description: str = ""
    # Columns Delta keeps min/max statistics on (data skipping); only ones no tombstone can name.
    stats_columns: tuple[str, ...] = ()
    # Delta refuses deletes and updates (delta.appendOnly): for audit records.
    append_only: bool = False

    @property
    def schema(self) -> StructType:
        return self.schema_of()


@functools.cache
def _fields(*fields: tuple[str, str, bool]) -> StructType:
    """A schema of (name, Spark type name, nullable) fields."""
    from pyspark.sql import types

    kinds = {"string": types.StringType, "long": types.LongType, "date": types.DateType}
    kinds |= {"timestamp": types.TimestampType, "binary": types.BinaryType}
    return types.StructType([types.StructField(name, kinds[kind](), nullable) for name, kind, nullable in fields])


def _lazy(*fields: tuple[str, str, bool]) -> Callable[[], StructType]:
    """The schema of `fields` (`_fields`), made on first call (a partial: a spec stays picklable)."""
    return functools.partial(_fields, *fields)


# The raw log's columns after the event's own (events/schema.py): (name, type, nullable).
RAW_LOG_SOURCE_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("event_date", "date", False),  # UTC date of `timestamp`: the partition
    ("source_file", "string", True),  # landing file, or "writer:<name>" for the writer API
    ("source_line", "long", True),
    ("ingested_at", "timestamp", False),
)


@functools.cache
def _raw_event_log_schema() -> StructType:
    source = _fields(*RAW_LOG_SOURCE_FIELDS)
    return type(source)(list(event_schema().fields) + list(source.fields))


RAW_EVENT_LOG = TableSpec(
    "raw_event_log",
    _raw_event_log_schema,
    ("event_date",),
    "Every accepted event, exactly once, partitioned by its UTC date.",
    ("timestamp", "event_type", "ingested_at"),
)
EVENT_QUARANTINE = TableSpec(
    "event_quarantine",
    _lazy(
        ("source_file", "string", False),
        ("line_number", "long", False),
        ("reason", "string", False),
        ("line", "string", True),  # the line as text (invalid UTF-8 replaced), for people
        ("raw_line", "binary", False),  # the line's exact bytes: nothing is lost
        ("ingest_batch", "long", False),
        ("quarantined_at", "timestamp", False),
    ),
    (),
    "Every bad landing line, kept whole, with its file, line number and reason.",
)
INGEST_LEDGER = TableSpec(
    "ingest_ledger",
    _lazy(
        ("batch_id", "long", False),
        ("stage", "string", False),  # "planned": one row per file; "committed": one row per batch
        ("file_path", "string", True),
        ("file_size", "long", True),
        ("lines_read", "long", True),
        ("accepted", "long", True),
        ("duplicates", "long", True),
        ("quarantined", "long", True),
        ("log_version", "long", True),
        ("recorded_at", "timestamp", False),
    ),
    (),
    "Which landing files each ingestion batch read (planned), and what it wrote (committed).",
)


_FIX_ROOT = "fix DATABUILD_LAKE_ROOT (the lakehouse resource's lake_root)"


def is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def plain_path(uri: str) -> str:
    """A local path given as a URI ("file:///data/lake", "file:/data/lake") as the plain path."""
    return "/" + uri.removeprefix("file:").lstrip("/") if uri.startswith("file:") else uri


@dataclass(frozen=True)
class Lake:
    """The lake root and the paths under it."""

    root: str = DEFAULT_LAKE_ROOT

    def __post_init__(self) -> None:
        # A local root given as a URI ("file:///data/lake", "file:/data/lake") is kept as the
        # plain path: Spark writes "file:/..." and Delta refuses a CREATE TABLE whose location
        # is spelled two ways.
        object.__setattr__(self, "root", plain_path(self.root))
        # A root on S3 is spelled s3a:// whichever scheme it was given with: the ingest ledger
        # keys landing objects by their full path, so one object must have one spelling.
        if self.root.lower().startswith("s3://"):
            object.__setattr__(self, "root", "s3a://" + self.root[len("s3://") :])

    @classmethod
    def from_env(cls) -> Lake:
        """The root from DATABUILD_LAKE_ROOT, else the repo's git-ignored `.lake/`."""
        return cls(os.environ.get("DATABUILD_LAKE_ROOT", DEFAULT_LAKE_ROOT))

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def table_path(self, table: TableSpec) -> str:
        return self.path("tables", table.name)

    @property
    def landing(self) -> str:
        """Where writers drop JSON Lines files (write to a hidden name, then rename)."""
        return self.path("landing")

    @property
    def landing_archive(self) -> str:
        """Where landing retention moves ingested landing files, and erasure writes the landing
        files it rewrites (maintenance/landing_files.py). Ingestion never reads it."""
        return self.path("landing_archive")

    def check_root(self) -> Lake:
        """This lake, its local root checked for a reader: LakeRootError when the root is a file,
        or is missing together with its parent folder (a typo or an unmounted volume). Creates
        nothing and needs no write access. Remote roots are not checked.

            lake = Lake("/data/lake").check_root()
        """
        if not is_local(self.root):
            return self
        root = Path(self.root)
        if root.exists() and not root.is_dir():
            raise LakeRootError(f"lake root {root} is a file, not a folder; {_FIX_ROOT}, or move that file away")
        if not root.exists() and self.root != DEFAULT_LAKE_ROOT and not root.parent.is_dir():
            raise LakeRootError(
                f"lake root {root} does not exist, nor does its parent folder {root.parent}: a typo or a volume "
                f"not mounted? Nothing was created. Create it (mkdir -p {root}) if it is meant to be new, "
                f"or {_FIX_ROOT}."
            )
        return self

    def ensure_root(self) -> Lake:
        """This lake, its local root checked (and created when only its last folder is missing,
        mode 0700, or 0750 with DATABUILD_LAKE_GROUP_READ=1), this process's umask narrowed for
        writing it (runtime/file_modes.py).

        A root whose parent folder is missing is refused rather than created with every parent:
        that is a typo or an unmounted volume, and a fresh empty lake there would make every run
        silently ingest into, and answer from, the wrong place. The default root (the repo's
        `.lake/`) is created. Remote roots (s3a://, abfss://...) are not checked here: object
        stores have no folders to create, and Spark reports a bad bucket on first use.

            lake = Lake("/data/lake").ensure_root()
        """
        # This process writes a lake from here on: what it creates is its owner's (and, with
        # DATABUILD_LAKE_GROUP_READ=1, its group's) alone, whatever umask it was started with.
        restrict_umask()
        if not is_local(self.root):
            return self
        self.check_root()
        root = Path(self.root)
        if not root.exists():
            try:
                if self.root == DEFAULT_LAKE_ROOT:
                    root.parent.mkdir(parents=True, exist_ok=True)
                root.mkdir(mode=folder_mode(), exist_ok=True)
            except OSError as error:
                raise LakeRootError(
                    f"lake root {root} cannot be created ({error.strerror}); {_FIX_ROOT}, or create it "
                    "with write access for this user"
                ) from error
        elif not os.access(root, os.W_OK | os.X_OK):
            raise LakeRootError(
                f"lake root {root} is not writable by this user (uid {os.geteuid()}); nothing was written. "
                f"Give this user write access to it (chown/chmod), or {_FIX_ROOT}."
            )
        return self


FILTERED_EVENT_LOG = TableSpec(
    "filtered_event_log",
    _raw_event_log_schema,
    ("event_date",),
    "The raw event log minus every event a tombstone matches: what projections and readers see.",
    RAW_EVENT_LOG.stats_columns,
)
TOMBSTONES = TableSpec(
    "tombstones",
    _lazy(
        ("tombstone_id", "string", False),
        ("record", "string", False),  # "requested" when asked, "applied" when compaction purged it
        ("key", "string", False),  # event_id, build_request_id, job_run_id or partition_ref
        ("value", "string", False),
        ("actor", "string", False),
        ("reason", "string", False),
        ("requested_at", "timestamp", False),
        ("applied_at", "timestamp", True),
        ("applied_log_version", "long", True),  # raw_event_log version of the purge
    ),
    (),
    append_only=True,
    description="Erasure requests (append-only, audited): one 'requested' record each, and an 'applied' "
    "record once compaction has purged the matching rows.",
)
