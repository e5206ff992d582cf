"""Misconfiguration: a bad lake root, a table path holding something that is not our Delta table,
a table of a newer schema version, Spark unable to start. Each gives one error that names the
problem and the fix, and leaves the disk exactly as it was (a listing of the tree before and after).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from urllib.parse import urlparse

import pytest

from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.ingest.writer import append_events
from databuild_assets.log.spark.backend import DeltaEventLog
from databuild_assets.runtime.delta_jars import DeltaJarsMissingError, jars_dir
from databuild_assets.runtime.delta_local import SchemaVersionError
from databuild_assets.runtime.delta_tables import NotADeltaTableError, ensure_table
from databuild_assets.runtime.jvm_startup import ARCHIVE_NAME, QUICK_JIT, WARNINGS_TO_STDERR, driver_java_options
from databuild_assets.runtime.lake import RAW_EVENT_LOG, SCHEMA_VERSION_PROPERTY, Lake, LakeRootError
from databuild_assets.runtime.spark import InvalidSparkMasterError, SparkSettings, build_spark_session, spark_config
from databuild_assets_tests.bel_cases import one_build_events
from databuild_assets_tests.support import OTHER_UID, REPO_ROOT, as_other_user, tree

# ---------------------------------------------------------------------------------------------
# The lake root
# ---------------------------------------------------------------------------------------------


def test_a_lake_root_whose_parent_folder_is_missing_is_refused_and_nothing_is_created(tmp_path):
    root = tmp_path / "mnt" / "data" / "lake"  # e.g. a volume that is not mounted
    before = tree(tmp_path)

    with pytest.raises(LakeRootError) as refused:
        _ = LakehouseResource(lake_root=str(root)).lake

    message = str(refused.value)
    assert f"lake root {root} does not exist, nor does its parent folder {root.parent}" in message
    assert f"mkdir -p {root}" in message and "DATABUILD_LAKE_ROOT" in message
    assert tree(tmp_path) == before


def test_a_lake_root_that_is_a_file_is_refused_and_left_alone(tmp_path):
    root = tmp_path / "lake"
    root.write_text("not a folder")
    before = tree(tmp_path)

    with pytest.raises(LakeRootError, match=rf"lake root {root} is a file, not a folder; fix DATABUILD_LAKE_ROOT"):
        _ = LakehouseResource(lake_root=str(root)).lake

    assert tree(tmp_path) == before


def test_a_missing_lake_root_under_an_existing_folder_is_created(tmp_path):
    lake = LakehouseResource(lake_root=str(tmp_path / "lake")).lake

    assert lake == Lake(str(tmp_path / "lake"))
    assert (tmp_path / "lake").is_dir()


def test_a_lake_root_this_user_cannot_write_is_refused(tmp_path):
    # Root may write anywhere, so as root the check runs as `nobody` in a child process.
    shared = Path("/tmp") / f"databuild-readonly-{os.getpid()}"
    root = shared / "lake"
    root.mkdir(parents=True, exist_ok=True)
    shared.chmod(0o755)
    root.chmod(0o555)  # readable by everyone, writable by no one but root
    try:
        before = tree(shared)
        if os.geteuid() == 0:
            script = "import sys; from databuild_assets.runtime.lake import Lake; Lake(sys.argv[1]).ensure_root()"
            _skip_unless_the_other_user_can_import_this_checkout()
            child = as_other_user(
                sys.executable, "-c", script, str(root), check=False, cwd=shared, env=_other_user_env()
            )
            assert child.returncode != 0
            error, uid = child.stderr, OTHER_UID
        else:
            with pytest.raises(LakeRootError) as refused:
                Lake(str(root)).ensure_root()
            error, uid = f"LakeRootError: {refused.value}", os.geteuid()
        assert (
            f"LakeRootError: lake root {root} is not writable by this user (uid {uid}); nothing was written." in error
        )
        assert "Give this user write access to it (chown/chmod), or fix DATABUILD_LAKE_ROOT" in error
        assert tree(shared) == before
    finally:
        root.chmod(0o755)
        root.rmdir()
        shared.rmdir()


# ---------------------------------------------------------------------------------------------
# A table path that holds something else
# ---------------------------------------------------------------------------------------------


def test_a_table_path_holding_non_delta_files_is_refused_and_its_files_are_kept(spark, lake):
    raw_path = Path(lake.table_path(RAW_EVENT_LOG))
    (raw_path / "2024").mkdir(parents=True)
    (raw_path / "2024" / "part-0000.parquet").write_bytes(b"PAR1 someone else's data")
    (raw_path / "notes.txt").write_text("keep me")
    before = tree(Path(lake.root))

    with pytest.raises(NotADeltaTableError) as refused:
        append_events(spark, lake, one_build_events(), writer="test")

    assert str(refused.value) == (
        f"{raw_path} should hold the Delta table raw_event_log but holds other files (2024, notes.txt) and no "
        "Delta log; nothing was written. Move those files away (or point DATABUILD_LAKE_ROOT at another lake); "
        "the table is created there on the next run."
    )
    assert tree(Path(lake.root)) == before


def test_a_table_path_that_is_a_file_is_refused(spark, lake):
    raw_path = Path(lake.table_path(RAW_EVENT_LOG))
    raw_path.parent.mkdir(parents=True)
    raw_path.write_text("a file where a table should be")
    before = tree(Path(lake.root))

    with pytest.raises(NotADeltaTableError, match=r"holds other files \(raw_event_log\) and no Delta log"):
        ensure_table(spark, str(raw_path), RAW_EVENT_LOG)

    assert tree(Path(lake.root)) == before


def test_an_empty_table_folder_is_used_for_the_table(spark, lake):
    raw_path = Path(lake.table_path(RAW_EVENT_LOG))
    raw_path.mkdir(parents=True)

    ensure_table(spark, str(raw_path), RAW_EVENT_LOG)

    assert (raw_path / "_delta_log" / f"{0:020d}.json").is_file()


# ---------------------------------------------------------------------------------------------
# A table of a newer schema version
# ---------------------------------------------------------------------------------------------


def test_a_log_of_a_newer_schema_version_is_neither_written_nor_read_and_stays_unchanged(spark, lake):
    raw_path = lake.table_path(RAW_EVENT_LOG)
    ensure_table(spark, raw_path, RAW_EVENT_LOG)
    spark.sql(f"ALTER TABLE delta.`{raw_path}` SET TBLPROPERTIES ('{SCHEMA_VERSION_PROPERTY}' = '7')")
    before = tree(Path(lake.root))
    expected = (
        f"{raw_path} has schema version 7, newer than this code's 1: a newer databuild-assets upgraded it, and "
        "this code would misread or mis-write its rows, so it neither reads nor writes it. Run a databuild-assets "
        "release that knows schema version 7 (upgrade this deployment), or point DATABUILD_LAKE_ROOT at a lake "
        "of version 1."
    )

    with pytest.raises(SchemaVersionError) as write_refused:
        append_events(spark, lake, one_build_events(), writer="test")
    with pytest.raises(SchemaVersionError) as read_refused:
        DeltaEventLog(spark, lake).list_events()

    assert str(write_refused.value) == str(read_refused.value) == expected
    assert tree(Path(lake.root)) == before


# ---------------------------------------------------------------------------------------------
# Spark unable to start
# ---------------------------------------------------------------------------------------------


def test_a_master_url_spark_does_not_know_is_refused_before_spark_starts(tmp_path):
    with pytest.raises(InvalidSparkMasterError) as refused:
        build_spark_session(SparkSettings(master="locl[*]"))

    assert str(refused.value) == (
        "Spark master URL 'locl[*]' is not one Spark knows; use local[*], local[N], spark://host:7077, yarn or "
        "k8s://https://host:port (DATABUILD_SPARK_MASTER, or the lakehouse resource's master). Spark was not started."
    )


def test_missing_delta_jars_name_make_setup(tmp_path, monkeypatch):
    empty = tmp_path / "jars"
    empty.mkdir()
    monkeypatch.setenv("DATABUILD_DELTA_JARS_DIR", str(empty))
    before = tree(tmp_path)

    with pytest.raises(DeltaJarsMissingError, match=rf"Delta Lake's jars are not in {empty}\. Run `make setup`"):
        build_spark_session(SparkSettings())

    assert tree(tmp_path) == before


def _start_spark_in_a_new_process(workdir: Path, **environment: str) -> subprocess.CompletedProcess:
    """Start Spark in a fresh interpreter (this one's JVM is already up), from `workdir`."""
    script = textwrap.dedent(
        """
        from databuild_assets.runtime.spark import SparkSettings, SparkStartError, build_spark_session
        try:
            build_spark_session(SparkSettings(master="local[1]"))
        except SparkStartError as error:
            print(f"{type(error).__name__}: {error}")
            raise SystemExit(3)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **environment}
    return subprocess.run(
        [sys.executable, "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )


def test_no_java_is_named_with_how_to_install_it(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    before = tree(tmp_path)

    child = _start_spark_in_a_new_process(workdir, JAVA_HOME=str(tmp_path / "no-such-jdk"))

    assert child.returncode == 3, child.stderr
    assert child.stdout.strip() == (
        f"JavaNotFoundError: Spark needs Java and there is none at {tmp_path}/no-such-jdk/bin/java "
        f"(JAVA_HOME is '{tmp_path}/no-such-jdk', and no usable `java` there). Install Java 17 (Debian: apt-get "
        "install openjdk-17-jdk-headless) or set JAVA_HOME to a Java 17 or 21 home, then run `make setup`. "
        "Spark was not started."
    )
    assert tree(tmp_path) == before


def test_a_java_that_cannot_run_spark_is_one_error_naming_java(tmp_path):
    java_home = tmp_path / "old-jdk"
    (java_home / "bin").mkdir(parents=True)
    java = java_home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'UnsupportedClassVersionError: class file version 61.0' >&2\nexit 1\n")
    java.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    before = tree(tmp_path)

    child = _start_spark_in_a_new_process(workdir, JAVA_HOME=str(java_home))

    assert child.returncode == 3, child.stderr
    assert child.stdout.strip() == (
        f"SparkStartError: Spark's JVM ({java}) exited before it started; its own message is printed above. "
        "Spark 4.2 needs Java 17 or 21: install it (Debian: apt-get install openjdk-17-jdk-headless) or point "
        "JAVA_HOME at one, then run `make setup`."
    )
    assert "UnsupportedClassVersionError" in child.stderr
    assert tree(tmp_path) == before


def test_the_driver_opens_the_class_archive_when_set_up_made_one_and_a_short_lived_one_runs_c1_only(tmp_path):
    assert driver_java_options(long_lived=False, directory=tmp_path) == QUICK_JIT
    assert driver_java_options(long_lived=True, directory=tmp_path) == ""
    (tmp_path / ARCHIVE_NAME).write_bytes(b"an archive")
    archive = f"-XX:SharedArchiveFile={tmp_path / ARCHIVE_NAME} {WARNINGS_TO_STDERR}"

    assert driver_java_options(long_lived=False, directory=tmp_path) == f"{archive} {QUICK_JIT}"
    assert driver_java_options(long_lived=True, directory=tmp_path) == archive
    assert (
        spark_config(SparkSettings(extra_config={"spark.driver.extraJavaOptions": "-Xss4m"}))[
            "spark.driver.extraJavaOptions"
        ]
        == "-Xss4m"
    )


def test_a_class_archive_the_jvm_cannot_use_does_not_stop_spark_from_starting(tmp_path):
    # Set-up's archive fits one Java build and class path; after an upgrade the JVM starts without it.
    jars = tmp_path / "jars"
    jars.mkdir()
    for jar in jars_dir().glob("*.jar"):
        (jars / jar.name).symlink_to(jar)
    (jars / ARCHIVE_NAME).write_bytes(b"not a class archive: another Java build's, or a torn copy" * 1000)
    workdir = tmp_path / "work"
    workdir.mkdir()

    child = _start_spark_in_a_new_process(workdir, DATABUILD_DELTA_JARS_DIR=str(jars))

    assert child.returncode == 0, child.stdout + child.stderr


def test_spark_keeps_its_warehouse_folder_out_of_the_folder_the_process_started_in(spark):
    # Spark makes its default database's folder on first use; ours are all Delta tables at paths.
    spark.sql("SHOW TABLES").collect()
    location = Path(urlparse(spark.catalog.getDatabase("default").locationUri).path)

    assert location == Path(tempfile.gettempdir()) / f"databuild-spark-warehouse-{os.getuid()}"
    assert not location.is_relative_to(Path.cwd())


def _other_user_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def _skip_unless_the_other_user_can_import_this_checkout() -> None:
    # A checkout under a folder only root may enter (`mktemp -d` makes one 0700) is out of the
    # other user's reach, and so is the interpreter of a virtual environment inside it.
    probe = as_other_user(
        sys.executable, "-c", "import databuild_assets.runtime.lake", check=False, env=_other_user_env()
    )
    if probe.returncode != 0:
        reason = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        pytest.skip(f"the other local user (uid {OTHER_UID}) cannot import this checkout at {REPO_ROOT}: {reason}")
