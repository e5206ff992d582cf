"""The writer API: append events to the raw log directly, for code that holds them in memory
(a DataBuild service) rather than dropping landing files.

Every event is validated first and nothing is written when any is bad. The new ones go in
one commit, keyed by event_id as ingestion's (ingest/dedup.py), so retries by the caller and
concurrent writers never duplicate an event; Delta's conflicts between writers are retried,
never swallowed.

    result = append_events(spark, Lake("/data/lake"), events, writer="graph-service")
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.events.validation import InvalidEventError, event_error
from databuild_assets.ingest.dedup import insert_new_events
from databuild_assets.ingest.landing import ensure_ingest_tables, events_from_lines
from databuild_assets.runtime.lake import Lake

log = logging.getLogger(__name__)

# How many problems one InvalidEventError lists before it says "and N more".
_MAX_LISTED_ERRORS = 20


@dataclass(frozen=True)
class WriteResult:
    """`accepted` new events written; `duplicates` whose event_id the log (or the call) had already."""

    accepted: int
    duplicates: int


def validate_events(events: Sequence[Mapping[str, Any]]) -> None:
    """Raise one InvalidEventError listing every bad event (by index and event_id)."""
    problems = []
    for index, event in enumerate(events):
        error = event_error(event)
        if error:
            event_id = event.get("event_id") if isinstance(event, Mapping) else None
            problems.append(f"events[{index}]" + (f" (event_id {event_id!r})" if event_id else "") + f": {error}")
    if problems:
        listed = problems[:_MAX_LISTED_ERRORS]
        more = len(problems) - len(listed)
        raise InvalidEventError(
            f"{len(problems)} of {len(events)} events are invalid; nothing was written.\n  "
            + "\n  ".join(listed)
            + (f"\n  ... and {more} more" if more else "")
        )


def append_events(
    spark: SparkSession, lake: Lake, events: Sequence[Mapping[str, Any]], writer: str = "api"
) -> WriteResult:
    """Validate `events`, then add the new ones to the raw log in one commit.

    `writer` names the caller in each row's `source_file` ("writer:<name>") for lineage.
    """
    validate_events(events)
    if not events:
        return WriteResult(0, 0)
    ensure_ingest_tables(spark, lake)
    # The first of each event_id, as ingestion keeps the first by (file, line): the events are
    # in memory here, so the later copies are dropped before Spark sees them.
    first_index: dict[str, int] = {}
    for index, event in enumerate(events):
        first_index.setdefault(event["event_id"], index)
    # As JSON text through from_json with the one event schema, so that both writers store
    # identical rows for identical events.
    lines = spark.createDataFrame(
        [
            (f"writer:{writer}", index + 1, json.dumps({c: events[index].get(c) for c in EVENT_COLUMNS}))
            for index in sorted(first_index.values())
        ],
        "source_file string, line_number long, line string",
    )
    unique_events = events_from_lines(lines)
    what = f"append {len(events)} events from writer {writer!r} to {lake.root}"
    accepted = insert_new_events(spark, lake, unique_events, len(first_index), what=what)
    log.info("writer %s: %d events, %d new, %d duplicates", writer, len(events), accepted, len(events) - accepted)
    return WriteResult(accepted, len(events) - accepted)


__all__ = ["WriteResult", "append_events", "validate_events", "InvalidEventError"]
