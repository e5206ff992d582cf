"""The lake check and compaction daily and vacuum weekly, by default; cron expressions from the environment."""

import os

from dagster import DefaultScheduleStatus, ScheduleDefinition

from databuild_assets.defs.maintenance.checks import check_lake_job
from databuild_assets.defs.maintenance.jobs import compaction_job, vacuum_job

compaction_schedule = ScheduleDefinition(
    name="compaction_schedule",
    job=compaction_job,
    cron_schedule=os.environ.get("DATABUILD_COMPACTION_CRON", "0 3 * * *"),
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Purge erased rows and bin-pack small files (DATABUILD_COMPACTION_CRON, default daily 03:00 UTC).",
)
vacuum_schedule = ScheduleDefinition(
    name="vacuum_schedule",
    job=vacuum_job,
    cron_schedule=os.environ.get("DATABUILD_VACUUM_CRON", "0 4 * * 0"),
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Delete table files past retention, and archive or delete ingested landing files past theirs "
    "(DATABUILD_VACUUM_CRON, default Sundays 04:00 UTC).",
)
check_lake_schedule = ScheduleDefinition(
    name="check_lake_schedule",
    job=check_lake_job,
    cron_schedule=os.environ.get("DATABUILD_CHECK_CRON", "0 2 * * *"),
    execution_timezone="UTC",
    default_status=DefaultScheduleStatus.RUNNING,
    description="Read every table of the lake whole and check that the tables agree, as `databuild-assets check` "
    "does (DATABUILD_CHECK_CRON, default daily 02:00 UTC, before compaction).",
)
