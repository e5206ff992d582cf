"""What Dagster's catalog shows of each asset beyond its definition: the Delta table it is (column
schema, table name), where it lives (dagster/uri, from the lake root of the deployment) and who
owns its group. definitions.py applies it to every asset with `in_catalog`; the settings a
deployment changes come from the environment (`CatalogSettings.from_env`), read there once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from dagster import AssetSpec, MetadataValue, TableSchema, map_asset_specs

from databuild_assets.defs.column_schema import projection_table_schema, table_schema
from databuild_assets.log.serving.store import index_folder_of
from databuild_assets.projections import PROJECTIONS
from databuild_assets.projections.refresh import projection_spec
from databuild_assets.runtime.lake import (
    EVENT_QUARANTINE,
    FILTERED_EVENT_LOG,
    RAW_EVENT_LOG,
    TOMBSTONES,
    Lake,
    TableSpec,
    is_local,
)

# Kinds name the technology (icons in the asset graph, a filter in the catalog). Dagster's icon for
# Delta Lake is the kind "deltalake" ("delta" would show as bare text). The assets also carry tags
# a platform team filters on: databuild/layer, and databuild/erasure (whether compaction purges
# erased rows from the asset, or keeps them: the tombstones' audit record). See docs/catalog.md.
TABLE_KINDS = {"spark", "deltalake"}

# Every asset that is a Delta table of the lake: its table and its columns as the catalog shows them.
TABLE_ASSETS: dict[str, tuple[TableSpec, TableSchema]] = {
    RAW_EVENT_LOG.name: (RAW_EVENT_LOG, table_schema(RAW_EVENT_LOG, unique=["event_id"])),
    EVENT_QUARANTINE.name: (EVENT_QUARANTINE, table_schema(EVENT_QUARANTINE)),
    TOMBSTONES.name: (TOMBSTONES, table_schema(TOMBSTONES)),
    FILTERED_EVENT_LOG.name: (FILTERED_EVENT_LOG, table_schema(FILTERED_EVENT_LOG, unique=["event_id"])),
    **{name: (projection_spec(p), projection_table_schema(p)) for name, p in PROJECTIONS.items()},
}
LANDING_FILES = "landing_files"  # files, not a table: <lake root>/landing
SERVING_INDEX = "serving_index"  # a SQLite file, not a Delta table: <lake root>/serving_index

OWNERS_ENV = "DATABUILD_ASSET_OWNERS"
MAX_LAG_ENV = "DATABUILD_PROJECTION_MAX_LAG_MINUTES"
FRESHNESS_CRON_ENV = "DATABUILD_FRESHNESS_CRON"
DEFAULT_OWNERS = ("team:databuild",)
# Dagster's owner forms: an email address or a team.
_OWNER = re.compile(r"^(team:[A-Za-z0-9_.-]+|[^@\s]+@[^@\s]+\.[^@\s]+)$")


class CatalogSettingsError(ValueError):
    """An environment variable of the catalog settings cannot be used; nothing was loaded."""


@dataclass(frozen=True)
class CatalogSettings:
    """Owners per asset group, and the projections' freshness bound and check schedule."""

    owners_by_group: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    default_owners: tuple[str, ...] = DEFAULT_OWNERS
    max_projection_lag: timedelta = timedelta(minutes=60)
    freshness_cron: str = "*/15 * * * *"

    def owners(self, group: str | None) -> list[str]:
        return list(self.owners_by_group.get(group or "", self.default_owners))

    @classmethod
    def from_env(cls) -> CatalogSettings:
        """Defaults, overridden by DATABUILD_ASSET_OWNERS ("event_log=team:ingest;projections=
        team:analytics,alice@example.com;*=team:databuild": owners by group, `*` for the rest),
        DATABUILD_PROJECTION_MAX_LAG_MINUTES and DATABUILD_FRESHNESS_CRON."""
        settings = cls()
        owners, default = parse_owners(os.environ.get(OWNERS_ENV, ""), settings.default_owners)
        lag = os.environ.get(MAX_LAG_ENV)
        if lag is not None:
            try:
                minutes = float(lag)
            except ValueError:
                minutes = -1.0
            if not minutes >= 0:
                raise CatalogSettingsError(
                    f"{MAX_LAG_ENV}={lag!r} is not a number of minutes >= 0; e.g. {MAX_LAG_ENV}=60"
                )
        return cls(
            owners_by_group=owners,
            default_owners=default,
            max_projection_lag=settings.max_projection_lag if lag is None else timedelta(minutes=minutes),
            freshness_cron=os.environ.get(FRESHNESS_CRON_ENV, settings.freshness_cron),
        )


def parse_owners(text: str, default: tuple[str, ...]) -> tuple[dict[str, tuple[str, ...]], tuple[str, ...]]:
    """Owners by group, and the owners of every other group, from DATABUILD_ASSET_OWNERS's form
    "group=owner,owner;*=owner" (empty: `default` for every group)."""
    by_group: dict[str, tuple[str, ...]] = {}
    for entry in filter(None, (part.strip() for part in text.split(";"))):
        group, equals, owners_text = entry.partition("=")
        owners = tuple(filter(None, (owner.strip() for owner in owners_text.split(","))))
        bad = [owner for owner in owners if not _OWNER.match(owner)]
        if not equals or not group.strip() or not owners or bad:
            raise CatalogSettingsError(
                f"{OWNERS_ENV}: cannot read {entry!r}"
                + (f" (not an email or team:name: {', '.join(bad)})" if bad else "")
                + f"; write group=owner[,owner] entries separated by ';', e.g. "
                f"{OWNERS_ENV}='event_log=team:ingest;*=team:databuild'"
            )
        by_group[group.strip()] = owners
    return by_group, by_group.pop("*", default)


def location_uri(location: str) -> str:
    """A lake location as a URI: file:///... for a local path, the root's own URI otherwise."""
    return Path(os.path.abspath(location)).as_uri() if is_local(location) else location


def catalog_metadata(name: str, lake: Lake) -> dict:
    """The definition metadata of asset `name`: for a table, its column schema, table name and
    URI; for the landing files, their folder's URI."""
    # Dagster's own keys (its TableMetadataSet and UriMetadataSet, which it does not export).
    if name == LANDING_FILES:
        return {"dagster/uri": MetadataValue.text(location_uri(lake.landing))}
    if name == SERVING_INDEX:
        return {"dagster/uri": MetadataValue.text(location_uri(index_folder_of(lake.root)))}
    if name not in TABLE_ASSETS:
        return {}
    spec, columns = TABLE_ASSETS[name]
    return {
        "dagster/column_schema": MetadataValue.table_schema(columns),
        "dagster/table_name": MetadataValue.text(spec.name),
        "dagster/uri": MetadataValue.text(location_uri(lake.table_path(spec))),
    }


def in_catalog(assets: Iterable, lake: Lake, settings: CatalogSettings) -> list:
    """`assets` (AssetSpecs and AssetsDefinitions) with their catalog metadata and their group's owners.

    assets = in_catalog([landing_files, ingested_event_log], Lake.from_env(), CatalogSettings.from_env())
    """

    def entry(spec: AssetSpec) -> AssetSpec:
        return spec.merge_attributes(
            metadata=catalog_metadata(spec.key.to_user_string(), lake), owners=settings.owners(spec.group_name)
        )

    return list(map_asset_specs(entry, assets))
