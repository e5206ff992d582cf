"""The landing-files sensor: a new file under <lake root>/landing requests one ingestion run."""

import json
from pathlib import Path

from dagster import RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from databuild_assets.defs.event_log.jobs import ingest_job
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.ingest.landing import LANDING_SUFFIXES
from databuild_assets.runtime.lake import is_local


def newest_landing_file(landing: str) -> tuple[int, str] | None:
    """(modification time ns, name) of the newest complete landing file, or None."""
    folder = Path(landing)
    if not folder.is_dir():
        return None
    files = [
        (entry.stat().st_mtime_ns, entry.name)
        for entry in folder.iterdir()
        if entry.is_file() and not entry.name.startswith((".", "_")) and entry.name.endswith(LANDING_SUFFIXES)
    ]
    return max(files, default=None)


@sensor(job=ingest_job, minimum_interval_seconds=30, description="Requests ingestion when a landing file appears.")
def landing_files_sensor(context: SensorEvaluationContext, lakehouse: LakehouseResource):
    landing = lakehouse.lake.landing
    if not is_local(landing):
        return SkipReason(f"{landing} is not on a local disk: schedule ingest_job instead of this sensor")
    newest = newest_landing_file(landing)
    seen = tuple(json.loads(context.cursor)) if context.cursor else None
    if newest is None or (seen is not None and newest <= seen):
        return SkipReason(f"no new landing files in {landing}")
    # Ingestion takes every file not yet ingested, so one run per newest file is enough.
    return SensorResult(
        run_requests=[RunRequest(run_key=f"landing-{newest[0]}-{newest[1]}")],
        cursor=json.dumps(list(newest)),
    )
