"""The lakehouse on a real distributed Spark: a standalone master and worker on loopback, started
from pyspark's own jars, with the project's Spark resource pointed at `spark://127.0.0.1:PORT`.

Ingestion, the filtered log, the three projections, an erasure and compaction run there (in a
process of their own: one SparkContext per process, and the suite's is local) and in local mode
(the suite's session); every table must come out the same, row for row. The cluster run must
really have used the cluster: separate executor JVMs, the Delta jars served to them, Python
workers running this venv's interpreter, and the master listing the application as finished.

Several minutes on a 2-core machine, so skipped by default: run it with `make cluster-test`
(DATABUILD_CLUSTER_TEST=1). See docs/cluster.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from databuild_assets.projections import PROJECTIONS
from databuild_assets.runtime.lake import Lake
from databuild_assets_tests.cluster_scenario import printed_summary, run_scenario, scenario_command

pytestmark = pytest.mark.cluster

CLUSTER_TEST_COMMAND = "make cluster-test"
N_EVENTS = 3000
APP_NAME = "databuild-cluster-parity"
STARTUP_TIMEOUT_S = 180
SCENARIO_TIMEOUT_S = 1500  # the cluster run took 400 s on the shared 2-core machine under load

if os.environ.get("DATABUILD_CLUSTER_TEST") != "1":
    pytest.skip(
        "the Spark standalone cluster test (a master, a worker and a driver JVM; several minutes) runs only "
        f"with DATABUILD_CLUSTER_TEST=1: run `{CLUSTER_TEST_COMMAND}`",
        allow_module_level=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    return str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")


class StandaloneCluster:
    """A Spark standalone master and one worker on 127.0.0.1, each in a process group of its own
    (the worker's executors are its children, so stopping the group stops them too)."""

    def __init__(self, workdir: Path, cores: int = 2, memory: str = "1g"):
        import pyspark

        self.spark_home = Path(pyspark.__file__).parent  # the pip package: jars/ holds Spark's launcher classes
        self.workdir = workdir
        self.port, self.ui_port, self.worker_ui_port = _free_port(), _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.cores, self.memory = cores, memory
        self.processes: list[subprocess.Popen] = []
        self.env = {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            # The worker builds each executor's command with Spark's launcher, which needs the Scala
            # version (bin/load-spark-env.sh exports it; starting the JVM by hand, we must).
            "SPARK_SCALA_VERSION": "2.13",
            "SPARK_LOCAL_IP": "127.0.0.1",  # web UIs and RPC on loopback only
        }

    def _start(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")
        command = [_java(), "-Xmx256m", "-cp", f"{self.spark_home}/jars/*", *args]
        self.processes.append(
            subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )
        log.close()

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=10) as response:
            return json.load(response)

    def start(self) -> None:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.url,
            "--host",
            "127.0.0.1",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--webui-port",
            str(self.worker_ui_port),
            "--work-dir",
            str(self.workdir / "work"),
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            for process, name in zip(self.processes, ("master", "worker"), strict=True):
                if process.poll() is not None:
                    raise RuntimeError(f"the Spark {name} exited ({process.returncode}): see {self.workdir / name}.log")
            try:
                if self.state().get("aliveworkers", 0) >= 1:
                    return
            except OSError:
                pass  # the master's web UI is not up yet
            time.sleep(1)
        raise TimeoutError(f"no worker registered with {self.url} within {STARTUP_TIMEOUT_S} s; logs in {self.workdir}")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = time.monotonic()
    standalone = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        standalone.start()
        print(f"standalone cluster {standalone.url} up in {time.monotonic() - started:.0f} s")
        yield standalone
    finally:
        standalone.stop()


def test_ingestion_projections_and_compaction_on_a_standalone_cluster_give_the_same_tables_as_local_mode(
    spark, cluster, tmp_path
):
    # The cluster run, in its own process: the project's LakehouseResource with master spark://...
    # Its Python workers must run this venv (they import this package, pyarrow and orjson):
    # spark.pyspark.python, as an operator would set it in DATABUILD_SPARK_CONF.
    cluster_lake = tmp_path / "cluster-lake"
    out, err = tmp_path / "cluster-run.out", tmp_path / "cluster-run.err"
    started = time.monotonic()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        run = subprocess.Popen(
            scenario_command(
                cluster.url,
                str(cluster_lake),
                N_EVENTS,
                "--app-name",
                APP_NAME,
                "--conf",
                f"spark.pyspark.python={sys.executable}",
                "--conf",
                "spark.executor.memory=1g",
            ),
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
            start_new_session=True,
        )
    finished: list[float] = []
    waiter = threading.Thread(target=lambda: (run.wait(), finished.append(time.monotonic())), daemon=True)
    waiter.start()
    try:
        # Meanwhile the same scenario in local mode, on the suite's session.
        local = run_scenario(spark, Lake(str(tmp_path / "local-lake")), N_EVENTS)
        local_s = time.monotonic() - started
        waiter.join(timeout=max(0.0, SCENARIO_TIMEOUT_S - local_s))
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    assert finished, f"the cluster run took more than {SCENARIO_TIMEOUT_S} s and was killed; log: {err}"
    print(f"local mode {local_s:.0f} s, cluster run {finished[0] - started:.0f} s (side by side)")
    returncode = run.returncode
    assert returncode == 0, f"the cluster run failed ({returncode}):\n{err.read_text()[-4000:]}"
    on_cluster = printed_summary(out.read_text())

    # It ran on the cluster: executors in JVMs of their own, fed Delta's jars by the driver, their
    # Python workers this venv; and the master knows the application, finished.
    engine = on_cluster["engine"]
    assert engine["master"] == cluster.url
    assert engine["executor_infos"] >= 2, engine  # the driver and at least one executor
    assert "delta-spark_4.2_2.13-4.4.0.jar" in engine["delta_jars_shipped"], engine
    assert engine["python_workers"] == [sys.executable], engine
    apps = {app["id"]: app for app in cluster.state()["completedapps"]}
    assert engine["app_id"] in apps, f"the master lists no application {engine['app_id']}: {list(apps)}"
    assert (apps[engine["app_id"]]["name"], apps[engine["app_id"]]["state"]) == (APP_NAME, "FINISHED")

    # The work was real (bad and redelivered lines, one erasure purged everywhere) ...
    result = on_cluster["result"]
    assert result["ingest"]["accepted"] == N_EVENTS and result["ingest"]["files"] == 3
    assert result["second_batch_refresh"] == dict.fromkeys(sorted(PROJECTIONS), "incremental")
    assert result["ingest"]["duplicates"] > 0 and result["ingest"]["quarantined"] > 0
    assert result["hidden_by_erasure"] > 0
    assert result["compaction"]["rows_purged"]["raw_event_log"] == result["hidden_by_erasure"]
    after = result["after_compaction"]
    assert after["raw_event_log"]["rows"] == N_EVENTS - result["hidden_by_erasure"]
    assert after["partition_state"]["rows"] == result["before_erasure"]["partition_state"]["rows"] - 1

    # ... and gave, table by table, what local mode gave.
    for stage in ("before_erasure", "after_compaction"):
        for table, digest in local["result"][stage].items():
            assert result[stage][table] == digest, (stage, table)
    assert result == local["result"]
