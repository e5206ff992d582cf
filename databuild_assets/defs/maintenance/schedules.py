"""The lake check and compaction daily and vacuum weekly, by default; cron expressions from the environment."""

import os

from dagster import DefaultScheduleStatus, ScheduleDefinition

from databuild_assets.defs.maintenance.checks import check_lake_job
from databuild_assets.defs.maintenance.jobs import compaction_job, vacuum_job


def _schedule(job, env: str, cron: str, what: str, when: str) -> ScheduleDefinition:
    """`job`'s schedule (`<job name without _job>_schedule`), running by default, on the cron
    expression in the environment variable `env`, else `cron` (UTC)."""
    return ScheduleDefinition(
        name=f"{job.name.removesuffix('_job')}_schedule",
        job=job,
        cron_schedule=os.environ.get(env, cron),
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.RUNNING,
        description=f"{what} ({env}, default {when}).",
    )


compaction_schedule = _schedule(
    compaction_job,
    "DATABUILD_COMPACTION_CRON",
    "0 3 * * *",
    "Purge erased rows and bin-pack small files",
    "daily 03:00 UTC",
)
vacuum_schedule = _schedule(
    vacuum_job,
    "DATABUILD_VACUUM_CRON",
    "0 4 * * 0",
    "Delete table files past retention, and archive or delete ingested landing files past theirs",
    "Sundays 04:00 UTC",
)
check_lake_schedule = _schedule(
    check_lake_job,
    "DATABUILD_CHECK_CRON",
    "0 2 * * *",
    "Read every table of the lake whole and check that the tables agree, as `databuild-assets check` does",
    "daily 02:00 UTC, before compaction",
)
