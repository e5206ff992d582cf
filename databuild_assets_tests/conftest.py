"""One SparkSession for the whole suite (the JVM starts once), and a fresh lake per test."""

from __future__ import annotations

import pytest

# bel_cases holds the shared specification's assertions; several test modules import it, so it is
# registered here, before any of them, for pytest to rewrite its asserts (values in failures).
pytest.register_assert_rewrite("databuild_assets_tests.bel_cases")

from databuild_assets.runtime.lake import Lake  # noqa: E402
from databuild_assets.runtime.spark import SparkSettings, build_spark_session  # noqa: E402

# Small on purpose: the suite's tables are tiny, and every shuffle partition is a task.
TEST_SPARK_SETTINGS = SparkSettings(
    app_name="databuild-assets-tests",
    shuffle_partitions=2,
    driver_memory="2g",
    extra_config={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
)


@pytest.fixture(scope="session")
def spark():
    session = build_spark_session(TEST_SPARK_SETTINGS)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(str(tmp_path / "lake"))
