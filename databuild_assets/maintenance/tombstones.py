"""Tombstones: erasure requests, and the one rule that says which events they match.

A tombstone names a key (event_id, build_request_id, job_run_id or partition_ref) and a value;
which events it matches is `events.erasure_rule`, applied here to Spark rows (`event_matches`).
Matching events are hidden from every read at once (the filtered log and the query API apply
the rule), and compaction later purges them physically.

The tombstones table is append-only (Delta's delta.appendOnly): a request appends a
"requested" record; compaction appends an "applied" record when it has purged the rows.

    request_erasure(spark, lake, key="partition_ref", value="data/users/id=42",
                    actor="alice@example.com", reason="GDPR art. 17 request #1234")
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.erasure_rule import (
    ARRAY_FIELDS,
    JSON_TEXT_FIELDS,
    SCALAR_FIELDS,
    TOMBSTONE_KEYS,
    token_pattern,
)
from databuild_assets.runtime.delta_tables import ensure_table
from databuild_assets.runtime.lake import TOMBSTONES, Lake

log = logging.getLogger(__name__)


# How a tombstone's reason records that its value was accepted with allow_ambiguous (the value
# would have been refused: maintenance/erasure_values.py): `<reason> [allow_ambiguous: <why>]`.
# The tombstones table has no column for it, and its reason is the audit record's free text.
ALLOW_AMBIGUOUS = "[allow_ambiguous"


class TombstoneError(ValueError):
    """An erasure request that cannot be recorded; nothing was written."""


@dataclass(frozen=True)
class Tombstone:
    tombstone_id: str
    key: str
    value: str
    actor: str
    reason: str
    requested_at: datetime
    applied_at: datetime | None = None
    applied_log_version: int | None = None

    @property
    def pending(self) -> bool:
        return self.applied_at is None

    @property
    def allow_ambiguous(self) -> bool:
        """Accepted with allow_ambiguous: text (a bad line, a quarantined line) matches its value
        only as a whole token, never inside a longer word."""
        return ALLOW_AMBIGUOUS in self.reason


def validate_request(key: str, value: str, actor: str, reason: str) -> None:
    problems = []
    if key not in TOMBSTONE_KEYS:
        problems.append(f"key {key!r} is not one of {', '.join(TOMBSTONE_KEYS)}")
    for name, given in (("value", value), ("actor", actor), ("reason", reason)):
        if not isinstance(given, str) or not given.strip():
            problems.append(
                f"{name} is empty: a tombstone needs the {name}"
                f" {'to erase' if name == 'value' else 'for the audit record'}"
            )
    if isinstance(reason, str) and ALLOW_AMBIGUOUS in reason:
        # The marker is how the tombstone records an override (Tombstone.allow_ambiguous): typed
        # into the free text it would switch whole-token matching on without the request's flag.
        problems.append(f"reason holds {ALLOW_AMBIGUOUS!r}, which only allow_ambiguous may write: reword it")
    if problems:
        raise TombstoneError("erasure request refused, nothing written: " + "; ".join(problems))


def request_erasure(spark: SparkSession, lake: Lake, key: str, value: str, actor: str, reason: str) -> Tombstone:
    """Record a tombstone (one commit). From that commit on, matching events are hidden."""
    return request_erasures(spark, lake, key, [value], actor, reason)[0]


def request_erasures(
    spark: SparkSession,
    lake: Lake,
    key: str,
    values: list[str],
    actor: str,
    reason: str,
    overridden: str | None = None,
) -> list[Tombstone]:
    """Record a tombstone for each of `values` (of one key, for one actor and reason) in one
    commit: a request that names many values costs one commit and one refresh, not one each.
    Every value is checked before anything is written; a value given twice is recorded once.
    `overridden`: what allow_ambiguous overrode (erasure_values), recorded in the reason.
    Whether a value matches only what it names is the request's entry point's check
    (`erasure_values.ambiguous_values`, in erase_job's tombstones asset): this records what it
    is given.

        request_erasures(spark, lake, "partition_ref", ["data/users/id=1", "data/users/id=2"],
                         actor="alice@example.com", reason="GDPR request #1234")
    """
    if not values:
        raise TombstoneError("erasure request refused, nothing written: no value given")
    for value in values:
        validate_request(key, value, actor, reason)
    if overridden:
        reason = f"{reason} {ALLOW_AMBIGUOUS}: {overridden}]"
    path = lake.table_path(TOMBSTONES)
    ensure_table(spark, path, TOMBSTONES)
    now = datetime.now(UTC)
    tombstones = [Tombstone(str(uuid.uuid4()), key, value, actor, reason, now) for value in dict.fromkeys(values)]
    _append(spark, path, tombstones, "requested")
    log.info("%d tombstone(s) recorded in one commit: %s by %s (%s)", len(tombstones), key, actor, reason)
    return tombstones


def record_applied(spark: SparkSession, lake: Lake, tombstones: list[Tombstone], log_version: int) -> None:
    """Append an "applied" record for each tombstone compaction purged (one commit)."""
    if not tombstones:
        return
    now = datetime.now(UTC)
    applied = [
        Tombstone(t.tombstone_id, t.key, t.value, t.actor, t.reason, t.requested_at, now, log_version)
        for t in tombstones
    ]
    _append(spark, lake.table_path(TOMBSTONES), applied, "applied")


def _append(spark: SparkSession, path: str, tombstones: list[Tombstone], record: str) -> None:
    rows = [
        (t.tombstone_id, record, t.key, t.value, t.actor, t.reason, t.requested_at, t.applied_at, t.applied_log_version)
        for t in tombstones
    ]
    frame = spark.createDataFrame(rows, TOMBSTONES.schema)
    (
        frame.write.format("delta")
        .mode("append")
        # The audit trail says who and how many, never the erased values themselves.
        .option(
            "userMetadata",
            json.dumps({"tombstones": record, "count": len(rows), "actors": sorted({t.actor for t in tombstones})}),
        )
        .save(path)
    )


def read_tombstones(spark: SparkSession, lake: Lake, version: int | None = None) -> list[Tombstone]:
    """Every tombstone with its state (applied or pending), oldest request first."""
    path = lake.table_path(TOMBSTONES)
    ensure_table(spark, path, TOMBSTONES)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    records = reader.load(path).collect()
    applied = {r.tombstone_id: r for r in records if r.record == "applied"}
    tombstones = []
    for r in records:
        if r.record == "requested":
            done = applied.get(r.tombstone_id)
            tombstones.append(
                Tombstone(
                    r.tombstone_id,
                    r.key,
                    r.value,
                    r.actor,
                    r.reason,
                    r.requested_at,
                    done.applied_at if done else None,
                    done.applied_log_version if done else None,
                )
            )
    return sorted(tombstones, key=lambda t: (t.requested_at, t.tombstone_id))


# The columns `with_erasure_data` adds to a frame: the tombstones' data as a row of a broadcast
# frame of one row (data, never printed in a plan), not as SQL literals (printed in every plan:
# `explain`, the Spark UI's SQL tab, event logs).
ERASURE_KEY, ERASURE_QUOTED, ERASURE_FORMS, ERASURE_TOKENS = (
    "_erasure_key",
    "_erasure_quoted",
    "_erasure_forms",
    "_erasure_tokens",
)
ERASURE_DATA = (ERASURE_KEY, ERASURE_QUOTED, ERASURE_FORMS, ERASURE_TOKENS)
_ERASURE_DATA_SCHEMA = (
    f"{ERASURE_KEY} string, {ERASURE_QUOTED} array<string>, {ERASURE_FORMS} array<string>,"
    f" {ERASURE_TOKENS} array<struct<form: string, pattern: string>>"
)
# The secret the digests `event_matches` looks up are keyed with: one per process, in no plan
# (it reaches Spark as data, in ERASURE_KEY), so a plan's digests cannot be tested against a
# guessed value.
_DIGEST_KEY = secrets.token_hex(32)


def with_erasure_data(frame: DataFrame, tombstones: list[Tombstone]) -> DataFrame:
    """`frame` with the columns `event_matches` and `text_mentions` read (ERASURE_DATA): one row
    of the tombstones' data, broadcast to every row. Drop them (`.drop(*ERASURE_DATA)`) or select
    past them before writing.

    Spark prints every literal of a query in its plans, which the Spark UI shows and event logs
    keep: the values to erase are data here, never a literal. The rule's hash-set lookup needs
    literals, so it looks up SHA-256 digests of the tagged values keyed by a random secret that is
    itself only in that row: a plan shows digests no one can test a guessed value against."""
    if not tombstones:
        return frame
    contained, tokens = _text_forms_by_rule(tombstones)
    row = (
        _DIGEST_KEY,
        sorted(piece for piece in _json_pieces(tombstones) if '"' in piece),
        contained,
        [(form, token_pattern([form])) for form in tokens],
    )
    data = frame.sparkSession.createDataFrame([row], _ERASURE_DATA_SCHEMA)
    return frame.crossJoin(F.broadcast(data))


def _json_pieces(tombstones: list[Tombstone]) -> set[str]:
    """The values of keys with JSON text fields, as JSON without the quotes."""
    return {json.dumps(t.value)[1:-1] for t in tombstones if t.key in JSON_TEXT_FIELDS}


def event_matches(tombstones: list[Tombstone]) -> Column:
    """True for an event (a row of the event schema, given `with_erasure_data(frame, tombstones)`)
    that any of `tombstones` matches; never null.

    Every string of the row a tombstone could name (the fields of each key, the elements of its
    array fields, the pieces of its JSON text fields between two quotes) is tagged with its key
    and looked up in one hash set (IN over many literals is InSet): a row costs its own strings,
    not the number of tombstones. The set holds each tagged value's SHA-256 keyed by the secret
    of ERASURE_KEY, not the value (see `with_erasure_data`). A JSON text field matches when it
    contains the value as a JSON string, `"<json>"`; for a value whose JSON has no quote inside,
    that is exactly when one of the text's pieces between two quotes is <json> (a value with a
    quote is searched for in the text, from ERASURE_QUOTED). The expression is handed to Spark as
    one SQL text: a Column per literal would cost a call into the JVM per tombstone."""
    strings: list[str] = []
    wanted: set[str] = set()
    searched: list[Column] = []
    for key in TOMBSTONE_KEYS:
        values = sorted({t.value for t in tombstones if t.key == key})
        if not values:
            continue
        tag, json_tag = _sql_string(f"{key}:"), _sql_string(f"{key}~json:")
        wanted.update(f"{key}:{value}" for value in values)
        strings += [f"array(concat({tag}, {field}))" for field in SCALAR_FIELDS[key]]
        strings += [f"transform({field}, s -> concat({tag}, s))" for field in ARRAY_FIELDS.get(key, ())]
        pieces = [json.dumps(value)[1:-1] for value in values]
        wanted.update(f"{key}~json:{piece}" for piece in pieces if '"' not in piece)
        for field in JSON_TEXT_FIELDS.get(key, ()):
            split = f"split({field}, '\"')"
            between_quotes = f"slice({split}, 2, greatest(size({split}) - 2, 0))"  # all but the first and last
            strings.append(f"transform({between_quotes}, s -> concat({json_tag}, s))")
            if any('"' in piece for piece in pieces):
                searched.append(F.expr(f"exists({ERASURE_QUOTED}, p -> contains({field}, concat('\"', p, '\"')))"))
    if not wanted:
        return F.lit(False)
    digests = ", ".join(sorted(f"'{hashlib.sha256((_DIGEST_KEY + value).encode()).hexdigest()}'" for value in wanted))
    # coalesce: a null field (an unset payload) means "no strings", never "unknown".
    every_string = ", ".join(f"coalesce({part}, cast(array() AS array<string>))" for part in strings)
    lookup = f"exists(concat({every_string}), s -> sha2(concat({ERASURE_KEY}, s), 256) IN ({digests}))"
    conditions = [F.expr(lookup), *searched]
    return reduce(lambda a, b: a | b, (F.coalesce(c, F.lit(False)) for c in conditions))


def _sql_string(value: str) -> str:
    """`value` as a Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def text_mentions(column: str, tombstones: list[Tombstone]) -> Column:
    """True for a line of text (a bad landing line, a quarantined line) in `column` that contains
    any of `tombstones`' values (given `with_erasure_data(frame, tombstones)`); never null. A bad
    line has no fields to match, so the text decides: a value that passed erase_job's checks
    (erasure_values), anywhere in it; a value accepted with allow_ambiguous, only as a whole token
    (`erasure_rule.token_pattern`), so `e` does not take every line holding `ingest_job`. The
    forms are data (ERASURE_FORMS, ERASURE_TOKENS), never literals of the plan; a token's
    pattern is compiled only for a line that contains its form."""
    contained, tokens = _text_forms_by_rule(tombstones)
    conditions = []
    if contained:
        conditions.append(F.expr(f"exists({ERASURE_FORMS}, form -> contains({column}, form))"))
    if tokens:
        conditions.append(
            F.expr(f"exists({ERASURE_TOKENS}, t -> contains({column}, t.form) AND {column} rlike t.pattern)")
        )
    if not conditions:
        return F.lit(False)
    return reduce(lambda a, b: a | b, (F.coalesce(c, F.lit(False)) for c in conditions))


def line_matcher(tombstones: list[Tombstone]) -> Callable[[str], bool]:
    """`text_mentions` on one line of text here: whether it mentions any of `tombstones`."""
    contained, tokens = _text_forms_by_rule(tombstones)
    token = re.compile(token_pattern(tokens)) if tokens else None
    return lambda line: any(form in line for form in contained) or bool(token and token.search(line))


def _text_forms_by_rule(tombstones: list[Tombstone]) -> tuple[list[str], list[str]]:
    """The text forms searched anywhere in a line, and those searched as whole tokens only."""
    contained = {form for t in tombstones if not t.allow_ambiguous for form in text_forms(t.value)}
    tokens = {form for t in tombstones if t.allow_ambiguous for form in text_forms(t.value)}
    return sorted(contained), sorted(tokens)


def text_forms(value: str) -> tuple[str, ...]:
    """The ways `value` can be written in a line of JSON text: itself, inside a JSON string
    (escaped, non-ASCII kept or written as \\u escapes, "/" as is or as "\\/", as writers
    choose), and inside a JSON
    string inside a JSON string (a job config naming a partition). Each once."""
    forms = [value]
    for ascii_only in (False, True):
        inner = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
        for escaped in (inner, inner.replace("/", "\\/")):  # JSON lets a writer escape "/" too
            forms += [escaped, json.dumps(escaped, ensure_ascii=ascii_only)[1:-1]]
    return tuple(dict.fromkeys(forms))


def json_string_forms(value: str) -> tuple[str, str]:
    """`value` as a whole JSON string (as a column or a JSON Lines line holds it), and escaped
    once more (as it appears inside a JSON text field, e.g. a job config naming a partition):
    what the erasure report searches the disk for."""
    needle = json.dumps(value, ensure_ascii=False)
    return needle, json.dumps(needle, ensure_ascii=False)[1:-1]


def visible_events(events: DataFrame, tombstones: list[Tombstone]) -> DataFrame:
    """`events` minus every event a tombstone matches: the soft delete."""
    if not tombstones:
        return events
    return with_erasure_data(events, tombstones).where(~event_matches(tombstones)).drop(*ERASURE_DATA)


def matching_events(events: DataFrame, tombstones: list[Tombstone]) -> DataFrame:
    """The events of `events` any of `tombstones` matches."""
    if not tombstones:
        return events.limit(0)
    return with_erasure_data(events, tombstones).where(event_matches(tombstones)).drop(*ERASURE_DATA)


def lines_mentioning(lines: DataFrame, column: str, tombstones: list[Tombstone]) -> DataFrame:
    """The rows of `lines` whose text in `column` mentions any of `tombstones` (`text_mentions`)."""
    if not tombstones:
        return lines.limit(0)
    return with_erasure_data(lines, tombstones).where(text_mentions(column, tombstones)).drop(*ERASURE_DATA)


def matching_event_ids(events: DataFrame, tombstones: list[Tombstone]) -> DataFrame:
    """(event_id, tombstone_id) for every event each tombstone matches: what a purge removes.

    One scan of `events` with every tombstone's predicate at once; then only the events that
    matched are paired with their tombstones, by a join per field of the rule, whatever the
    number of tombstones (a scan per tombstone would read the log once for each)."""
    spark = events.sparkSession
    if not tombstones:
        return spark.createDataFrame([], "event_id string, tombstone_id string")
    matched = matching_events(events, tombstones)
    wanted = spark.createDataFrame(
        [(t.tombstone_id, t.key, t.value, json.dumps(t.value)) for t in tombstones],
        "tombstone_id string, key string, value string, json_value string",
    )
    pairs = []
    for key in TOMBSTONE_KEYS:
        of_key = F.broadcast(wanted.where(F.col("key") == key))
        for field in SCALAR_FIELDS[key]:
            held = matched.select("event_id", F.col(field).alias("held"))
            pairs.append(held.join(of_key, F.col("held") == F.col("value")))
        for field in ARRAY_FIELDS.get(key, ()):
            held = matched.select("event_id", F.explode(F.col(field)).alias("held"))
            pairs.append(held.join(of_key, F.col("held") == F.col("value")))
        for field in JSON_TEXT_FIELDS.get(key, ()):
            held = matched.select("event_id", F.col(field).alias("held"))
            pairs.append(held.join(of_key, F.col("held").contains(F.col("json_value"))))
    return reduce(DataFrame.unionByName, [p.select("event_id", "tombstone_id") for p in pairs]).distinct()
