"""The data catalogue the simulated DataBuild graph builds: business domains, each with the same
shape of partitioned datasets (raw, daily, summary, regional report) plus two shared ones, the
job that builds each dataset, and how partitions depend on each other.

    inputs_of(PartitionKey(dataset_index(0, DAILY), "2026-11-17", "eu"))  # raw sales, fx rates
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

REGIONS = ("eu", "us", "apac", "latam")
WAREHOUSES = {"eu": ("ams1", "fra2"), "us": ("iad1", "sfo3"), "apac": ("sin1", "nrt2"), "latam": ("gru1", "mex1")}
REGION_OF_WAREHOUSE = {w: r for r, ws in WAREHOUSES.items() for w in ws}


class DepType(NamedTuple):
    """DataBuild's DepType: MATERIALIZE inputs must be built first, QUERY inputs are only read."""

    code: int
    name: str


QUERY, MATERIALIZE = DepType(0, "QUERY"), DepType(1, "MATERIALIZE")


@dataclass(frozen=True)
class Dataset:
    """One partitioned dataset and the job that builds it."""

    ref_template: str  # formatted with date= and dim=
    job_label: str
    job_per_date: bool  # one job run builds all of a date's partitions (e.g. one inventory snapshot)
    median_run_s: float
    env: tuple[tuple[str, str], ...]


# Business domains, each with the same shape of datasets. A workload uses as many as its rate of
# build requests needs (see `domains_for`): a busier deployment has a bigger catalog, so the
# mix of events stays alike from a thousand events to ten million.
DOMAINS = (
    "sales",
    "orders",
    "payments",
    "refunds",
    "shipments",
    "returns",
    "subscriptions",
    "ad_clicks",
    "sessions",
    "reviews",
    "promotions",
    "support_tickets",
    "loyalty",
    "pricing",
    "marketplace",
    "catalog",
)
_EVENTS_PER_DAY_PER_DOMAIN = 25_000
_SPARK = (("SPARK_MASTER", "k8s://spark-batch"),)

# Dataset index: two shared datasets, then four per domain (raw, daily, summary, regional report).
FX_RATES, INVENTORY = 0, 1
RAW, DAILY, SUMMARY, REGIONAL = range(4)


def dataset_index(domain: int, kind: int) -> int:
    return 2 + 4 * domain + kind


def _domain_datasets(domain: str) -> tuple[Dataset, ...]:
    if domain == "sales":  # the flagship domain, with the names operators know
        summary = Dataset(
            "reports/revenue/date={date}",
            "//jobs:build_revenue_report",
            False,
            600.0,
            _SPARK + (("JOB_MEMORY", "16g"),),
        )
        regional = Dataset(
            "reports/stockouts/date={date}/region={dim}",
            "//jobs:detect_stockouts",
            False,
            240.0,
            _SPARK + (("JOB_MEMORY", "4g"),),
        )
    else:
        summary = Dataset(
            f"reports/{domain}_summary/date={{date}}",
            f"//jobs:build_{domain}_summary",
            False,
            400.0,
            _SPARK + (("JOB_MEMORY", "8g"),),
        )
        regional = Dataset(
            f"reports/{domain}_anomalies/date={{date}}/region={{dim}}",
            f"//jobs:detect_{domain}_anomalies",
            False,
            200.0,
            _SPARK + (("JOB_MEMORY", "4g"),),
        )
    return (
        Dataset(
            f"data/raw/{domain}/date={{date}}/region={{dim}}",
            f"//jobs:ingest_{domain}",
            False,
            150.0,
            (("SOURCE_BUCKET", f"s3://exports-{domain.replace('_', '-')}"), ("JOB_MEMORY", "2g")),
        ),
        Dataset(
            f"data/{domain}/daily/date={{date}}/region={{dim}}",
            f"//jobs:aggregate_{domain}_daily",
            False,
            420.0,
            _SPARK + (("JOB_MEMORY", "8g"),),
        ),
        summary,
        regional,
    )


DATASETS = (
    Dataset(
        "data/raw/fx_rates/date={date}",
        "//jobs:ingest_fx_rates",
        False,
        20.0,
        (("FX_API_URL", "https://fx.internal/v2/rates"), ("JOB_MEMORY", "512m")),
    ),
    Dataset(
        "data/inventory/snapshot/date={date}/warehouse={dim}",
        "//jobs:snapshot_inventory",
        True,
        300.0,
        (("WMS_DSN", "postgres://wms-replica/wms"), ("JOB_MEMORY", "4g")),
    ),
) + tuple(dataset for domain in DOMAINS for dataset in _domain_datasets(domain))


class PartitionKey(NamedTuple):
    """One partition of the catalogue; `Dataset.ref_template` turns it into its partition_ref."""

    dataset: int  # index into DATASETS
    date: str  # "YYYY-MM-DD"
    dim: str  # the dimension value (region, warehouse), or ""


def domains_for(n_events: int, days: int) -> int:
    return max(1, min(len(DOMAINS), math.ceil(n_events / days / _EVENTS_PER_DAY_PER_DOMAIN)))


def inputs_of(key: PartitionKey) -> list[tuple[PartitionKey, DepType]]:
    """The partitions a partition is built from, with their dependency type."""
    dataset, date, dim = key
    if dataset < 2:
        return []
    domain, kind = divmod(dataset - 2, 4)
    if kind == DAILY:
        return [(PartitionKey(dataset - 1, date, dim), MATERIALIZE), (PartitionKey(FX_RATES, date, ""), QUERY)]
    if kind == SUMMARY:
        return [(PartitionKey(dataset - 1, date, region), MATERIALIZE) for region in REGIONS]
    if kind == REGIONAL:
        inputs = [(PartitionKey(dataset - 2, date, dim), MATERIALIZE)]
        if domain == 0:  # stockouts compare sales with the warehouses' stock
            inputs += [(PartitionKey(INVENTORY, date, warehouse), QUERY) for warehouse in WAREHOUSES[dim]]
        return inputs
    return []


def downstream_of(key: PartitionKey, n_domains: int) -> list[PartitionKey]:
    """The partitions built directly from `key` (the inverse of `inputs_of`) in the first `n_domains` domains."""
    dataset, date, dim = key
    if dataset == FX_RATES:
        return [
            PartitionKey(dataset_index(domain, DAILY), date, region)
            for domain in range(n_domains)
            for region in REGIONS
        ]
    if dataset == INVENTORY:
        return [PartitionKey(dataset_index(0, REGIONAL), date, REGION_OF_WAREHOUSE[dim])]
    kind = (dataset - 2) % 4
    if kind == RAW:
        return [PartitionKey(dataset + 1, date, dim)]
    if kind == DAILY:
        return [PartitionKey(dataset + 1, date, ""), PartitionKey(dataset + 2, date, dim)]
    return []
