"""Where the lakehouse keeps things: the one place table paths and table properties are defined.

The root is a local folder by default and any Hadoop filesystem URI otherwise
(`s3a://bucket/databuild`, `abfss://...`), so the same code runs on a laptop and a cluster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql.types import (
    BinaryType,
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from databuild_assets.events.schema import EVENT_SCHEMA, SCHEMA_VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LAKE_ROOT = str(REPO_ROOT / ".lake")

SCHEMA_VERSION_PROPERTY = "databuild.schemaVersion"

# Properties every table of ours carries. Change data feed stays off: change files would keep
# copies of rows that a tombstone later erases (EVENTS.md, Tombstones).
COMMON_TABLE_PROPERTIES: dict[str, str] = {
    SCHEMA_VERSION_PROPERTY: str(SCHEMA_VERSION),
    "delta.enableChangeDataFeed": "false",
}


@dataclass(frozen=True)
class TableSpec:
    name: str
    schema: StructType
    partition_by: tuple[str, ...] = ()
    description: str = ""


def _fields(*fields: tuple[str, object, bool]) -> list[StructField]:
    return [StructField(name, data_type, nullable) for name, data_type, nullable in fields]


RAW_EVENT_LOG = TableSpec(
    "raw_event_log",
    StructType(
        list(EVENT_SCHEMA.fields)
        + _fields(
            ("event_date", DateType(), False),  # UTC date of `timestamp`: the partition
            ("source_file", StringType(), True),  # landing file, or "writer:<name>" for the writer API
            ("source_line", LongType(), True),
            ("ingested_at", TimestampType(), False),
        )
    ),
    ("event_date",),
    "Every accepted event, exactly once, partitioned by its UTC date.",
)
EVENT_QUARANTINE = TableSpec(
    "event_quarantine",
    StructType(
        _fields(
            ("source_file", StringType(), False),
            ("line_number", LongType(), False),
            ("reason", StringType(), False),
            ("line", StringType(), True),  # the line as text (invalid UTF-8 replaced), for people
            ("raw_line", BinaryType(), False),  # the line's exact bytes: nothing is lost
            ("ingest_batch", LongType(), False),
            ("quarantined_at", TimestampType(), False),
        )
    ),
    (),
    "Every bad landing line, kept whole, with its file, line number and reason.",
)
INGEST_LEDGER = TableSpec(
    "ingest_ledger",
    StructType(
        _fields(
            ("batch_id", LongType(), False),
            ("stage", StringType(), False),  # "planned": one row per file; "committed": one row per batch
            ("file_path", StringType(), True),
            ("file_size", LongType(), True),
            ("lines_read", LongType(), True),
            ("accepted", LongType(), True),
            ("duplicates", LongType(), True),
            ("quarantined", LongType(), True),
            ("log_version", LongType(), True),
            ("recorded_at", TimestampType(), False),
        )
    ),
    (),
    "Which landing files each ingestion batch read (planned), and what it wrote (committed).",
)


def is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


@dataclass(frozen=True)
class Lake:
    """The lake root and the paths under it."""

    root: str = DEFAULT_LAKE_ROOT

    @classmethod
    def from_env(cls) -> "Lake":
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
