"""Paths a table's log names and symlinks inside a table (issue 42, findings 4 and 10): nothing
outside the lake is read, moved or deleted through them. A commit naming a path that leaves its
table is damage `check` names by its version; `repair` moves no file from outside the lake and
a symlink only as the link itself; the readers refuse such a commit in one line; vacuum refuses
while a table holds a symlink, because Delta's VACUUM deletes old files in a linked folder.

One lake is built by Spark per module (one ingestion batch, the derived tables refreshed); each
test changes a copy of it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.log.serving.follower import DeltaFollower
from databuild_assets.log.spark.backend import DeltaEventLog
from databuild_assets.maintenance.check import check_lake
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.repair import repair_lake
from databuild_assets.maintenance.vacuum import SymlinkInTableError, vacuum_lake
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.commits import log_changes
from databuild_assets.runtime.damage import DamagedTableError
from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.delta_log import OutsideTableError, checked_log, table_relative
from databuild_assets.runtime.delta_tables import refuse_paths_outside
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, Lake
from databuild_assets.workload import write_landing_files

MARKER = b"a file outside the lake, readable by its owner only\n"
DAYS_AGO = time.time() - 30 * 86400


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory) -> Lake:
    lake = Lake(str(tmp_path_factory.mktemp("paths") / "lake"))
    os.makedirs(lake.root)
    write_landing_files(lake.landing, 300, seed=11, events_per_file=100)
    ingest_landing_files(spark, lake, settle_seconds=0)
    refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake, full=True)
    assert check_lake(lake).ok
    return lake


@pytest.fixture
def copy(built, tmp_path) -> Lake:
    shutil.copytree(built.root, tmp_path / "lake")
    return Lake(str(tmp_path / "lake"))


def _outside_file(path: Path) -> Path:
    """A 0600 file outside the lake that a commit or a link will name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(MARKER)
    path.chmod(0o600)
    os.utime(path, (DAYS_AGO, DAYS_AGO))
    return path


def _state(folder: Path) -> dict[str, tuple]:
    """Every file under `folder`: its bytes, mode and inode (the same file, in the same place)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            status = path.stat()
            found[str(path.relative_to(folder))] = (path.read_bytes(), status.st_mode, status.st_ino)
    return found


def _append_commit(table: Path, path: str) -> int:
    """A commit after the table's newest adding one data file at `path`, as a writer of the log
    would write it: the version it got."""
    version = latest_version_on_disk(str(table)) + 1
    add = {
        "path": path,
        "partitionValues": {"event_date": "2099-01-01"},
        "size": len(MARKER),
        "modificationTime": int(DAYS_AGO * 1000),
        "dataChange": True,
        "stats": json.dumps({"numRecords": 3}),
    }
    info = {"timestamp": int(time.time() * 1000), "operation": "WRITE", "operationParameters": {}}
    lines = [json.dumps({"commitInfo": info}), json.dumps({"add": add})]
    (table / "_delta_log" / f"{version:020d}.json").write_text("\n".join(lines) + "\n")
    return version


def _marker_in_lake(lake: Lake) -> list[str]:
    return [
        str(p) for p in Path(lake.root).rglob("*") if p.is_file() and not p.is_symlink() and MARKER in p.read_bytes()
    ]


@pytest.mark.parametrize(
    "path",
    [
        "../outside.parquet",
        "event_date=2024-01-01/../../../outside.parquet",
        "%2E%2E%2Foutside.parquet",
        "event_date=2024-01-01%2F%2e%2e%2F%2e%2e%2Foutside.parquet",
        "/etc/passwd",
        "%2Fetc%2Fpasswd",
        "file:/etc/passwd",
        "file%3A%2Fetc%2Fpasswd",
        "s3a://bucket/lake/part-0.parquet",
        "",
    ],
)
def test_a_log_path_that_leaves_the_table_is_refused_however_it_is_spelt(path: str) -> None:
    with pytest.raises(OutsideTableError, match=re.escape(f"the log names {path!r}, outside the table")):
        table_relative(path)


@pytest.mark.parametrize(
    ("path", "relative"),
    [
        ("event_date=2024-01-01/part-00000-1f.c000.snappy.parquet",) * 2,
        ("at=2024-01-01%2010%3A00%3A00/part-0.parquet", "at=2024-01-01 10:00:00/part-0.parquet"),
        ("a..b/part..0.parquet",) * 2,
    ],
)
def test_the_paths_our_writers_write_are_accepted_unquoted(path: str, relative: str) -> None:
    assert table_relative(path) == relative


def test_commits_naming_files_outside_the_table_are_damage_and_repair_moves_nothing_from_outside(
    spark, copy, tmp_path
) -> None:
    outside = tmp_path / "outside"
    _outside_file(outside / "x.parquet")
    absolute = _outside_file(outside / "absolute.parquet")
    table = Path(copy.table_path(RAW_EVENT_LOG))
    relative_version = _append_commit(table, "../../../outside/x.parquet")
    absolute_version = _append_commit(table, str(absolute))
    before = _state(outside)

    lines = [problem.line() for problem in check_lake(copy).problems]
    for version, path in ((relative_version, "../../../outside/x.parquet"), (absolute_version, str(absolute))):
        named = [line for line in lines if f"_delta_log/{version:020d}.json: commit {version} refused" in line]
        assert len(named) == 1 and f"the log names {path!r}, outside the table" in named[0], lines

    result = repair_lake(spark, copy)
    assert _state(outside) == before
    assert _marker_in_lake(copy) == []
    assert result.after is not None and result.after.ok, [p.line() for p in result.after.problems]
    for version in (relative_version, absolute_version):  # the commits went aside, the files they name stayed
        assert (Path(result.aside_folder) / "tables/raw_event_log/_delta_log" / f"{version:020d}.json").is_file()


def test_readers_refuse_a_commit_naming_a_file_outside_the_table_in_one_line_naming_it(spark, copy, tmp_path) -> None:
    _outside_file(tmp_path / "outside" / "x.parquet")
    table = Path(copy.table_path(RAW_EVENT_LOG))
    follower = DeltaFollower(str(table))
    follower.load(["event_id"])
    encoded = "%2E%2E%2F%2E%2E%2F%2E%2E%2Foutside%2Fx.parquet"  # ../../../outside/x.parquet
    version = _append_commit(table, encoded)
    named = re.escape(f"_delta_log/{version:020d}.json: commit {version} refused: ") + "(line 2: )?"
    named += re.escape(f"the log names {encoded!r}, outside the table")

    with pytest.raises(DamagedTableError, match=named):
        follower.changes()  # the serving index's follower, commit by commit
    with pytest.raises(DamagedTableError, match=named):
        DeltaFollower(str(table)).load(["event_id"])  # a snapshot as delta-rs lists it
    with pytest.raises(DamagedTableError, match=named):
        log_changes(spark, str(table), version - 1, version)  # the incremental refreshes
    with pytest.raises(DamagedTableError, match=named):
        DeltaEventLog(spark, copy).get_events_in_range(0, 2**62)  # the query API's Spark backend


def test_vacuum_refuses_while_a_table_holds_a_symlinked_folder_and_the_old_files_it_leads_to_survive(
    spark, copy, tmp_path
) -> None:
    outside = tmp_path / "outside-dir"
    old = _outside_file(outside / "part-00000-0ld.c000.snappy.parquet")
    link = Path(copy.table_path(RAW_EVENT_LOG)) / "event_date=2099-01-01"
    link.symlink_to(outside)

    with pytest.raises(SymlinkInTableError, match=rf"^vacuum refused: {re.escape(str(link))} is a symlink inside"):
        vacuum_lake(spark, copy, retention_hours=0, allow_short_retention=True)
    assert old.read_bytes() == MARKER

    lines = [problem.line() for problem in check_lake(copy).problems]
    named = "raw_event_log: tables/raw_event_log/event_date=2099-01-01: a symlink"
    assert any(line.startswith(named) for line in lines), lines
    result = repair_lake(spark, copy)
    assert not os.path.lexists(link) and os.path.islink(Path(result.aside_folder) / link.relative_to(copy.root))
    assert result.after is not None and result.after.ok

    vacuum_lake(spark, copy, retention_hours=0, allow_short_retention=True)
    assert old.read_bytes() == MARKER


def test_a_partition_folder_swapped_for_a_symlink_out_of_the_lake_is_moved_aside_as_a_link(
    spark, copy, tmp_path
) -> None:
    table = Path(copy.table_path(RAW_EVENT_LOG))
    partition = sorted(table.glob("event_date=*"))[0]
    elsewhere = tmp_path / "elsewhere"
    shutil.move(partition, elsewhere)
    partition.symlink_to(elsewhere)
    cut = sorted(elsewhere.glob("*.parquet"))[0]
    cut.write_bytes(cut.read_bytes()[:-1])  # damaged there: a repair would move it aside
    before = _state(elsewhere)
    events = spark.read.format("delta").load(str(table)).count()

    lines = [problem.line() for problem in check_lake(copy, read_data=False).problems]
    assert any(f"{partition.name}: a symlink (-> {elsewhere})" in line for line in lines), lines
    assert any("data file is outside the table" in line and str(partition) in line for line in lines), lines

    result = repair_lake(spark, copy)
    assert _state(elsewhere) == before
    assert not partition.is_symlink()  # the link went aside; the folder is the events ingested again
    assert (Path(result.aside_folder) / partition.relative_to(copy.root)).is_symlink()
    assert result.after is not None and result.after.ok, [p.line() for p in result.after.problems]
    assert spark.read.format("delta").load(str(table)).count() == events  # ingested again from landing


# -- Spark's readers: the guard on the paths of the log files a job's read would follow ------------


SPARK_MARKER = "marker-3f9c1ae07b5d42e8a6c0d19b7e2f8a41"  # the event_id of the one row outside the lake


def _outside_parquet(spark, table: Path, outside: Path) -> tuple[str, int]:
    """A real data file of the table's oldest partition, outside the lake, its one row's event_id
    SPARK_MARKER: (that partition's date, the file's size)."""
    partition = sorted(table.glob("event_date=*"))[0]
    scratch = outside.parent / "outside-scratch"
    row = spark.read.parquet(str(next(partition.glob("*.parquet")))).limit(1)
    row.withColumn("event_id", F.lit(SPARK_MARKER)).coalesce(1).write.parquet(str(scratch))
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(next(scratch.glob("part-*.parquet")), outside)
    shutil.rmtree(scratch)
    return partition.name.removeprefix("event_date="), outside.stat().st_size


def _plant_add(table: Path, path: str, event_date: str, size: int) -> int:
    """A commit adding the file at `path` (as the log names it) to the `event_date` partition, as a
    writer of the log would write it: the version it got."""
    version = latest_version_on_disk(str(table)) + 1
    add = {
        "path": path,
        "partitionValues": {"event_date": event_date},
        "size": size,
        "modificationTime": int(DAYS_AGO * 1000),
        "dataChange": True,
        "stats": json.dumps({"numRecords": 1}),
    }
    info = {"timestamp": int(time.time() * 1000), "operation": "WRITE", "operationParameters": {}}
    lines = [json.dumps({"commitInfo": info}), json.dumps({"add": add})]
    (table / "_delta_log" / f"{version:020d}.json").write_text("\n".join(lines) + "\n")
    return version


def _land_more(lake: Lake, folder: Path, seed: int) -> None:
    """A few more landing files, beside those the lake ingested already."""
    write_landing_files(folder, 30, seed=seed, events_per_file=10)
    for path in folder.glob("*.jsonl"):
        shutil.move(path, Path(lake.landing) / f"more-{path.name}")


def _spark_marker_in_lake(lake: Lake) -> list[str]:
    """The files under the lake holding SPARK_MARKER (a Parquet footer keeps it in its statistics)."""
    marker = SPARK_MARKER.encode()
    return [str(p) for p in Path(lake.root).rglob("*") if p.is_file() and marker in p.read_bytes()]


def test_a_planted_commit_naming_a_parquet_file_outside_the_lake_fails_compaction_and_the_filtered_log_rebuild(
    spark, copy, tmp_path
) -> None:
    table = Path(copy.table_path(RAW_EVENT_LOG))
    outside = tmp_path / "outside" / "x.parquet"
    event_date, size = _outside_parquet(spark, table, outside)
    assert spark.read.parquet(str(outside)).where(F.col("event_id") == SPARK_MARKER).count() == 1
    version = _plant_add(table, "../../../outside/x.parquet", event_date, size)
    named = re.escape(
        f"raw_event_log: tables/raw_event_log/_delta_log/{version:020d}.json: commit {version} refused: line 2: "
        "the log names '../../../outside/x.parquet', outside the table (it holds a '..' segment)"
    )

    with pytest.raises(DamagedTableError, match=f"^{named}"):
        compact(spark, copy)  # OPTIMIZE would pack the file into the partition's new file
    with pytest.raises(DamagedTableError, match=f"^{named}"):
        refresh_filtered_log(spark, copy, full=True)  # the rebuild would copy its row
    assert _spark_marker_in_lake(copy) == []
    assert outside.is_file()


def test_a_planted_commit_in_the_filtered_log_fails_its_refresh_in_one_line_naming_it(spark, copy, tmp_path) -> None:
    raw, table = Path(copy.table_path(RAW_EVENT_LOG)), Path(copy.table_path(FILTERED_EVENT_LOG))
    outside = tmp_path / "outside" / "x.parquet"
    event_date, size = _outside_parquet(spark, raw, outside)
    version = _plant_add(table, str(outside), event_date, size)  # absolute, as a shallow clone's
    _land_more(copy, tmp_path / "more", seed=12)
    ingest_landing_files(spark, copy, settle_seconds=0)  # new raw events for the refresh to fold in

    named = f"filtered_event_log: tables/filtered_event_log/_delta_log/{version:020d}.json: commit {version} refused"
    with pytest.raises(DamagedTableError, match=f"^{re.escape(named)}: line 2: the log names .*it is absolute"):
        refresh_filtered_log(spark, copy)
    assert _spark_marker_in_lake(copy) == []


def test_the_guard_reads_each_log_file_once_and_then_only_the_commits_written_since(spark, copy, tmp_path) -> None:
    table = Path(copy.table_path(FILTERED_EVENT_LOG))
    newest = latest_version_on_disk(str(table))
    first = refuse_paths_outside(str(table))
    assert first == newest
    version, read = checked_log(str(table))
    assert version == newest and 1 <= read <= newest + 1
    assert refuse_paths_outside(str(table)) == newest and checked_log(str(table)) == (newest, read)  # nothing new

    latest = table / "_delta_log" / f"{newest:020d}.json"
    added = table / "_delta_log" / f"{newest + 1:020d}.json"
    added.write_text(latest.read_text())  # a commit that names the files its writer wrote: accepted
    assert refuse_paths_outside(str(table)) == newest + 1
    assert checked_log(str(table)) == (newest + 1, read + 1)  # only the new commit was read

    planted = _plant_add(table, "%2E%2E/elsewhere.parquet", "2024-01-01", 10)
    with pytest.raises(DamagedTableError, match=re.escape(f"{planted:020d}.json: commit {planted} refused")):
        refuse_paths_outside(str(table))
    assert checked_log(str(table)) == (newest + 1, read + 1)  # a refused commit is not remembered as checked
    with pytest.raises(DamagedTableError, match=re.escape(f"{planted:020d}.json: commit {planted} refused")):
        refuse_paths_outside(str(table))  # refused again, on every call


def test_a_planted_checkpoint_naming_a_path_outside_the_table_is_refused_naming_it(spark, copy) -> None:
    table = Path(copy.table_path(FILTERED_EVENT_LOG))
    newest = latest_version_on_disk(str(table))
    refuse_paths_outside(str(table))
    adds = pa.array([{"path": "/etc/passwd", "size": 1}], pa.struct([("path", pa.string()), ("size", pa.int64())]))
    checkpoint = table / "_delta_log" / f"{newest:020d}.checkpoint.parquet"
    pq.write_table(pa.table({"add": adds}), checkpoint)

    named = f"filtered_event_log: tables/filtered_event_log/_delta_log/{checkpoint.name}: checkpoint {newest} refused"
    with pytest.raises(DamagedTableError, match=f"^{re.escape(named)}: the log names '/etc/passwd'"):
        refuse_paths_outside(str(table))


def test_a_lone_part_of_a_checkpoint_does_not_hide_the_commit_before_it(spark, copy) -> None:
    # Spark ignores an incomplete multi-part checkpoint and replays the commits from an older one:
    # a part 1 of 2 planted at the planted commit's version must not make the guard skip that commit.
    table = Path(copy.table_path(FILTERED_EVENT_LOG))
    refuse_paths_outside(str(table))
    version = _plant_add(table, "/etc/passwd", "2026-01-01", 1)
    adds = pa.array([{"path": "harmless.parquet", "size": 1}], pa.struct([("path", pa.string()), ("size", pa.int64())]))
    pq.write_table(
        pa.table({"add": adds}), table / "_delta_log" / f"{version:020d}.checkpoint.0000000001.0000000002.parquet"
    )

    named = f"filtered_event_log: tables/filtered_event_log/_delta_log/{version:020d}.json: commit {version} refused"
    with pytest.raises(DamagedTableError, match=f"^{re.escape(named)}: line 2: the log names '/etc/passwd'"):
        refuse_paths_outside(str(table))


def test_an_ingestion_run_refuses_a_raw_log_naming_a_file_outside_it_before_reading_it(spark, copy, tmp_path) -> None:
    table = Path(copy.table_path(RAW_EVENT_LOG))
    outside = tmp_path / "outside" / "x.parquet"
    event_date, size = _outside_parquet(spark, table, outside)
    version = _plant_add(table, f"file://{outside}", event_date, size)
    _land_more(copy, tmp_path / "more", seed=13)

    named = f"raw_event_log: tables/raw_event_log/_delta_log/{version:020d}.json: commit {version} refused"
    with pytest.raises(DamagedTableError, match=f"^{re.escape(named)}: line 2: the log names .*it is a URI"):
        ingest_landing_files(spark, copy, settle_seconds=0)
    assert _spark_marker_in_lake(copy) == []
