"""Which values an erasure request may name: those that match only the field the request names.

Events match a tombstone's value exactly (events.erasure_rule), but text has no fields: a bad
landing line and a quarantined line are matched by the value's text anywhere in them, and
Dagster's storage by whole tokens. A value that is short, that is a value of another field, or
that occurs inside other stored values would take unrelated records with it there (`e` inside
`ingest_job`). erase_job, which anyone who reaches the UI can launch, checks each value here
before anything is written, and refuses with one line naming the value, its key and why.

`allow_ambiguous: true` in the request overrides the refusal; what it overrode is recorded in the
tombstone's reason (`tombstones.ALLOW_AMBIGUOUS`), and text is then matched by whole tokens only
for that tombstone, never inside a longer word.

    problems = ambiguous_values(spark, lake, "partition_ref", ["zoe-42"])  # shorter than 8 characters
    if problems and not allow_ambiguous:
        raise AmbiguousValueError(refusal(problems))
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.events.schema import CORE_FIELDS, EVENT_TYPES, PAYLOADS
from databuild_assets.maintenance.dagster_home import ERASED
from databuild_assets.maintenance.tombstones import TombstoneError
from databuild_assets.projections import PROJECTIONS
from databuild_assets.runtime.lake import (
    EVENT_QUARANTINE,
    FILTERED_EVENT_LOG,
    INGEST_LEDGER,
    RAW_EVENT_LOG,
    TOMBSTONES,
    Lake,
)

# Every id this project generates is a UUID (36 characters: event_id, build_request_id and
# job_run_id, EVENTS.md and workload/encoding.py), and every partition_ref of the workload's
# catalogue is a dataset path with a date (over 20). Eight is a UUID's first group: a shorter
# value is a word, a number or a fragment that occurs by chance inside unrelated text.
MIN_LENGTH = 8
# What allow_ambiguous cannot go below. Measured on a test DAGSTER_HOME: `e` occurs as a whole
# token in SQLite's own page structure (cell pointers 0x0965 read as tab, `e`, tab) and in the
# bytes freed space keeps, where no scan can tell a copy from chance; bytes of that kind make up
# most of a binary file. Four printable characters never fit between a 4 KB page's cell pointer
# bytes (each other byte is below 0x10), and four given bytes occur by chance about once in 4 GB
# of random bytes (256**-4), once in hundreds of GB as a whole token.
MIN_OVERRIDE_LENGTH = 4

# Names of the event model and the lake: values of other fields (event_type, status_name, the
# dependency types of a job config), field names, and the tables' names.
VOCABULARY: dict[str, str] = {
    **{name: "an event_type" for name in EVENT_TYPES},
    **{
        status.name: f"a {enum.__name__} name"
        for enum in (BuildRequestStatus, PartitionStatus, JobStatus)
        for status in enum
    },
    **{name: "a dependency type of a job config" for name in ("QUERY", "MATERIALIZE")},
    **{field.name: "an event field's name" for fields in (CORE_FIELDS, *PAYLOADS.values()) for field in fields},
    **{
        table.name: "a table of the lake"
        for table in (RAW_EVENT_LOG, EVENT_QUARANTINE, INGEST_LEDGER, FILTERED_EVENT_LOG, TOMBSTONES)
    },
    **{name: "a table of the lake" for name in PROJECTIONS},
    ERASED: "the marker erased values are rewritten to",
}

# The projections' columns that hold stored values, with the tombstone key their values are
# (None: a value no key names). A projection has a row per partition, job run or build request,
# not per event: reading these columns costs their rows, a small part of the log's.
STORED_VALUES: dict[str, tuple[tuple[str, str | None], ...]] = {
    "partition_state": (
        ("partition_ref", "partition_ref"),
        ("last_event_id", "event_id"),
        ("last_build_request_id", "build_request_id"),
        ("last_job_run_id", "job_run_id"),
    ),
    "job_runs": (("job_run_id", "job_run_id"), ("build_request_id", "build_request_id"), ("job_label", None)),
    "build_requests": (("build_request_id", "build_request_id"),),
}


class AmbiguousValueError(TombstoneError):
    """An erasure request naming a value that would match more than the field it names."""


@dataclass(frozen=True)
class Problem:
    key: str
    value: str
    why: str  # without the value: what the tombstone's reason records when overridden


def ambiguous_values(
    spark: SparkSession, lake: Lake, key: str, values: Iterable[str], other_names: dict[str, str] | None = None
) -> list[Problem]:
    """Why each of `values` (of `key`) would match more than that field, if it would: shorter than
    MIN_LENGTH, a name of VOCABULARY or of `other_names` (e.g. the deployment's Dagster jobs and
    assets), a stored value of another field, or inside other stored values (`_stored_overlaps`).
    Empty: every value names only its field. A value shorter than MIN_OVERRIDE_LENGTH, which no
    override can take, raises AmbiguousValueError (`refuse_too_short`)."""
    values = list(dict.fromkeys(values))
    refuse_too_short(key, values)
    names = {**VOCABULARY, **(other_names or {})}
    problems = []
    for value in values:
        if len(value) < MIN_LENGTH:
            problems.append(Problem(key, value, f"is shorter than {MIN_LENGTH} characters"))
        if value in names:
            problems.append(Problem(key, value, f"is {names[value]}"))
        inside = sorted(name for name in names if value in name and value != name)
        if inside:
            problems.append(Problem(key, value, f"occurs inside {len(inside)} names ({', '.join(inside[:3])})"))
    return problems + _stored_overlaps(spark, lake, key, values)


def refuse_too_short(key: str, values: Iterable[str]) -> None:
    """Raise AmbiguousValueError, one line, for values shorter than MIN_OVERRIDE_LENGTH: whether
    their copies are gone from Dagster's storage cannot be proven, so allow_ambiguous cannot
    take them either."""
    short = [value for value in values if len(value) < MIN_OVERRIDE_LENGTH]
    if short:
        named = ", ".join(f"{key} {value!r}" for value in short)
        raise AmbiguousValueError(
            f"erasure request refused, nothing written: {named} is shorter than {MIN_OVERRIDE_LENGTH} characters, "
            "which allow_ambiguous cannot override: no scan can tell its copies in Dagster's binary files (SQLite "
            "page structure, freed space, compressed snapshots) from chance bytes, so its erasure could not be "
            "proven. Name the whole value (the partition_ref or id) instead"
        )


def refusal(problems: list[Problem]) -> str:
    by_value: dict[tuple[str, str], list[str]] = {}
    for problem in problems:
        by_value.setdefault((problem.key, problem.value), []).append(problem.why)
    named = "; ".join(f"{key} {value!r} {' and '.join(whys)}" for (key, value), whys in by_value.items())
    return (
        f"erasure request refused, nothing written: {named}, so erasing it would rewrite unrelated records. "
        "Check the value; if it is right, set allow_ambiguous: true in the request (recorded in the tombstone's "
        "reason) and text will be matched by whole tokens only"
    )


def overridden(problems: list[Problem]) -> str:
    """What allow_ambiguous overrode, for the tombstone's reason: the reasons, not the values."""
    return "; ".join(dict.fromkeys(problem.why for problem in problems))


def _stored_overlaps(spark: SparkSession, lake: Lake, key: str, values: list[str]) -> list[Problem]:
    """A value equal to a stored value of another field, or inside a different stored value of
    any field, in the projections' columns of STORED_VALUES (projections not built yet are
    skipped). One scan of those columns, each row compared with every value (a broadcast nested
    loop: rows x values substring tests); the log itself is not read. What it cannot see: values
    only in free text (messages, configs, quarantined lines, Dagster's storage)."""
    held = _held_values(spark, lake)
    if held is None or not values:
        return []
    wanted = F.broadcast(spark.createDataFrame([(value,) for value in values], "value string"))
    pairs = held.join(wanted, F.instr(F.col("held"), F.col("value")) > 0)
    exact = F.col("held") == F.col("value")
    # The field the request names holding the value itself: what the tombstone is for.
    others = pairs.where(~(exact & (F.col("field") == F.lit(key))))
    rows = (
        others.groupBy("value", "field", exact.alias("exact"))
        .agg(F.count(F.lit(1)).alias("count"))
        .orderBy("value", "field", "exact")
        .collect()
    )
    problems = []
    for row in rows:
        if row.exact:
            problems.append(Problem(key, row.value, f"is a stored {row.field}"))
        else:
            # No example: another stored value (another person's partition) stays out of the
            # message and out of the tombstone's reason, which is never erased.
            problems.append(Problem(key, row.value, f"occurs inside {row['count']} stored {row.field} values"))
    return problems


def _held_values(spark: SparkSession, lake: Lake) -> DataFrame | None:
    """(field, held) for every value of STORED_VALUES' columns in the projections that exist."""
    parts = []
    for table, columns in STORED_VALUES.items():
        path = lake.path("tables", table)
        if not DeltaTable.isDeltaTable(spark, path):
            continue
        frame = spark.read.format("delta").load(path)
        for column, field in columns:
            parts.append(frame.select(F.lit(field or column).alias("field"), F.col(column).alias("held")))
    if not parts:
        return None
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union.where(F.col("held").isNotNull())
