"""The warm Spark driver (runtime/warm_driver.py): processes of their own attach to one JVM and
ingest through it, each seeing the commits of the one before; a process that dies attached takes
the JVM with it; other settings or other code get another host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from databuild_assets.runtime.lake import Lake
from databuild_assets.runtime.processes import process_alive
from databuild_assets.runtime.warm_driver import DRIVERS_DIR_ENV, driver_key, running_hosts, stop_hosts
from databuild_assets_tests.support import REPO_ROOT, one_partition_build, write_landing
from databuild_assets_tests.warm_driver_client import SETTINGS


@pytest.fixture(scope="module")
def drivers(tmp_path_factory):
    """A registry of hosts for this module alone; every host in it is stopped at the end."""
    folder = tmp_path_factory.mktemp("spark-drivers")
    yield folder
    stop_hosts(folder)


def start_client(lake: Lake, drivers: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "databuild_assets_tests.warm_driver_client", lake.root, *extra],
        cwd=REPO_ROOT,
        # The host it starts imports this checkout's package too (not an installed one).
        env={**os.environ, DRIVERS_DIR_ENV: str(drivers), "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def report(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, f"client failed:\n{err[-3000:]}"
    return json.loads(out.splitlines()[-1])


def test_processes_attach_to_one_jvm_and_ingest_through_it_and_one_killed_attached_stops_it(tmp_path, drivers):
    lake = Lake(str(tmp_path / "lake"))
    write_landing(lake, "first.jsonl", one_partition_build("br-1", "data/a", 0))

    first = report(start_client(lake, drivers))
    write_landing(lake, "second.jsonl", one_partition_build("br-2", "data/b", 10))
    second = report(start_client(lake, drivers))

    assert (first["files"], first["accepted"]) == (1, 3)
    assert (second["files"], second["accepted"]) == (1, 3)  # the first file is not read again
    assert second["jvm_pid"] == first["jvm_pid"]
    [(_, host, attached)] = running_hosts(drivers)
    assert attached == []  # both detached when they were done; the host waits for the next

    # A process that dies attached (killed mid-run) takes the host with it: what it held in the
    # JVM cannot be released, so no later run may inherit it. The same host: no second JVM start.
    holder = start_client(lake, drivers, "--hold")
    assert json.loads(holder.stdout.readline())["jvm_pid"] == first["jvm_pid"]
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 30
    while (
        process_alive(first["jvm_pid"]) or process_alive(host.pid) or running_hosts(drivers)
    ) and time.monotonic() < deadline:
        time.sleep(0.2)

    assert not process_alive(first["jvm_pid"]), "the JVM outlived the process that died attached to it"
    assert not process_alive(host.pid)
    assert running_hosts(drivers) == []


@pytest.mark.extended  # a leak over many attached processes: minutes; bench.soak runs it for an hour
def test_what_a_process_still_holds_at_exit_is_released_in_the_jvm(tmp_path, drivers):
    """A run that exits holding DataFrames (module globals, its session) must not leave them, their
    plans and broadcast relations bound in the warm JVM: its heap would grow run after run."""
    lake = Lake(str(tmp_path / "lake"))
    write_landing(lake, "only.jsonl", one_partition_build("br-1", "data/a", 0))
    kept = report(start_client(lake, drivers, "--keep"))["kept"]

    probe = subprocess.run(
        [sys.executable, "-m", "databuild_assets_tests.warm_driver_client", "--probe", kept],
        cwd=REPO_ROOT,
        env={**os.environ, DRIVERS_DIR_ENV: str(drivers), "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert json.loads(probe.stdout.splitlines()[-1]) == {"bound": False}


def test_other_settings_or_other_code_get_another_host(tmp_path):
    source = tmp_path / "package"
    (source / "ingest").mkdir(parents=True)
    (source / "ingest" / "lines.py").write_text("VALIDATE = 1\n")
    key = driver_key(SETTINGS, source)

    assert driver_key(replace(SETTINGS, shuffle_partitions=3), source) != key
    assert driver_key(replace(SETTINGS, extra_config={"spark.ui.enabled": "true"}), source) != key
    (source / "ingest" / "lines.py").write_text("VALIDATE = 2\n")  # the host's Python workers run the old code
    assert driver_key(SETTINGS, source) != key
    assert driver_key(SETTINGS) == driver_key(SETTINGS)


# A script that runs a job in its own process, as a user's script or notebook does, with the
# deployment's definitions (DATABUILD_SPARK_DRIVER unset), then reports what of Spark is left.
IN_PROCESS_RUN = """
import json, os
from pathlib import Path
from databuild_assets.definitions import defs

result = defs.resolve_job_def("ingest_job").execute_in_process()
children = [
    Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")[0].decode()
    for pid in os.listdir("/proc")
    if pid.isdigit() and Path(f"/proc/{pid}/stat").exists()
    and Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[1] == str(os.getpid())
]
print(json.dumps({"success": result.success, "children": children}))
"""


def test_a_job_executed_in_a_scripts_process_leaves_no_warm_driver_nor_jvm_behind(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    write_landing(lake, "first.jsonl", one_partition_build("br-1", "data/a", 0))
    drivers = tmp_path / "spark-drivers"
    environ = {key: value for key, value in os.environ.items() if key != "DATABUILD_SPARK_DRIVER"}
    environ.update(
        {DRIVERS_DIR_ENV: str(drivers), "DATABUILD_LAKE_ROOT": lake.root, "DATABUILD_SPARK_DRIVER_MEMORY": "1g"}
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", IN_PROCESS_RUN],
            cwd=tmp_path,
            env={**environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        reported = json.loads(run.stdout.splitlines()[-1])

        assert reported["success"]
        assert reported["children"] == []  # its JVM stopped when the run returned, not when the script ends
        assert (not drivers.exists()) or running_hosts(drivers) == []  # and no detached driver was started
        assert not (tmp_path / "spark-warehouse").exists()
    finally:
        if drivers.exists():  # what a run that attached to a warm driver left behind
            stop_hosts(drivers, wait_s=60)
