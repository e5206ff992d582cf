"""`check`: does every table of a lake read whole, and do the tables agree with each other?

For each Delta table under `tables/`, with no JVM (runtime/delta_log.py reads the logs):
- every commit file and checkpoint parses, and no version is missing;
- every data file the current version references exists, has the size the log recorded, and
  reads: every row group decoded, and as many rows as the log's statistics say;
- no path the log names leaves the table (absolute, a URI, `..`: the commit is damage), and no
  symlink is inside a table (none of ours makes one; VACUUM would follow a linked folder): a
  file is never opened through one;
- the versions the derived tables recorded exist in what they were derived from: the filtered
  log's raw_event_log and tombstones versions, each projection's filtered_event_log version,
  the serving index's stamp (and the index file passes SQLite's quick_check);
- the ingest ledger agrees with the raw log: no batch recorded as committed beyond the raw log's
  newest version, or beyond the last ingestion batch the raw log itself records.

Each problem says the table, the file, what is wrong, what it costs and the command that
repairs it (`databuild-assets repair`, maintenance/repair.py).

    report = check_lake(Lake("/data/lake"))
    print(format_check(report)); exit(0 if report.ok else 1)
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import quote

import pyarrow.parquet as pq

from databuild_assets.ingest.landing import EVENTS_APP_ID
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER, IndexFolder
from databuild_assets.runtime.delta_log import (
    LiveFile,
    LogState,
    OutsideTableError,
    is_table,
    read_log,
    resolve_in_table,
    symlinks_in,
)
from databuild_assets.runtime.lake import (
    EVENT_QUARANTINE,
    FILTERED_EVENT_LOG,
    INGEST_LEDGER,
    RAW_EVENT_LOG,
    TOMBSTONES,
    Lake,
)

# Tables that hold what was given (repair can only restore them to a good version, and ingest
# again what the landing files still hold) and tables derived from them (repair rebuilds them).
SOURCE_TABLES = (RAW_EVENT_LOG.name, INGEST_LEDGER.name, EVENT_QUARANTINE.name, TOMBSTONES.name)
PROJECTION_TABLES = ("partition_state", "job_runs", "build_requests")
DERIVED_TABLES = (FILTERED_EVENT_LOG.name, *PROJECTION_TABLES)

_PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong: `file` relative to the lake root ('' when it is no one file)."""

    table: str
    file: str
    what: str
    cost: str
    repair: str

    def line(self) -> str:
        where = f" {self.file}:" if self.file else ""
        return f"{self.table}:{where} {self.what}. Costs: {self.cost}. Repair: {self.repair}"


@dataclass
class TableCheck:
    name: str
    version: int | None = None
    files: int = 0
    bytes: int = 0
    records: int = 0
    log_files: int = 0
    problems: list[Problem] = field(default_factory=list)


@dataclass
class LakeCheck:
    root: str
    tables: list[TableCheck] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[Problem]:
        return [problem for table in self.tables for problem in table.problems]

    @property
    def ok(self) -> bool:
        return not self.problems

    def table(self, name: str) -> TableCheck | None:
        return next((t for t in self.tables if t.name == name), None)


def repair_command(lake: Lake) -> str:
    return f"databuild-assets repair delta://{lake.root}"


def check_lake(
    lake: Lake,
    read_data: bool = True,
    deep: bool = False,
    workers: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> LakeCheck:
    """Check every table of the lake (see the module doc); `read_data=False` checks the logs and
    the files' presence and sizes without reading them. The serving index is checked by its
    stamp and its size in pages; `deep` also runs SQLite's quick_check over it, which reads
    the whole file and its b-trees. `progress` gets a line now and then."""
    started = time.monotonic()
    report = LakeCheck(lake.root)
    tables_folder = lake.path("tables")
    names = sorted(os.listdir(tables_folder)) if os.path.isdir(tables_folder) else []
    # The serving index before the logs: a version it reflects is then one the logs listed after
    # it hold, however many commits the appends add meanwhile.
    index, index_file, stamp = _read_serving_index(lake, deep)
    states: dict[str, LogState] = {}
    for name in names:
        path = os.path.join(tables_folder, name)
        if not is_table(path):
            continue
        states[name] = state = read_log(path)
        report.tables.append(_check_table(lake, name, state, read_data, workers, progress))
    _check_lineage(lake, states, report)
    _check_ledger(lake, states, report)
    for source, recorded in zip((RAW_EVENT_LOG.name, TOMBSTONES.name), stamp, strict=True):
        if recorded >= 0 and (why := _beyond(index.name, recorded, source, states)):
            index.problems.append(Problem(index.name, index_file, why, _INDEX_COST, repair_command(lake)))
    report.tables.append(index)
    report.seconds = time.monotonic() - started
    return report


def _cost_of_log_damage(name: str, state: LogState, version: int) -> str:
    if state.version is not None and version <= state.version:
        return f"time travel to version {version} and before fails; the current version {state.version} reads"
    readable = "no version" if state.version is None else f"version {state.version}"
    newest = max(version, state.newest_on_disk or 0)
    lost = f"version {version}" if newest == version else f"versions {version} to {newest}"
    return f"{lost} of {name} cannot be read; it reads as of {readable}"


def _check_table(
    lake: Lake,
    name: str,
    state: LogState,
    read_data: bool,
    workers: int | None,
    progress: Callable[[str], None] | None,
) -> TableCheck:
    table = TableCheck(name, state.version, len(state.files), state.size, state.records, state.commits_read)
    repair = repair_command(lake)
    for damage in state.damage:
        table.problems.append(
            Problem(
                name,
                f"tables/{name}/{damage.file}",
                damage.what,
                _cost_of_log_damage(name, state, damage.version),
                repair,
            )
        )
    root = os.path.join(lake.path("tables"), name)
    for link in symlinks_in(root):
        table.problems.append(
            Problem(
                name,
                os.path.relpath(link, lake.root),
                f"a symlink (-> {os.readlink(link)}) inside the table: a table holds only its own files, and "
                "vacuum refuses to run while it is there (Delta's VACUUM deletes old files in a linked folder)",
                "nothing yet: the files it leads to are read as the table's",
                f"{repair} (moves the link itself aside; what it points to is not touched)",
            )
        )
    files = sorted(state.files.values(), key=lambda f: f.path)
    checked, last_report = 0, time.monotonic()
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        for live, problem in zip(files, pool.map(lambda f: data_file_problem(root, f, read_data), files), strict=True):
            checked += 1
            if problem is not None:
                cost = f"{live.records:,} rows" if live.records is not None else "its rows (count unknown)"
                table.problems.append(
                    Problem(name, f"tables/{name}/{live.path}", problem, f"{cost} of version {state.version}", repair)
                )
            if progress is not None and time.monotonic() - last_report > _PROGRESS_EVERY_S:
                progress(f"{name}: {checked:,} of {len(files):,} data files checked")
                last_report = time.monotonic()
    return table


def data_file_problem(root: str, live: LiveFile, read_data: bool) -> str | None:
    """What is wrong with one data file, or None. A file a symlink leads out of the table to is
    not opened."""
    try:
        path = resolve_in_table(root, live.path)
    except OutsideTableError as error:
        return f"data file is outside the table: {error}"
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return "data file is missing"
    except OSError as error:
        return f"data file cannot be read ({error.strerror})"
    if size != live.size:
        return f"data file has {size:,} bytes, the log recorded {live.size:,}"
    if not read_data:
        return None
    try:
        parquet = pq.ParquetFile(path)
        rows = 0
        for group in range(parquet.num_row_groups):
            rows += parquet.read_row_group(group, use_threads=False).num_rows
    except Exception as error:  # noqa: BLE001 - any failure to decode is the finding
        return f"data file does not read ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    if live.records is not None and rows != live.records:
        return f"data file has {rows:,} rows, the log recorded {live.records:,}"
    return None


def _newest_metadata(state: LogState, wanted: Callable[[dict], bool]) -> tuple[int, dict] | None:
    for version in sorted(state.user_metadata, reverse=True):
        if state.version is not None and version > state.version:
            continue
        try:
            metadata = json.loads(state.user_metadata[version])
        except json.JSONDecodeError:
            continue
        if isinstance(metadata, dict) and wanted(metadata):
            return version, metadata
    return None


def _beyond(table: str, recorded: int, source: str, states: dict[str, LogState]) -> str | None:
    """Why `recorded` (a version of `source` a derived table says it reflects) is not there."""
    state = states.get(source)
    newest = None if state is None else state.version
    if newest is None or recorded > newest:
        has = "no readable version" if newest is None else f"versions up to {newest}"
        return f"reflects {source} version {recorded}, but {source} has {has}"
    return None


def _check_lineage(lake: Lake, states: dict[str, LogState], report: LakeCheck) -> None:
    repair = repair_command(lake)
    cost = "its rows may hold events the log no longer has, or miss ones it has"
    filtered = states.get(FILTERED_EVENT_LOG.name)
    if filtered is not None:
        found = _newest_metadata(filtered, lambda m: "raw_log_version" in m)
        if found is not None:
            _, metadata = found
            for source, key in ((RAW_EVENT_LOG.name, "raw_log_version"), (TOMBSTONES.name, "tombstones_version")):
                recorded = int(metadata.get(key, -1))
                if recorded >= 0 and (why := _beyond(FILTERED_EVENT_LOG.name, recorded, source, states)):
                    _add(report, Problem(FILTERED_EVENT_LOG.name, "", why, cost, repair))
    for name in PROJECTION_TABLES:
        state = states.get(name)
        if state is None:
            continue
        found = _newest_metadata(state, lambda m, name=name: m.get("projection") == name)
        if found is not None and found[1].get("log_version") is not None:
            recorded = int(found[1]["log_version"])
            if why := _beyond(name, recorded, FILTERED_EVENT_LOG.name, states):
                _add(report, Problem(name, "", why, cost, repair))


def _check_ledger(lake: Lake, states: dict[str, LogState], report: LakeCheck) -> None:
    ledger, raw = states.get(INGEST_LEDGER.name), states.get(RAW_EVENT_LOG.name)
    if ledger is None or raw is None or ledger.version is None:
        return
    table = report.table(INGEST_LEDGER.name)
    if table is not None and table.problems:
        return  # its own files are damaged: what it says is not known
    committed = committed_batches(lake, ledger)
    repair = repair_command(lake)
    newest_raw = -1 if raw.version is None else raw.version
    recorded_batch = raw.transactions.get(EVENTS_APP_ID, -1)
    # The raw log records its newest ingestion batch with each commit (Delta's idempotent-write
    # id), and batch ids only grow: a batch that accepted events after that one is not in it.
    lost = {b: v for b, (v, accepted) in committed.items() if b > recorded_batch and accepted > 0}
    if lost:
        events = sum(committed[b][1] for b in lost)
        _add(
            report,
            Problem(
                RAW_EVENT_LOG.name,
                "",
                f"the ingest ledger records {len(lost)} batch(es) committed ({_span(sorted(lost))}) that the raw log "
                f"does not hold (its newest version is {newest_raw}, its last ingestion batch {recorded_batch})",
                f"{events:,} events those batches accepted",
                f"{repair} (ingests those batches' landing files again)",
            ),
        )


def committed_batches(lake: Lake, ledger: LogState) -> dict[int, tuple[int, int]]:
    """batch id -> (raw_event_log version, events accepted) of every batch the ledger records as
    committed, read from the ledger's live files."""
    root = os.path.join(lake.path("tables"), INGEST_LEDGER.name)
    batches: dict[int, tuple[int, int]] = {}
    for live in ledger.files.values():
        parquet = pq.ParquetFile(resolve_in_table(root, live.path))
        present = [c for c in ("batch_id", "stage", "log_version", "accepted") if c in parquet.schema_arrow.names]
        for row in parquet.read(columns=present).to_pylist():  # a plan's rows may leave the counts out
            if row["stage"] == "committed" and row.get("log_version") is not None:
                batches[row["batch_id"]] = (row["log_version"], row.get("accepted") or 0)
    return batches


def _span(values: list[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]} to {values[-1]}"


def _add(report: LakeCheck, problem: Problem) -> None:
    table = report.table(problem.table)
    if table is None:
        table = TableCheck(problem.table)
        report.tables.append(table)
    table.problems.append(problem)


_INDEX_COST = "the JVM-free readers rebuild it at their next open (minutes at 10M events)"
# A checkpoint of the index's write-ahead log writes its first page, which holds the new size,
# before the pages that extend the file (up to the thousands of pages a compaction's refresh
# leaves there): a size check that meets one in flight looks again until the file stops growing.
_SIZE_WAIT_S = 10.0
_SIZE_LOOK_PAUSE_S = 0.2


def _read_serving_index(lake: Lake, deep: bool) -> tuple[TableCheck, str, tuple[int, int]]:
    """The serving index's check but for its stamp's versions, the file's name under the lake
    root, and the raw log's and the tombstones' versions its stamp holds (-1 when none)."""
    table = TableCheck(SERVING_INDEX_FOLDER)
    path, _ = IndexFolder(lake.path(SERVING_INDEX_FOLDER)).current()
    if path is None or not os.path.exists(path):
        return table, "", (-1, -1)  # none yet: the first reader builds it
    relative, repair = f"{SERVING_INDEX_FOLDER}/{os.path.basename(path)}", repair_command(lake)
    table.files, table.bytes = 1, os.path.getsize(path)
    try:
        connection = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
        try:
            verdict = connection.execute("PRAGMA quick_check").fetchone()[0] if deep else "ok"
            raw_version, tombstones_version, events = connection.execute(
                "SELECT raw_log_version, tombstones_version, visible_events FROM serving_stamp"
            ).fetchone()
        finally:
            connection.close()
    except sqlite3.DatabaseError as error:
        table.problems.append(Problem(table.name, relative, f"index file does not read ({error})", _INDEX_COST, repair))
        return table, relative, (-1, -1)
    table.version, table.records = raw_version, events
    table.bytes, short = _cut_short(path)
    verdict = short or verdict
    if verdict != "ok":
        table.problems.append(
            Problem(table.name, relative, f"index file fails quick_check ({verdict})", _INDEX_COST, repair)
        )
    return table, relative, (raw_version, tombstones_version)


def _cut_short(path: str) -> tuple[int, str | None]:
    """The index file's size, and why it is shorter than its own header says, if it is. The
    header's size, not SQLite's page count: in WAL mode the pages a writer added since the last
    checkpoint are in the write-ahead log, and the file itself holds only what was checkpointed."""
    deadline, last_size = time.monotonic() + _SIZE_WAIT_S, None
    while True:
        with open(path, "rb") as file:
            header, size = file.read(100), os.fstat(file.fileno()).st_size
        if len(header) < 100:
            return size, f"it is {size:,} bytes, shorter than a header"
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65_536 if page_size == 1 else page_size
        pages = int.from_bytes(header[28:32], "big")
        if header[24:28] != header[92:96] or page_size * pages <= size:  # no size in the header, or all there
            return size, None
        now = time.monotonic()
        if size == last_size and now > deadline or now > deadline + _SIZE_WAIT_S:  # short, not growing
            return size, f"it is {size:,} bytes, its header says {page_size * pages:,}: cut short"
        last_size = size
        time.sleep(_SIZE_LOOK_PAUSE_S)


def format_check(report: LakeCheck) -> str:
    """The report as lines: one per table, then one per problem."""
    lines = [f"checked {report.root} in {report.seconds:.1f}s"]
    for table in report.tables:
        state = "ok" if not table.problems else f"{len(table.problems)} problem(s)"
        version = "-" if table.version is None else str(table.version)
        lines.append(
            f"  {table.name:20} version {version:>6}  {table.files:>6,} files  {table.bytes / 1e6:>9.1f} MB  "
            f"{table.records:>12,} rows  {state}"
        )
    for problem in report.problems:
        lines.append(problem.line())
    lines.append("no damage found" if report.ok else f"{len(report.problems)} problem(s) found")
    return "\n".join(lines)
