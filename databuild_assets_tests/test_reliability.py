"""Crash and concurrency, small: worker subprocesses with their own SparkSession, killed with a
real SIGKILL or racing each other, then a check that nothing was lost or duplicated.

The full scale (50 crash points over ingestion, refresh and compaction; 4 writers) is
`python -m bench.reliability`; see the README's Reliability section.

The two scenarios start several JVMs each (about 2 and 3.5 minutes on an idle 2-core machine),
so `make test` skips them with a printed reason to keep the suite well under 20 minutes;
`make reliability-test` runs them. Crashes between commit and bookkeeping and concurrent
writers are also tested in-process in test_ingest.py and test_maintenance.py, which always run.
"""

from __future__ import annotations

import os

import pytest

from databuild_assets_tests.reliability_scenarios import (
    Worker,
    processes_in_group,
    run_concurrency_scenario,
    run_crash_scenario,
)

scenario = pytest.mark.skipif(
    os.environ.get("DATABUILD_SLOW_TESTS") != "1",
    reason="a multi-process scenario (several JVMs, minutes): run `make reliability-test` (DATABUILD_SLOW_TESTS=1)",
)


@pytest.mark.slow
@scenario
def test_ingestion_killed_at_random_points_then_rerun_holds_every_event_exactly_once(tmp_path):
    # Killed within the first half of the work's measured time: a kill is all but certain to land.
    result = run_crash_scenario("crash-ingest", crash_points=2, workdir=tmp_path, seed=3, per_batch=40, kill_window=0.5)

    assert (result.lost, result.duplicates, result.problems) == (0, 0, [])
    assert result.sent > 0 and result.in_log == result.sent
    assert result.runs >= 1, result.kill_steps  # at least one worker really was killed mid-work


@pytest.mark.slow
@scenario
def test_two_writer_processes_racing_ingestion_refresh_and_compaction_lose_and_duplicate_nothing(tmp_path):
    result = run_concurrency_scenario(writers=2, workdir=tmp_path, per_batch=40, calls=2)

    assert (result.lost, result.duplicates, result.problems) == (0, 0, [])
    assert result.sent > 0


def test_a_kill_takes_the_workers_jvm_too(tmp_path):
    # The runner's kill must not leave a JVM behind that keeps writing after the "crash".
    worker = Worker(
        ["crash-ingest", "--lake", str(tmp_path / "lake"), "--batches", "1", "--per-batch", "5"],
        tmp_path / "worker.log",
    )
    assert worker.wait_for("ready", 600)["event"] == "ready"
    group = worker.process.pid

    assert len(processes_in_group(group)) >= 2  # the Python driver and its JVM

    worker.kill()  # returns once the group is gone, or raises naming the pids still running

    assert processes_in_group(group) == []
