"""A deterministic, realistic DataBuild workload: event streams and JSON Lines landing files.

Benchmarks and tests need logs that look like a busy DataBuild graph service (overlapping build
requests, failed jobs retried later, delegation to concurrent builds, invalidations, cancellations)
and landing files that look like real writers' output (late arrivals, redeliveries, broken lines).
The same seed always gives the same bytes.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import random
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from json.encoder import c_make_encoder, encode_basestring_ascii
from pathlib import Path

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus

# The workload ends here (2026-11-18T00:00:00Z) unless told otherwise, so that output is reproducible.
DEFAULT_START_NS = 1_794_960_000 * 1_000_000_000
# Share of events a writer hands over late, in a later file than their neighbours in time.
DEFAULT_LATE_ARRIVAL_RATE = 0.002

_NS = 1_000_000_000
_HOUR_NS = 3600 * _NS
_DAY_NS = 24 * _HOUR_NS
# No build request outlives this, by construction: it runs at most three layers of jobs (raw, daily,
# report), each within `_MAX_QUEUE_S + _MAX_RUN_S` plus seconds, and an input it delegates is ready
# within its owner's (earlier) layers. Arrivals stop this long before the window's end.
_MAX_BUILD_SPAN_NS = 3 * _HOUR_NS
_MAX_QUEUE_S = 180.0
_MAX_RUN_S = 2400.0
# A build request delegates a partition only if its owner is still this far from finishing it.
_DELEGATION_MARGIN_NS = 5 * _NS
# Builds request partitions of yesterday mostly, and backfill up to this many days back.
_BACKFILL_DAYS = 90

# Relative build-request arrival rate by hour of day (UTC): the nightly batch, then office hours.
_HOURLY_ARRIVAL_WEIGHTS = (3, 6, 8, 8, 6, 4, 2, 2, 3, 4, 4, 4, 3, 4, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2)

# Outcome probabilities of one job run.
_JOB_FAILURE_RATE = 0.05
_JOB_TIMEOUT_RATE = 0.01
# Build-request mix.
_BUILD_CANCEL_RATE = 0.03
_DRY_RUN_RATE = 0.04
_BURST_RATE = 0.2  # a request arrives seconds after the previous one (a trigger storm)

# uuid.UUID(int=bits, version=4), without the object: clear then set the version and variant bits.
_UUID_CLEAR = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_UUID_SET = (4 << 76) | (0x8000 << 48)


def _json_encoder():
    """`json.dumps(obj, separators=(",", ":"))`, without rebuilding the C encoder on every call
    (which is half the cost for small objects). The output is byte for byte the same."""
    if c_make_encoder is None:  # no C accelerator: the plain way
        return json.JSONEncoder(separators=(",", ":")).encode

    def unsupported(value):
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    # No circular-reference check: events are trees built here.
    encoder = c_make_encoder(None, unsupported, encode_basestring_ascii, None, ":", ",", False, False, True)
    join = "".join
    return lambda value: join(encoder(value, 0))


_encode = _json_encoder()


def _uuid4(rng: random.Random) -> str:
    """A version-4 UUID string drawn from `rng`: deterministic for the seed, unlike uuid.uuid4()."""
    h = "%032x" % ((rng.getrandbits(128) & _UUID_CLEAR) | _UUID_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# --- The data catalog the simulated graph builds -------------------------------------------------

REGIONS = ("eu", "us", "apac", "latam")
WAREHOUSES = {"eu": ("ams1", "fra2"), "us": ("iad1", "sfo3"), "apac": ("sin1", "nrt2"), "latam": ("gru1", "mex1")}
_REGION_OF_WAREHOUSE = {w: r for r, ws in WAREHOUSES.items() for w in ws}

# DataBuild's DepType: MATERIALIZE inputs must be built first, QUERY inputs are only read.
_QUERY, _MATERIALIZE = (0, "QUERY"), (1, "MATERIALIZE")


@dataclass(frozen=True)
class _Dataset:
    """One partitioned dataset and the job that builds it."""

    ref_template: str  # formatted with date= and dim=
    job_label: str
    job_per_date: bool  # one job run builds all of a date's partitions (e.g. one inventory snapshot)
    median_run_s: float
    env: tuple[tuple[str, str], ...]


# Business domains, each with the same shape of datasets. A workload uses as many as its rate of
# build requests needs (see `_domains_for`): a busier deployment has a bigger catalog, so the
# mix of events stays alike from a thousand events to ten million.
DOMAINS = (
    "sales", "orders", "payments", "refunds", "shipments", "returns", "subscriptions", "ad_clicks",
    "sessions", "reviews", "promotions", "support_tickets", "loyalty", "pricing", "marketplace", "catalog",
)
_EVENTS_PER_DAY_PER_DOMAIN = 25_000
_SPARK = (("SPARK_MASTER", "k8s://spark-batch"),)

# Dataset index: two shared datasets, then four per domain (raw, daily, summary, regional report).
_FX_RATES, _INVENTORY = 0, 1
_RAW, _DAILY, _SUMMARY, _REGIONAL = range(4)


def _dataset(domain: int, kind: int) -> int:
    return 2 + 4 * domain + kind


def _domain_datasets(domain: str) -> tuple[_Dataset, ...]:
    if domain == "sales":  # the flagship domain, with the names operators know
        summary = _Dataset("reports/revenue/date={date}", "//jobs:build_revenue_report", False, 600.0,
                           _SPARK + (("JOB_MEMORY", "16g"),))
        regional = _Dataset("reports/stockouts/date={date}/region={dim}", "//jobs:detect_stockouts", False, 240.0,
                            _SPARK + (("JOB_MEMORY", "4g"),))
    else:
        summary = _Dataset(f"reports/{domain}_summary/date={{date}}", f"//jobs:build_{domain}_summary", False, 400.0,
                           _SPARK + (("JOB_MEMORY", "8g"),))
        regional = _Dataset(f"reports/{domain}_anomalies/date={{date}}/region={{dim}}",
                            f"//jobs:detect_{domain}_anomalies", False, 200.0, _SPARK + (("JOB_MEMORY", "4g"),))
    return (
        _Dataset(f"data/raw/{domain}/date={{date}}/region={{dim}}", f"//jobs:ingest_{domain}", False, 150.0,
                 (("SOURCE_BUCKET", f"s3://exports-{domain.replace('_', '-')}"), ("JOB_MEMORY", "2g"))),
        _Dataset(f"data/{domain}/daily/date={{date}}/region={{dim}}", f"//jobs:aggregate_{domain}_daily", False, 420.0,
                 _SPARK + (("JOB_MEMORY", "8g"),)),
        summary,
        regional,
    )


_DATASETS = (
    _Dataset("data/raw/fx_rates/date={date}", "//jobs:ingest_fx_rates", False, 20.0,
             (("FX_API_URL", "https://fx.internal/v2/rates"), ("JOB_MEMORY", "512m"))),
    _Dataset("data/inventory/snapshot/date={date}/warehouse={dim}", "//jobs:snapshot_inventory", True, 300.0,
             (("WMS_DSN", "postgres://wms-replica/wms"), ("JOB_MEMORY", "4g"))),
) + tuple(dataset for domain in DOMAINS for dataset in _domain_datasets(domain))

# A partition key: (dataset index, date "YYYY-MM-DD", dimension value or "").
_Key = tuple[int, str, str]


def _domains_for(n_events: int, days: int) -> int:
    return max(1, min(len(DOMAINS), math.ceil(n_events / days / _EVENTS_PER_DAY_PER_DOMAIN)))


def _inputs(key: _Key) -> list[tuple[_Key, tuple[int, str]]]:
    """The partitions a partition is built from, with their dependency type."""
    dataset, date, dim = key
    if dataset < 2:
        return []
    domain, kind = divmod(dataset - 2, 4)
    if kind == _DAILY:
        return [((dataset - 1, date, dim), _MATERIALIZE), ((_FX_RATES, date, ""), _QUERY)]
    if kind == _SUMMARY:
        return [((dataset - 1, date, region), _MATERIALIZE) for region in REGIONS]
    if kind == _REGIONAL:
        inputs = [((dataset - 2, date, dim), _MATERIALIZE)]
        if domain == 0:  # stockouts compare sales with the warehouses' stock
            inputs += [((_INVENTORY, date, warehouse), _QUERY) for warehouse in WAREHOUSES[dim]]
        return inputs
    return []


def _downstream(key: _Key, n_domains: int) -> list[_Key]:
    """The partitions built directly from `key` (the inverse of `_inputs`) in the first `n_domains` domains."""
    dataset, date, dim = key
    if dataset == _FX_RATES:
        return [(_dataset(domain, _DAILY), date, region) for domain in range(n_domains) for region in REGIONS]
    if dataset == _INVENTORY:
        return [(_dataset(0, _REGIONAL), date, _REGION_OF_WAREHOUSE[dim])]
    kind = (dataset - 2) % 4
    if kind == _RAW:
        return [(dataset + 1, date, dim)]
    if kind == _DAILY:
        return [(dataset + 1, date, ""), (dataset + 2, date, dim)]
    return []


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
_RESTATEMENT_REASONS = (
    "upstream correction: POS export re-delivered",
    "data quality check failed: duplicate order ids",
    "late-arriving records for this date",
)

# status_name of every status code, precomputed: the event model's enums are the one source.
_BR = {member: member.name for member in BuildRequestStatus}
_PS = {member: member.name for member in PartitionStatus}
_JS = {member: member.name for member in JobStatus}


# --- Simulating build requests -------------------------------------------------------------------


@dataclass
class _Job:
    """One planned job run and its simulated timeline (ns); `outcome` names its terminal JobStatus."""

    job_run_id: str
    dataset: int
    outputs: list[_Key]
    inputs: list[tuple[_Key, tuple[int, str]]]
    scheduled: int = 0
    running: int = 0
    end: int = 0
    outcome: JobStatus = JobStatus.JOB_COMPLETED
    message: str = ""
    cancelled_at: int = 0  # a task_cancel_event's time, for timeouts and cancelled builds


class _Simulation:
    """Generates build requests one after another in arrival order, each completely (its future
    included), and remembers just enough (the latest attempt per partition, recent failures and
    recent builds) for later requests to delegate, retry and invalidate. Memory is bounded by the
    partition catalog, not by the number of events."""

    def __init__(self, n_events: int, seed: int, days: int, start_ns: int) -> None:
        self.rng = random.Random(seed)
        self.n_events = n_events
        self.n_domains = _domains_for(n_events, days)
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
        self.previous_goal: list[_Key] = []
        # key -> (build_request_id, job_run_id, start_ns, end_ns, available): the latest attempt.
        self.attempts: dict[_Key, tuple[str, str, int, int, bool]] = {}
        self.recent_failed: deque[tuple[_Key, int]] = deque(maxlen=64)
        self.recent_available: deque[tuple[_Key, int]] = deque(maxlen=256)
        self.refs: dict[_Key, str] = {}
        self.configs: dict[tuple, tuple[str, str, str]] = {}
        self.dates: dict[int, str] = {}

    # Small lookups, cached because the catalog is small and they run for every event.

    def ref(self, key: _Key) -> str:
        ref = self.refs.get(key)
        if ref is None:
            ref = self.refs[key] = _DATASETS[key[0]].ref_template.format(date=key[1], dim=key[2])
        return ref

    def date(self, day_number: int) -> str:
        date = self.dates.get(day_number)
        if date is None:
            date = self.dates[day_number] = (datetime(1970, 1, 1) + timedelta(days=day_number)).strftime("%Y-%m-%d")
        return date

    def job_config(self, job: _Job) -> tuple[str, str, str]:
        """(JobConfig JSON, its inputs JSON, its outputs JSON) for `job`: computed once per shape."""
        cache_key = (job.dataset, tuple(job.outputs))
        cached = self.configs.get(cache_key)
        if cached is not None:
            return cached
        dataset = _DATASETS[job.dataset]
        outputs = [{"str": self.ref(key)} for key in job.outputs]
        inputs = [
            {"dep_type_code": code, "dep_type_name": name, "partition_ref": {"str": self.ref(key)}}
            for key, (code, name) in job.inputs
        ]
        date = job.outputs[0][1]
        args = ["--date", date]
        dims = [key[2] for key in job.outputs if key[2]]
        if dims:
            args += ["--" + dataset.ref_template.rsplit("/", 1)[1].split("=")[0], ",".join(dims)]
        env = {"DATABUILD_JOB_LABEL": dataset.job_label, "PARTITION_DATE": date, **dict(dataset.env)}
        config = {"outputs": outputs, "inputs": inputs, "args": args, "env": env}
        cached = (_encode(config), _encode(inputs), _encode(outputs))
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

    def pick_goal(self, now_ns: int) -> tuple[list[_Key], list[_Key], str]:
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
            keys = [(_dataset(domain, _RAW), date, region) for region in rng.sample(REGIONS, rng.randint(1, 4))]
            if rng.random() < 0.3:
                keys.append((_FX_RATES, date, ""))
            return keys, [], ""
        if draw < 0.50:
            regions = rng.sample(REGIONS, rng.randint(1, 4))
            return [(_dataset(domain, _DAILY), date, region) for region in regions], [], ""
        if draw < 0.68:
            return [(_dataset(domain, _SUMMARY), date, "")], [], ""
        if draw < 0.85:
            regions = rng.sample(REGIONS, rng.randint(1, 2))
            return [(_dataset(domain, _REGIONAL), date, region) for region in regions], [], ""
        return [(_INVENTORY, date, warehouse) for warehouse in _REGION_OF_WAREHOUSE], [], ""

    def _retry_candidates(self, now_ns: int) -> list[_Key]:
        """Partitions whose latest attempt failed before now, newest first: someone retries them."""
        candidates: dict[_Key, None] = {}
        for key, failed_at in reversed(self.recent_failed):
            attempt = self.attempts[key]
            if failed_at < now_ns and not attempt[4] and attempt[3] < now_ns:
                candidates[key] = None
                if len(candidates) == 8:
                    break
        return list(candidates)

    def _restatement(self, now_ns: int) -> tuple[list[_Key], list[_Key], str] | None:
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
            for child in _downstream(frontier.pop(), self.n_domains):
                if child not in invalidate and self._is_available(child, now_ns):
                    invalidate.append(child)
                    frontier.append(child)
        rebuild = [key] + [child for child in _downstream(key, self.n_domains) if child in invalidate]
        return rebuild, invalidate, rng.choice(_RESTATEMENT_REASONS)

    def _is_available(self, key: _Key, now_ns: int) -> bool:
        attempt = self.attempts.get(key)
        return attempt is not None and attempt[4] and attempt[3] < now_ns

    # One build request, start to finish.

    def build(self, build_request_id: str, arrival_ns: int) -> list[tuple[int, str, dict]]:
        """Every event of one build request as (timestamp, event_type, payload), unsorted."""
        rng = self.rng
        events: list[tuple[int, str, dict]] = []
        if self.previous_goal and rng.random() < _BURST_RATE * 0.5:
            requested, invalidate, reason = list(self.previous_goal), [], ""  # the same request, twice
        else:
            requested, invalidate, reason = self.pick_goal(arrival_ns)
        self.previous_goal = requested
        requested_refs = [self.ref(key) for key in requested]
        n_requested = len(requested_refs)

        def request_status(ts: int, status: BuildRequestStatus, message: str) -> None:
            payload = {"status_code": int(status), "status_name": _BR[status],
                       "requested_partitions": list(requested_refs), "message": message}
            events.append((ts, "build_request_event", payload))

        def partition_status(ts: int, key: _Key, status: PartitionStatus, message: str, job_run_id: str | None) -> None:
            payload = {"partition_ref": self.ref(key), "status_code": int(status), "status_name": _PS[status],
                       "message": message}
            if job_run_id is not None:
                payload["job_run_id"] = job_run_id
            events.append((ts, "partition_event", payload))

        t = arrival_ns
        request_status(t, BuildRequestStatus.BUILD_REQUEST_RECEIVED,
                       f"Build request received for {n_requested} partition{'s' if n_requested > 1 else ''}")
        for key in invalidate:
            t += int(rng.uniform(0.001, 0.05) * _NS)
            events.append((t, "partition_invalidation_event", {"partition_ref": self.ref(key), "reason": reason}))
            attempt = self.attempts[key]
            self.attempts[key] = (attempt[0], attempt[1], attempt[2], t, False)
        t += int(rng.uniform(0.005, 0.2) * _NS)
        request_status(t, BuildRequestStatus.BUILD_REQUEST_PLANNING, "Starting build planning")

        t_plan = t + int(rng.uniform(0.2, 3.0) * _NS)
        to_build, delegated = self._plan(requested, t_plan)
        jobs = self._jobs(to_build)
        configs = [self.job_config(job) for job in jobs]
        nodes = ",".join(
            '{"job":{"label":"%s"},"config":%s}' % (_DATASETS[job.dataset].job_label, config[0])
            for job, config in zip(jobs, configs)
        )
        job_graph = '{"label":{"label":"//:databuild_graph"},"outputs":%s,"nodes":[%s]}' % (
            _encode([{"str": ref} for ref in requested_refs]), nodes)
        n_partitions = sum(len(job.outputs) for job in jobs)
        events.append((t_plan, "job_graph_event", {
            "job_graph": job_graph,
            "message": f"Planned {len(jobs)} jobs for {n_partitions} partitions, {len(delegated)} delegated",
        }))
        t = t_plan

        if rng.random() < _DRY_RUN_RATE:  # `databuild analyze`: plan only
            t += int(rng.uniform(0.001, 0.05) * _NS)
            request_status(t, BuildRequestStatus.BUILD_REQUEST_ANALYSIS_COMPLETED,
                           f"Analysis completed: would run {len(jobs)} jobs for {n_partitions} partitions")
            return events

        t += int(rng.uniform(0.001, 0.05) * _NS)
        t_requested = t
        for key in to_build:
            partition_status(t, key, PartitionStatus.PARTITION_REQUESTED, "Partition requested", None)
        for key, (owner, owner_job_run_id, _start, _end, _ok) in delegated.items():
            t += int(rng.uniform(0.001, 0.02) * _NS)
            ref = self.ref(key)
            events.append((t, "delegation_event", {
                "partition_ref": ref, "delegated_to_build_request_id": owner,
                "message": f"Partition is already being built by build request {owner}",
            }))
            partition_status(t, key, PartitionStatus.PARTITION_DELEGATED, f"Delegated to build request {owner}",
                             owner_job_run_id)
        t += int(rng.uniform(0.01, 0.5) * _NS)
        t_executing = t
        request_status(t, BuildRequestStatus.BUILD_REQUEST_EXECUTING,
                       f"Executing {len(jobs)} jobs")

        # Each job runs when its inputs are ready: built here, by a delegate, or already available.
        ready: dict[_Key, tuple[int, bool]] = {key: (attempt[3], attempt[4]) for key, attempt in delegated.items()}
        for job in jobs:
            ready_at, failed_input = t_executing, None
            for key, _dep in job.inputs:
                at, ok = ready.get(key, (t_executing, True))
                if not ok:
                    failed_input = key if failed_input is None else failed_input
                ready_at = max(ready_at, at)
            if failed_input is not None:
                job.outcome = JobStatus.JOB_SKIPPED
                job.end = ready_at + int(rng.uniform(0.01, 0.5) * _NS)
                job.message = f"Skipped: input {self.ref(failed_input)} failed"
            else:
                self._run(job, ready_at)
            ok = job.outcome == JobStatus.JOB_COMPLETED
            for key in job.outputs:
                ready[key] = (job.end, ok)

        cancelled_at = None
        last_end = max([job.end for job in jobs] + [ready[key][0] for key in requested if key in delegated]
                       + [t_executing])
        if jobs and rng.random() < _BUILD_CANCEL_RATE:
            cancelled_at = t_executing + int(rng.random() * (last_end - t_executing)) + 1
            last_end = self._cancel(jobs, cancelled_at, events)

        for job, config in zip(jobs, configs):
            self._emit_job(job, config, cancelled_at, events, partition_status)
            ok = job.outcome == JobStatus.JOB_COMPLETED
            for key in job.outputs:
                self.attempts[key] = (build_request_id, job.job_run_id, t_requested, job.end, ok)
                (self.recent_available if ok else self.recent_failed).append((key, job.end))

        # Terminal status, and what later build requests will see.
        failed = [key for job in jobs for key in job.outputs if job.outcome != JobStatus.JOB_COMPLETED]
        failed += [key for key in requested if key in delegated and not delegated[key][4]]
        t = last_end + int(rng.uniform(0.01, 1.0) * _NS)
        if cancelled_at is not None:
            request_status(t, BuildRequestStatus.BUILD_REQUEST_CANCELLED, "Build request cancelled")
        elif failed:
            request_status(t, BuildRequestStatus.BUILD_REQUEST_FAILED,
                           f"Build request failed: {len(failed)} of {n_partitions + len(delegated)} partitions failed")
        else:
            request_status(t, BuildRequestStatus.BUILD_REQUEST_COMPLETED,
                           f"Build request completed: {n_requested} requested partitions available")
        return events

    def _plan(self, requested: list[_Key], t_plan: int) -> tuple[dict[_Key, None], dict[_Key, tuple]]:
        """(partitions to build, inputs first; partitions delegated, with the attempt they wait for).

        The requested partitions are always rebuilt, their inputs only when not available. A
        partition another build request is building at `t_plan` is delegated to it (when it is not
        about to finish: a delegation must come before the owner's terminal partition event)."""
        to_build: dict[_Key, None] = {}
        delegated: dict[_Key, tuple[str, str, int, int, bool]] = {}
        attempts = self.attempts

        def visit(key: _Key, is_requested: bool) -> None:
            if key in to_build or key in delegated:
                return
            attempt = attempts.get(key)
            if attempt is not None:
                if attempt[2] <= t_plan and t_plan + _DELEGATION_MARGIN_NS < attempt[3]:
                    delegated[key] = attempt
                    return
                if not is_requested and attempt[4] and attempt[3] <= t_plan:
                    return
            for input_key, _dep in _inputs(key):
                visit(input_key, False)
            to_build[key] = None  # post-order: inputs first

        for key in requested:
            visit(key, True)
        return to_build, delegated

    def _jobs(self, to_build: dict[_Key, None]) -> list[_Job]:
        """One job run per partition, or per date for datasets built a date at a time; inputs first."""
        rng = self.rng
        jobs: list[_Job] = []
        job_of_date: dict[tuple[int, str], _Job] = {}
        for key in to_build:
            per_date = _DATASETS[key[0]].job_per_date
            if per_date and (key[0], key[1]) in job_of_date:
                job = job_of_date[key[0], key[1]]
                job.outputs.append(key)
                job.inputs += _inputs(key)
                continue
            job = _Job(_uuid4(rng), key[0], [key], _inputs(key))
            jobs.append(job)
            if per_date:
                job_of_date[key[0], key[1]] = job
        return jobs

    def _run(self, job: _Job, ready_at: int) -> None:
        """Schedule, run and finish `job`: its timeline and outcome."""
        rng = self.rng
        job.scheduled = ready_at + int(rng.uniform(0.01, 2.0) * _NS)
        queue_s = min(rng.lognormvariate(math.log(5.0), 1.0), _MAX_QUEUE_S) + 0.2
        job.running = job.scheduled + int(queue_s * _NS)
        run_s = min(rng.lognormvariate(math.log(_DATASETS[job.dataset].median_run_s), 0.5), _MAX_RUN_S) + 1.0
        draw = rng.random()
        if draw < _JOB_FAILURE_RATE:
            job.outcome = JobStatus.JOB_FAILED
            job.end = job.running + int(run_s * rng.random() * _NS) + _NS
            dataset = _DATASETS[job.dataset]
            job.message = rng.choice(_FAILURE_MESSAGES).format(
                source=self.ref(job.outputs[0]).replace("data/", "s3://lake/", 1),
                memory=dict(dataset.env)["JOB_MEMORY"])
        elif draw < _JOB_FAILURE_RATE + _JOB_TIMEOUT_RATE:
            job.outcome = JobStatus.JOB_CANCELLED
            timeout_s = rng.choice((600, 900, 1800))
            job.cancelled_at = job.running + timeout_s * _NS
            job.end = job.cancelled_at + int(rng.uniform(0.5, 5.0) * _NS)
            job.message = f"Cancelled: exceeded timeout of {timeout_s // 60}m"
        else:
            job.outcome = JobStatus.JOB_COMPLETED
            job.end = job.running + int(run_s * _NS)
            job.message = "Job completed"

    def _cancel(self, jobs: list[_Job], cancelled_at: int, events: list) -> int:
        """A person cancels the build at `cancelled_at`: jobs under way are cancelled, jobs not yet
        scheduled never start. Returns the time the last job stopped."""
        rng = self.rng
        events.append((cancelled_at, "build_cancel_event", {"reason": rng.choice(_BUILD_CANCEL_REASONS)}))
        last = cancelled_at
        for job in jobs:
            if job.end <= cancelled_at:
                continue
            if job.outcome != JobStatus.JOB_SKIPPED and job.scheduled <= cancelled_at:
                job.cancelled_at = cancelled_at + int(rng.uniform(0.001, 0.05) * _NS)
                job.end = job.cancelled_at + int(rng.uniform(0.5, 5.0) * _NS)
                job.message = "Cancelled: build request cancelled"
            else:  # never started: no job events, its partitions fail
                job.scheduled = 0
                job.end = cancelled_at + int(rng.uniform(0.1, 1.0) * _NS)
                job.message = "Not built: build request cancelled"
            if job.running > cancelled_at:
                job.running = 0
            job.outcome = JobStatus.JOB_CANCELLED
            last = max(last, job.end)
        return last

    def _emit_job(self, job: _Job, config: tuple[str, str, str], cancelled_at: int | None, events: list,
                  partition_status) -> None:
        """The events of `job` and of the partitions it builds."""
        label = _DATASETS[job.dataset].job_label
        targets = [self.ref(key) for key in job.outputs]
        config_json = config[0]

        def job_status(ts: int, status: JobStatus, message: str, manifests: str | None = None) -> None:
            payload = {"job_run_id": job.job_run_id, "job_label": label, "target_partitions": list(targets),
                       "status_code": int(status), "status_name": _JS[status], "message": message,
                       "config": config_json}
            if manifests is not None:
                payload["manifests"] = manifests
            events.append((ts, "job_event", payload))

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
                manifests = '[{"outputs":%s,"inputs":%s,"start_time":%d,"end_time":%d,"task":{"job":{"label":"%s"},' \
                    '"config":%s},"metadata":{"rows_written":"%d","bytes_written":"%d"}}]' % (
                        config[2], config[1], job.running // _NS, job.end // _NS, label, config_json,
                        self.rng.randint(1_000, 5_000_000), self.rng.randint(100_000, 2_000_000_000))
                job_status(job.end, JobStatus.JOB_COMPLETED, job.message, manifests)
                partitions(job.end, PartitionStatus.PARTITION_AVAILABLE, "Partition available")
            elif outcome == JobStatus.JOB_FAILED:
                job_status(job.end, JobStatus.JOB_FAILED, f"Job failed: {job.message}")
                partitions(job.end, PartitionStatus.PARTITION_FAILED, f"Job failed: {job.message}")
            else:  # cancelled: by a timeout or with its build request
                events.append((job.cancelled_at, "task_cancel_event",
                               {"job_run_id": job.job_run_id, "reason": job.message.removeprefix("Cancelled: ")}))
                job_status(job.end, JobStatus.JOB_CANCELLED, job.message)
                partitions(job.end, PartitionStatus.PARTITION_FAILED, job.message)


# --- The public API ------------------------------------------------------------------------------


def generate_events(
    n_events: int, seed: int = 0, days: int = 3, start_ns: int = DEFAULT_START_NS
) -> Iterator[dict]:
    """Yield exactly `n_events` valid DataBuild events (dicts shaped like the landing format), in
    time order, the same for the same arguments. Use it to feed a log or a benchmark directly.

    Build requests arrive over the `days` days that end at `start_ns` (Unix epoch ns), overlap in
    time and are generated whole until the count is reached; the last one is cut short. The stream
    is lazy and its memory bounded, so ten million events are fine:
    `sum(1 for _ in generate_events(10_000_000))`.
    """
    _check_workload(n_events, days, start_ns)
    return map(_event_dict, _event_tuples(n_events, seed, days, start_ns))


def _check_workload(n_events: int, days: int, start_ns: int) -> None:
    if n_events < 0:
        raise ValueError(f"n_events is {n_events}; it must be 0 or more")
    if days < 1:
        raise ValueError(f"days is {days}; the workload needs at least 1 day to spread its build requests over")
    if start_ns - days * _DAY_NS < 0:
        raise ValueError(f"start_ns {start_ns} is too early: timestamps are Unix epoch nanoseconds, so the "
                         f"{days}-day window must start after 1970")


# One event as the stream carries it: (timestamp, sequence, event_type, payload, event_id,
# build_request_id). (timestamp, sequence) orders it; the dict or the JSON line is made at the end.
_EventTuple = tuple[int, int, str, dict, str, str]


def _event_tuples(n_events: int, seed: int, days: int, start_ns: int) -> Iterator[_EventTuple]:
    simulation = _Simulation(n_events, seed, days, start_ns)
    rng = simulation.rng
    # Events of build requests still under way: a build request is generated whole at its arrival,
    # and its events are released once no later arrival can precede them.
    pending: list[_EventTuple] = []
    sequence = 0
    generated = 0
    while generated < n_events:
        arrival_ns = simulation.next_arrival(generated)
        while pending and pending[0][0] <= arrival_ns:
            yield heapq.heappop(pending)
        build_request_id = _uuid4(rng)
        build = simulation.build(build_request_id, arrival_ns)
        build.sort(key=_timestamp)  # stable: events with the same timestamp keep their causal order
        if build[-1][0] > simulation.end_ns:
            raise AssertionError(
                f"build request {build_request_id} ends after the window; _MAX_BUILD_SPAN_NS is too small")
        del build[n_events - generated:]
        for timestamp, event_type, payload in build:
            heapq.heappush(pending, (timestamp, sequence, event_type, payload, _uuid4(rng), build_request_id))
            sequence += 1
        generated += len(build)
    while pending:
        yield heapq.heappop(pending)


def _event_dict(item: _EventTuple) -> dict:
    timestamp, _sequence, event_type, payload, event_id, build_request_id = item
    return {"event_id": event_id, "timestamp": timestamp, "build_request_id": build_request_id,
            "event_type": event_type, event_type: payload}


_escape = encode_basestring_ascii
# Escaped JobConfig JSON by its text: a config is shared by every event of its job and jobs repeat.
_escaped_configs: dict[str, str] = {}


def _strings(values: list[str]) -> str:
    return "[" + ",".join(map(_escape, values)) + "]"


def _event_line(item: _EventTuple) -> str:
    """`_encode(_event_dict(item)) + "\n"`, byte for byte, about three times faster: the frequent
    payloads are formatted from templates (tests compare every line with json.dumps)."""
    timestamp, _sequence, event_type, p, event_id, build_request_id = item
    if event_type == "partition_event":
        if "job_run_id" in p:
            body = '{"partition_ref":%s,"status_code":%d,"status_name":"%s","message":%s,"job_run_id":"%s"}' % (
                _escape(p["partition_ref"]), p["status_code"], p["status_name"], _escape(p["message"]), p["job_run_id"])
        else:
            body = '{"partition_ref":%s,"status_code":%d,"status_name":"%s","message":%s}' % (
                _escape(p["partition_ref"]), p["status_code"], p["status_name"], _escape(p["message"]))
    elif event_type == "job_event":
        config = _escaped_configs.get(p["config"])
        if config is None:
            if len(_escaped_configs) > 100_000:
                _escaped_configs.clear()
            config = _escaped_configs[p["config"]] = _escape(p["config"])
        body = '{"job_run_id":"%s","job_label":%s,"target_partitions":%s,"status_code":%d,"status_name":"%s",' \
            '"message":%s,"config":%s%s}' % (
                p["job_run_id"], _escape(p["job_label"]), _strings(p["target_partitions"]), p["status_code"],
                p["status_name"], _escape(p["message"]), config,
                ',"manifests":' + _escape(p["manifests"]) if "manifests" in p else "")
    elif event_type == "build_request_event":
        body = '{"status_code":%d,"status_name":"%s","requested_partitions":%s,"message":%s}' % (
            p["status_code"], p["status_name"], _strings(p["requested_partitions"]), _escape(p["message"]))
    else:
        body = _encode(p)
    return '{"event_id":"%s","timestamp":%d,"build_request_id":"%s","event_type":"%s","%s":%s}\n' % (
        event_id, timestamp, build_request_id, event_type, event_type, body)


def _timestamp(item: tuple) -> int:
    return item[0]


@dataclass(frozen=True)
class WorkloadSummary:
    """What `write_landing_files` wrote. Lines reconcile like ingestion's counts must:
    lines_written == events_written + bad_lines_written + duplicate_lines_written."""

    files: tuple[Path, ...]  # in write order, which is also their sorted order
    events_written: int  # distinct events
    bad_lines_written: int
    duplicate_lines_written: int  # good events written again, byte for byte
    lines_written: int
    late_arrivals: int  # events held back and written after later ones, often in a later file


_BAD_KINDS = (
    "not_json", "truncated", "unknown_event_type", "status_out_of_range", "status_name_mismatch",
    "missing_event_id", "empty",
)
_NOT_JSON = (
    "WARN bel-writer: flush failed, retrying batch {n}",
    "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
    "event_id={id},event_type=job_event,status=JOB_RUNNING",
    "{{'event_id': '{id}', 'event_type': 'partition_event'}}",
)
_UNKNOWN_EVENT_TYPES = ("job_retry_event", "partition_evnt", "PartitionEvent", "build_request")
_STATUS_ENUMS = {"build_request_event": BuildRequestStatus, "partition_event": PartitionStatus, "job_event": JobStatus}

# A status-bearing event to corrupt when a bad line is due before any such event was written.
_FALLBACK_STATUS_EVENT = {
    "event_id": "00000000-0000-4000-8000-000000000000", "timestamp": DEFAULT_START_NS,
    "build_request_id": "00000000-0000-4000-8000-000000000000", "event_type": "build_request_event",
    "build_request_event": {"status_code": 1, "status_name": "BUILD_REQUEST_RECEIVED", "requested_partitions": []},
}


def _bad_line(rng: random.Random, event: dict, status_event: dict) -> str:
    """One line that ingestion must quarantine, made from a good event by a typical writer bug."""
    kind = rng.choice(_BAD_KINDS)
    if kind == "empty":
        return rng.choice(("", "   "))
    if kind == "not_json":
        return rng.choice(_NOT_JSON).format(n=rng.randint(1, 99_999), id=_uuid4(rng))
    bad = dict(event, event_id=_uuid4(rng))  # a fresh id: a bad line never shadows a good event
    if kind == "truncated":  # a writer killed mid-line
        text = _encode(bad)
        return text[: rng.randint(1, len(text) - 1)]
    if kind == "missing_event_id":
        del bad["event_id"]
        return _encode(bad)
    if kind == "unknown_event_type":
        bad["event_type"] = rng.choice(_UNKNOWN_EVENT_TYPES)
        return _encode(bad)
    event_type = status_event["event_type"]
    payload = dict(status_event[event_type])
    bad = dict(status_event, event_id=_uuid4(rng))
    bad[event_type] = payload
    enum = _STATUS_ENUMS[event_type]
    if kind == "status_out_of_range":
        payload["status_code"] = rng.choice((-1, max(enum) + 1, 42, 99))
    else:  # status_name_mismatch: a writer with a stale enum table
        payload["status_name"] = rng.choice([m.name for m in enum if m != payload["status_code"]])
    return _encode(bad)


class _LandingFiles:
    """Writes numbered landing files, each atomically: to a hidden temp name, then renamed, so that
    ingestion (which skips names starting with "." or "_") never reads half a file."""

    _BUFFER_LINES = 4096  # one write() per this many lines: much faster than one per line

    def __init__(self, out_dir: Path, events_per_file: int) -> None:
        self.out_dir = out_dir
        self.events_per_file = events_per_file
        self.files: list[Path] = []
        self.handle = None
        self.temp_path: Path | None = None
        self.good_in_file = 0
        self.buffer: list[str] = []

    def write_good(self, line: str) -> None:
        if self.handle is None or self.good_in_file == self.events_per_file:
            self._next_file()
        self.good_in_file += 1
        self.write_extra(line)

    def write_extra(self, line: str) -> None:
        """A bad or duplicate line: it goes with the current file and does not count toward its size."""
        self.buffer.append(line)
        if len(self.buffer) >= self._BUFFER_LINES:
            self.handle.write("".join(self.buffer))
            self.buffer.clear()

    def _next_file(self) -> None:
        self.close()
        final = self.out_dir / f"events-{len(self.files):05d}.jsonl"
        self.temp_path = self.out_dir / f".{final.name}.tmp"
        self.handle = open(self.temp_path, "w", encoding="utf-8", newline="\n")
        self.files.append(final)
        self.good_in_file = 0

    def close(self) -> None:
        """Publish the current file under its final name."""
        if self.handle is not None:
            self.handle.write("".join(self.buffer))
            self.buffer.clear()
            self.handle.close()
            self.handle = None
            os.replace(self.temp_path, self.files[-1])
            self.temp_path = None

    def abandon(self) -> None:
        """After a failure: remove the unfinished temp file, publish nothing more."""
        self.buffer.clear()
        if self.handle is not None:
            self.handle.close()
            self.handle = None
            self.files.pop()
        if self.temp_path is not None:
            self.temp_path.unlink(missing_ok=True)
            self.temp_path = None


def write_landing_files(
    out_dir: str | os.PathLike,
    n_events: int,
    seed: int = 0,
    events_per_file: int = 100_000,
    days: int = 3,
    bad_line_rate: float = 0.0,
    duplicate_rate: float = 0.0,
    *,
    start_ns: int = DEFAULT_START_NS,
    late_arrival_rate: float = DEFAULT_LATE_ARRIVAL_RATE,
) -> WorkloadSummary:
    """Write `generate_events(n_events, seed, days, start_ns)` as JSON Lines landing files
    `events-00000.jsonl`, ... into `out_dir` (created if missing, refused if it already holds
    landing files), `events_per_file` distinct events per file. Use it to stage input for ingestion.

    Like real writers, it hands over a share `late_arrival_rate` of events late (often in a later
    file), and adds EXTRA lines: after each event, with probability `bad_line_rate`, one bad line
    (not JSON, truncated, unknown event_type, status code out of range, status name not matching
    its code, no event_id, empty), and each event is redelivered with probability `duplicate_rate`,
    later in the same or a later file. Same arguments, same bytes.
    Example: `write_landing_files("/tmp/landing", 1_000_000, bad_line_rate=0.001, duplicate_rate=0.01)`.
    """
    for name, rate in (("bad_line_rate", bad_line_rate), ("duplicate_rate", duplicate_rate),
                       ("late_arrival_rate", late_arrival_rate)):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} is {rate}; it must be a fraction between 0 and 1")
    if events_per_file < 1:
        raise ValueError(f"events_per_file is {events_per_file}; it must be 1 or more")
    _check_workload(n_events, days, start_ns)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(out.glob("events-*.jsonl"))
    if existing:
        raise FileExistsError(
            f"{out} already holds landing files ({existing[0].name} and {len(existing) - 1} more); "
            "write each workload into an empty directory so that two workloads never mix"
        )
    # One generator per kind of noise, so that changing one rate leaves the rest of the output alone.
    late_rng, duplicate_rng, bad_rng = (random.Random(f"databuild-workload/{seed}/{kind}")
                                        for kind in ("late", "duplicate", "bad"))
    held: list[tuple[int, int, str]] = []  # late events: (release after this many good lines, seq, line)
    redeliveries: list[tuple[int, int, str]] = []  # duplicates, the same way
    sequence = good = bad = duplicates = late = 0
    status_event: _EventTuple | None = None
    files = _LandingFiles(out, events_per_file)

    def write_good(line: str) -> None:
        nonlocal good, sequence
        files.write_good(line)
        good += 1
        if duplicate_rate and duplicate_rng.random() < duplicate_rate:
            delay = duplicate_rng.randint(1, 1000) if duplicate_rng.random() < 0.7 else \
                duplicate_rng.randint(1, events_per_file)
            heapq.heappush(redeliveries, (good + delay, sequence, line))
            sequence += 1

    def write_due_duplicates(final: bool = False) -> None:
        nonlocal duplicates
        while redeliveries and (final or redeliveries[0][0] <= good):
            files.write_extra(heapq.heappop(redeliveries)[2])
            duplicates += 1

    try:
        for item in _event_tuples(n_events, seed, days, start_ns):
            line = _event_line(item)
            if late_arrival_rate and late_rng.random() < late_arrival_rate:
                delay = late_rng.randint(1, 200) if late_rng.random() < 0.5 else \
                    late_rng.randint(events_per_file // 2 + 1, 2 * events_per_file)
                heapq.heappush(held, (good + delay, sequence, line))
                sequence += 1
                late += 1
            else:
                write_good(line)
            while held and held[0][0] <= good:
                write_good(heapq.heappop(held)[2])
            if bad_line_rate:
                if item[2] in _STATUS_ENUMS:
                    status_event = item
                if files.handle is not None and bad_rng.random() < bad_line_rate:
                    status = _event_dict(status_event) if status_event else _FALLBACK_STATUS_EVENT
                    files.write_extra(_bad_line(bad_rng, _event_dict(item), status) + "\n")
                    bad += 1
            if redeliveries:
                write_due_duplicates()
        while held:
            write_good(heapq.heappop(held)[2])
        write_due_duplicates(final=True)
        files.close()
    except BaseException:
        files.abandon()
        raise
    return WorkloadSummary(
        files=tuple(files.files),
        events_written=good,
        bad_lines_written=bad,
        duplicate_lines_written=duplicates,
        lines_written=good + bad + duplicates,
        late_arrivals=late,
    )

