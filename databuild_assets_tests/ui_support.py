"""What the UI test needs around the browser: `dagster dev` on loopback in a throwaway home and
lake, its GraphQL API (to wait for readiness and runs), and the headless Chromium to drive.

Nothing here downloads a browser: Playwright (the Python driver) launches Debian's chromium.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from databuild_assets.runtime.warm_driver import stop_hosts

REPO_ROOT = Path(__file__).resolve().parents[1]
UI_TEST_COMMAND = "make ui-test"
# Debian's package (apt-get install chromium); DATABUILD_UI_TEST_CHROMIUM overrides.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_executable() -> str | None:
    """The system Chromium to launch, or None when there is none."""
    configured = os.environ.get("DATABUILD_UI_TEST_CHROMIUM")
    candidates = (configured,) if configured else CHROMIUM_CANDIDATES
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DagsterDevError(RuntimeError):
    pass


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class DagsterDev:
    """`dagster dev` (webserver, daemon, code server) with this repo's workspace.yaml, a copy of
    its dagster.yaml in a temporary DAGSTER_HOME, and the lake in a temporary folder."""

    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    greeted: bool = False  # the UI's first-visit dialog was dismissed

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def dagster_home(self) -> Path:
        return self.workdir / "dagster_home"

    @property
    def lake_root(self) -> Path:
        return self.workdir / "lake"

    @property
    def log_path(self) -> Path:
        return self.workdir / "dagster-dev.log"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DAGSTER_HOME=str(self.dagster_home),
            DATABUILD_LAKE_ROOT=str(self.lake_root),
            # A tiny workload: small Spark, no Spark UI (it would take a port of its own).
            DATABUILD_SPARK_MASTER="local[2]",
            DATABUILD_SPARK_SHUFFLE_PARTITIONS="2",
            DATABUILD_SPARK_DRIVER_MEMORY="1g",
            DATABUILD_SPARK_CONF="spark.ui.enabled=false,spark.ui.showConsoleProgress=false",
            # The runs share a warm driver, as in a deployment; it registers here, and stop() stops it.
            DATABUILD_SPARK_DRIVERS_DIR=str(self.workdir / "spark-drivers"),
        )
        return env

    def start(self) -> None:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / "dagster.yaml", self.dagster_home / "dagster.yaml")
        dagster = Path(sys.executable).with_name("dagster")
        command = [
            str(dagster),
            "dev",
            "-w",
            str(REPO_ROOT / "workspace.yaml"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
        ]
        log = open(self.log_path, "wb")
        # A session of its own: dagster dev spawns a webserver, a daemon and a code server, and
        # each run is one more process (its Spark work on the warm driver); stop() ends the whole
        # group, then the driver. SIGINT is restored first: a test started in the background
        # inherits it ignored, and dagster dev shuts down cleanly only on SIGINT.
        self.process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )
        log.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        try:
            self._stop_dagster()
        finally:
            if (self.workdir / "spark-drivers").is_dir():
                stop_hosts(self.workdir / "spark-drivers")  # it outlives the runs, not the test

    def _stop_dagster(self) -> None:
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
                # The leader is gone; make sure no child of the group outlives it.
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            except subprocess.TimeoutExpired:
                continue

    def graphql(self, query: str, variables: dict | None = None, timeout: float = 30) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.load(response)
        if answer.get("errors"):
            raise DagsterDevError(f"GraphQL errors: {answer['errors']}")
        return answer["data"]

    def wait_until_ready(self, timeout: float = 300) -> None:
        """Until the webserver answers and the code location has loaded (or failed to)."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise DagsterDevError(f"dagster dev exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                data = self.graphql(
                    """{ workspaceOrError { __typename ... on Workspace { locationEntries {
                         name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }""",
                    timeout=10,
                )
                entries = data["workspaceOrError"].get("locationEntries") or []
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    errors = [e for e in entries if e["locationOrLoadError"]["__typename"] == "PythonError"]
                    if errors:
                        raise DagsterDevError(f"code location failed to load: {errors}")
                    return
                last = f"locations: {entries}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as error:
                last = repr(error)
            time.sleep(1)
        raise DagsterDevError(f"dagster dev not ready after {timeout:.0f} s ({last}):\n{self.log_tail()}")

    def runs(self, limit: int = 20) -> list[dict]:
        data = self.graphql(
            """query ($limit: Int) { runsOrError(limit: $limit) { __typename ... on Runs { results {
                 runId jobName status assetSelection { path } } } } }""",
            {"limit": limit},
        )
        return data["runsOrError"]["results"]

    def wait_for_run(self, run_id: str, timeout: float = 600) -> str:
        """The run's final status (SUCCESS, FAILURE or CANCELED)."""
        deadline = time.monotonic() + timeout
        status = "unknown"
        while time.monotonic() < deadline:
            data = self.graphql(
                """query ($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }""", {"id": run_id}
            )
            status = data["runOrError"].get("status", data["runOrError"]["__typename"])
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
            time.sleep(2)
        raise DagsterDevError(f"run {run_id} still {status} after {timeout:.0f} s:\n{self.log_tail()}")
