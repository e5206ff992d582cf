"""What several test modules share: the Dagster resource for a test lake, and JVM-free appender
processes. Test modules import this module (and bel_cases), never each other."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.runtime.lake import Lake
from databuild_assets_tests.conftest import TEST_SPARK_SETTINGS

REPO_ROOT = Path(__file__).resolve().parents[1]


def lakehouse_for(lake: Lake) -> LakehouseResource:
    """The suite's Spark settings, so materializing does not reconfigure the shared session."""
    return LakehouseResource(
        lake_root=lake.root,
        shuffle_partitions=TEST_SPARK_SETTINGS.shuffle_partitions,
        driver_memory=TEST_SPARK_SETTINGS.driver_memory,
        extra_spark_config=dict(TEST_SPARK_SETTINGS.extra_config),
    )


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
            [sys.executable, "-m", "databuild_assets_tests.appender", f"delta://{lake.root}", str(batches_file), name],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        return cls(process, batches_file)

    def report(self, timeout_s: float = 600) -> dict[str, Any]:
        """{"accepted": n, "duplicates": n} once the process has exited 0."""
        out, err = self.process.communicate(timeout=timeout_s)
        assert self.process.returncode == 0, f"appender failed:\n{err[-3000:]}"
        return json.loads(out.splitlines()[-1])
