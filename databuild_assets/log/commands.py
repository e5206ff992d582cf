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
from collections.abc import Sequence
from typing import Any

from databuild_assets.events.enums import BuildRequestStatus
from databuild_assets.log.interface import BuildEventLog, EventFilter

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


class QueryArgumentError(ValueError):
    """The command line names no query method, or its arguments do not fit the method."""


def _value(method: str, name: str, text: str) -> Any:
    try:
        if name in _INTEGERS:
            return int(text)
        if name == "status":
            return int(text) if text.lstrip("-").isdigit() else BuildRequestStatus[text]
        if name == "filter":
            fields = json.loads(text)
            if not isinstance(fields, dict):
                raise ValueError("not a JSON object")
            return EventFilter(**fields)
    except (ValueError, KeyError, TypeError) as error:
        raise QueryArgumentError(f"{method}: {name}={text!r} is not valid ({error})") from error
    return text


def call(log: BuildEventLog, method: str, arguments: Sequence[str]) -> Any:
    """Call the query `method` of `log` with command-line `arguments` (values, or name=value)."""
    if method not in QUERY_METHODS:
        raise QueryArgumentError(f"no query method {method!r}; one of: {', '.join(QUERY_METHODS)}")
    parameters = list(inspect.signature(getattr(log, method)).parameters)
    keywords: dict[str, Any] = {}
    for position, argument in enumerate(arguments):
        name, equals, text = argument.partition("=")
        if not equals or name not in parameters:
            if position >= len(parameters):
                raise QueryArgumentError(f"{method} takes {len(parameters)} argument(s) ({', '.join(parameters)})")
            name, text = parameters[position], argument
        if name in keywords:
            raise QueryArgumentError(f"{method}: {name} given twice")
        keywords[name] = _value(method, name, text)
    try:
        inspect.signature(getattr(log, method)).bind(**keywords)
    except TypeError as error:
        raise QueryArgumentError(f"{method}({', '.join(parameters)}): {error}") from error
    return getattr(log, method)(**keywords)


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


__all__ = ["QUERY_METHODS", "QueryArgumentError", "call", "to_json"]
