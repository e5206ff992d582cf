"""Helpers for the serving index's tests: tombstones committed without Spark, what the index
folder's files hold, and the answers a reader gives against SQLite's."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq

from databuild_assets.events.erasure_rule import matches
from databuild_assets.log import SqliteEventLog
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER
from databuild_assets.runtime.delta_local import table_properties
from databuild_assets.runtime.lake import TOMBSTONES, Lake
from databuild_assets_tests import bel_cases


def request_erasure_without_spark(lake: Lake, key: str, value: str | list[str]) -> None:
    """'requested' tombstone records of `value` (or of each of a list, in one commit), committed by
    delta-rs with the table's own properties."""
    path = lake.table_path(TOMBSTONES)
    schema = deltalake.Schema.from_json(TOMBSTONES.schema.json())
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        deltalake.DeltaTable.create(
            path, schema=schema, configuration=table_properties(TOMBSTONES), raise_if_key_not_exists=False
        )
    records = []
    for one in [value] if isinstance(value, str) else value:
        record = {"tombstone_id": f"t-{one}", "record": "requested", "key": key, "value": one, "actor": "test"}
        record |= {"reason": "a test", "requested_at": datetime.now(UTC), "applied_at": None}
        records.append(record | {"applied_log_version": None})
    deltalake.write_deltalake(path, pa.Table.from_pylist(records, schema=pa.schema(schema.to_arrow())), mode="append")


def without_write_access(lake: Lake, code: str) -> list[str]:
    """The command that runs `code` (after `log = open_event_log(<the lake>)`) in a process that
    cannot write the lake: the lake is made read-only here, and when the tests run as root (which
    writes through any mode), the process starts without the capabilities that let root ignore
    file modes."""
    script = f"from databuild_assets.log import open_event_log\nlog = open_event_log('delta://{lake.root}')\n{code}"
    for directory, _, files in os.walk(lake.root):
        os.chmod(directory, 0o555)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o444)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    return [*drop, sys.executable, "-c", script]


def serving_files(lake: Lake) -> list[Path]:
    """Every file under the lake's serving_index/ folder, segments included."""
    root = Path(lake.path(SERVING_INDEX_FOLDER))
    return sorted(path for path in root.rglob("*") if path.is_file())


def files_holding(lake: Lake, value: str) -> list[str]:
    """The serving files whose bytes hold `value`, or, for Parquet (zstd pages hide bytes),
    whose values do."""
    found = []
    for path in serving_files(lake):
        data = path.read_bytes()
        if value.encode() in data:
            found.append(path.name)
        elif path.suffix == ".parquet" and any(value in str(row) for row in pq.read_table(path).to_pylist()):
            found.append(path.name)
    return found


def folder_bytes(lake: Lake) -> int:
    """The bytes of every file under serving_index/."""
    return sum(path.stat().st_size for path in serving_files(lake))


def reference_answers(events: list[dict]) -> dict:
    """Every bel_cases answer over `events` of the reference backend (SQLite in memory)."""
    with SqliteEventLog(":memory:") as reference:
        reference.append_events(events)
        return bel_cases.answers(reference, *bel_cases.keys_of(events))


def erase_each_key_in_turn(lake: Lake, events: list[dict], values: dict[str, list[str]], after_each=None) -> list[dict]:
    """A tombstone of each key's `values` in turn, committed without Spark. After each: it hid
    events no earlier one did, and a new reader (its first read catches up) answers as the
    reference over the events still visible; then `after_each(erased values)`. Returns the
    events hidden."""
    hidden: list[dict] = []
    for key, erased in values.items():
        request_erasure_without_spark(lake, key, erased)
        newly = [e for e in events if matches(e, {key: set(erased)}) and e not in hidden]
        assert newly
        hidden += newly
        visible = [e for e in events if e not in hidden]
        with DeltaRsEventLog(lake) as log:
            assert bel_cases.answers(log, *bel_cases.keys_of(visible)) == reference_answers(visible)
            assert log._store().event_count() == log.get_activity_summary().total_events  # kept, not counted
        if after_each is not None:
            after_each(erased)
            with DeltaRsEventLog(lake) as log:
                assert bel_cases.answers(log, *bel_cases.keys_of(visible)) == reference_answers(visible)
    return hidden


def data_files_on_disk(table_path: str) -> set[str]:
    """The Parquet files under a table's folder, relative to it, whether a commit names them or not."""
    root = Path(table_path)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def data_files_named(table_path: str) -> set[str]:
    """The data files the table's latest version names, relative to its folder."""
    root = Path(table_path)
    return {
        str(Path(uri.removeprefix("file://")).relative_to(root)) for uri in deltalake.DeltaTable(table_path).file_uris()
    }


def soon(found: Callable[[], set[str]], timeout_s: float = 30.0) -> set[str]:
    """`found()` once it is not empty, or empty after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := found()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return value
