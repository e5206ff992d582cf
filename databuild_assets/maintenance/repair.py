"""`repair`: mend what `check` finds, losing nothing a landing file or a good version still holds.

- A table given to us (raw_event_log, ingest_ledger, event_quarantine, tombstones) whose log is
  damaged is restored to its newest version that reads whole: the commit files after it, a
  damaged commit or checkpoint, are moved aside and `_last_checkpoint` names a checkpoint that
  reads. Its data files that are missing, cut short or unreadable are moved aside, and a commit
  removes them from the table (delta-rs's file system check). Nothing is deleted: what is
  moved aside goes to `<root>/repair/<time>/`, under the table's path. A symlink inside a table
  is moved aside itself (what it points to is not touched), and a commit naming a path outside
  the table is a damaged commit: nothing outside the lake is ever moved.
- The events that lost: the landing files every committed batch read (from `landing/`, or
  `landing_archive/` once retention moved them) are ingested again in one new batch; its MERGE
  keeps only the event ids the raw log no longer holds. What no landing file holds (events
  appended through the writer API) is counted as lost.
- The derived tables (filtered_event_log, the projections) are rebuilt from the raw log in full
  (a damaged one is moved aside first), and the serving index gets a new generation.

Each table is mended under its commit lock (the raw log under its checkpoint lock too), so no
writer of ours commits or checkpoints in between.

    result = repair_lake(spark, Lake("/data/lake"))
    print(format_repair(result))
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from databuild_assets.ingest.dedup import merge_new_events
from databuild_assets.ingest.landing import EVENTS_APP_ID, ingest_again, ingested_files
from databuild_assets.ingest.landing_folder import LandingFile
from databuild_assets.log.serving.backend import refresh_serving_index
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER, IndexFolder, remove_index_files
from databuild_assets.maintenance.check import (
    DERIVED_TABLES,
    SOURCE_TABLES,
    LakeCheck,
    check_lake,
    committed_batches,
    data_file_problem,
)
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.commit_lock import checkpoint_lock, commit_lock
from databuild_assets.runtime.delta_log import (
    LAST_CHECKPOINT,
    LogState,
    OutsideTableError,
    log_folder,
    parse_commit,
    read_log,
    resolve_in_table,
    symlinks_in,
)
from databuild_assets.runtime.lake import FILTERED_EVENT_LOG, RAW_EVENT_LOG, TOMBSTONES, Lake

log = logging.getLogger(__name__)
_VERSIONED = ("json", "crc")


@dataclass
class RepairResult:
    """What `repair_lake` did, and what the check after it found."""

    before: LakeCheck
    after: LakeCheck | None = None
    actions: list[str] = field(default_factory=list)
    moved_aside: list[str] = field(default_factory=list)  # relative to the lake root
    aside_folder: str | None = None
    events_lost: int = 0  # the raw log's events the restore and the removed files took away
    events_from_landing: int = 0  # put back by ingesting landing files again
    events_from_filtered_log: int = 0  # put back from the filtered log's copy of the visible events
    # Events the derived copies (filtered log, serving index) held before the repair that the raw
    # log does not hold after it: lost, or None when no copy could say.
    events_missing: int | None = None
    rebuilt: list[str] = field(default_factory=list)

    @property
    def events_recovered(self) -> int:
        return self.events_from_landing + self.events_from_filtered_log

    @property
    def events_unrecovered(self) -> int:
        if self.events_missing is not None:
            return self.events_missing
        return max(0, self.events_lost - self.events_recovered)


def repair_lake(spark: SparkSession, lake: Lake, progress: Callable[[str], None] | None = None) -> RepairResult:
    """Check the lake, mend it (see the module doc), and check it again."""
    say = progress or log.info
    result = RepairResult(check_lake(lake))
    if result.before.ok:
        result.after = result.before
        return result
    aside = lake.path("repair", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    result.aside_folder = aside
    damaged = {problem.table for problem in result.before.problems}
    _move_links_aside(lake, aside, result, say)
    raw_changed = RAW_EVENT_LOG.name in damaged
    filtered_reads = not _has_damaged_files(result.before, FILTERED_EVENT_LOG.name)
    witnesses = _witness_ids(lake, filtered_reads, say) if raw_changed else None
    for name in SOURCE_TABLES:
        if name in damaged:
            lost = _mend_source_table(lake, name, aside, result, say)
            if name == RAW_EVENT_LOG.name:
                result.events_lost += lost
            elif name == TOMBSTONES.name and lost:
                result.actions.append(
                    f"tombstones: {lost:,} record(s) lost: the events an erasure request among them hid are "
                    "visible again until it is requested again (erase_job); the erase runs' configs name them"
                )
                say(result.actions[-1])
    if raw_changed:
        _ingest_again(spark, lake, result, say)
        if filtered_reads:
            _put_back_from_filtered_log(spark, lake, result, say)
        if witnesses is not None:
            held = _event_ids(lake.table_path(RAW_EVENT_LOG))
            result.events_missing = len(witnesses) - (pc.sum(pc.is_in(witnesses, value_set=held)).as_py() or 0)
    derived_damaged = [name for name in DERIVED_TABLES if name in damaged]
    for name in derived_damaged:
        if _has_damaged_files(result.before, name):
            _move_table_aside(lake, name, aside, result)
    if derived_damaged or raw_changed:
        say("rebuilding the filtered log and the projections from the raw log")
        refresh_filtered_log(spark, lake, full=True)
        refresh_all_projections(spark, lake, full=True)
        result.rebuilt.extend(DERIVED_TABLES)
    if SERVING_INDEX_FOLDER in damaged or raw_changed or derived_damaged:
        _drop_serving_index(lake)
        say("building a new serving index")
        refresh_serving_index(lake, progress=say)
        result.rebuilt.append(SERVING_INDEX_FOLDER)
    result.after = check_lake(lake)
    return result


def _move_links_aside(lake: Lake, aside: str, result: RepairResult, say: Callable[[str], None]) -> None:
    """Move every symlink inside a table aside, the link itself, before anything reads the
    tables: the files it led to then read as missing and leave the table like any missing file."""
    tables = lake.path("tables")
    for name in sorted(os.listdir(tables)) if os.path.isdir(tables) else []:
        path = os.path.join(tables, name)
        links = symlinks_in(path) if os.path.isdir(path) and not os.path.islink(path) else []
        if not links:
            continue
        with commit_lock(path):
            for link in links:
                _move(lake, link, aside, result)
        result.actions.append(f"{name}: {len(links)} symlink(s) moved aside (what they point to is not touched)")
        say(result.actions[-1])


def _has_damaged_files(report: LakeCheck, name: str) -> bool:
    """Whether a table's own files (log or data) are damaged, beyond disagreeing with another's."""
    table = report.table(name)
    return table is not None and any(problem.file for problem in table.problems)


def _event_ids(table_path: str) -> pa.Array:
    """The event ids of a Delta table's live files (at its newest readable version)."""
    state = read_log(table_path)
    parts = [
        pq.read_table(resolve_in_table(table_path, live.path), columns=["event_id"]).column("event_id")
        for live in state.files.values()
    ]
    return pa.chunked_array(parts, pa.string()).combine_chunks() if parts else pa.array([], pa.string())


def _witness_ids(lake: Lake, filtered_reads: bool, say: Callable[[str], None]) -> pa.Array | None:
    """The event ids the derived copies of the raw log hold before the repair (the filtered log
    when its files read, and the serving index): what the raw log held, as far as they saw it.
    None when neither is there."""
    found = []
    filtered = lake.table_path(FILTERED_EVENT_LOG)
    if filtered_reads and os.path.isdir(filtered):
        found.append(_event_ids(filtered))
    index, _ = IndexFolder(lake.path(SERVING_INDEX_FOLDER)).current()
    if index is not None and os.path.exists(index):
        try:
            connection = sqlite3.connect(f"file:{quote(index)}?mode=ro", uri=True)
            try:
                found.append(
                    pa.array([row[0] for row in connection.execute("SELECT event_id FROM events")], pa.string())
                )
            finally:
                connection.close()
        except sqlite3.DatabaseError as error:
            say(f"the serving index does not read ({error}); the filtered log alone says what the raw log held")
    if not found:
        return None
    return pc.unique(pa.chunked_array(found, pa.string()).combine_chunks())


def _put_back_from_filtered_log(spark: SparkSession, lake: Lake, result: RepairResult, say: Callable[[str], None]):
    """Insert into the raw log the filtered log's events it no longer holds: the filtered log is a
    copy of every visible event, stored as the raw log stores it."""
    filtered = spark.read.format("delta").load(lake.table_path(FILTERED_EVENT_LOG))
    metrics = merge_new_events(spark, lake.table_path(RAW_EVENT_LOG), filtered).first()
    inserted = 0 if metrics is None else int(metrics["num_inserted_rows"])
    result.events_from_filtered_log += inserted
    if inserted:
        result.actions.append(f"raw_event_log: {inserted:,} events put back from filtered_event_log's copy")
        say(result.actions[-1])


def _relative(lake: Lake, path: str) -> str:
    return os.path.relpath(path, lake.root)


def _move(lake: Lake, path: str, aside: str, result: RepairResult) -> None:
    """Move a file (or folder) aside, with the checksum file Hadoop's local filesystem keeps
    beside a file (`.<name>.crc`): one left behind fails the next file written at that name.
    A symlink is moved itself; a path whose folder resolves outside the lake is refused."""
    folder, name = os.path.split(path)
    real_root, real_folder = os.path.realpath(lake.root), os.path.realpath(folder)
    if not real_folder.startswith(real_root.rstrip(os.sep) + os.sep):
        raise OutsideTableError(f"repair refuses to move {path}: its folder {real_folder} is outside the lake")
    for source in (path, os.path.join(folder, f".{name}.crc")):
        if source != path and not os.path.exists(source):
            continue
        target = os.path.join(aside, _relative(lake, source))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(source, target)
    result.moved_aside.append(_relative(lake, path))


def _mend_source_table(lake: Lake, name: str, aside: str, result: RepairResult, say: Callable[[str], None]) -> int:
    """Restore one source table's log and remove its damaged files; the events (rows) it lost."""
    path = os.path.join(lake.path("tables"), name)
    # The appends write the raw log's checkpoints beside its commit lock, under a lock of their own.
    checkpoints = checkpoint_lock(path) if name == RAW_EVENT_LOG.name else contextlib.nullcontext()
    with commit_lock(path), checkpoints:
        state = read_log(path)
        lost = _restore_log(lake, path, state, aside, result)
        state = read_log(path)
        if name == RAW_EVENT_LOG.name:  # a torn commit's rows are not known: the ledger's count is
            lost = max(lost, _events_of_batches_not_held(lake, state))
        bad = [live for live in state.files.values() if data_file_problem(path, live, True) is not None]
        for live in bad:
            file = os.path.join(path, live.path)
            if os.path.exists(file):
                _move(lake, file, aside, result)
            lost += live.records or 0
        if bad:
            removed = deltalake.DeltaTable(path).repair(dry_run=False).get("files_removed", [])
            result.actions.append(
                f"{name}: {len(bad)} damaged data file(s) moved aside, {len(removed)} removed from the table "
                f"by a commit ({sum(f.records or 0 for f in bad):,} rows)"
            )
            say(result.actions[-1])
    return lost


def _events_of_batches_not_held(lake: Lake, raw: LogState) -> int:
    """The events the ledger says committed batches accepted that the raw log does not hold
    (batches after the last one its idempotent-write id records)."""
    ledger = read_log(os.path.join(lake.path("tables"), "ingest_ledger"))
    if ledger.version is None:
        return 0
    recorded = raw.transactions.get(EVENTS_APP_ID, -1)
    return sum(accepted for batch, (_, accepted) in committed_batches(lake, ledger).items() if batch > recorded)


def _restore_log(lake: Lake, path: str, state: LogState, aside: str, result: RepairResult) -> int:
    """Move aside the log files after the newest version that reads whole, and damaged ones before
    it; the rows the moved-aside commits that still parse had added (the table's loss)."""
    folder = log_folder(path)
    good = -1 if state.version is None else state.version
    lost, moved = 0, 0
    damaged_versions = {d.version for d in state.damage if d.version >= 0}
    # A damaged commit the state does not need (a checkpoint after it holds the state): the
    # history up to it goes aside, as the log's own cleanup would remove it.
    oldest_damaged = min(
        (d.version for d in state.damage if d.kind == "commit" and 0 <= d.version <= good), default=None
    )
    for entry in sorted(os.listdir(folder)):
        stem, _, rest = entry.partition(".")
        if not stem.isdigit():
            checksum_of = entry.removeprefix(".").removesuffix(".crc")  # Hadoop's, of a file now gone
            if entry.startswith(".") and entry.endswith(".crc") and not (folder / checksum_of).exists():
                number = checksum_of.partition(".")[0]
                if number.isdigit() and int(number) > (-1 if state.version is None else state.version):
                    _move(lake, str(folder / entry), aside, result)
            continue
        version = int(stem)
        beyond = version > good
        history = oldest_damaged is not None and version <= oldest_damaged and rest in _VERSIONED
        broken_checkpoint = "checkpoint" in rest and version in damaged_versions
        if not (beyond or history or broken_checkpoint):
            continue
        if beyond and rest == "json":
            try:
                lost += sum(f.records or 0 for f in parse_commit(folder / entry).adds.values())
            except (OSError, ValueError, KeyError, TypeError):
                pass
        _move(lake, str(folder / entry), aside, result)
        moved += 1
    _point_last_checkpoint(lake, folder, state, aside, result)
    if moved:
        result.actions.append(
            f"{os.path.basename(path)}: {moved} log file(s) moved aside; the table reads as of version {good}"
        )
    return lost


def _point_last_checkpoint(lake: Lake, folder: Path, state: LogState, aside: str, result: RepairResult) -> None:
    """Make `_last_checkpoint` name the checkpoint the state was read from, or remove it."""
    pointer = folder / LAST_CHECKPOINT
    wanted = None if state.checkpoint is None else {"version": state.checkpoint}
    try:
        current = json.loads(pointer.read_text()) if pointer.exists() else None
    except (OSError, ValueError):
        current = {}
    if current is None and wanted is None:
        return
    if current is not None and wanted is not None and current.get("version") == wanted["version"]:
        return
    if pointer.exists():
        _move(lake, str(pointer), aside, result)
    if wanted is not None:
        pointer.write_text(json.dumps(wanted) + "\n")


def _ingest_again(spark: SparkSession, lake: Lake, result: RepairResult, say: Callable[[str], None]) -> None:
    """Ingest again every landing file a committed batch read that is still kept."""
    state = read_log(os.path.join(lake.path("tables"), "ingest_ledger"))
    if state.version is None:
        return
    files = []
    for ledger_path in ingested_files(spark, lake):
        name = os.path.basename(ledger_path)
        # This lake's landing folder (a lake copied elsewhere keeps its ledger's old paths: the
        # file is looked up by name), then its archive (retention or erasure put it there).
        for candidate in (os.path.join(lake.landing, name), os.path.join(lake.landing_archive, name)):
            if os.path.isfile(candidate):  # spelt as Spark lists landing files (file:/...)
                files.append(LandingFile(f"file:{os.path.abspath(candidate)}", os.path.getsize(candidate)))
                break
    if not files:
        return
    say(f"ingesting {len(files)} landing file(s) again for the events the raw log lost")
    batch = ingest_again(spark, lake, files)
    if batch is not None:
        result.events_from_landing += batch.accepted
        result.actions.append(
            f"raw_event_log: {len(files)} landing file(s) ingested again (batch {batch.batch_id}): "
            f"{batch.accepted:,} events put back, {batch.duplicates:,} already there"
        )


def _move_table_aside(lake: Lake, name: str, aside: str, result: RepairResult) -> None:
    path = os.path.join(lake.path("tables"), name)
    if os.path.isdir(path):
        with commit_lock(path):
            _move(lake, path, aside, result)
        result.actions.append(f"{name}: damaged, moved aside whole; rebuilt from the raw log")


def _drop_serving_index(lake: Lake) -> None:
    """Remove the index in use, so that the next refresh builds a new generation."""
    folder = IndexFolder(lake.path(SERVING_INDEX_FOLDER))
    if not os.path.isdir(folder.path):
        return
    with folder.build_lock():
        current, _ = folder.current()
        if current is not None:
            remove_index_files(current)


def format_repair(result: RepairResult) -> str:
    if result.before.ok:
        return "no damage found: nothing to repair"
    lines = [f"repaired {result.before.root}"]
    lines += [f"  {action}" for action in result.actions]
    if result.rebuilt:
        lines.append(f"  rebuilt from the raw log: {', '.join(result.rebuilt)}")
    if result.moved_aside:
        lines.append(f"  {len(result.moved_aside)} file(s) moved aside to {result.aside_folder} (nothing deleted)")
    if result.events_lost or result.events_recovered or result.events_unrecovered:
        lines.append(
            f"  raw_event_log: at least {result.events_lost:,} events were in what was damaged; put back "
            f"{result.events_from_landing:,} from landing files and {result.events_from_filtered_log:,} from the "
            f"filtered log; {result.events_unrecovered:,} lost (in no landing file still kept, nor in a derived copy)"
        )
    after = result.after
    if after is not None and not after.ok:
        lines.append(f"  {len(after.problems)} problem(s) remain:")
        lines += [f"    {problem.line()}" for problem in after.problems]
    elif after is not None:
        lines.append("  the check after the repair finds no damage")
    return "\n".join(lines)
