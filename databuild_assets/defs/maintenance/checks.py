"""The lake check (`maintenance/check.py`, `databuild-assets check`) as Dagster asset checks: one
per table it covers, all answered from one read of the lake, so each asset's Checks tab says
whether its files are whole and, when not, what is wrong, what it costs and the command that
repairs it. When they run and how deep they read: docs/decisions/0037-lake-checks.md."""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetSelection,
    Config,
    MetadataValue,
    define_asset_job,
    multi_asset_check,
)
from pydantic import Field

from databuild_assets.defs.catalog import SERVING_INDEX
from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.maintenance.check import LakeCheck, TableCheck, check_lake
from databuild_assets.projections import PROJECTIONS
from databuild_assets.runtime.lake import (
    EVENT_QUARANTINE,
    FILTERED_EVENT_LOG,
    INGEST_LEDGER,
    RAW_EVENT_LOG,
    TOMBSTONES,
    is_local,
)

INTACT = "intact"
LEDGER_INTACT = f"{INGEST_LEDGER.name}_{INTACT}"

# Each check and the table of the lake check it reports. The ingest ledger is no asset (ingestion's
# bookkeeping, written in the same step as raw_event_log), so raw_event_log carries its check.
CHECKED_TABLES: dict[AssetCheckKey, str] = {
    **{
        AssetCheckKey.from_user_string(f"{name}:{INTACT}"): name
        for name in (
            RAW_EVENT_LOG.name,
            EVENT_QUARANTINE.name,
            TOMBSTONES.name,
            FILTERED_EVENT_LOG.name,
            *PROJECTIONS,
            SERVING_INDEX,
        )
    },
    AssetCheckKey.from_user_string(f"{RAW_EVENT_LOG.name}:{LEDGER_INTACT}"): INGEST_LEDGER.name,
}


class LakeCheckConfig(Config):
    """How deep the lake check reads: by default as much as is cheap after every write."""

    read_data: bool = Field(
        default=False,
        description="Read every row group of every data file and compare the row counts with the log "
        "(check_lake_job does). Off: the logs, and each data file's presence and size.",
    )
    deep: bool = Field(
        default=False, description="Also run SQLite's quick_check over the serving index (reads all of it)."
    )


def _description(table: str) -> str:
    if table == INGEST_LEDGER.name:
        return (
            "The ingest ledger (ingestion's bookkeeping, no asset of its own): its Delta log parses, every data "
            "file it references is whole, and the batches it records as committed are in raw_event_log."
        )
    if table == SERVING_INDEX:
        return (
            "The serving index file opens, is as long as its header says (and passes SQLite's quick_check "
            "when asked), and the raw_event_log and tombstones versions it is stamped with exist."
        )
    return (
        f"{table}'s Delta log parses, every data file it references exists, has its recorded size and (in "
        "check_lake_job) reads whole, and the versions it recorded of its sources exist in them."
    )


def _specs() -> list[AssetCheckSpec]:
    return [
        AssetCheckSpec(key.name, asset=key.asset_key, description=_description(table))
        for key, table in CHECKED_TABLES.items()
    ]


@multi_asset_check(specs=_specs(), name="lake_checks", can_subset=True)
def lake_checks(context: AssetCheckExecutionContext, config: LakeCheckConfig, lakehouse: LakehouseResource):
    """Runs `check_lake` once (no JVM) and reports each selected check's table from it."""
    lake = lakehouse.lake
    selected = [key for key in CHECKED_TABLES if key in context.selected_asset_check_keys]
    if not is_local(lake.root):
        context.log.info(f"{lake.root} is not on a local disk: the lake check reads local Delta logs only")
        for key in selected:
            yield AssetCheckResult(
                check_name=key.name,
                asset_key=key.asset_key,
                passed=True,
                metadata={"skipped": MetadataValue.text("lake not on a local disk")},
            )
        return
    report = check_lake(lake, read_data=config.read_data, deep=config.deep, progress=context.log.info)
    context.log.info(
        f"lake checked in {report.seconds:.1f}s (data files read: {config.read_data}): "
        f"{len(report.problems)} problem(s)"
    )
    for table in report.tables:  # a table no check reports (one added to the lake later) is not dropped silently
        if table.name not in CHECKED_TABLES.values() and table.problems:
            context.log.warning("\n".join(problem.line() for problem in table.problems))
    for key in selected:
        yield table_result(key, report, config)


def table_result(key: AssetCheckKey, report: LakeCheck, config: LakeCheckConfig) -> AssetCheckResult:
    """The check result of one table of `report`: passed when it has no problem, else an ERROR
    whose metadata lists every problem (what, what it costs, the repair)."""
    table = report.table(CHECKED_TABLES[key]) or TableCheck(CHECKED_TABLES[key])
    lines = [problem.line() for problem in table.problems]
    metadata = {
        "version": MetadataValue.int(-1 if table.version is None else table.version),
        "files": MetadataValue.int(table.files),
        "bytes": MetadataValue.int(table.bytes),
        "rows": MetadataValue.int(table.records),
        "log_files": MetadataValue.int(table.log_files),
        "problems": MetadataValue.text("\n".join(lines) or "none"),
        "problem_count": MetadataValue.int(len(lines)),
        "data_files_read": MetadataValue.bool(config.read_data),
        "lake_check_seconds": MetadataValue.float(round(report.seconds, 3)),
    }
    if table.name == SERVING_INDEX:
        metadata["quick_check"] = MetadataValue.bool(config.deep)
    if lines:
        metadata["repair"] = MetadataValue.text("\n".join(dict.fromkeys(p.repair for p in table.problems)))
        description = f"{len(lines)} problem(s); the first: {lines[0]}"
    elif table.version is None and table.files == 0:
        description = "nothing written yet"
    elif table.name == SERVING_INDEX:
        checked = "; passes quick_check" if config.deep else ""
        description = (
            f"{table.bytes:,} bytes, stamped raw_event_log version {table.version}, {table.records:,} events{checked}"
        )
    else:
        read = "every one read whole" if config.read_data else "each there at its recorded size (not read)"
        description = (
            f"version {table.version}: {table.files:,} data file(s), {table.bytes:,} bytes, {table.records:,} rows, "
            f"{read}"
        )
    return AssetCheckResult(
        check_name=key.name,
        asset_key=key.asset_key,
        passed=not lines,
        severity=AssetCheckSeverity.ERROR,
        description=description,
        metadata=metadata,
    )


# The full read, every row group of every data file, once a day: too slow for the runs that write.
check_lake_job = define_asset_job(
    "check_lake_job",
    selection=AssetSelection.checks(lake_checks),
    config={"ops": {"lake_checks": {"config": {"read_data": True, "deep": False}}}},
    description="Check that every table of the lake reads whole and agrees with the others, reading every data "
    "file (databuild-assets check, as Dagster asset checks).",
)
