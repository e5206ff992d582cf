"""The query API from a shell: `databuild-assets query URI METHOD [ARGS]` prints the answer as JSON.

Arguments are given in the method's order or as name=value; numbers are numbers, a status may
be given by name, and `filter` is a JSON object of EventFilter's fields.

    databuild-assets query delta:///data/lake get_latest_partition_status data/date=2024-01-01
    databuild-assets query sqlite:///var/lib/bel.db list_build_requests limit=5 status=BUILD_REQUEST_FAILED
    databuild-assets query delta:///data/lake list_events 'filter={"event_types": ["job_event"]}' limit=10
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Sequence
from typing import Any

from databuild_assets.events.enums import BuildRequestStatus
from databuild_assets.log.interface import BuildEventLog, EventFilter, decode_cursor

QUERY_METHODS = (
    "get_build_request_events",
    "get_partition_events",
    "get_job_run_events",
    "get_events_in_range",
    "list_events",
    "get_latest_partition_status",
    "get_active_builds_for_partition",
    "get_build_request_for_available_partition",
    "list_build_requests",
    "list_recent_partitions",
    "get_activity_summary",
)
_INTEGERS = frozenset({"since_ns", "start_ns", "end_ns", "limit", "offset"})
_POSITIVE = frozenset({"limit"})
_NON_NEGATIVE = frozenset({"offset"})
# "name=value" is read as a keyword when `name` looks like one; a value with "=" elsewhere (a
# partition ref such as data/sales/date=2026-11-18) is positional.
_KEYWORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STATUS_NAMES = ", ".join(status.name for status in BuildRequestStatus)
_FILTER_FIELDS = ", ".join(field.name for field in dataclasses.fields(EventFilter))


class QueryArgumentError(ValueError):
    """The command line names no query method, or its arguments do not fit the method."""


def _value(method: str, name: str, text: str) -> Any:
    """`text` as the value of the argument `name`, or QueryArgumentError saying what it must be."""
    bad = f"{method}: {name}={text!r}"
    if name in _INTEGERS:
        try:
            number = int(text)
        except ValueError:
            raise QueryArgumentError(f"{bad} is not an integer") from None
        if name in _POSITIVE and number < 1:
            raise QueryArgumentError(f"{bad} is not a positive integer")
        if name in _NON_NEGATIVE and number < 0:
            raise QueryArgumentError(f"{bad} is negative; give 0 or more")
        return number
    if name == "status":
        try:
            return BuildRequestStatus(int(text)) if text.lstrip("-").isdigit() else BuildRequestStatus[text]
        except (KeyError, ValueError):
            raise QueryArgumentError(
                f"{bad} is not a build request status; give one of {_STATUS_NAMES} (or its code 0..7)"
            ) from None
    if name == "since":
        try:
            decode_cursor(text)
        except ValueError:
            raise QueryArgumentError(
                f"{bad} is not a cursor this log issued; give the next_cursor of an earlier list_events answer, "
                "or leave since out to start at the first event"
            ) from None
        return text
    if name == "filter":
        try:
            fields = json.loads(text)
            if not isinstance(fields, dict):
                raise ValueError("not a JSON object")
            return EventFilter(**fields)
        except (ValueError, TypeError) as error:
            raise QueryArgumentError(
                f"{bad} is not valid ({error}); give a JSON object of EventFilter's fields ({_FILTER_FIELDS}), "
                'e.g. filter=\'{"event_types": ["job_event"]}\''
            ) from None
    return text


def parse_arguments(method: str, arguments: Sequence[str]) -> dict[str, Any]:
    """The keyword arguments of the query `method` from command-line `arguments` (values in the
    method's order, or name=value), checked before any log is opened: QueryArgumentError names
    the method or the argument that does not fit, and what would.

        parse_arguments("list_build_requests", ["limit=5", "status=BUILD_REQUEST_FAILED"])
    """
    if method not in QUERY_METHODS:
        raise QueryArgumentError(f"no query method {method!r}; give one of: {', '.join(QUERY_METHODS)}")
    signature = inspect.signature(getattr(BuildEventLog, method))
    parameters = [name for name in signature.parameters if name != "self"]
    takes = f"{method} takes {', '.join(parameters) or 'no arguments'}"
    keywords: dict[str, Any] = {}
    for position, argument in enumerate(arguments):
        name, equals, text = argument.partition("=")
        if not (equals and name in parameters):
            if equals and _KEYWORD.fullmatch(name):
                # A first argument taken as is (an id or a ref) may itself hold "=".
                text_first = parameters and parameters[0] not in (*_INTEGERS, "status", "since", "filter")
                hint = f" (a value holding '=' is written name=value: {parameters[0]}={argument})" if text_first else ""
                raise QueryArgumentError(f"{method}: no argument named {name!r}; {takes}{hint}")
            if position >= len(parameters):
                raise QueryArgumentError(f"{method}: too many arguments ({len(arguments)}); {takes}")
            name, text = parameters[position], argument
        if name in keywords:
            raise QueryArgumentError(f"{method}: {name} given twice")
        keywords[name] = _value(method, name, text)
    missing = [
        name
        for name, parameter in signature.parameters.items()
        if name != "self" and parameter.default is inspect.Parameter.empty and name not in keywords
    ]
    if missing:
        raise QueryArgumentError(f"{method}: missing {', '.join(missing)}; {takes}")
    if method == "get_events_in_range" and keywords["end_ns"] < keywords["start_ns"]:
        raise QueryArgumentError(
            f"{method}: end_ns {keywords['end_ns']} is before start_ns {keywords['start_ns']}; "
            "the range is start_ns <= timestamp < end_ns"
        )
    return keywords


def call(log: BuildEventLog, method: str, arguments: Sequence[str]) -> Any:
    """Call the query `method` of `log` with command-line `arguments` (values, or name=value)."""
    return getattr(log, method)(**parse_arguments(method, arguments))


def to_json(answer: Any) -> str:
    """The answer as indented JSON: dataclasses as objects, tuples as arrays."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return value

    return json.dumps(plain(answer), indent=2, ensure_ascii=False)


__all__ = ["QUERY_METHODS", "QueryArgumentError", "call", "parse_arguments", "to_json"]
