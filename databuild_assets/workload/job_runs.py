"""One job run of a simulated build request: its timeline, its outcome (completed, failed, timed
out, cancelled with its build, skipped) and the job, task-cancel and partition events it leaves.
`simulation.py` plans the runs and calls these in order, with its one random generator.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from databuild_assets.events.enums import JobStatus, PartitionStatus
from databuild_assets.workload.catalogue import DATASETS, DepType, PartitionKey

NS = 1_000_000_000
_MAX_QUEUE_S = 180.0
_MAX_RUN_S = 2400.0

# Outcome probabilities of one job run.
_JOB_FAILURE_RATE = 0.05
_JOB_TIMEOUT_RATE = 0.01

_FAILURE_MESSAGES = (
    "exit code 1: AnalysisException: Path does not exist: {source}",
    "exit code 137: container OOMKilled (limit {memory})",
    "exit code 1: schema mismatch: column 'amount' is DECIMAL(18,2) upstream, expected DECIMAL(12,2)",
    "exit code 2: upstream export incomplete: _SUCCESS marker missing",
    "exit code 1: S3 SlowDown: reduce your request rate (after 5 retries)",
)
_BUILD_CANCEL_REASONS = (
    "cancelled by alice@example.com",
    "cancelled by bob@example.com: wrong date range",
    "superseded by a newer build request",
    "cancelled by operator: maintenance window",
)

_JS = {member: member.name for member in JobStatus}


class BuildEvent(NamedTuple):
    """One event of a build request as the simulation makes it, before it has an event_id."""

    timestamp: int
    event_type: str
    payload: dict


class JobConfig(NamedTuple):
    """A job's JobConfig as JSON text, and its inputs and outputs as JSON (for its manifests)."""

    config_json: str
    inputs_json: str
    outputs_json: str


@dataclass
class Job:
    """One planned job run and its simulated timeline (ns); `outcome` names its terminal JobStatus."""

    job_run_id: str
    dataset: int
    outputs: list[PartitionKey]
    inputs: list[tuple[PartitionKey, DepType]]
    scheduled: int = 0
    running: int = 0
    end: int = 0
    outcome: JobStatus = JobStatus.JOB_COMPLETED
    message: str = ""
    cancelled_at: int = 0  # a task_cancel_event's time, for timeouts and cancelled builds


def run_job(rng: random.Random, job: Job, ready_at: int, ref: Callable[[PartitionKey], str]) -> None:
    """Schedule, run and finish `job` once its inputs are ready at `ready_at`: its timeline and outcome."""
    job.scheduled = ready_at + int(rng.uniform(0.01, 2.0) * NS)
    queue_s = min(rng.lognormvariate(math.log(5.0), 1.0), _MAX_QUEUE_S) + 0.2
    job.running = job.scheduled + int(queue_s * NS)
    run_s = min(rng.lognormvariate(math.log(DATASETS[job.dataset].median_run_s), 0.5), _MAX_RUN_S) + 1.0
    draw = rng.random()
    if draw < _JOB_FAILURE_RATE:
        job.outcome = JobStatus.JOB_FAILED
        job.end = job.running + int(run_s * rng.random() * NS) + NS
        dataset = DATASETS[job.dataset]
        job.message = rng.choice(_FAILURE_MESSAGES).format(
            source=ref(job.outputs[0]).replace("data/", "s3://lake/", 1),
            memory=dict(dataset.env)["JOB_MEMORY"],
        )
    elif draw < _JOB_FAILURE_RATE + _JOB_TIMEOUT_RATE:
        job.outcome = JobStatus.JOB_CANCELLED
        timeout_s = rng.choice((600, 900, 1800))
        job.cancelled_at = job.running + timeout_s * NS
        job.end = job.cancelled_at + int(rng.uniform(0.5, 5.0) * NS)
        job.message = f"Cancelled: exceeded timeout of {timeout_s // 60}m"
    else:
        job.outcome = JobStatus.JOB_COMPLETED
        job.end = job.running + int(run_s * NS)
        job.message = "Job completed"


def cancel_jobs(rng: random.Random, jobs: list[Job], cancelled_at: int, events: list) -> int:
    """A person cancels the build at `cancelled_at`: jobs under way are cancelled, jobs not yet
    scheduled never start. Returns the time the last job stopped."""
    events.append(BuildEvent(cancelled_at, "build_cancel_event", {"reason": rng.choice(_BUILD_CANCEL_REASONS)}))
    last = cancelled_at
    for job in jobs:
        if job.end <= cancelled_at:
            continue
        if job.outcome != JobStatus.JOB_SKIPPED and job.scheduled <= cancelled_at:
            job.cancelled_at = cancelled_at + int(rng.uniform(0.001, 0.05) * NS)
            job.end = job.cancelled_at + int(rng.uniform(0.5, 5.0) * NS)
            job.message = "Cancelled: build request cancelled"
        else:  # never started: no job events, its partitions fail
            job.scheduled = 0
            job.end = cancelled_at + int(rng.uniform(0.1, 1.0) * NS)
            job.message = "Not built: build request cancelled"
        if job.running > cancelled_at:
            job.running = 0
        job.outcome = JobStatus.JOB_CANCELLED
        last = max(last, job.end)
    return last


def emit_job_events(
    rng: random.Random,
    job: Job,
    config: JobConfig,
    cancelled_at: int | None,
    events: list,
    partition_status: Callable,
    ref: Callable[[PartitionKey], str],
) -> None:
    """Append to `events` the events of `job` and, through `partition_status`, of the partitions it builds."""
    label = DATASETS[job.dataset].job_label
    targets = [ref(key) for key in job.outputs]
    config_json = config.config_json

    def job_status(ts: int, status: JobStatus, message: str, manifests: str | None = None) -> None:
        payload = {
            "job_run_id": job.job_run_id,
            "job_label": label,
            "target_partitions": list(targets),
            "status_code": int(status),
            "status_name": _JS[status],
            "message": message,
            "config": config_json,
        }
        if manifests is not None:
            payload["manifests"] = manifests
        events.append(BuildEvent(ts, "job_event", payload))

    def partitions(ts: int, status: PartitionStatus, message: str) -> None:
        for key in job.outputs:
            partition_status(ts, key, status, message, job.job_run_id)

    outcome = job.outcome
    never_started = cancelled_at is not None and outcome == JobStatus.JOB_CANCELLED and not job.scheduled
    if outcome == JobStatus.JOB_SKIPPED or never_started:
        if outcome == JobStatus.JOB_SKIPPED:
            job_status(job.end, JobStatus.JOB_SKIPPED, job.message)
        partitions(job.end, PartitionStatus.PARTITION_FAILED, job.message)
    else:
        job_status(job.scheduled, JobStatus.JOB_SCHEDULED, "Job scheduled")
        partitions(job.scheduled, PartitionStatus.PARTITION_SCHEDULED, "Job scheduled")
        if job.running:
            job_status(job.running, JobStatus.JOB_RUNNING, "Job running")
            partitions(job.running, PartitionStatus.PARTITION_BUILDING, "Building")
        if outcome == JobStatus.JOB_COMPLETED:
            manifests = (
                '[{"outputs":%s,"inputs":%s,"start_time":%d,"end_time":%d,"task":{"job":{"label":"%s"},'
                '"config":%s},"metadata":{"rows_written":"%d","bytes_written":"%d"}}]'
                % (
                    config.outputs_json,
                    config.inputs_json,
                    job.running // NS,
                    job.end // NS,
                    label,
                    config_json,
                    rng.randint(1_000, 5_000_000),
                    rng.randint(100_000, 2_000_000_000),
                )
            )
            job_status(job.end, JobStatus.JOB_COMPLETED, job.message, manifests)
            partitions(job.end, PartitionStatus.PARTITION_AVAILABLE, "Partition available")
        elif outcome == JobStatus.JOB_FAILED:
            job_status(job.end, JobStatus.JOB_FAILED, f"Job failed: {job.message}")
            partitions(job.end, PartitionStatus.PARTITION_FAILED, f"Job failed: {job.message}")
        else:  # cancelled: by a timeout or with its build request
            events.append(
                BuildEvent(
                    job.cancelled_at,
                    "task_cancel_event",
                    {"job_run_id": job.job_run_id, "reason": job.message.removeprefix("Cancelled: ")},
                )
            )
            job_status(job.end, JobStatus.JOB_CANCELLED, job.message)
            partitions(job.end, PartitionStatus.PARTITION_FAILED, job.message)
