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
import re
from collections.abc import Collection, Iterable, Mapping
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


# What ends a token in text: whitespace, quotes, brackets, separators, and the backslash of a
# JSON escape (`\"value\"` in a JSON text inside a JSON string). Letters, digits and
# `_ - . / = : @ + %` continue one: `ingest_job` holds no token `e`, `data/users/id=42` no token
# `data/users/id=4`, `date=2025-11-18` no token `2025-11-18`.
_DELIMITERS = r"""\s"'`()\[\]{}<>,;|\\"""
_TOKEN_START = f"(?<![^{_DELIMITERS}])"
# A token ends at a delimiter or the end, or at sentence punctuation followed by one ("built x.").
_TOKEN_END = f"(?:(?![^{_DELIMITERS}])|(?=[.:!?](?![^{_DELIMITERS}])))"


def token_pattern(forms: Iterable[str]) -> str:
    """A regular expression, the same text for Python's `re` and Java's (Spark's `rlike`), for
    any of `forms` written as a whole token of text: a whole JSON string value, a word of a log
    message, never a part of a longer name. What text is matched by where a value was accepted
    only with allow_ambiguous (`maintenance.erasure_values`), and what Dagster's storage is
    scrubbed by. Longer forms first, so a form inside another does not cut it."""
    alternatives = "|".join(re.escape(form) for form in sorted(set(forms), key=lambda form: (-len(form), form)))
    return f"{_TOKEN_START}(?:{alternatives}){_TOKEN_END}"


_STARTS, _ENDS = re.compile(_TOKEN_START), re.compile(_TOKEN_END)
_STARTS_BYTES, _ENDS_BYTES = re.compile(_TOKEN_START.encode()), re.compile(_TOKEN_END.encode())


def is_token(text: str | bytes, start: int, end: int) -> bool:
    """Whether `text[start:end]` (an occurrence of a value) is a whole token of `text`."""
    starts, ends = (_STARTS_BYTES, _ENDS_BYTES) if isinstance(text, bytes) else (_STARTS, _ENDS)
    return bool(starts.match(text, start) and ends.match(text, end))


__all__ = [
    "ARRAY_FIELDS",
    "JSON_TEXT_FIELDS",
    "SCALAR_FIELDS",
    "TOMBSTONE_KEYS",
    "is_token",
    "json_forms",
    "matches",
    "names_in_json_text",
    "token_pattern",
]
