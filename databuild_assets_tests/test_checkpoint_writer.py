"""The checkpoint an appender writes from the last one and the commits since
(runtime/delta_checkpoint.py): the same actions delta-rs writes for that version, and what it
leaves to delta-rs."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving.append import append_files, raw_log_rows
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.log.serving.checkpoints import CHECKPOINT_BASE, checkpoint_if_due
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.local_bin_pack import bin_pack_locally
from databuild_assets.runtime import delta_checkpoint
from databuild_assets.runtime.delta_checkpoint import NotReplayable, file_identity, replay
from databuild_assets.runtime.delta_log import checkpoint_path, commit_path, last_checkpoint
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events

_OURS = "parquet-cpp-arrow"  # pyarrow's writer; delta-rs's files say parquet-rs


def _actions(table_path: str, version: int) -> dict[tuple[str, str], dict[str, Any]]:
    """The actions of a checkpoint by (kind, key), fields left null dropped; `dataChange` aside
    (a checkpoint's adds are no change of data, whatever each writer puts there)."""
    actions = {}
    for row in pq.read_table(checkpoint_path(table_path, version)).to_pylist():
        for kind, body in row.items():
            if body is not None:
                key = body.get("path") or body.get("appId") or body.get("domain") or ""
                assert (kind, key) not in actions, f"{kind} {key} twice in the checkpoint of {version}"
                actions[(kind, key)] = {name: value for name, value in body.items() if value is not None}
                actions[(kind, key)].pop("dataChange", None)
    return actions


def _append_in_batches(log: DeltaRsEventLog, events: list[dict[str, Any]], size: int = 5) -> None:
    for start in range(0, len(events), size):
        log.append_events(events[start : start + size])


def _others_append(path: str, events: list[dict[str, Any]], size: int = 5) -> None:
    """Commits of another process's appender: ones this process's checkpoints read from the files."""
    columns = deltalake.DeltaTable(path).metadata().configuration["delta.dataSkippingStatsColumns"].split(",")
    for start in range(0, len(events), size):
        rows = raw_log_rows(enumerate(canonical_event(e) for e in events[start : start + size]), "other")
        append_files(path, deltalake.DeltaTable(path).version() + 1, rows, ["event_date"], columns)


def test_a_checkpoint_from_the_last_one_and_the_commits_since_holds_what_delta_rs_writes(
    spark, lake: Lake, tmp_path: Path
) -> None:
    path = lake.table_path(RAW_EVENT_LOG)
    events = list(generate_events(700, seed=31))
    with DeltaRsEventLog(lake) as log:
        _append_in_batches(log, events[:200])  # the first checkpoint delta-rs's, the next ones ours
        compact(spark, lake, open_days=0)  # Spark's removes and adds
        _append_in_batches(log, events[200:400])
        bin_pack_locally(path, None, 1 << 30)  # ours: removes and adds, then a checkpoint
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('databuild.test' = 'x')")  # a metaData action
        _append_in_batches(log, events[400:600])
    _others_append(path, events[600:])
    last, newest = last_checkpoint(path)[0], deltalake.DeltaTable(path).version()
    assert pq.ParquetFile(checkpoint_path(path, last)).metadata.created_by.startswith(_OURS)
    assert newest > last + 5

    ours, delta_rs = str(tmp_path / "ours"), str(tmp_path / "delta_rs")
    shutil.copytree(path, ours)
    shutil.copytree(path, delta_rs)
    # The appender's own checkpoint, its commits replayed from memory, is delta-rs's of that version.
    checkpoint_path(delta_rs, last).unlink()
    (Path(delta_rs) / "_delta_log" / "_last_checkpoint").unlink()
    deltalake.DeltaTable(delta_rs, version=last).create_checkpoint()
    assert _actions(path, last) == _actions(delta_rs, last)
    state = replay(ours, newest)
    assert state.configuration["databuild.test"] == "x"
    assert state.write()
    deltalake.DeltaTable(delta_rs, version=newest).create_checkpoint()

    expected = _actions(delta_rs, newest)
    assert {kind for kind, _ in expected} >= {"protocol", "metaData", "add", "remove"}
    assert sum(kind == "remove" for kind, _ in expected) >= 40  # the compactions' tombstones
    assert _actions(ours, newest) == expected
    assert json.loads((Path(ours) / "_delta_log" / "_last_checkpoint").read_text()) == {
        "version": newest,
        "size": len(expected),
        "sizeInBytes": checkpoint_path(ours, newest).stat().st_size,
        "numOfAddFiles": sum(kind == "add" for kind, _ in expected),
    }
    # Spark and delta-rs open the table from it.
    by_spark = spark.read.format("delta").load(ours).select("event_id").collect()
    assert sorted(row["event_id"] for row in by_spark) == sorted(event["event_id"] for event in events)
    assert deltalake.DeltaTable(ours).version() == newest

    # Tombstones past `delta.deletedFileRetentionDuration` (a week) are left out, as delta-rs does.
    shutil.rmtree(ours)
    shutil.copytree(path, ours)
    replay(ours, newest).write(now_ms=state_time_ms(newest, path) + 8 * 24 * 3600 * 1000)
    assert {key for key in _actions(ours, newest) if key[0] != "remove"} == {
        key for key in expected if key[0] != "remove"
    }
    assert not [key for key in _actions(ours, newest) if key[0] == "remove"]


def state_time_ms(version: int, path: str) -> int:
    return json.loads(commit_path(path, version).read_text().splitlines()[0])["commitInfo"]["timestamp"]


def _small_table(tmp_path: Path) -> str:
    table = str(tmp_path / "t")
    deltalake.write_deltalake(table, pa.table({"n": [0]}))
    deltalake.DeltaTable(table).create_checkpoint()
    deltalake.write_deltalake(table, pa.table({"n": [1]}), mode="append")
    return table


def _add_line(table: str, version: int, **fields: Any) -> None:
    lines = commit_path(table, version).read_text().splitlines()
    add = next(json.loads(line) for line in lines if '"add"' in line)
    add["add"].update(fields, path=f"other-{add['add']['path']}")
    commit_path(table, version).write_text("\n".join([*lines, json.dumps(add)]) + "\n")


def _set_property(table: str, name: str, value: str) -> None:
    lines = commit_path(table, 0).read_text().splitlines()
    meta = next(json.loads(line) for line in lines if '"metaData"' in line)
    meta["metaData"]["configuration"][name] = value
    with open(commit_path(table, 1), "a") as commit:
        commit.write("\n" + json.dumps(meta) + "\n")


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda table: _add_line(table, 1, deletionVector={"storageType": "u", "pathOrInlineDv": "x"}), "deletion"),
        (lambda table: _add_line(table, 1, newField=1), "no place for"),
        (lambda table: Path(commit_path(table, 1)).write_text('{"checkpointMetadata": {"version": 1}}\n'), "action"),
        (lambda table: Path(commit_path(table, 1)).write_text("{not json\n"), "does not read"),
        (lambda table: Path(commit_path(table, 1)).unlink(), "missing"),
        (lambda table: checkpoint_path(table, 0).unlink(), "single file"),
        (lambda table: _set_property(table, "delta.deletedFileRetentionDuration", "a fortnight"), "Retention"),
        (lambda table: _set_property(table, "delta.checkpoint.writeStatsAsStruct", "true"), "writeStatsAsStruct"),
        (lambda table: _add_line(table, 1, size="large"), "does not take"),
    ],
)
def test_what_the_replay_does_not_know_is_left_to_delta_rs(tmp_path: Path, damage, why: str) -> None:
    table = _small_table(tmp_path)
    assert replay(table, 1).configuration == {}
    damage(table)
    with pytest.raises(NotReplayable, match=why):
        replay(table, 1)


def test_a_table_the_replay_leaves_is_checkpointed_by_delta_rs(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    for n in range(2 * CHECKPOINT_BASE + 1):
        deltalake.write_deltalake(table, pa.table({"n": [n]}), mode="append")
    assert last_checkpoint(table) is None  # nothing to replay from
    assert checkpoint_if_due(table, CHECKPOINT_BASE) == CHECKPOINT_BASE
    assert pq.ParquetFile(checkpoint_path(table, CHECKPOINT_BASE)).metadata.created_by.startswith("parquet-rs")
    assert checkpoint_if_due(table, 2 * CHECKPOINT_BASE) == 2 * CHECKPOINT_BASE  # from delta-rs's: ours
    assert pq.ParquetFile(checkpoint_path(table, 2 * CHECKPOINT_BASE)).metadata.created_by.startswith(_OURS)
    assert last_checkpoint(table) == (2 * CHECKPOINT_BASE, 2 + 2 * CHECKPOINT_BASE + 1)
    assert sorted(deltalake.DeltaTable(table).to_pyarrow_table()["n"].to_pylist()) == list(
        range(2 * CHECKPOINT_BASE + 1)
    )


def test_a_commit_this_process_wrote_is_replayed_from_memory_only_while_its_file_is_still_there(
    tmp_path: Path,
) -> None:
    table = _small_table(tmp_path)
    written = json.loads(commit_path(table, 1).read_text().splitlines()[-1])
    identity = file_identity(commit_path(table, 1))
    other = {"add": {**written["add"], "path": "other.parquet"}}
    assert _paths(replay(table, 1, {1: (identity, [other])})) == {"other.parquet"}  # from memory
    # Another commit put at version 1 since (a repair moved ours aside): its file is read.
    text = commit_path(table, 1).read_text()
    commit_path(table, 1).unlink()
    commit_path(table, 1).write_text(text + "\n")  # the same inode may come back, within the clock's tick
    assert _paths(replay(table, 1, {1: (identity, [other])})) == {written["add"]["path"]}
    commit_path(table, 1).unlink()
    with pytest.raises(NotReplayable, match="missing"):
        replay(table, 1, {1: (identity, [other])})


def _paths(state) -> set[str]:
    return {path for path, (kind, _) in state.files.items() if kind == "add"}


def test_a_path_written_encoded_is_the_file_its_decoded_remove_names(tmp_path: Path) -> None:
    # Delta compares paths decoded: `a%3Db` in the checkpoint is the file a remove of `a=b` drops.
    table = _small_table(tmp_path)
    added = json.loads(commit_path(table, 1).read_text().splitlines()[-1])["add"]
    encoded = {**added, "path": "x%3D1/f.parquet"}
    commit_path(table, 2).write_text(json.dumps({"add": encoded}) + "\n")
    replay(table, 2).write()
    remove = {"path": "x=1/f.parquet", "deletionTimestamp": int(time.time() * 1000), "dataChange": True}
    commit_path(table, 3).write_text(json.dumps({"remove": remove}) + "\n")
    replay(table, 3).write()
    actions = _actions(table, 3)
    assert ("add", "x%3D1/f.parquet") not in actions and ("remove", "x=1/f.parquet") in actions


def test_a_log_closed_drops_what_it_kept_of_the_tables_checkpoints(lake: Lake) -> None:
    path = lake.table_path(RAW_EVENT_LOG)
    events = list(generate_events(5 * (3 * CHECKPOINT_BASE + 3), seed=32))
    with DeltaRsEventLog(lake) as log:
        _append_in_batches(log, events[:-5])
        log._checkpoints.wait()
        # One commit after the writer is done: a writer that fell behind checkpoints the newest
        # commit, so the commits since are not known to be any before this one.
        _append_in_batches(log, events[-5:])
        log._checkpoints.wait()
        assert pq.ParquetFile(checkpoint_path(path, last_checkpoint(path)[0])).metadata.created_by.startswith(_OURS)
        assert path in delta_checkpoint._kept  # the next checkpoint starts from it, unread
        assert log._checkpoints._known  # the commits since, from memory
    assert path not in delta_checkpoint._kept
    assert not log._checkpoints._known
