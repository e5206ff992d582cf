"""A first pass over landing lines in C: the lines it passes are valid events, and the rest go to
`validation.parse_line`, which decides them and words the reason.

msgspec decodes each line strictly into one struct per event type (`event_type` is the tag),
declared from `schema.PAYLOADS` like everything else: exact JSON kinds (a bool or a float is not
an int, a number is not a string), no unknown field at the top level or in a payload, the core
fields and a payload's identity fields present, non-empty and not null, status codes members of
their enum, the other payloads absent or null. The one rule left, a `status_name` that matches
its code, is checked here in Python on the decoded struct. A duplicate key keeps its last value,
as in `parse_line`.

    event = decode(b'{"event_id": "e1", ...}')   # a struct, or None
    event.event_id, event_type_of(event), event.partition_event.status_code

It may refuse a line `parse_line` accepts (a duplicate key whose first value is bad, say): such a
line just takes the slow path. It must never pass a line `parse_line` refuses, nor decode one to
another event; `test_fuzz` holds the two to that on mutated lines.
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec

from databuild_assets.events.schema import CORE_FIELDS, EVENT_TYPES, PAYLOADS, Field
from databuild_assets.events.validation import MAX_LINE_BYTES, REQUIRED_PAYLOAD_FIELDS

_NON_EMPTY = Annotated[str, msgspec.Meta(min_length=1)]
_CORE_TYPES = {
    "event_id": _NON_EMPTY,
    "timestamp": Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)],  # epoch nanoseconds, a bigint
    "build_request_id": _NON_EMPTY,
}
assert set(_CORE_TYPES) | {"event_type"} == {field.name for field in CORE_FIELDS}


def _field_type(field: Field, required: bool) -> object:
    if field.status_enum is not None:  # the only int fields: their codes are checked by the enum
        kind = field.status_enum
    else:
        kind = {"string": str, "array<string>": list[str]}[field.kind]
    if required:
        return _NON_EMPTY if kind is str else kind
    return kind | None


def _event_struct(event_type: str) -> type[msgspec.Struct]:
    required = REQUIRED_PAYLOAD_FIELDS[event_type]
    payload = msgspec.defstruct(
        event_type,
        [
            (field.name, _field_type(field, True))
            if field.name in required
            else (field.name, _field_type(field, False), None)  # optional: absent or null is None
            for field in PAYLOADS[event_type]
        ],
        kw_only=True,
        forbid_unknown_fields=True,
        gc=False,  # no cycles: the collector need not track a worker batch's thousands of events
    )
    return msgspec.defstruct(
        f"{event_type}_line",
        [*_CORE_TYPES.items(), (event_type, payload)]
        + [(other, None, None) for other in EVENT_TYPES if other != event_type],  # absent or null only
        kw_only=True,
        forbid_unknown_fields=True,
        gc=False,  # no cycles: the collector need not track a worker batch's thousands of events
        tag_field="event_type",
        tag=event_type,
    )


STRUCTS: dict[str, type[msgspec.Struct]] = {event_type: _event_struct(event_type) for event_type in EVENT_TYPES}
_EVENT_TYPE_OF = {struct: event_type for event_type, struct in STRUCTS.items()}
_DECODE = msgspec.json.Decoder(Union[tuple(STRUCTS.values())]).decode  # noqa: UP007 (a runtime tuple)
# The payload (attribute) of each line struct whose payload has a status code, and the names of its codes.
_STATUS_NAMES = {
    struct: (event_type, {member: member.name for member in field.status_enum})
    for event_type, struct in STRUCTS.items()
    for field in PAYLOADS[event_type]
    if field.status_enum is not None
}


def decode(raw: bytes) -> msgspec.Struct | None:
    """The event of `raw` (one line, without its newline) when it is valid; None when it may not be.

    The struct has the event's core fields and payloads as attributes (the unset payloads None),
    status codes as their enum's members; its type is `STRUCTS[event_type]`.
    """
    if len(raw) > MAX_LINE_BYTES:
        return None
    try:
        event = _DECODE(raw)
    except (msgspec.MsgspecError, ValueError, RecursionError):  # ValueError: a string not UTF-8
        return None
    status = _STATUS_NAMES.get(type(event))
    if status is not None:
        payload = getattr(event, status[0])
        if payload.status_name is not None and payload.status_name != status[1][payload.status_code]:
            return None
    return event


def event_type_of(event: msgspec.Struct) -> str:
    """The `event_type` of a struct `decode` returned."""
    return _EVENT_TYPE_OF[type(event)]
