"""The read models of the Build Event Log (EVENTS.md, Projections) as pure Spark functions.

`PROJECTIONS` maps each table name to its `Projection`: how to build it from events, and how
to fold new events into the per-key state its rows are stored with.

    rows = PROJECTIONS["partition_state"].build(visible_events)
"""

from databuild_assets.projections.build_requests import BUILD_REQUESTS
from databuild_assets.projections.job_runs import JOB_RUNS
from databuild_assets.projections.partition_state import PARTITION_STATE
from databuild_assets.projections.projection import Projection

PROJECTIONS: dict[str, Projection] = {
    projection.name: projection for projection in (PARTITION_STATE, JOB_RUNS, BUILD_REQUESTS)
}

__all__ = ["BUILD_REQUESTS", "JOB_RUNS", "PARTITION_STATE", "PROJECTIONS", "Projection"]
