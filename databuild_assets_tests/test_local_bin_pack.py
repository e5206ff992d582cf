"""The bin-pack without Spark (maintenance/local_bin_pack.py): a service's small files packed into
one, every row kept, committed as the OPTIMIZE the file-count trigger recognises; appends that
land meanwhile kept; a purge that removed a packed file meanwhile makes it give up with the
table unchanged; a pack that fails partway leaves none of its files; a file path in the log
that leaves the table is not read."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from databuild_assets.log import open_event_log
from databuild_assets.log.serving.append import commit_files
from databuild_assets.maintenance.compaction_trigger import files_since_pack
from databuild_assets.maintenance.local_bin_pack import PackConflictError, bin_pack_locally
from databuild_assets.runtime.commit_lock import commit_lock
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events
from databuild_assets_tests.support import AppenderProcess, log_uri

PACKED_BYTES = 64 * 2**20


def _lake_of_small_appends(root: Path, batches: int, seed: int = 5) -> tuple[Lake, list[dict[str, Any]]]:
    lake = Lake(str(root))
    events = list(generate_events(batches * 5, seed=seed))
    with open_event_log(log_uri(lake), writer="svc") as log:
        for start in range(0, len(events), 5):
            log.append_events(events[start : start + 5])
    return lake, events


def _rows(path: str) -> list[dict[str, Any]]:
    table = deltalake.DeltaTable(path).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda row: row["event_id"])


def _commit(path: str, version: int) -> list[dict[str, Any]]:
    text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_small_files_become_one_with_every_row_and_an_optimize_commit(tmp_path: Path) -> None:
    lake, events = _lake_of_small_appends(tmp_path / "lake", batches=40)
    path = lake.table_path(RAW_EVENT_LOG)
    before = deltalake.DeltaTable(path)
    files, version, rows = len(before.file_uris()), before.version(), _rows(path)
    assert files >= 40

    assert bin_pack_locally(path, closed_before=None, packed_bytes=PACKED_BYTES) == files

    after = deltalake.DeltaTable(path)
    assert after.version() == version + 1
    assert len(after.file_uris()) == len({f.split("event_date=")[1].split("/")[0] for f in before.file_uris()})
    assert _rows(path) == rows and len(rows) == len(events)
    actions = _commit(path, version + 1)
    info = actions[0]["commitInfo"]
    assert (info["operation"], info["operationParameters"]["predicate"], info["readVersion"]) == (
        "OPTIMIZE",
        "[]",
        version,
    )
    assert all(not next(iter(a.values()))["dataChange"] for a in actions[1:])
    # The file-count trigger sees a whole-table bin-pack: nothing added since.
    assert files_since_pack(path, None, stop_above=10_000).files == 0
    assert bin_pack_locally(path, closed_before=None, packed_bytes=PACKED_BYTES) == 0  # one file per date


def test_appends_landing_while_it_packs_are_kept(tmp_path: Path) -> None:
    lake, events = _lake_of_small_appends(tmp_path / "lake", batches=300)
    path = lake.table_path(RAW_EVENT_LOG)
    more = list(generate_events(1_000, seed=77))
    appender = AppenderProcess.start(lake, [more[i : i + 5] for i in range(0, len(more), 5)], tmp_path, "late")
    while deltalake.DeltaTable(path).version() < 305:  # the appender is committing
        time.sleep(0.05)
    removed = bin_pack_locally(path, closed_before=None, packed_bytes=PACKED_BYTES)
    assert appender.report()["accepted"] == len(more)
    assert removed >= 300
    ids = [row["event_id"] for row in _rows(path)]
    assert sorted(ids) == sorted(e["event_id"] for e in events + more)  # each once


def test_a_purge_of_a_packed_file_meanwhile_leaves_the_table_as_it_was(tmp_path: Path) -> None:
    lake, _ = _lake_of_small_appends(tmp_path / "lake", batches=20)
    path = lake.table_path(RAW_EVENT_LOG)
    table = deltalake.DeltaTable(path)
    version, victim = table.version(), pa.table(table.get_add_actions(flatten=True)).to_pylist()[0]
    listed = set(Path(path).rglob("*.parquet"))
    outcome: list[BaseException | int | None] = []

    def pack() -> None:
        try:
            outcome.append(bin_pack_locally(path, closed_before=None, packed_bytes=PACKED_BYTES))
        except BaseException as error:  # the test thread asserts on it
            outcome.append(error)

    with commit_lock(path):  # the bin-pack reads and writes, then waits here to commit
        worker = threading.Thread(target=pack)
        worker.start()
        while len(set(Path(path).rglob("*.parquet")) - listed) == 0:
            time.sleep(0.01)
        time.sleep(0.5)  # its packed file written
        # A purge's rewrite, committed in between: it removes a file the bin-pack read.
        remove = {
            "remove": {
                "path": victim["path"],
                "deletionTimestamp": int(time.time() * 1000),
                "dataChange": True,
                "partitionValues": {"event_date": victim["partition.event_date"].isoformat()},
                "size": victim["size_bytes"],
            }
        }
        commit_files(path, version + 1, [remove], ["event_date"], {"operation": "DELETE"})
    worker.join(timeout=120)

    assert isinstance(outcome[0], PackConflictError), outcome
    assert deltalake.DeltaTable(path).version() == version + 1  # no OPTIMIZE committed
    assert set(Path(path).rglob("*.parquet")) == listed  # its packed file removed


def test_a_pack_that_fails_in_a_later_bin_leaves_no_file_of_its_own(tmp_path: Path) -> None:
    lake, _ = _lake_of_small_appends(tmp_path / "lake", batches=40)
    path = lake.table_path(RAW_EVENT_LOG)
    table = deltalake.DeltaTable(path)
    version, adds = table.version(), pa.table(table.get_add_actions(flatten=True)).to_pylist()
    dates = list(dict.fromkeys(add["partition.event_date"] for add in adds))
    assert len(dates) >= 2  # a bin per date: the last date's is packed after the others
    damaged = Path(path) / [add for add in adds if add["partition.event_date"] == dates[-1]][-1]["path"]
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    listed = set(Path(path).rglob("*.parquet"))

    with pytest.raises(pa.ArrowInvalid):
        bin_pack_locally(path, closed_before=None, packed_bytes=PACKED_BYTES)

    assert set(Path(path).rglob("*.parquet")) == listed  # neither the earlier bins' files nor its part
    assert deltalake.DeltaTable(path).version() == version


def test_a_path_in_the_log_that_leaves_the_table_is_not_read(tmp_path: Path) -> None:
    lake, _ = _lake_of_small_appends(tmp_path / "lake", batches=3)
    path = lake.table_path(RAW_EVENT_LOG)
    table = deltalake.DeltaTable(path)
    # Another user's file beside the lake, named by a planted commit: its rows must not be
    # copied into the lake's packed file.
    some_file = Path(path) / pa.table(table.get_add_actions(flatten=True)).to_pylist()[0]["path"]
    outside = tmp_path / "outside.parquet"
    pq.write_table(pq.read_table(some_file), outside)
    date_folder = some_file.parent.name
    planted = {
        "add": {
            "path": f"{date_folder}/../../../../outside.parquet",
            "partitionValues": {"event_date": date_folder.split("=")[1]},
            "size": outside.stat().st_size,
            "modificationTime": 0,
            "dataChange": True,
        }
    }
    commit_files(path, table.version() + 1, [planted], ["event_date"])

    assert bin_pack_locally(path, closed_before=None, packed_bytes=PACKED_BYTES) is None
    assert deltalake.DeltaTable(path).version() == table.version() + 1  # nothing committed
