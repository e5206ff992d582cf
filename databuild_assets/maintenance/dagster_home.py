"""Erasure through Dagster's own storage under DAGSTER_HOME: run configs, event logs (the
materializations' previews, log messages), ticks and compute logs.

`scrub_dagster_home`, the last step of compaction_job, rewrites each tombstone's value to ERASED
wherever Dagster stored it, but in the run record of an erase request for it (an erase_job run
whose config names the value), which keeps it as the tombstones table does. Records are
rewritten, not deleted, so runs, their events and the assets' history stay readable.
`scan_dagster_home` reads every byte of every file under DAGSTER_HOME for what is left: the
erasure report's DAGSTER_HOME row. An ephemeral instance (no DAGSTER_HOME) stores nothing.

A value erase_job accepted after its checks (maintenance/erasure_values.py: long enough, no
other field's value, inside no stored value) is erased wherever its text occurs. A value it
accepted only with allow_ambiguous (never under 4 characters: erasure_values.MIN_OVERRIDE_LENGTH)
is erased where it is a whole token (`erasure_rule.token_pattern`): a whole JSON string value, a
tag's value, a word of a log line; never inside a longer name (`ingest` leaves `ingest_job` as it
is). For those, bytes cannot tell a whole value from a part of a word (a SQLite cell's bytes sit
beside its neighbours': `subjectingest`), so the scan reads Dagster's databases as values: every
cell of every table through SQL, JSON records by their string values, zlib snapshots
decompressed; whole tokens there are what is left, occurrences inside longer words are reported
apart (`embedded`) and stay. The bytes no query reads (free pages, freed blocks, pages and frames
the write-ahead log replaced: `dagster_sqlite.unread_bytes`) count every occurrence, and the
scrub rebuilds a database holding one there. Other files (compute logs) are read as text.
Storage in PostgreSQL (maintenance/dagster_postgres.py) is rewritten through the storages' own
engines by the same rules, its tables are read as values, and the server's data folder, where this
process can read it, byte by byte as files are: old row versions and WAL segments included.
Why this design: docs/decisions/0035-erasure-reaches-dagster-storage.md.

    scrub_dagster_home(context.instance, read_tombstones(spark, lake)).remaining.total  # 0
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, serialize_value

# Dagster exports no compute log manager class: their kind is told by these internal paths.
from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._core.storage.noop_compute_log_manager import NoOpComputeLogManager

from databuild_assets.events.erasure_rule import is_token, token_pattern
from databuild_assets.maintenance import dagster_postgres
from databuild_assets.maintenance.dagster_sqlite import (
    rebuild,
    rewrite_stored_text,
    sqlite_databases,
    stored_values,
    unread_bytes,
)
from databuild_assets.maintenance.tombstones import Tombstone
from databuild_assets.runtime.lake import TOMBSTONES

log = logging.getLogger(__name__)

ERASE_JOB = "erase_job"  # the job that records an erasure request (ops.tombstones.config)
ERASED = "[erased]"  # what a value is rewritten to
FINISHED = frozenset({DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED})
# serdes' type names in a stored record (`{"__class__": "EventLogEntry", ...}`): never a value.
_TYPE_MARKERS = frozenset({"__class__", "__enum__"})
# Bytes compared each side of an occurrence with a kept record (it may be an older copy of it).
_CONTEXT = 24
_CHUNK_BYTES = 8 << 20


def value_forms(value: str) -> tuple[str, ...]:
    """`value` as stored text may hold it, longest first: itself (a compute log, a tag), and
    JSON-escaped once and twice, ASCII-only or not (a string of a serialized record; a JSON text,
    such as a job config, inside one)."""
    forms, level = {value}, {value}
    for _ in range(2):
        level = {json.dumps(form, ensure_ascii=ascii_only)[1:-1] for form in level for ascii_only in (True, False)}
        forms |= level
    return tuple(sorted(forms, key=lambda form: (-len(form), form)))


@dataclass(frozen=True)
class Erasure:
    """The forms to erase from text: `anywhere` (longest first), of values that passed erase_job's
    checks, and `tokens`, of values accepted with allow_ambiguous, as whole tokens only."""

    anywhere: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()

    @classmethod
    def of(cls, tombstones: Iterable[Tombstone]) -> Erasure:
        anywhere = {form for t in tombstones if not t.allow_ambiguous for form in value_forms(t.value)}
        tokens = {form for t in tombstones if t.allow_ambiguous for form in value_forms(t.value)}
        return cls(_longest_first(anywhere), _longest_first(tokens))

    def without(self, kept: Iterable[str]) -> Erasure:
        """These forms but those that are part of one of `kept` (an erase request's own value)."""
        kept = tuple(kept)
        keep = lambda forms: tuple(f for f in forms if not any(f in k for k in kept))  # noqa: E731
        return Erasure(keep(self.anywhere), keep(self.tokens))

    @property
    def every_form(self) -> tuple[str, ...]:
        return _longest_first((*self.anywhere, *self.tokens))

    def __bool__(self) -> bool:
        return bool(self.anywhere or self.tokens)


def _token_regex(tokens: tuple[str, ...]) -> re.Pattern[str] | None:
    return _compiled(tokens) if tokens else None


@functools.lru_cache(maxsize=64)
def _compiled(tokens: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(token_pattern(tokens))


def erase_text(text: str, erasure: Erasure) -> str:
    """`text` with every occurrence of each of `erasure.anywhere` (longest first), and each whole
    token of `erasure.tokens`, replaced by ERASED."""
    for form in erasure.anywhere:
        text = text.replace(form, ERASED)
    tokens = _token_regex(erasure.tokens)
    return tokens.sub(ERASED, text) if tokens else text


def erase_record(text: str, erasure: Erasure) -> str:
    """A stored record with `erasure` applied: in a JSON record, in its string values only (keys
    and serdes' type names stay, so the record still deserializes); other text, everywhere."""
    try:
        record = json.loads(text)
    except ValueError:
        return erase_text(text, erasure)
    if not isinstance(record, dict | list):
        return erase_text(text, erasure)
    erased = _erase_values(record, erasure)
    return text if erased == record else json.dumps(erased)


def _erase_values(node: Any, forms: Erasure, key: str | None = None) -> Any:
    if isinstance(node, str):
        return node if key in _TYPE_MARKERS else erase_text(node, forms)
    if isinstance(node, dict):
        return {k: _erase_values(v, forms, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_erase_values(item, forms) for item in node]
    return node


def erase_requests(instance: DagsterInstance, values: Iterable[str]) -> dict[str, frozenset[str]]:
    """For every erase_job run whose request names one of `values`: its run_id -> those values.
    Those runs' records keep the value they name."""
    wanted, requests = set(values), {}
    for run in instance.get_runs(filters=RunsFilter(job_name=ERASE_JOB)):
        config = run.run_config.get("ops", {}).get(TOMBSTONES.name, {}).get("config", {})
        named = {config.get("value"), *(config.get("values") or [])} if isinstance(config, dict) else set()
        if named & wanted:
            requests[run.run_id] = frozenset(named & wanted)
    return requests


class _Search:
    """The byte forms of the tombstones' values, searched in files, and the kept records (the
    stored erase requests) an occurrence may belong to. In Dagster's SQLite databases, values
    accepted with allow_ambiguous are searched as values (`_database_counts`), not as bytes."""

    def __init__(
        self,
        tombstones: list[Tombstone],
        kept_records: dict[str, list[bytes]],
        requests: dict[str, frozenset[str]] | None = None,
        databases: Iterable[Path] = (),
    ):
        self.tombstone_ids: dict[bytes, list[str]] = {}
        for tombstone in tombstones:
            for form in value_forms(tombstone.value):
                self.tombstone_ids.setdefault(form.encode("utf-8"), []).append(tombstone.tombstone_id)
        needles = sorted(self.tombstone_ids, key=len, reverse=True)
        self.pattern = re.compile(b"|".join(re.escape(needle) for needle in needles))
        self.longest = len(needles[0]) if needles else 0
        self.kept = {t.tombstone_id: kept_records.get(t.value, []) for t in tombstones}
        self.as_tokens = {t.tombstone_id for t in tombstones if t.allow_ambiguous}
        self.token_values = [_TokenValue.of(t) for t in tombstones if t.allow_ambiguous]
        self.every_value = [_TokenValue.of(t) for t in tombstones]
        self.requests = requests or {}
        self.databases = frozenset(databases)
        self.logs = frozenset(_wal(database) for database in self.databases)

    def count(self, path: Path) -> dict[str, int]:
        """Occurrences in the file at `path`, per tombstone, but those inside a kept record (and,
        of a value accepted with allow_ambiguous, those inside a longer word)."""
        return self.counts(path)[0]

    def counts(self, path: Path) -> tuple[dict[str, int], dict[str, int]]:
        """Occurrences in the file at `path` per tombstone, but those inside a kept record; and
        apart, of values accepted with allow_ambiguous, those inside a longer word (embedded).
        A database's write-ahead log is counted with the database."""
        counts: dict[str, int] = {}
        embedded: dict[str, int] = {}
        in_database = path in self.databases or path in self.logs
        for needle, before, after, token in self._occurrences(path):
            for tombstone_id in self.tombstone_ids[needle]:
                if in_database and tombstone_id in self.as_tokens:
                    continue  # read as values below, never as bytes
                if not any(
                    (before is not None and before in record) or (after is not None and after in record)
                    for record in self.kept[tombstone_id]
                ):
                    found = counts if token or tombstone_id not in self.as_tokens else embedded
                    found[tombstone_id] = found.get(tombstone_id, 0) + 1
        if path in self.databases and self.token_values:
            for found, more in zip((counts, embedded), self._database_counts(path), strict=True):
                for tombstone_id, count in more.items():
                    found[tombstone_id] = found.get(tombstone_id, 0) + count
        return counts, embedded

    def found_in(self, *paths: Path) -> bool:
        return any(self.count(path) for path in paths)

    def _database_counts(self, database: Path) -> tuple[dict[str, int], dict[str, int]]:
        """Of values accepted with allow_ambiguous, in a SQLite database: whole tokens and, apart,
        occurrences inside longer words, in its values as a query reads them (`_value_texts`), but
        in an erase request's own run record; and every occurrence, whole or not, in its bytes no
        query reads (`unread_bytes`: free space, replaced pages), where no whole value can be told
        from a part of a word, so the scrub rebuilds the file."""
        counts: dict[str, int] = {}
        embedded: dict[str, int] = {}
        for table, run_id, value in stored_values(database):
            kept = self.requests.get(run_id, frozenset()) if table == "runs" else frozenset()
            for text in _value_texts(value):
                for wanted in self.token_values:
                    if any(wanted.value in named for named in kept):
                        continue
                    tokens, anywhere = wanted.found(text)
                    if tokens:
                        counts[wanted.tombstone_id] = counts.get(wanted.tombstone_id, 0) + tokens
                    if anywhere > tokens:
                        embedded[wanted.tombstone_id] = embedded.get(wanted.tombstone_id, 0) + anywhere - tokens
        for unread in unread_bytes(database):
            for wanted in self.token_values:
                if found := len(wanted.anywhere_bytes.findall(unread)):
                    counts[wanted.tombstone_id] = counts.get(wanted.tombstone_id, 0) + found
        return counts, embedded

    def postgres_counts(self, engine) -> tuple[dict[str, int], dict[str, int]]:
        """Of every value, in a PostgreSQL database's tables as a query reads them, but in an erase
        request's own run record: occurrences (of a value accepted with allow_ambiguous, whole
        tokens) and, apart, occurrences of those inside longer words."""
        counts: dict[str, int] = {}
        embedded: dict[str, int] = {}
        for table, run_id, value in dagster_postgres.stored_values(engine):
            kept = self.requests.get(run_id, frozenset()) if table == "runs" else frozenset()
            for text in _value_texts(value):
                for wanted in self.every_value:
                    if any(wanted.value in named for named in kept):
                        continue
                    tokens, anywhere = wanted.found(text)
                    whole = tokens if wanted.tombstone_id in self.as_tokens else anywhere
                    if whole:
                        counts[wanted.tombstone_id] = counts.get(wanted.tombstone_id, 0) + whole
                    if anywhere > whole:
                        embedded[wanted.tombstone_id] = embedded.get(wanted.tombstone_id, 0) + anywhere - whole
        return counts, embedded

    def _occurrences(self, path: Path) -> Iterator[tuple[bytes, bytes | None, bytes | None, bool]]:
        """Each occurrence in the file: the form found, with _CONTEXT bytes before it and after it
        (None at the file's start or end), and whether it is a whole token. Read in chunks, not
        mapped: another process may truncate a write-ahead log meanwhile. Nothing if the file is
        gone."""
        keep = self.longest + 2 * _CONTEXT  # what a match starting before the end needs after it
        data, position, at_end = b"", 0, False
        try:
            with open(path, "rb") as stream:
                while not at_end:
                    chunk = stream.read(_CHUNK_BYTES)
                    at_end = not chunk
                    data += chunk
                    # Matches starting before `limit` have all their context in `data` already.
                    limit = len(data) if at_end else max(position, len(data) - keep)
                    for match in self.pattern.finditer(data, position):
                        start, end = match.span()
                        if start >= limit:
                            break
                        before = data[start - _CONTEXT : end] if start >= _CONTEXT else None
                        after = data[start : end + _CONTEXT] if end + _CONTEXT <= len(data) else None
                        yield match.group(), before, after, is_token(data, start, end)
                        position = end
                    position = max(position, limit)
                    cut = max(0, position - _CONTEXT)
                    data, position = data[cut:], position - cut
        except FileNotFoundError:
            return


@dataclass(frozen=True)
class _TokenValue:
    """A value accepted with allow_ambiguous, as searched in a database's values and unread bytes."""

    tombstone_id: str
    value: str
    tokens: re.Pattern[str]
    anywhere: re.Pattern[str]
    tokens_bytes: re.Pattern[bytes]
    anywhere_bytes: re.Pattern[bytes]

    @classmethod
    def of(cls, tombstone: Tombstone) -> _TokenValue:
        forms = value_forms(tombstone.value)
        anywhere = "|".join(re.escape(form) for form in forms)
        return cls(
            tombstone.tombstone_id,
            tombstone.value,
            re.compile(token_pattern(forms)),
            re.compile(anywhere),
            re.compile(token_pattern(forms).encode("utf-8")),
            re.compile(anywhere.encode("utf-8")),
        )

    def found(self, text: str | bytes) -> tuple[int, int]:
        """(whole tokens, occurrences anywhere) of the value in `text`."""
        if isinstance(text, bytes):
            return len(self.tokens_bytes.findall(text)), len(self.anywhere_bytes.findall(text))
        return len(self.tokens.findall(text)), len(self.anywhere.findall(text))


def _value_texts(value: object) -> Iterator[str | bytes]:
    """The texts a stored value holds, as the scrub reads them: a JSON record's string values
    (keys and serdes' type names are structure), other text whole (a tag's value is a whole
    value, whatever cells lie beside it in the file), a number as written, a blob decompressed
    when it is zlib (Dagster's snapshots, dagster/_core/storage/runs/sql_run_storage.py), or as
    its bytes."""
    if isinstance(value, bytes):
        try:
            value = zlib.decompress(value).decode("utf-8")
        except (zlib.error, UnicodeDecodeError):
            yield value
            return
    if isinstance(value, int | float):
        yield str(value)
        return
    if not isinstance(value, str):
        return
    try:
        record = json.loads(value)
    except ValueError:
        yield value
        return
    if isinstance(record, dict | list):
        yield from _strings_of(record)
    else:
        yield value


def _strings_of(node: Any, key: str | None = None) -> Iterator[str]:
    if isinstance(node, str):
        if key not in _TYPE_MARKERS:
            yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _strings_of(v, k)
    elif isinstance(node, list):
        for item in node:
            yield from _strings_of(item)


def _search(instance: DagsterInstance, tombstones: list[Tombstone]) -> tuple[_Search, dict[str, frozenset[str]]]:
    requests = erase_requests(instance, {t.value for t in tombstones})
    kept_records: dict[str, list[bytes]] = {}
    for run_id, values in requests.items():
        run = instance.get_run_by_id(run_id)
        if run is not None:  # the run storage holds a run as its serialized text
            for value in values:
                kept_records.setdefault(value, []).append(serialize_value(run).encode("utf-8"))
    return _Search(tombstones, kept_records, requests, sqlite_databases(instance)[0]), requests


@dataclass(frozen=True)
class DagsterHomeScan:
    """What still holds a tombstone's value under DAGSTER_HOME, outside the erase requests' own
    run records: byte occurrences per tombstone, and the files holding them."""

    home: str
    files_scanned: int
    occurrences: dict[str, int] = field(default_factory=dict)
    files_holding: tuple[str, ...] = ()
    # Of values accepted with allow_ambiguous: occurrences inside longer words, which stay.
    embedded: dict[str, int] = field(default_factory=dict)
    # What the scan could not read, said plainly (storage in PostgreSQL: its archives and backups).
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.occurrences.values())


def _files_under(instance: DagsterInstance) -> list[Path]:
    """Every file under DAGSTER_HOME, and the SQLite files of its storage kept elsewhere (with
    their write-ahead logs)."""
    files = {path for path in Path(instance.root_directory).rglob("*") if path.is_file()}
    for database in sqlite_databases(instance)[0]:
        files |= {database, _wal(database)}
    return sorted(path for path in files if path.is_file())


def _wal(database: Path) -> Path:
    return database.with_name(database.name + "-wal")


def _postgres_places(instance: DagsterInstance) -> tuple[list[tuple[Any, Path | None]], tuple[str, ...]]:
    """The instance's PostgreSQL engines with the server's data folder where this process can
    read it, and what the scan says of the rest."""
    engines, _ = dagster_postgres.postgres_engines(instance)
    places = [(engine, dagster_postgres.data_folder(engine)) for engine in engines]
    notes = []
    for engine, folder in places:
        if folder is None:
            notes.append(
                f"PostgreSQL {engine.url.render_as_string(hide_password=True)}: tables read through SQL only; "
                f"its data folder is not readable here (set {dagster_postgres.DATA_FOLDER_SETTING} on the "
                "server's machine to scan its files)"
            )
    if places:
        notes.append(dagster_postgres.OUTSIDE_THE_SERVER)
    return places, tuple(notes)


def storage_notes(instance: DagsterInstance) -> tuple[str, ...]:
    """What a scan of the instance's storage cannot read (a PostgreSQL server's archives, backups,
    a data folder on another machine), in plain words; none for storage in SQLite files."""
    return () if instance.is_ephemeral else _postgres_places(instance)[1]


def scan_dagster_home(instance: DagsterInstance, tombstones: list[Tombstone]) -> DagsterHomeScan | None:
    """Read every byte of every file under DAGSTER_HOME for each tombstone's value (and its
    escaped forms), leaving out occurrences inside the erase requests' own run records; with
    storage in PostgreSQL, its tables as values and the server's data folder as bytes, where
    readable. None for an ephemeral instance: it stores nothing."""
    if instance.is_ephemeral:
        return None
    places, notes = _postgres_places(instance)
    files = _files_under(instance)
    for _, folder in places:
        files += dagster_postgres.data_folder_files(folder) if folder is not None else []
    if not tombstones:
        return DagsterHomeScan(instance.root_directory, len(files), notes=notes)
    search, _ = _search(instance, tombstones)
    occurrences: dict[str, int] = {t.tombstone_id: 0 for t in tombstones}
    embedded: dict[str, int] = {t.tombstone_id: 0 for t in tombstones}
    holding = []
    found_in = [(str(path), search.counts(path)) for path in files]
    for engine, _ in places:
        found_in.append((f"{engine.url.render_as_string(hide_password=True)} (tables)", search.postgres_counts(engine)))
    for place, (counts, inside_words) in found_in:
        for tombstone_id, count in counts.items():
            occurrences[tombstone_id] += count
        for tombstone_id, count in inside_words.items():
            embedded[tombstone_id] += count
        if counts:
            holding.append(place)
    return DagsterHomeScan(instance.root_directory, len(files), occurrences, tuple(holding), embedded, notes)


@dataclass(frozen=True)
class DagsterHomeScrub:
    """What `scrub_dagster_home` changed, what it could not reach, and what a scan found after."""

    records_rewritten: int = 0
    databases_rebuilt: tuple[str, ...] = ()
    compute_logs_rewritten: tuple[str, ...] = ()
    runs_in_progress: int = 0  # their compute logs are still being written: the next compaction reads them
    not_scrubbed: tuple[str, ...] = ()  # storages of kinds this release cannot rewrite, by class
    # PostgreSQL statements the server refused this role (VACUUM FULL of pg_statistic, CHECKPOINT)
    not_reclaimed: tuple[str, ...] = ()
    remaining: DagsterHomeScan | None = None  # None: an ephemeral instance, nothing stored


def scrub_dagster_home(instance: DagsterInstance, tombstones: list[Tombstone]) -> DagsterHomeScrub:
    """Rewrite every value of `tombstones` to ERASED in Dagster's stored records (run configs and
    tags, events, asset and tick records) and in the compute logs of finished runs, leaving freed
    bytes nowhere (see dagster_sqlite); the erase requests' own run records keep their value."""
    if instance.is_ephemeral:
        return DagsterHomeScrub()
    if not tombstones:
        return DagsterHomeScrub(remaining=scan_dagster_home(instance, tombstones))
    search, requests = _search(instance, tombstones)
    erasure = Erasure.of(tombstones)
    every_form = erasure.every_form

    def rewrite(table: str, run_id: str | None, text: str) -> str:
        kept = requests.get(run_id, frozenset()) if table == "runs" else frozenset()
        if not kept:
            return erase_record(text, erasure)
        # An erase request's run keeps its value, even where another value is part of it.
        others = Erasure.of(t for t in tombstones if t.value not in kept).without(
            form for value in kept for form in value_forms(value)
        )
        return erase_record(text, others) if others else text

    databases, other_storages = sqlite_databases(instance)
    rewritten, rebuilt, refused = 0, [], []
    for database in databases:
        if not search.found_in(database, _wal(database)):
            continue
        rewritten += rewrite_stored_text(database, every_form, rewrite)
        if search.found_in(database, _wal(database)):  # free pages still hold an older write
            rebuild(database)
            rebuilt.append(str(database))
    places, _ = _postgres_places(instance)
    for engine, folder in places:
        changed, tables = dagster_postgres.rewrite_stored_text(engine, every_form, rewrite)
        rewritten += changed
        if folder is not None and search.found_in(*dagster_postgres.data_folder_files(folder)):
            # Old row versions of an earlier write (a deleted run's, a scrub's before): every table.
            tables = [*tables, *dagster_postgres.stored_text_tables(engine)]
        if tables:
            reclaimed = dagster_postgres.reclaim(engine, tables)
            rebuilt += [f"{engine.url.database}.{table}" for table in reclaimed.tables]
            refused += reclaimed.refused
    postgres_kinds = set(dagster_postgres.postgres_engines(instance)[1])
    other_storages = [kind for kind in other_storages if kind not in postgres_kinds]
    logs, in_progress, other_logs = _compute_logs(instance)
    rewritten_logs = [str(path) for path in logs if search.found_in(path) and _rewrite_file(path, erasure)]
    not_scrubbed = tuple(other_storages + other_logs)
    if not_scrubbed:
        log.warning(
            "Dagster storage of kinds this release does not rewrite: %s; erase values there with its own tools",
            ", ".join(not_scrubbed),
        )
    return DagsterHomeScrub(
        rewritten,
        tuple(rebuilt),
        tuple(rewritten_logs),
        in_progress,
        not_scrubbed,
        tuple(refused),
        scan_dagster_home(instance, tombstones),
    )


def _longest_first(forms: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(forms), key=lambda form: (-len(form), form)))


def _compute_logs(instance: DagsterInstance) -> tuple[list[Path], int, list[str]]:
    """The compute log files of every run that is not in progress (a deleted run's included),
    the number of runs in progress, and a compute log manager of another kind, by class."""
    manager = instance.compute_log_manager
    if isinstance(manager, NoOpComputeLogManager):
        return [], 0, []
    if not isinstance(manager, LocalComputeLogManager):
        return [], 0, [type(manager).__name__]
    unfinished = [status for status in DagsterRunStatus if status not in FINISHED]
    in_progress = set(instance.get_run_ids(filters=RunsFilter(statuses=unfinished)))
    # Each run's logs are <base>/<run_id>/compute_logs/<key>.<out|err>; the manager places a key's file.
    base = Path(manager.get_captured_local_path(["run_id"], "out")).parent
    files = [
        path
        for path in base.glob("*/compute_logs/*")
        if path.is_file() and path.parent.parent.name not in in_progress and not path.name.startswith(".")
    ]
    return sorted(files), len(in_progress), []


def _rewrite_file(path: Path, erasure: Erasure) -> bool:
    """Rewrite a text file with `erasure` applied, through a hidden file in the same folder, synced,
    then renamed over it. Bytes that are not UTF-8 are kept as they are."""
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    erased = erase_text(text, erasure)
    if erased == text:
        return False
    temp = path.with_name(f".{path.name}.erasing")
    with open(temp, "wb") as out:
        out.write(erased.encode("utf-8", errors="surrogateescape"))
        out.flush()
        os.fsync(out.fileno())
    shutil.copymode(path, temp)
    os.replace(temp, path)
    return True
