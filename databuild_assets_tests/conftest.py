"""One SparkSession per test process (its JVM starts once; `make test` runs two), and a fresh lake per test."""

from __future__ import annotations

import os

import pytest

# bel_cases holds the shared specification's assertions and support the shared builders; test
# modules import them, so they are registered here, before any of them, for pytest to rewrite
# their asserts (values in failures).
pytest.register_assert_rewrite("databuild_assets_tests.bel_cases", "databuild_assets_tests.support")

from databuild_assets.runtime.lake import Lake  # noqa: E402
from databuild_assets.runtime.spark import build_spark_session  # noqa: E402
from databuild_assets_tests.support import MACHINE_ANCHOR_STEPS, TEST_SPARK_SETTINGS, machine_anchor_s  # noqa: E402


@pytest.fixture(scope="session")
def spark():
    session = build_spark_session(TEST_SPARK_SETTINGS)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(str(tmp_path / "lake"))


# The suite's time follows the host's: on the shared 2-core VMs this project runs on, the same
# Python loop's CPU time varies severalfold within minutes on an idle machine (bench/README.md,
# "Test and demo times"). So a run with test processes (`-n`, as `make test`) times a fixed loop
# before they start and after they end, and prints it beside the suite's time: compare two suite
# times by their ratio to it.
_ANCHORS = pytest.StashKey[list]()


def pytest_configure(config: pytest.Config) -> None:
    # The controller of a run with test processes, before any of them starts.
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        config.stash[_ANCHORS] = [machine_anchor_s()]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    anchors = config.stash.get(_ANCHORS, None)
    if anchors is None:
        return
    anchors.append(machine_anchor_s())
    terminalreporter.write_line(
        f"machine anchor ({MACHINE_ANCHOR_STEPS:,} Python loop steps, median of 3): "
        f"{anchors[0]:.2f} s before the tests, {anchors[1]:.2f} s after"
    )


# The extended tier (marker `extended`): what `make test` proves more cheaply, run again on a
# slower path. Skipped unless DATABUILD_EXTENDED_TESTS=1 (`make extended-test`, part of
# `make long-test`): CI's `make test` has 30 minutes on 2 cores (docs/decisions/0033-test-suite.md).
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DATABUILD_EXTENDED_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="extended tier: run `make extended-test` (DATABUILD_EXTENDED_TESTS=1)")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)
