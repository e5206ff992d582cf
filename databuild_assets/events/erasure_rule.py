"""Which events a tombstone matches (EVENTS.md, Tombstones): the rule, declared once.

A tombstone names a key (event_id, build_request_id, job_run_id or partition_ref) and a value.
An event matches when any of its fields of that key equals the value, array fields by
membership, and JSON text fields (job configs, manifests and job graphs name partitions as
inputs and outputs) when they contain the value as a JSON string. The Spark form of the rule is
`maintenance.tombstones.event_matches`; `matches` below is the same rule on one event as a dict,
for readers that hold events in memory (the JVM-free query path).

    matches(event, {"partition_ref": {"data/users/id=42"}})  # True if the event names that ref
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

# For each key: the event fields ("payload.field" or a core column) that hold a value of it.
SCALAR_FIELDS: dict[str, tuple[str, ...]] = {
    "event_id": ("event_id",),
    "build_request_id": ("build_request_id", "delegation_event.delegated_to_build_request_id"),
    "job_run_id": ("partition_event.job_run_id", "job_event.job_run_id", "task_cancel_event.job_run_id"),
    "partition_ref": (
        "partition_event.partition_ref",
        "delegation_event.partition_ref",
        "partition_invalidation_event.partition_ref",
    ),
}
ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    "partition_ref": ("build_request_event.requested_partitions", "job_event.target_partitions")
}
JSON_TEXT_FIELDS: dict[str, tuple[str, ...]] = {
    "partition_ref": ("job_event.config", "job_event.manifests", "job_graph_event.job_graph")
}
TOMBSTONE_KEYS: tuple[str, ...] = tuple(SCALAR_FIELDS)


def _field(event: Mapping[str, Any], path: str) -> Any:
    """The value at "payload.field" (None when the payload is unset) or at a core column."""
    payload_name, dot, name = path.partition(".")
    if not dot:
        return event.get(path)
    payload = event.get(payload_name)
    return payload.get(name) if isinstance(payload, Mapping) else None


def matches(event: Mapping[str, Any], values_by_key: Mapping[str, Collection[str]]) -> bool:
    """True when the event (a dict of the event schema) holds any of `values_by_key[key]` in a
    field of that key: the same answer as `event_matches` gives for its row in Spark."""
    for key, values in values_by_key.items():
        if not values:
            continue
        for path in SCALAR_FIELDS[key]:
            if _field(event, path) in values:
                return True
        for path in ARRAY_FIELDS.get(key, ()):
            listed = _field(event, path)
            if listed and any(value in values for value in listed):
                return True
        texts = [_field(event, path) for path in JSON_TEXT_FIELDS.get(key, ())]
        if any(texts):
            forms = json_forms(values)
            if any(names_in_json_text(text, forms) for text in texts):
                return True
    return False


def json_forms(values: Collection[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """The values' JSON without its quotes, as `names_in_json_text` looks for them: those with no
    quote inside, and apart those with one."""
    pieces = {json.dumps(value)[1:-1] for value in values}
    quoted = tuple(sorted(piece for piece in pieces if '"' in piece))
    return frozenset(pieces.difference(quoted)), quoted


def names_in_json_text(text: str | None, forms: tuple[frozenset[str], tuple[str, ...]]) -> bool:
    """Whether a JSON text field holds one of the values as a JSON string ("<json>"). For a value
    whose JSON has no quote inside, that is exactly when one of the text's pieces between two
    quotes is that JSON: a lookup per piece, however many values (the Spark form,
    `maintenance.tombstones.event_matches`, reads it the same way); a value with a quote is
    searched for in the text."""
    if not text or '"' not in text:
        return False
    unquoted, quoted = forms
    return not unquoted.isdisjoint(text.split('"')[1:-1]) or any(f'"{piece}"' in text for piece in quoted)


__all__ = [
    "ARRAY_FIELDS",
    "JSON_TEXT_FIELDS",
    "SCALAR_FIELDS",
    "TOMBSTONE_KEYS",
    "json_forms",
    "matches",
    "names_in_json_text",
]
