"""One SparkSession per test process (its JVM starts once; `make test` runs two), and a fresh lake per test."""

from __future__ import annotations

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
