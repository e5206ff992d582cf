"""Dagster in its production shape, for the deployment test: a code server (`dagster code-server
start`), `dagster-daemon run` and `dagster-webserver`, each a process of its own on loopback, with a
DAGSTER_HOME whose `dagster.yaml` is this repo's plus a `storage:` section (None: SQLite under
DAGSTER_HOME), and a `workspace.yaml` that points at the code server. Every process keeps its log
for the failure message; the webserver's GraphQL API is how the test drives and watches them.

    with DagsterDeployment(workdir, storage=None) as deployment:
        run_id = deployment.launch_run("erase_job", run_config)   # queued; the daemon launches it
        assert deployment.wait_for_run(run_id) == "SUCCESS"
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from databuild_assets.runtime.warm_driver import stop_hosts

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCATION = "databuild_assets"  # the code server's --location-name, and workspace.yaml's location_name
REPOSITORY = "__repository__"  # what Dagster names the repository of a module's Definitions
DEFINITIONS_MODULE = "databuild_assets.definitions"
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
# A cron expression that does not fire while a test runs (midnight, January 1st): the schedules the
# test does not drive stay quiet, so every run it sees is one it asked for.
QUIET_CRON = "0 0 1 1 *"


class DeploymentError(RuntimeError):
    """A process of the deployment exited or did not answer; the message holds the logs' tails."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_a_service(nice: int = 0) -> None:
    # What a service manager gives each process (docs/deployment.md): files its owner's alone
    # (UMask=0077), SIGINT's default action (a test started in the background inherits it ignored),
    # and on a host shared with a live service, a lower CPU priority (Nice=).
    os.umask(0o077)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if nice:
        os.nice(nice)


def workspace_yaml(port: int, host: str = "127.0.0.1") -> str:
    """A workspace.yaml that loads the code location from a code server, not from the module."""
    return yaml.safe_dump(
        {"load_from": [{"grpc_server": {"host": host, "port": port, "location_name": LOCATION}}]}, sort_keys=False
    )


def instance_yaml(storage: dict[str, Any] | None) -> str:
    """This repo's dagster.yaml (run queue, concurrency, telemetry), with `storage` as its
    `storage:` section when given (e.g. {"postgres": {"postgres_url": ...}})."""
    text = (REPO_ROOT / "dagster.yaml").read_text()
    if storage is None:
        return text
    return text + "\n" + yaml.safe_dump({"storage": storage}, sort_keys=False)


@dataclass
class ServiceProcess:
    """One process of the deployment, in a session of its own, its output in `log`."""

    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_after_s: float | None = None
    nice: int = 0  # added to its CPU niceness, and so to its runs' and their Spark driver's

    def start(self, env: dict[str, str], cwd: Path) -> None:
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                self.command,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=functools.partial(_as_a_service, self.nice),
            )
        self.started_at = time.monotonic()

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"--- {self.name}: no log"
        return f"--- {self.name} ({self.log}):\n" + "\n".join(text)

    def stop(self) -> None:
        """SIGINT, then SIGTERM, then SIGKILL to the whole session (a code server's runs are its
        children), each given its time; then whatever of the group is left is killed."""
        if self.process is None or self.process.poll() is not None:
            return
        group = self.process.pid  # the session leader's id is the group's id
        for sig, wait in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class DagsterDeployment:
    """The three processes of a Dagster deployment over one DAGSTER_HOME and one lake in `workdir`."""

    workdir: Path
    storage: dict[str, Any] | None = None  # dagster.yaml's storage: section; None keeps SQLite
    settings: dict[str, str] = field(default_factory=dict)  # more environment for every process
    nice: int = 0  # the three processes' CPU niceness (their runs inherit it)
    code_server_port: int = field(default_factory=free_port)
    webserver_port: int = field(default_factory=free_port)
    services: dict[str, ServiceProcess] = field(default_factory=dict)

    @property
    def dagster_home(self) -> Path:
        return self.workdir / "dagster_home"

    @property
    def lake_root(self) -> Path:
        return self.workdir / "lake"

    @property
    def drivers_dir(self) -> Path:
        return self.workdir / "spark-drivers"

    @property
    def workspace_file(self) -> Path:
        return self.workdir / "workspace.yaml"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.webserver_port}"

    def environment(self) -> dict[str, str]:
        """What every process gets: the same DAGSTER_HOME, lake root and warm drivers' folder (the
        code server passes its environment on to the runs it launches), a small Spark, and the
        schedules the test does not drive made quiet."""
        env = dict(os.environ)
        env.update(
            DAGSTER_HOME=str(self.dagster_home),
            DATABUILD_LAKE_ROOT=str(self.lake_root),
            DATABUILD_SPARK_DRIVERS_DIR=str(self.drivers_dir),
            DATABUILD_SPARK_MASTER="local[2]",
            DATABUILD_SPARK_SHUFFLE_PARTITIONS="2",
            DATABUILD_SPARK_DRIVER_MEMORY="1g",
            DATABUILD_SPARK_CONF="spark.ui.enabled=false,spark.ui.showConsoleProgress=false",
            DATABUILD_VACUUM_CRON=QUIET_CRON,
            DATABUILD_CHECK_CRON=QUIET_CRON,
            DATABUILD_FRESHNESS_CRON=QUIET_CRON,
        )
        env.update(self.settings)
        return env

    def write_configuration(self) -> None:
        self.dagster_home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.dagster_home / "dagster.yaml").write_text(instance_yaml(self.storage))
        self.workspace_file.write_text(workspace_yaml(self.code_server_port))

    def start(self) -> None:
        """The code server first (the others load the code location from it), then the daemon and
        the webserver; returns once each answers, with how long each took in `ready_after_s`."""
        self.write_configuration()
        bin_dir = Path(sys.executable).parent
        env = self.environment()
        self.services["code-server"] = ServiceProcess(
            "code-server",
            [
                str(bin_dir / "dagster"),
                "code-server",
                "start",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.code_server_port),
                "-m",
                DEFINITIONS_MODULE,
                "--location-name",
                LOCATION,
            ],
            self.workdir / "code-server.log",
            nice=self.nice,
        )
        self.services["daemon"] = ServiceProcess(
            "daemon",
            [str(bin_dir / "dagster-daemon"), "run", "-w", str(self.workspace_file)],
            self.workdir / "daemon.log",
            nice=self.nice,
        )
        self.services["webserver"] = ServiceProcess(
            "webserver",
            [
                str(bin_dir / "dagster-webserver"),
                "-w",
                str(self.workspace_file),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.webserver_port),
            ],
            self.workdir / "webserver.log",
            nice=self.nice,
        )
        code_server = self.services["code-server"]
        code_server.start(env, REPO_ROOT)
        self._wait(code_server, self._code_server_answers, timeout=300)
        for name in ("daemon", "webserver"):
            self.services[name].start(env, self.workdir)
        self._wait(self.services["webserver"], self._webserver_lists_the_location, timeout=180)
        self._wait(self.services["daemon"], self._daemons_healthy, timeout=180)

    def stop(self) -> None:
        try:
            for name in ("webserver", "daemon", "code-server"):
                if name in self.services:
                    self.services[name].stop()
        finally:
            if self.drivers_dir.is_dir():
                stop_hosts(self.drivers_dir)  # it outlives the runs, not the test

    def __enter__(self) -> DagsterDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self, lines: int = 30) -> str:
        """The tail of every process's log: what a failure message shows."""
        return "\n".join(service.tail(lines) for service in self.services.values())

    def _wait(self, service: ServiceProcess, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for other in self.services.values():
                if other.exited() is not None:
                    raise DeploymentError(f"{other.name} exited with {other.exited()}:\n{self.logs()}")
            try:
                answer = ready()
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, DeploymentError) as error:
                answer = repr(error)
            if answer is True:
                service.ready_after_s = time.monotonic() - service.started_at
                return
            last = answer
            time.sleep(0.5)
        raise DeploymentError(f"{service.name} not ready after {timeout:.0f} s ({last}):\n{self.logs()}")

    def _code_server_answers(self) -> bool | str:
        check = subprocess.run(
            [
                str(Path(sys.executable).parent / "dagster"),
                "api",
                "grpc-health-check",
                "-p",
                str(self.code_server_port),
                "-h",
                "127.0.0.1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return check.returncode == 0 or f"health check: {check.stdout.strip()} {check.stderr.strip()[-300:]}"

    def _webserver_lists_the_location(self) -> bool | str:
        entries = self.location_entries()
        if entries and all(e["loadStatus"] == "LOADED" for e in entries):
            errors = [e for e in entries if e["locationOrLoadError"]["__typename"] == "PythonError"]
            if errors:
                raise DeploymentError(f"code location failed to load: {errors}\n{self.logs()}")
            return True
        return f"locations: {entries}"

    def _daemons_healthy(self) -> bool | str:
        statuses = self.graphql("{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }")[
            "instance"
        ]["daemonHealth"]["allDaemonStatuses"]
        unhealthy = [s["daemonType"] for s in statuses if s["required"] and not s["healthy"]]
        return not unhealthy or f"daemons not healthy yet: {unhealthy}"

    # --- the webserver's GraphQL API -------------------------------------------------------

    def graphql(self, query: str, variables: dict | None = None, timeout: float = 30) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.load(response)
        if answer.get("errors"):
            raise DeploymentError(f"GraphQL errors: {answer['errors']}")
        return answer["data"]

    def location_entries(self) -> list[dict]:
        data = self.graphql(
            """{ workspaceOrError { __typename ... on Workspace { locationEntries {
                 name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
        )
        return data["workspaceOrError"].get("locationEntries") or []

    def selector(self, **name: str) -> dict[str, str]:
        return {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, **name}

    def start_sensor(self, name: str) -> str:
        data = self.graphql(
            """mutation ($selector: SensorSelector!) { startSensor(sensorSelector: $selector) {
                 __typename ... on Sensor { sensorState { status } } ... on PythonError { message } } }""",
            {"selector": self.selector(sensorName=name)},
        )["startSensor"]
        if data["__typename"] != "Sensor":
            raise DeploymentError(f"sensor {name} not started: {data}")
        return data["sensorState"]["status"]

    def schedule_state(self, name: str) -> dict:
        """{"id": ..., "status": "RUNNING" or "STOPPED", "ticks": [...]} of schedule `name`."""
        data = self.graphql(
            """query ($selector: ScheduleSelector!) { scheduleOrError(scheduleSelector: $selector) {
                 __typename ... on Schedule { scheduleState { id selectorId status
                   ticks(limit: 10) { status runIds timestamp } } } ... on PythonError { message } } }""",
            {"selector": self.selector(scheduleName=name)},
        )["scheduleOrError"]
        if data["__typename"] != "Schedule":
            raise DeploymentError(f"schedule {name}: {data}")
        return data["scheduleState"]

    def stop_schedule(self, name: str, settle_s: float = 3.0, timeout: float = 60) -> None:
        """Stops schedule `name`, and checks `settle_s` later that it stayed stopped: the scheduler
        daemon writes the schedule's state back after a tick (its cursor), and a stop that lands
        between its read and that write is undone, so the stop is repeated until it holds."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.schedule_state(name)
            data = self.graphql(
                """mutation ($id: String, $selectorId: String) { stopRunningSchedule(id: $id,
                     scheduleSelectorId: $selectorId) { __typename ... on PythonError { message } } }""",
                {"id": state["id"], "selectorId": state["selectorId"]},
            )["stopRunningSchedule"]
            if data["__typename"] != "ScheduleStateResult":
                raise DeploymentError(f"schedule {name} not stopped: {data}")
            time.sleep(settle_s)
            if self.schedule_state(name)["status"] == "STOPPED":
                return
            if time.monotonic() > deadline:
                raise DeploymentError(f"schedule {name} still running {timeout:.0f} s after it was stopped")

    def start_schedule(self, name: str) -> None:
        data = self.graphql(
            """mutation ($selector: ScheduleSelector!) { startSchedule(scheduleSelector: $selector) {
                 __typename ... on PythonError { message } } }""",
            {"selector": self.selector(scheduleName=name)},
        )["startSchedule"]
        if data["__typename"] != "ScheduleStateResult":
            raise DeploymentError(f"schedule {name} not started: {data}")

    def sensor_cursor(self, name: str) -> str | None:
        data = self.graphql(
            """query ($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
                 __typename ... on Sensor { sensorState { typeSpecificData { __typename
                   ... on SensorData { lastCursor } } } } } }""",
            {"selector": self.selector(sensorName=name)},
        )["sensorOrError"]
        return data["sensorState"]["typeSpecificData"]["lastCursor"]

    def launch_run(self, job: str, run_config: dict | None = None) -> str:
        """Submits a run of `job` as the UI's Launch button does: the run coordinator queues it, and
        the daemon launches it when the queue's limits allow."""
        data = self.graphql(
            """mutation ($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
                 ... on LaunchRunSuccess { run { runId status } }
                 ... on PythonError { message }
                 ... on RunConfigValidationInvalid { errors { message } } } }""",
            {"params": {"selector": self.selector(jobName=job), "runConfigData": run_config or {}}},
        )["launchRun"]
        if data["__typename"] != "LaunchRunSuccess":
            raise DeploymentError(f"{job} not launched: {data}")
        return data["run"]["runId"]

    def runs(self, job: str | None = None, limit: int = 50) -> list[dict]:
        """Runs, newest first, each with its id, job, status, tags and times (seconds since the epoch)."""
        data = self.graphql(
            """query ($filter: RunsFilter, $limit: Int) { runsOrError(filter: $filter, limit: $limit) {
                 __typename ... on Runs { results { runId jobName status creationTime startTime endTime
                   tags { key value } } } } }""",
            {"filter": {"pipelineName": job} if job else {}, "limit": limit},
        )
        return data["runsOrError"]["results"]

    def wait_for_runs(self, job: str, count: int, timeout: float = 600) -> list[dict]:
        """Until `count` runs of `job` exist, newest first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(found := self.runs(job)) >= count:
                return found
            self._check_alive()
            time.sleep(1)
        raise DeploymentError(f"no {count} runs of {job} after {timeout:.0f} s: {self.runs()}\n{self.logs()}")

    def wait_for_run(self, run_id: str, timeout: float = 600) -> dict:
        """The run once it finished (status SUCCESS, FAILURE or CANCELED)."""
        deadline = time.monotonic() + timeout
        run: dict = {}
        while time.monotonic() < deadline:
            data = self.graphql(
                """query ($id: ID!) { runOrError(runId: $id) { __typename ... on Run { runId jobName status
                     creationTime startTime endTime tags { key value } } } }""",
                {"id": run_id},
            )["runOrError"]
            run = data if data["__typename"] == "Run" else {"status": data["__typename"]}
            if run["status"] in FINISHED:
                return run
            self._check_alive()
            time.sleep(1)
        raise DeploymentError(f"run {run_id} still {run.get('status')} after {timeout:.0f} s:\n{self.logs()}")

    def run_log(self, run_id: str) -> str:
        """A run's event log messages, one a line: what a failed run's assertion shows."""
        data = self.graphql(
            """query ($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection {
                 events { __typename ... on MessageEvent { message level } } } } }""",
            {"id": run_id},
        )["logsForRun"]
        return "\n".join(f"{e['level']}: {e['message']}" for e in data.get("events", []) if "message" in e)

    def failed_checks(self, run_id: str) -> list[str]:
        """The asset checks of a run that did not pass, each as 'asset/check: its description'
        (every page of the run's events)."""
        failed: list[str] = []
        cursor = None
        while True:
            data = self.graphql(
                """query ($id: ID!, $after: String) { logsForRun(runId: $id, afterCursor: $after) { __typename
                     ... on EventConnection { cursor hasMore events { __typename ... on AssetCheckEvaluationEvent {
                       evaluation { success checkName description assetKey { path } } } } } } }""",
                {"id": run_id, "after": cursor},
            )["logsForRun"]
            if data["__typename"] != "EventConnection":
                raise DeploymentError(f"the events of run {run_id} do not read: {data['__typename']}")
            failed += [
                f"{'/'.join(e['evaluation']['assetKey']['path'])}/{e['evaluation']['checkName']}: "
                f"{e['evaluation']['description']}"
                for e in data["events"]
                if e["__typename"] == "AssetCheckEvaluationEvent" and not e["evaluation"]["success"]
            ]
            if not data["hasMore"]:
                return failed
            cursor = data["cursor"]

    def output_metadata(self, run_id: str, step: str) -> dict[str, Any]:
        """The output metadata of step `step` in run `run_id`: each entry's int, text or markdown value."""
        data = self.graphql(
            """query ($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection { events {
                 __typename ... on ExecutionStepOutputEvent { stepKey metadataEntries { label
                   ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text }
                   ... on MarkdownMetadataEntry { mdStr } } } } } } }""",
            {"id": run_id},
        )["logsForRun"]
        return {
            entry["label"]: entry.get("intValue", entry.get("text", entry.get("mdStr")))
            for event in data.get("events", [])
            if event["__typename"] == "ExecutionStepOutputEvent" and event["stepKey"] == step
            for entry in event["metadataEntries"]
        }

    def _check_alive(self) -> None:
        for service in self.services.values():
            if service.exited() is not None:
                raise DeploymentError(f"{service.name} exited with {service.exited()}:\n{self.logs()}")
