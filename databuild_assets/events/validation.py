"""Validation of one event, with a reason a person can act on.

Pure Python, so the same checks (and the same words) serve JSON Lines ingestion, which runs
them inside Spark's Python workers, and the writer API, which runs them before it commits.

Choices where EVENTS.md is silent (docs/decisions/0001-strict-event-validation.md):
- unknown fields are refused, top level and in payloads: a field we would not store is data lost;
- the identity fields a projection keys on are required (`REQUIRED_PAYLOAD_FIELDS`);
- `status_name` may be omitted, but when given it must match `status_code`;
- `event_id` is any non-empty string (DataBuild writes UUIDs; tests use readable ids).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from databuild_assets.events.enums import enum_range
from databuild_assets.events.schema import CORE_FIELDS, EVENT_COLUMNS, EVENT_TYPES, PAYLOADS, Field

# A line longer than this is quarantined unparsed: no DataBuild event comes near it, and an
# unbounded line would let one bad writer exhaust an executor's memory.
MAX_LINE_BYTES = 1024 * 1024
# Of a line over MAX_LINE_BYTES, only this many first bytes reach the Python workers and the
# quarantine (ingest/lines.py cuts it in Spark's read): enough for a person to see what it was.
OVER_LIMIT_KEPT_BYTES = 1024


def over_limit_reason(size: int) -> str:
    """The quarantine's reason for a line of `size` bytes, over MAX_LINE_BYTES."""
    return (
        f"line is {size:,} bytes, over the {MAX_LINE_BYTES:,}-byte limit for one event "
        f"(only its first {OVER_LIMIT_KEPT_BYTES:,} bytes are kept)"
    )


REQUIRED_PAYLOAD_FIELDS: dict[str, frozenset[str]] = {
    "build_request_event": frozenset({"status_code"}),
    "partition_event": frozenset({"partition_ref", "status_code"}),
    "job_event": frozenset({"job_run_id", "status_code"}),
    "delegation_event": frozenset({"partition_ref", "delegated_to_build_request_id"}),
    "job_graph_event": frozenset(),
    "partition_invalidation_event": frozenset({"partition_ref"}),
    "task_cancel_event": frozenset({"job_run_id"}),
    "build_cancel_event": frozenset(),
}

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_KIND_WORDS = {
    "string": "a string",
    "int": "an integer",
    "bigint": "an integer",
    "array<string>": "an array of strings",
}
_KNOWN_COLUMNS = frozenset(EVENT_COLUMNS)


class InvalidEventError(ValueError):
    """An event failed validation; the message says what is wrong and where."""


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else json.dumps(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )
    return f"{kind} {text}" if value is not None else "null"


def _type_error(field: Field, where: str, value: Any) -> str | None:
    """The reason `value` is not of `field`'s kind, or None when it is."""
    kind = field.kind
    if kind == "string":
        ok = isinstance(value, str)
    elif kind in ("int", "bigint"):
        low, high = _INT32 if kind == "int" else _INT64
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    else:  # array<string>
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
    if ok:
        return None
    return f"{where} must be {_KIND_WORDS[kind]}, got {_describe(value)}"


def _payload_error(event_type: str, payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return f"{event_type} must be an object, got {_describe(payload)}"
    fields = PAYLOADS[event_type]
    known = {f.name for f in fields}
    for key in payload:
        if key not in known:
            return f"{event_type} has unknown field {key!r} (its fields: {', '.join(sorted(known))})"
    for field in fields:  # in the payload's field order, not a set's: the same reason in every process
        if field.name in REQUIRED_PAYLOAD_FIELDS[event_type] and payload.get(field.name) is None:
            return f"{event_type}.{field.name} is missing; it is required"
    for field in fields:
        value = payload.get(field.name)
        error = None if value is None else _type_error(field, f"{event_type}.{field.name}", value)
        if error:
            return error
        if value == "" and field.name in REQUIRED_PAYLOAD_FIELDS[event_type]:
            return f"{event_type}.{field.name} is empty; it identifies what the event is about"
    for field in fields:
        value = payload.get(field.name)
        if value is not None and field.status_enum is not None:
            enum = field.status_enum
            try:
                member = enum(value)
            except ValueError:
                return f"{event_type}.status_code {value} is not a {enum.__name__} ({enum_range(enum)})"
            name = payload.get("status_name")
            if name is not None and name != member.name:
                return (
                    f"{event_type}.status_name {name!r} does not match status_code {value} ({member.name}); "
                    "the code is authoritative"
                )
    return None


def event_error(event: Any) -> str | None:
    """Why `event` (a parsed JSON object) is not a valid event, or None when it is valid."""
    if not isinstance(event, dict):
        return f"expected one event as a JSON object, got {_describe(event)}"
    for key in event:
        if key not in _KNOWN_COLUMNS:
            return f"unknown field {key!r} (an event has: {', '.join(EVENT_COLUMNS)})"
    for field in CORE_FIELDS:
        value = event.get(field.name)
        if value is None:
            return f"missing required field {field.name!r}"
        error = _type_error(field, field.name, value)
        if error:
            return error
    for name in ("event_id", "build_request_id", "event_type"):
        if event[name] == "":
            return f"{name} is empty"
    if event["timestamp"] < 0:
        return f"timestamp {event['timestamp']} is negative; it must be Unix epoch nanoseconds"
    event_type = event["event_type"]
    if event_type not in PAYLOADS:
        return f"event_type {event_type!r} names no payload (one of: {', '.join(EVENT_TYPES)})"
    for other in EVENT_TYPES:
        if other != event_type and event.get(other) is not None:
            return f"event_type is {event_type!r} but {other} is also set; exactly one payload must be set"
    if event.get(event_type) is None:
        return f"event_type is {event_type!r} but its payload {event_type} is missing"
    return _payload_error(event_type, event[event_type])


def parse_line(raw: bytes | str) -> tuple[dict | None, str | None]:
    """Parse and validate one JSON Lines line: (event, None) when good, (None, reason) when bad."""
    size = len(raw.encode("utf-8") if isinstance(raw, str) else raw)
    if size > MAX_LINE_BYTES:
        return None, over_limit_reason(size)
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            return None, f"not valid UTF-8: byte 0x{raw[error.start]:02x} at offset {error.start}"
    if raw.strip() == "":
        return None, "empty line: expected one event as a JSON object"
    try:
        event = orjson.loads(raw)  # several times faster than json; it refuses what json refuses, and more
    except orjson.JSONDecodeError:
        try:  # so the standard parser decides, and its words give the reason
            event = json.loads(raw)
        except json.JSONDecodeError as error:
            message = error.msg.removesuffix(" at")  # "Unterminated string starting at"
            return None, f"not valid JSON: {message} at column {error.colno}"
        except RecursionError:
            return None, "not valid JSON: nested too deeply"
        try:  # json, unlike orjson, accepts escaped lone surrogates ("\ud800"): not text Spark can store
            json.dumps(event, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return None, "not valid JSON text: a string holds an unpaired UTF-16 surrogate escape (e.g. \\ud800)"
    error = event_error(event)
    return (None, error) if error else (event, None)


def require_valid(event: Any, where: str) -> None:
    """Raise `InvalidEventError` naming `where` (e.g. "events[3]") when `event` is not valid."""
    error = event_error(event)
    if error:
        raise InvalidEventError(f"{where}: {error}")
