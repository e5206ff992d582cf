"""What several test modules share: the suite's Spark settings and the Dagster resource for a test
lake, builders of hand-written events and landing files, and JVM-free appender processes. Test
modules import this module (and bel_cases, the BuildEventLog specification), never each other."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, Definitions, JobDefinition, SensorDefinition, build_sensor_context

from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.events.enums import PartitionStatus
from databuild_assets.projections.refresh import RebuildRule
from databuild_assets.runtime.jvm_startup import driver_java_options
from databuild_assets.runtime.lake import Lake
from databuild_assets.runtime.spark import SparkSettings
from databuild_assets_tests import bel_cases

REPO_ROOT = Path(__file__).resolve().parents[1]

# Small on purpose: the suite's tables are tiny, and every shuffle partition is a task.
TEST_SPARK_SETTINGS = SparkSettings(
    app_name="databuild-assets-tests",
    shuffle_partitions=2,
    driver_memory="2g",
    # A test worker's JVM runs for the whole suite, so it keeps the full JIT tiers: with C1 alone
    # (a short-lived driver's default) the suite is much slower (docs/decisions/0023-driver-jvm-start.md).
    long_lived=True,
    extra_config={
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Interpreted execution instead of generated code: the tables hold a few rows, and
        # generating and compiling code for each plan (Delta's log replay included) was most of
        # the test JVMs' CPU. Results do not depend on it (docs/decisions/0033-test-suite.md).
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        # The throughput collector instead of G1: the suite's JVMs want throughput, not short
        # pauses, and the same tests took 12-15% less (docs/decisions/0033-test-suite.md). The
        # driver's own options (the class archive) are kept: this setting replaces them.
        "spark.driver.extraJavaOptions": f"{driver_java_options(long_lived=True)} -XX:+UseParallelGC".strip(),
    },
)

# The tests' logs are tiny, and by default a refresh rebuilds a small log (`RebuildRule`). The tests
# of the fold, and of the recompute after a removal, fold and recompute as they would in a large log.
FOLD = RebuildRule(small_log_bytes=0, recompute_share=math.inf)


def lakehouse_for(lake: Lake) -> LakehouseResource:
    """The suite's Spark settings, so materializing does not reconfigure the shared session."""
    return LakehouseResource(
        lake_root=lake.root,
        shuffle_partitions=TEST_SPARK_SETTINGS.shuffle_partitions,
        driver_memory=TEST_SPARK_SETTINGS.driver_memory,
        extra_spark_config=dict(TEST_SPARK_SETTINGS.extra_config),
    )


def project_job(lake: Lake, name: str) -> JobDefinition:
    """The project's job `name` as definitions.py assembles it (its assets, checks and executor),
    on `lake`: what a deployment runs, with the suite's lakehouse resource."""
    from databuild_assets.definitions import defs

    return Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        jobs=defs.jobs,
        resources={"lakehouse": lakehouse_for(lake)},
        executor=defs.executor,
    ).resolve_job_def(name)


def evaluate_sensor(sensor: SensorDefinition, **context: Any) -> Any:
    """One evaluation of `sensor`, with its resources opened and closed around it as Dagster's
    daemon does (the lakehouse resource detaches from a warm Spark driver when closed), with an
    instance as the daemon always has (an empty ephemeral one unless given)."""
    context.setdefault("instance", DagsterInstance.ephemeral())
    with build_sensor_context(**context) as sensor_context:
        return sensor(sensor_context)


def tree(root: Path) -> dict[str, tuple]:
    """Every file and folder under `root` (root included) with its kind, size and mtime: what
    "nothing changed on disk" is compared on."""
    listing = {}
    for path in [root, *sorted(root.rglob("*"))]:
        stat = path.stat()
        kind = "dir" if path.is_dir() else "file"
        listing[str(path.relative_to(root))] = (
            kind,
            stat.st_mode,
            0 if kind == "dir" else stat.st_size,
            stat.st_mtime_ns,
        )
    return listing


# ---------------------------------------------------------------------------------------------
# Events at realistic timestamps, and landing files
# ---------------------------------------------------------------------------------------------

T0 = 1_763_424_000_000_000_000  # 2025-11-18T00:00:00Z in ns

ONE_EVENT_OF_EACH_TYPE = [
    {
        "event_id": "e-build",
        "timestamp": T0,
        "build_request_id": "br-1",
        "event_type": "build_request_event",
        "build_request_event": {
            "status_code": 1,
            "status_name": "BUILD_REQUEST_RECEIVED",
            "requested_partitions": ["data/a/date=2025-11-18", "data/b/date=2025-11-18"],
            "message": "requested by cli",
        },
    },
    {
        "event_id": "e-graph",
        "timestamp": T0 + 1,
        "build_request_id": "br-1",
        "event_type": "job_graph_event",
        "job_graph_event": {"job_graph": json.dumps({"nodes": ["//jobs:a"]}), "message": "planned"},
    },
    {
        "event_id": "e-job",
        "timestamp": T0 + 2,
        "build_request_id": "br-1",
        "event_type": "job_event",
        "job_event": {
            "job_run_id": "jr-1",
            "job_label": "//jobs:a",
            "target_partitions": ["data/a/date=2025-11-18"],
            "status_code": 3,
            "status_name": "JOB_COMPLETED",
            "message": "ok",
            "config": json.dumps(
                {"outputs": [{"str": "data/a/date=2025-11-18"}], "inputs": [], "args": ["--x"], "env": {"K": "V"}}
            ),
            "manifests": json.dumps(
                [
                    {
                        "outputs": [{"str": "data/a/date=2025-11-18"}],
                        "inputs": [],
                        "start_time": 1763424000,
                        "end_time": 1763424060,
                        "task": "t",
                        "metadata": {},
                    }
                ]
            ),
        },
    },
    {
        "event_id": "e-part",
        "timestamp": T0 + 3,
        "build_request_id": "br-1",
        "event_type": "partition_event",
        "partition_event": {
            "partition_ref": "data/a/date=2025-11-18",
            "status_code": 4,
            "status_name": "PARTITION_AVAILABLE",
            "message": None,
            "job_run_id": "jr-1",
        },
    },
    {
        "event_id": "e-deleg",
        "timestamp": T0 + 4,
        "build_request_id": "br-1",
        "event_type": "delegation_event",
        "delegation_event": {
            "partition_ref": "data/b/date=2025-11-18",
            "delegated_to_build_request_id": "br-0",
            "message": "already building",
        },
    },
    {
        "event_id": "e-inval",
        "timestamp": T0 + 5,
        "build_request_id": "br-1",
        "event_type": "partition_invalidation_event",
        "partition_invalidation_event": {"partition_ref": "data/a/date=2025-11-18", "reason": "upstream fix"},
    },
    {
        "event_id": "e-tcancel",
        "timestamp": T0 + 6,
        "build_request_id": "br-1",
        "event_type": "task_cancel_event",
        "task_cancel_event": {"job_run_id": "jr-2", "reason": "operator"},
    },
    {
        "event_id": "e-bcancel",
        "timestamp": T0 + 7,
        "build_request_id": "br-1",
        "event_type": "build_cancel_event",
        "build_cancel_event": {"reason": "operator"},
    },
]


def partition_event_at(
    event_id: str,
    offset_ns: int = 0,
    status: PartitionStatus = PartitionStatus.PARTITION_AVAILABLE,
    ref: str = "data/a",
) -> dict[str, Any]:
    """`bel_cases.partition_event` of build request br-1 at `T0 + offset_ns`: one line of a
    landing file, where only the event_id and the order matter."""
    return bel_cases.partition_event(event_id, T0 + offset_ns, "br-1", ref, status)


def one_partition_build(br: str, ref: str, offset_ns: int) -> list[dict[str, Any]]:
    """A build of one partition at `T0 + offset_ns`: requested, job completed, partition available."""
    job_run = f"{br}-job"
    return [
        {
            "event_id": f"{br}-1",
            "timestamp": T0 + offset_ns,
            "build_request_id": br,
            "event_type": "build_request_event",
            "build_request_event": {
                "status_code": 1,
                "status_name": "BUILD_REQUEST_RECEIVED",
                "requested_partitions": [ref],
            },
        },
        {
            "event_id": f"{br}-2",
            "timestamp": T0 + offset_ns + 1,
            "build_request_id": br,
            "event_type": "job_event",
            "job_event": {
                "job_run_id": job_run,
                "job_label": "//jobs:x",
                "target_partitions": [ref],
                "status_code": 3,
                "status_name": "JOB_COMPLETED",
                "config": json.dumps({"outputs": [{"str": ref}]}),
            },
        },
        {
            "event_id": f"{br}-3",
            "timestamp": T0 + offset_ns + 2,
            "build_request_id": br,
            "event_type": "partition_event",
            "partition_event": {
                "partition_ref": ref,
                "status_code": 4,
                "status_name": "PARTITION_AVAILABLE",
                "job_run_id": job_run,
            },
        },
    ]


# Another local user, for the tests of what one can do to the pipeline's user (docs/security.md):
# `nobody`, reached with util-linux's setpriv, which only root can use. Its commands are plain
# programs (mkdir, ln, flock, a system python3 without this package), so they run whatever the
# folder this checkout lives in lets `nobody` read.
OTHER_UID = 65534
OTHER_GID = 65534
needs_another_user = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as another local user (setpriv to nobody) needs root"
)


def as_other_user(
    *command: str, wait: bool = True, check: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess | subprocess.Popen:
    """Run `command` as the other local user (`nobody`): completed (raising on a non-zero exit
    unless `check` is false), or started with `wait=False`.

    as_other_user("mkdir", "-m", "0777", "/tmp/planted")
    """
    argv = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_GID}", "--clear-groups", *command]
    if not wait:
        return subprocess.Popen(argv, **kwargs)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=check, **kwargs)


def write_landing(lake: Lake, name: str, lines: list[str | bytes | dict]) -> Path:
    """A landing file `name` in the lake's landing folder, one line per item (a dict as JSON)."""
    directory = Path(lake.landing)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "wb") as out:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line)
            out.write((line.encode() if isinstance(line, str) else line) + b"\n")
    return directory / name


# ---------------------------------------------------------------------------------------------
# JVM-free appender processes
# ---------------------------------------------------------------------------------------------


def log_uri(lake: Lake) -> str:
    """The event log URI of `lake`: delta:///path for a local root, delta+s3a://... for a bucket."""
    return f"delta://{lake.root}" if "://" not in lake.root else f"delta+{lake.root}"


@dataclass
class AppenderProcess:
    """A real process appending batches of events to a lake through the JVM-free backend
    (`databuild_assets_tests.appender`); its report says what it accepted."""

    process: subprocess.Popen
    batches_file: Path

    @classmethod
    def start(cls, lake: Lake, batches: list[list[dict[str, Any]]], workdir: Path, name: str) -> AppenderProcess:
        batches_file = workdir / f"{name}.json"
        batches_file.write_text(json.dumps(batches))
        process = subprocess.Popen(
            [sys.executable, "-m", "databuild_assets_tests.appender", log_uri(lake), str(batches_file), name],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return cls(process, batches_file)

    def report(self, timeout_s: float = 600) -> dict[str, Any]:
        """{"accepted": n, "duplicates": n} once the process has exited 0."""
        out, err = self.process.communicate(timeout=timeout_s)
        assert self.process.returncode == 0, f"appender failed:\n{err[-3000:]}"
        return json.loads(out.splitlines()[-1])


def op_output_metadata(run: Any, op: str) -> dict[str, Any]:
    """The output metadata values of op `op` in an op job's run (compaction_job has three ops:
    the purge, the serving index's refresh, then the scrub of Dagster's storage)."""
    [output] = [event for event in run.all_events if event.is_successful_output and event.step_key == op]
    return {key: value.value for key, value in output.step_output_data.metadata.items()}


MACHINE_ANCHOR_STEPS = 3_000_000


def machine_anchor_s(steps: int = MACHINE_ANCHOR_STEPS, repeats: int = 3) -> float:
    """The median time of `repeats` runs of a Python loop of `steps` additions: the host's speed
    now, beside which a suite's or a bench's times are read (on shared VMs it moves severalfold
    within minutes; bench/README.md, "Test and demo times"). Timed with no trace function set: a
    coverage run's tracer made the same loop three times slower."""
    timings, tracer = [], sys.gettrace()
    sys.settrace(None)
    try:
        for _ in range(repeats):
            timings.append(_timed_loop(steps))
    finally:
        sys.settrace(tracer)
    return sorted(timings)[len(timings) // 2]


def _timed_loop(steps: int) -> float:
    started = time.perf_counter()
    total = 0
    for step in range(steps):
        total += step
    return time.perf_counter() - started
