"""Deterministic, realistic DataBuild workloads: event streams and JSON Lines landing files for tests and benchmarks."""

from databuild_assets.workload.generator import (
    DEFAULT_LATE_ARRIVAL_RATE,
    DEFAULT_START_NS,
    WorkloadSummary,
    generate_events,
    write_landing_files,
)

__all__ = [
    "DEFAULT_LATE_ARRIVAL_RATE",
    "DEFAULT_START_NS",
    "WorkloadSummary",
    "generate_events",
    "write_landing_files",
]
