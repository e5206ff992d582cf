"""Reliability runner: crash anywhere (SIGKILL) and concurrent writers, then check nothing is lost.

    python -m bench.reliability --crash-points 50 --writers 4
    python -m bench.reliability --scenarios crash-ingest --crash-points 6   # a quick look

Every piece of work runs in a worker subprocess with its own SparkSession (`python -m
databuild_assets_tests.reliability_workers ...`), so a kill is a real SIGKILL of the Python driver,
its JVM and its Python workers (the whole process group) at a random moment. The scenarios are
databuild_assets_tests/reliability_scenarios.py, which test_reliability.py runs small; this
module is their command line.

Crash scenarios (`crash-ingest`, `crash-refresh`, `crash-compact`): cycle k's worker first
*recovers* (re-runs what cycle k-1 was doing when it was killed: ingestion, the writer's append,
the tombstone request, refresh or compaction), then *verifies* the lake (every event sent is in
the raw log exactly once, no tombstoned event is visible, or left after compaction; the filtered
log and each projection equal a full rebuild; every table reads), then starts cycle k's work, and
the runner kills it after a random delay within that work's expected duration.

Concurrency scenario: `--writers` processes append through `append_events` (each also re-sends
another writer's first call, so event_ids race) while one maintenance process loops over
landing-file ingestion, filtered-log and projection refresh and compaction (a tombstone pending);
a last worker verifies. A failure a process sees (Delta's retries exhausted) is counted as
surfaced and the call is retried by the caller, as a DataBuild service would.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from databuild_assets_tests.reliability_scenarios import (
    CRASH_SCENARIOS,
    SCENARIOS,
    format_table,
    run_concurrency_scenario,
    run_crash_scenario,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--crash-points", type=int, default=50, help="kills that land mid-work, in total over the crash scenarios"
    )
    parser.add_argument("--writers", type=int, default=4, help="concurrent writer processes")
    parser.add_argument(
        "--events-per-batch", type=int, default=100, help="events per cycle, per writer call, per landing file"
    )
    parser.add_argument("--writer-calls", type=int, default=4, help="append_events calls per writer")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the working folder (lakes, worker logs)")
    args = parser.parse_args(argv)

    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-reliability-"))
    crash = [s for s in scenarios if s in CRASH_SCENARIOS]
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} cores; workdir {workdir}", flush=True)
    results = []
    for index, scenario in enumerate(crash):
        points = args.crash_points // len(crash) + (1 if index < args.crash_points % len(crash) else 0)
        print(f"{scenario}: {points} crash points", flush=True)
        results.append(run_crash_scenario(scenario, points, workdir, args.seed + index, args.events_per_batch))
        print(f"  kill points by step: {results[-1].kill_steps}", flush=True)
    if "concurrency" in scenarios:
        print(f"concurrency: {args.writers} writer processes, ingestion, refresh and compaction", flush=True)
        results.append(run_concurrency_scenario(args.writers, workdir, args.events_per_batch, args.writer_calls))
    print(f"load average at end: {os.getloadavg()}")
    print(format_table(results))
    for result in results:
        for problem in result.problems:
            print(f"{result.scenario}: {problem}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
