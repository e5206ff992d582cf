"""Deterministic, realistic DataBuild workloads: event streams and JSON Lines landing files for tests and benchmarks.

Benchmarks and tests need logs that look like a busy DataBuild graph service (overlapping build
requests, failed jobs retried later, delegation to concurrent builds, invalidations, cancellations)
and landing files that look like real writers' output (late arrivals, redeliveries, broken lines).
The same seed always gives the same bytes. `catalogue.py` holds the datasets the simulated graph
builds, `simulation.py` the build requests, `landing_files.py` the files.
"""

from databuild_assets.workload.event_stream import DEFAULT_START_NS, generate_events
from databuild_assets.workload.landing_files import DEFAULT_LATE_ARRIVAL_RATE, WorkloadSummary, write_landing_files

__all__ = [
    "DEFAULT_LATE_ARRIVAL_RATE",
    "DEFAULT_START_NS",
    "WorkloadSummary",
    "generate_events",
    "write_landing_files",
]
