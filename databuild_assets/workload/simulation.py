"""The simulated DataBuild graph service: build requests arrive over a window of days, overlap,
plan jobs over the data catalogue (`catalogue.py`), delegate partitions to concurrent builds, fail
and are retried, invalidated and cancelled; each job run's timeline and events are `job_runs.py`'s.
`event_stream.py` releases their events in time order.

    simulation = Simulation(n_events=5_000, seed=1, days=3, start_ns=1_794_960_000 * 10**9)
    events = simulation.build("br-1", simulation.next_arrival(0))  # one build request, unsorted
"""

from __future__ import annotations

import itertools
import math
import random
from bisect import bisect_right
from collections import deque
from datetime import datetime, timedelta
from typing import NamedTuple

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.workload.catalogue import (
    DAILY,
    DATASETS,
    FX_RATES,
    INVENTORY,
    RAW,
    REGION_OF_WAREHOUSE,
    REGIONAL,
    REGIONS,
    SUMMARY,
    PartitionKey,
    dataset_index,
    domains_for,
    downstream_of,
    inputs_of,
)
from databuild_assets.workload.encoding import encode_json, uuid4
from databuild_assets.workload.job_runs import NS as _NS
from databuild_assets.workload.job_runs import BuildEvent, Job, JobConfig, cancel_jobs, emit_job_events, run_job

_HOUR_NS = 3600 * _NS
_DAY_NS = 24 * _HOUR_NS
# No build request outlives this, by construction: it runs at most three layers of jobs (raw, daily,
# report), each within job_runs' `_MAX_QUEUE_S + _MAX_RUN_S` plus seconds, and an input it delegates is ready
# within its owner's (earlier) layers. Arrivals stop this long before the window's end.
_MAX_BUILD_SPAN_NS = 3 * _HOUR_NS
# A build request delegates a partition only if its owner is still this far from finishing it.
_DELEGATION_MARGIN_NS = 5 * _NS
# Builds request partitions of yesterday mostly, and backfill up to this many days back.
_BACKFILL_DAYS = 90

# Relative build-request arrival rate by hour of day (UTC): the nightly batch, then office hours.
_HOURLY_ARRIVAL_WEIGHTS = (3, 6, 8, 8, 6, 4, 2, 2, 3, 4, 4, 4, 3, 4, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2)

# Build-request mix.
_BUILD_CANCEL_RATE = 0.03
_DRY_RUN_RATE = 0.04
_BURST_RATE = 0.2  # a request arrives seconds after the previous one (a trigger storm)

_RESTATEMENT_REASONS = (
    "upstream correction: POS export re-delivered",
    "data quality check failed: duplicate order ids",
    "late-arriving records for this date",
)

# status_name of every status code, precomputed: the event model's enums are the one source.
_BR = {member: member.name for member in BuildRequestStatus}
_PS = {member: member.name for member in PartitionStatus}


class Attempt(NamedTuple):
    """The latest attempt at building a partition, as later build requests see it."""

    build_request_id: str
    job_run_id: str
    start_ns: int
    end_ns: int
    available: bool  # it ended with the partition available


class Readiness(NamedTuple):
    """When an input of a job is ready, and whether it is usable then (not failed)."""

    at: int
    ok: bool


# --- Simulating build requests -------------------------------------------------------------------


class Simulation:
    """Generates build requests one after another in arrival order, each completely (its future
    included), and remembers just enough (the latest attempt per partition, recent failures and
    recent builds) for later requests to delegate, retry and invalidate. Memory is bounded by the
    partition catalog, not by the number of events."""

    def __init__(self, n_events: int, seed: int, days: int, start_ns: int) -> None:
        self.rng = random.Random(seed)
        self.n_events = n_events
        self.n_domains = domains_for(n_events, days)
        # Zipf: the first domains (sales first) see most of the build requests, as in any company.
        self.domain_indexes = range(self.n_domains)
        self.domain_weights = list(itertools.accumulate(1 / (rank + 1) for rank in self.domain_indexes))
        self.end_ns = start_ns
        self.window_start_ns = start_ns - days * _DAY_NS
        arrival_window_ns = max(days * _DAY_NS - _MAX_BUILD_SPAN_NS, _HOUR_NS)
        self.last_arrival_ns = self.window_start_ns + arrival_window_ns
        # Cumulative arrival weight at each hour boundary, for inverse-CDF arrival times.
        hours = math.ceil(arrival_window_ns / _HOUR_NS)
        first_hour = (self.window_start_ns // _HOUR_NS) % 24
        self.cumulative_weight = [0]
        for hour in range(hours):
            weight = _HOURLY_ARRIVAL_WEIGHTS[(first_hour + hour) % 24]
            self.cumulative_weight.append(self.cumulative_weight[-1] + weight)
        self.arrival_ns = self.window_start_ns
        self.previous_goal: list[PartitionKey] = []
        self.attempts: dict[PartitionKey, Attempt] = {}  # the latest attempt at each partition
        self.recent_failed: deque[tuple[PartitionKey, int]] = deque(maxlen=64)
        self.recent_available: deque[tuple[PartitionKey, int]] = deque(maxlen=256)
        self.refs: dict[PartitionKey, str] = {}
        self.configs: dict[tuple, JobConfig] = {}
        self.dates: dict[int, str] = {}

    # Small lookups, cached because the catalog is small and they run for every event.

    def ref(self, key: PartitionKey) -> str:
        ref = self.refs.get(key)
        if ref is None:
            ref = self.refs[key] = DATASETS[key.dataset].ref_template.format(date=key.date, dim=key.dim)
        return ref

    def date(self, day_number: int) -> str:
        date = self.dates.get(day_number)
        if date is None:
            date = self.dates[day_number] = (datetime(1970, 1, 1) + timedelta(days=day_number)).strftime("%Y-%m-%d")
        return date

    def job_config(self, job: Job) -> JobConfig:
        """The JobConfig JSON of `job`, with its inputs and outputs JSON: computed once per shape."""
        cache_key = (job.dataset, tuple(job.outputs))
        cached = self.configs.get(cache_key)
        if cached is not None:
            return cached
        dataset = DATASETS[job.dataset]
        outputs = [{"str": self.ref(key)} for key in job.outputs]
        inputs = [
            {"dep_type_code": code, "dep_type_name": name, "partition_ref": {"str": self.ref(key)}}
            for key, (code, name) in job.inputs
        ]
        date = job.outputs[0].date
        args = ["--date", date]
        dims = [key.dim for key in job.outputs if key.dim]
        if dims:
            args += ["--" + dataset.ref_template.rsplit("/", 1)[1].split("=")[0], ",".join(dims)]
        env = {"DATABUILD_JOB_LABEL": dataset.job_label, "PARTITION_DATE": date, **dict(dataset.env)}
        config = {"outputs": outputs, "inputs": inputs, "args": args, "env": env}
        cached = JobConfig(encode_json(config), encode_json(inputs), encode_json(outputs))
        if len(self.configs) > 100_000:  # bounded: shapes repeat, but backfills add dates
            self.configs.clear()
        self.configs[cache_key] = cached
        return cached

    # Arrivals and goals.

    def next_arrival(self, emitted: int) -> int:
        """The next build request's arrival: the arrival-rate curve at the share of events emitted
        so far, so that the builds spread over the window whatever their sizes; some arrive in bursts."""
        rng = self.rng
        target = emitted / self.n_events * self.cumulative_weight[-1]
        hour = min(bisect_right(self.cumulative_weight, target) - 1, len(self.cumulative_weight) - 2)
        low, high = self.cumulative_weight[hour], self.cumulative_weight[hour + 1]
        on_curve = self.window_start_ns + hour * _HOUR_NS + int((target - low) / (high - low) * _HOUR_NS)
        previous = self.arrival_ns
        if previous > self.window_start_ns and rng.random() < _BURST_RATE:
            # Seconds after the previous request, but never more than 90 s ahead of the curve:
            # at high rates, bursts must not push arrivals (and the pending events) ahead of it.
            arrival = min(previous + int(rng.uniform(1, 90) * _NS), max(previous, on_curve + 90 * _NS))
        else:
            arrival = max(previous, on_curve + int(rng.random() * 60 * _NS))  # near the curve, not on it
        self.arrival_ns = min(arrival, self.last_arrival_ns)
        return self.arrival_ns

    def pick_date(self, now_ns: int) -> str:
        today = now_ns // _DAY_NS
        draw = self.rng.random()
        if draw < 0.75:
            return self.date(today - 1)
        if draw < 0.9:
            return self.date(today - 2)
        return self.date(today - self.rng.randint(3, _BACKFILL_DAYS))

    def pick_goal(self, now_ns: int) -> tuple[list[PartitionKey], list[PartitionKey], str]:
        """(requested partitions, partitions to invalidate first, invalidation reason)."""
        rng = self.rng
        draw = rng.random()
        if draw < 0.10:
            failed = self._retry_candidates(now_ns)
            if failed:
                return rng.sample(failed, min(len(failed), rng.randint(1, 3))), [], ""
        elif draw < 0.15:
            restatement = self._restatement(now_ns)
            if restatement:
                return restatement
        date = self.pick_date(now_ns)
        domain = rng.choices(self.domain_indexes, cum_weights=self.domain_weights)[0]
        draw = rng.random()
        if draw < 0.22:
            keys = [
                PartitionKey(dataset_index(domain, RAW), date, region)
                for region in rng.sample(REGIONS, rng.randint(1, 4))
            ]
            if rng.random() < 0.3:
                keys.append(PartitionKey(FX_RATES, date, ""))
            return keys, [], ""
        if draw < 0.50:
            regions = rng.sample(REGIONS, rng.randint(1, 4))
            return [PartitionKey(dataset_index(domain, DAILY), date, region) for region in regions], [], ""
        if draw < 0.68:
            return [PartitionKey(dataset_index(domain, SUMMARY), date, "")], [], ""
        if draw < 0.85:
            regions = rng.sample(REGIONS, rng.randint(1, 2))
            return [PartitionKey(dataset_index(domain, REGIONAL), date, region) for region in regions], [], ""
        return [PartitionKey(INVENTORY, date, warehouse) for warehouse in REGION_OF_WAREHOUSE], [], ""

    def _retry_candidates(self, now_ns: int) -> list[PartitionKey]:
        """Partitions whose latest attempt failed before now, newest first: someone retries them."""
        candidates: dict[PartitionKey, None] = {}
        for key, failed_at in reversed(self.recent_failed):
            attempt = self.attempts[key]
            if failed_at < now_ns and not attempt.available and attempt.end_ns < now_ns:
                candidates[key] = None
                if len(candidates) == 8:
                    break
        return list(candidates)

    def _restatement(self, now_ns: int) -> tuple[list[PartitionKey], list[PartitionKey], str] | None:
        """Invalidate an available partition and everything built from it, then rebuild it and its
        direct descendants; reports further down stay invalidated until someone asks for them."""
        rng = self.rng
        for _ in range(3):
            if not self.recent_available:
                return None
            key, _available_at = self.recent_available[rng.randrange(len(self.recent_available))]
            if self._is_available(key, now_ns):
                break
        else:
            return None
        invalidate = [key]
        frontier = [key]
        while frontier:
            for child in downstream_of(frontier.pop(), self.n_domains):
                if child not in invalidate and self._is_available(child, now_ns):
                    invalidate.append(child)
                    frontier.append(child)
        rebuild = [key] + [child for child in downstream_of(key, self.n_domains) if child in invalidate]
        return rebuild, invalidate, rng.choice(_RESTATEMENT_REASONS)

    def _is_available(self, key: PartitionKey, now_ns: int) -> bool:
        attempt = self.attempts.get(key)
        return attempt is not None and attempt.available and attempt.end_ns < now_ns

    # One build request, start to finish.

    def build(self, build_request_id: str, arrival_ns: int) -> list[BuildEvent]:
        """Every event of one build request, unsorted."""
        rng = self.rng
        events: list[BuildEvent] = []
        if self.previous_goal and rng.random() < _BURST_RATE * 0.5:
            requested, invalidate, reason = list(self.previous_goal), [], ""  # the same request, twice
        else:
            requested, invalidate, reason = self.pick_goal(arrival_ns)
        self.previous_goal = requested
        requested_refs = [self.ref(key) for key in requested]
        n_requested = len(requested_refs)

        def request_status(ts: int, status: BuildRequestStatus, message: str) -> None:
            payload = {
                "status_code": int(status),
                "status_name": _BR[status],
                "requested_partitions": list(requested_refs),
                "message": message,
            }
            events.append(BuildEvent(ts, "build_request_event", payload))

        def partition_status(
            ts: int, key: PartitionKey, status: PartitionStatus, message: str, job_run_id: str | None
        ) -> None:
            payload = {
                "partition_ref": self.ref(key),
                "status_code": int(status),
                "status_name": _PS[status],
                "message": message,
            }
            if job_run_id is not None:
                payload["job_run_id"] = job_run_id
            events.append(BuildEvent(ts, "partition_event", payload))

        t = arrival_ns
        request_status(
            t,
            BuildRequestStatus.BUILD_REQUEST_RECEIVED,
            f"Build request received for {n_requested} partition{'s' if n_requested > 1 else ''}",
        )
        for key in invalidate:
            t += int(rng.uniform(0.001, 0.05) * _NS)
            events.append(
                BuildEvent(t, "partition_invalidation_event", {"partition_ref": self.ref(key), "reason": reason})
            )
            self.attempts[key] = self.attempts[key]._replace(end_ns=t, available=False)
        t += int(rng.uniform(0.005, 0.2) * _NS)
        request_status(t, BuildRequestStatus.BUILD_REQUEST_PLANNING, "Starting build planning")

        t_plan = t + int(rng.uniform(0.2, 3.0) * _NS)
        to_build, delegated = self._plan(requested, t_plan)
        jobs = self._jobs(to_build)
        configs = [self.job_config(job) for job in jobs]
        nodes = ",".join(
            '{"job":{"label":"%s"},"config":%s}' % (DATASETS[job.dataset].job_label, config.config_json)
            for job, config in zip(jobs, configs, strict=True)
        )
        job_graph = '{"label":{"label":"//:databuild_graph"},"outputs":%s,"nodes":[%s]}' % (
            encode_json([{"str": ref} for ref in requested_refs]),
            nodes,
        )
        n_partitions = sum(len(job.outputs) for job in jobs)
        events.append(
            BuildEvent(
                t_plan,
                "job_graph_event",
                {
                    "job_graph": job_graph,
                    "message": f"Planned {len(jobs)} jobs for {n_partitions} partitions, {len(delegated)} delegated",
                },
            )
        )
        t = t_plan

        if rng.random() < _DRY_RUN_RATE:  # `databuild analyze`: plan only
            t += int(rng.uniform(0.001, 0.05) * _NS)
            request_status(
                t,
                BuildRequestStatus.BUILD_REQUEST_ANALYSIS_COMPLETED,
                f"Analysis completed: would run {len(jobs)} jobs for {n_partitions} partitions",
            )
            return events

        t += int(rng.uniform(0.001, 0.05) * _NS)
        t_requested = t
        for key in to_build:
            partition_status(t, key, PartitionStatus.PARTITION_REQUESTED, "Partition requested", None)
        for key, attempt in delegated.items():
            owner = attempt.build_request_id
            t += int(rng.uniform(0.001, 0.02) * _NS)
            ref = self.ref(key)
            events.append(
                BuildEvent(
                    t,
                    "delegation_event",
                    {
                        "partition_ref": ref,
                        "delegated_to_build_request_id": owner,
                        "message": f"Partition is already being built by build request {owner}",
                    },
                )
            )
            partition_status(
                t, key, PartitionStatus.PARTITION_DELEGATED, f"Delegated to build request {owner}", attempt.job_run_id
            )
        t += int(rng.uniform(0.01, 0.5) * _NS)
        t_executing = t
        request_status(t, BuildRequestStatus.BUILD_REQUEST_EXECUTING, f"Executing {len(jobs)} jobs")

        # Each job runs when its inputs are ready: built here, by a delegate, or already available.
        ready = {key: Readiness(attempt.end_ns, attempt.available) for key, attempt in delegated.items()}
        for job in jobs:
            ready_at, failed_input = t_executing, None
            for key, _dep in job.inputs:
                at, ok = ready.get(key, Readiness(t_executing, True))
                if not ok:
                    failed_input = key if failed_input is None else failed_input
                ready_at = max(ready_at, at)
            if failed_input is not None:
                job.outcome = JobStatus.JOB_SKIPPED
                job.end = ready_at + int(rng.uniform(0.01, 0.5) * _NS)
                job.message = f"Skipped: input {self.ref(failed_input)} failed"
            else:
                run_job(rng, job, ready_at, self.ref)
            ok = job.outcome == JobStatus.JOB_COMPLETED
            for key in job.outputs:
                ready[key] = Readiness(job.end, ok)

        cancelled_at = None
        last_end = max(
            [job.end for job in jobs] + [ready[key].at for key in requested if key in delegated] + [t_executing]
        )
        if jobs and rng.random() < _BUILD_CANCEL_RATE:
            cancelled_at = t_executing + int(rng.random() * (last_end - t_executing)) + 1
            last_end = cancel_jobs(rng, jobs, cancelled_at, events)

        for job, config in zip(jobs, configs, strict=True):
            emit_job_events(rng, job, config, cancelled_at, events, partition_status, self.ref)
            ok = job.outcome == JobStatus.JOB_COMPLETED
            for key in job.outputs:
                self.attempts[key] = Attempt(build_request_id, job.job_run_id, t_requested, job.end, ok)
                (self.recent_available if ok else self.recent_failed).append((key, job.end))

        # Terminal status, and what later build requests will see.
        failed = [key for job in jobs for key in job.outputs if job.outcome != JobStatus.JOB_COMPLETED]
        failed += [key for key in requested if key in delegated and not delegated[key].available]
        t = last_end + int(rng.uniform(0.01, 1.0) * _NS)
        if cancelled_at is not None:
            request_status(t, BuildRequestStatus.BUILD_REQUEST_CANCELLED, "Build request cancelled")
        elif failed:
            request_status(
                t,
                BuildRequestStatus.BUILD_REQUEST_FAILED,
                f"Build request failed: {len(failed)} of {n_partitions + len(delegated)} partitions failed",
            )
        else:
            request_status(
                t,
                BuildRequestStatus.BUILD_REQUEST_COMPLETED,
                f"Build request completed: {n_requested} requested partitions available",
            )
        return events

    def _plan(
        self, requested: list[PartitionKey], t_plan: int
    ) -> tuple[dict[PartitionKey, None], dict[PartitionKey, Attempt]]:
        """(partitions to build, inputs first; partitions delegated, with the attempt they wait for).

        The requested partitions are always rebuilt, their inputs only when not available. A
        partition another build request is building at `t_plan` is delegated to it (when it is not
        about to finish: a delegation must come before the owner's terminal partition event)."""
        to_build: dict[PartitionKey, None] = {}
        delegated: dict[PartitionKey, Attempt] = {}
        attempts = self.attempts

        def visit(key: PartitionKey, is_requested: bool) -> None:
            if key in to_build or key in delegated:
                return
            attempt = attempts.get(key)
            if attempt is not None:
                if attempt.start_ns <= t_plan and t_plan + _DELEGATION_MARGIN_NS < attempt.end_ns:
                    delegated[key] = attempt
                    return
                if not is_requested and attempt.available and attempt.end_ns <= t_plan:
                    return
            for input_key, _dep in inputs_of(key):
                visit(input_key, False)
            to_build[key] = None  # post-order: inputs first

        for key in requested:
            visit(key, True)
        return to_build, delegated

    def _jobs(self, to_build: dict[PartitionKey, None]) -> list[Job]:
        """One job run per partition, or per date for datasets built a date at a time; inputs first."""
        rng = self.rng
        jobs: list[Job] = []
        job_of_date: dict[tuple[int, str], Job] = {}
        for key in to_build:
            per_date = DATASETS[key.dataset].job_per_date
            if per_date and (key.dataset, key.date) in job_of_date:
                job = job_of_date[key.dataset, key.date]
                job.outputs.append(key)
                job.inputs += inputs_of(key)
                continue
            job = Job(uuid4(rng), key.dataset, [key], inputs_of(key))
            jobs.append(job)
            if per_date:
                job_of_date[key.dataset, key.date] = job
        return jobs


def check_workload(n_events: int, days: int, start_ns: int) -> None:
    """Refuse a workload the simulation cannot make, saying which argument is wrong."""
    if n_events < 0:
        raise ValueError(f"n_events is {n_events}; it must be 0 or more")
    if days < 1:
        raise ValueError(f"days is {days}; the workload needs at least 1 day to spread its build requests over")
    if start_ns - days * _DAY_NS < 0:
        raise ValueError(
            f"start_ns {start_ns} is too early: timestamps are Unix epoch nanoseconds, so the "
            f"{days}-day window must start after 1970"
        )
