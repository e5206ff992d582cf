"""The projections domain: partition_state, job_runs and build_requests, refreshed from the event log."""
