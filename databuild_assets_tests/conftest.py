"""One SparkSession per test process (its JVM starts once; `make test` runs two), and a fresh lake per test."""

from __future__ import annotations

import time

import pytest

# bel_cases holds the shared specification's assertions and support the shared builders; test
# modules import them, so they are registered here, before any of them, for pytest to rewrite
# their asserts (values in failures).
pytest.register_assert_rewrite("databuild_assets_tests.bel_cases", "databuild_assets_tests.support")

from databuild_assets.runtime.lake import Lake  # noqa: E402
from databuild_assets.runtime.spark import build_spark_session  # noqa: E402
from databuild_assets_tests.support import TEST_SPARK_SETTINGS  # noqa: E402


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
ANCHOR_STEPS = 3_000_000
_ANCHORS = pytest.StashKey[list]()


def _anchor_s() -> float:
    """The median of three timings of ANCHOR_STEPS additions in a Python loop."""
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for step in range(ANCHOR_STEPS):
            total += step
        timings.append(time.perf_counter() - started)
    return sorted(timings)[1]


def pytest_configure(config: pytest.Config) -> None:
    # The controller of a run with test processes, before any of them starts.
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        config.stash[_ANCHORS] = [_anchor_s()]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    anchors = config.stash.get(_ANCHORS, None)
    if anchors is None:
        return
    anchors.append(_anchor_s())
    terminalreporter.write_line(
        f"machine anchor ({ANCHOR_STEPS:,} Python loop steps, median of 3): "
        f"{anchors[0]:.2f} s before the tests, {anchors[1]:.2f} s after"
    )
