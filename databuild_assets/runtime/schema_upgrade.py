"""Schema evolution of our Delta tables: read a table of an older schema version as the newer
schema, and upgrade the table in place (add the new nullable columns and nested fields, record
the new version in its `databuild.schemaVersion` property) without rewriting or losing a row.

Only additive changes are upgrades: a new nullable column, or a new nullable field in a struct
(a payload). Old rows read the new fields as null, which is what "not recorded" means, so no data
file is rewritten. Dropping, renaming or retyping a field is refused: it needs a migration that
rewrites the data, decided case by case.

    upgrade_table_schema(spark, lake.table_path(RAW_EVENT_LOG), RAW_EVENT_LOG.schema, SCHEMA_VERSION)
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructField, StructType

from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.delta_tables import (
    USER_METADATA,
    check_schema_version,
    current_version,
    retry_on_conflict,
    session_settings,
)
from databuild_assets.runtime.lake import SCHEMA_VERSION_PROPERTY

log = logging.getLogger(__name__)


class SchemaUpgradeError(RuntimeError):
    """The target schema is not an additive change of the table's (or the upgrade could not be
    verified); the table was not changed by it."""


class SchemaDowngradeError(SchemaUpgradeError):
    """The table is at a newer schema version than the target; downgrades are refused."""


@dataclass(frozen=True)
class SchemaUpgrade:
    """What `upgrade_table_schema` did: `added_fields` as dotted paths (`partition_event.attempt`),
    and the table versions of its commits (none when the table was already at the target)."""

    path: str
    from_version: int
    to_version: int
    added_fields: tuple[str, ...]
    rows: int
    commits: tuple[int, ...]


@dataclass(frozen=True)
class _Addition:
    parent: tuple[str, ...]  # the struct the field goes into; () for a top-level column
    field: StructField
    after: str | None  # the sibling it follows in the target; None: it comes first

    @property
    def path(self) -> str:
        return ".".join((*self.parent, self.field.name))

    def sql(self) -> str:
        name = ".".join(f"`{part}`" for part in (*self.parent, self.field.name))
        comment = self.field.metadata.get("comment")
        clause = f"{name} {self.field.dataType.simpleString()}"
        if comment:
            clause += " COMMENT " + json.dumps(comment)  # a double-quoted SQL string literal
        return clause + (f" AFTER `{self.after}`" if self.after else " FIRST")


def _same_type(current: DataType, target: DataType) -> bool:
    """Equal types, ignoring nullability and comments (simpleString carries neither)."""
    return current.simpleString() == target.simpleString()


def schema_additions(current: StructType, target: StructType) -> list[_Addition]:
    """The fields `target` adds to `current`, outermost first; raises SchemaUpgradeError when
    `target` drops a field, changes a type, or adds a field that is not nullable (naming each)."""
    problems: list[str] = []
    additions = _additions(current, target, (), problems)
    if problems:
        raise SchemaUpgradeError("; ".join(problems))
    return additions


def _additions(current: StructType, target: StructType, where: tuple[str, ...], problems: list[str]) -> list[_Addition]:
    additions = []
    target_names = set(target.fieldNames())
    problems += [f"{'.'.join((*where, f.name))} is dropped" for f in current.fields if f.name not in target_names]
    current_fields = {field.name: field for field in current.fields}
    previous = None
    for field in target.fields:
        path = ".".join((*where, field.name))
        existing = current_fields.get(field.name)
        if existing is None:
            if field.nullable:
                additions.append(_Addition(where, field, previous))
            else:
                problems.append(f"{path} is new and NOT NULL (rows already stored have no value for it)")
        elif isinstance(existing.dataType, StructType) and isinstance(field.dataType, StructType):
            additions += _additions(existing.dataType, field.dataType, (*where, field.name), problems)
        elif not _same_type(existing.dataType, field.dataType):
            problems.append(
                f"{path} changes type from {existing.dataType.simpleString()} to {field.dataType.simpleString()}"
            )
        previous = field.name
    return additions


def conform_to_schema(frame: DataFrame, schema: StructType) -> DataFrame:
    """`frame` with exactly the columns of `schema`, in its order: fields `frame` lacks (at any
    depth of structs) are null, so rows of an older schema version read as the newer one.

        events_v2 = conform_to_schema(spark.read.format("delta").load(path), EVENT_SCHEMA_V2)
    """
    return frame.select(
        *(_conformed(F.col(f"`{f.name}`"), _field_type(frame.schema, f.name), f).alias(f.name) for f in schema.fields)
    )


def _field_type(struct: StructType, name: str) -> DataType | None:
    return struct[name].dataType if name in struct.fieldNames() else None


def _conformed(value: Column, current: DataType | None, target: StructField) -> Column:
    if current is None:
        return F.lit(None).cast(target.dataType)
    if isinstance(current, StructType) and isinstance(target.dataType, StructType):
        inner = F.struct(
            *(
                _conformed(value.getField(f.name), _field_type(current, f.name), f).alias(f.name)
                for f in target.dataType.fields
            )
        )
        return F.when(value.isNull(), F.lit(None)).otherwise(inner)  # an unset payload stays unset
    return value.cast(target.dataType) if not _same_type(current, target.dataType) else value


def _count_at(spark: SparkSession, path: str, version: int) -> int:
    return spark.read.format("delta").option("versionAsOf", version).load(path).count()


def upgrade_table_schema(
    spark: SparkSession, path: str, target_schema: StructType, target_version: int
) -> SchemaUpgrade:
    """Bring the Delta table at `path` to `target_schema` and record `target_version`.

    One commit adds every new column and nested field (ALTER TABLE ADD COLUMNS; no data file is
    rewritten), a second sets the table's schema-version property; each is verified to leave the
    row count unchanged. Until the second commit, code of the old version still reads and writes
    the table (its rows leave the new fields null, as old rows read). Rerunning after a failure
    completes the upgrade; rerunning after success changes nothing. Refuses a downgrade (the
    table is at a newer version than `target_version`) and any change that is not additive.

        upgrade_table_schema(spark, "/data/lake/tables/raw_event_log", RAW_EVENT_LOG.schema, 2)
    """
    if not DeltaTable.isDeltaTable(spark, path):
        raise SchemaUpgradeError(f"{path} is not a Delta table: there is nothing to upgrade")
    found = check_schema_version(spark, path, known_version=sys.maxsize)
    if found > target_version:
        raise SchemaDowngradeError(
            f"{path} is at schema version {found}; refusing to downgrade it to {target_version}: newer fields would "
            f"be lost and newer code would misread the table. Run code of schema version {found} or later; to undo "
            "an upgrade, RESTORE the table to its version before the upgrade (DESCRIBE HISTORY lists it)."
        )
    session = spark.newSession()  # its own commit metadata, whatever other threads do meanwhile
    before = current_version(session, path)
    try:
        additions = schema_additions(DeltaTable.forPath(session, path).toDF().schema, target_schema)
    except SchemaUpgradeError as error:
        raise SchemaUpgradeError(
            f"{path}: schema version {target_version} is not an additive change of the table's schema ({error}); "
            "nothing was changed. Only new nullable columns and struct fields are upgraded in place."
        ) from error
    if found == target_version:
        if additions:
            raise SchemaUpgradeError(
                f"{path}: the target schema adds {', '.join(a.path for a in additions)} but keeps schema version "
                f"{found}; nothing was changed. Bump SCHEMA_VERSION with every change of the stored schema."
            )
        return SchemaUpgrade(path, found, target_version, (), _count_at(session, path, before), ())

    upgrade_id = uuid.uuid4().hex
    metadata = json.dumps({"schema_upgrade": upgrade_id, "from": found, "to": target_version})
    with commit_lock(path), session_settings(session, {USER_METADATA: metadata}):
        if additions:
            columns = ", ".join(addition.sql() for addition in additions)
            retry_on_conflict(
                lambda: session.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})"),
                what=f"add {', '.join(a.path for a in additions)} to {path}",
            )
        retry_on_conflict(
            lambda: session.sql(
                f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{SCHEMA_VERSION_PROPERTY}' = '{target_version}')"
            ),
            what=f"record schema version {target_version} at {path}",
        )

    ours = sorted(
        row["version"]
        for row in DeltaTable.forPath(session, path)
        .history()
        .where(F.col("version") > before)
        .select("version", "userMetadata")
        .collect()
        if upgrade_id in (row["userMetadata"] or "")
    )
    for version in ours:
        rows_before, rows_after = _count_at(session, path, version - 1), _count_at(session, path, version)
        if rows_before != rows_after:
            raise SchemaUpgradeError(
                f"{path}: the schema upgrade's commit {version} changed the row count from {rows_before} to "
                f"{rows_after}; RESTORE TABLE delta.`{path}` TO VERSION AS OF {version - 1} and report it"
            )
    log.info(
        "%s: schema version %d -> %d, added %s (commits %s)",
        path,
        found,
        target_version,
        [a.path for a in additions],
        ours,
    )
    return SchemaUpgrade(
        path, found, target_version, tuple(a.path for a in additions), _count_at(session, path, ours[-1]), tuple(ours)
    )


__all__ = [
    "SchemaDowngradeError",
    "SchemaUpgrade",
    "SchemaUpgradeError",
    "conform_to_schema",
    "schema_additions",
    "upgrade_table_schema",
]
