"""A JVM-free appender process for the concurrency tests: `python -m databuild_assets_tests.appender
URI BATCHES_JSON NAME` appends each batch of the JSON file and prints its totals as JSON."""

from __future__ import annotations

import json
import sys

from databuild_assets.log import open_event_log


def main(uri: str, batches_file: str, name: str) -> None:
    with open(batches_file) as file:
        batches = json.load(file)
    accepted = duplicates = 0
    with open_event_log(uri, writer=name) as log:
        for batch in batches:
            result = log.append_events(batch)
            accepted += result.accepted
            duplicates += result.duplicates
            # Read-your-writes: every event of the batch is readable at once.
            for event in batch:
                if event["event_type"] == "partition_event":
                    assert log.get_latest_partition_status(event["partition_event"]["partition_ref"]) is not None
    print(json.dumps({"accepted": accepted, "duplicates": duplicates}))


if __name__ == "__main__":
    main(*sys.argv[1:])
