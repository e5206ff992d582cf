"""A checkpoint of a local Delta table written from the checkpoint before it and the commits
since, each found by name: no listing of `_delta_log`.

delta-rs writes a checkpoint by loading the table, which lists `_delta_log` (the log keeps every
commit of its retention, 7 days: a service appending a few times a second leaves millions of
names to read at every checkpoint), replays it, and writes every action again, beside the
appends of the process that checkpoints every few dozen commits. Here the state is the previous
classic checkpoint, its rows kept as Arrow rows (the one this process wrote last is kept in
memory, not read back), and the commits after it: those this process wrote are given as the
actions it wrote (`known`, while their files are the ones it wrote), the others read. The Python
work follows the commits since, not the table's files: the checkpoint is written in a thread
beside a service's appends, which share the interpreter with it. The result is a classic
single-file checkpoint of the previous one's schema, which Spark, delta-rs and
runtime/delta_log.py read, with each add's `stats` string as committed and no `stats_parsed`.

What this replay does not know raises NotReplayable and the caller leaves the checkpoint to
delta-rs: no single-file checkpoint to start from (none yet, several parts, V2), parsed
statistics or partition values (or a table property asking for them), a deletion vector, a
reader or writer feature beyond the few that constrain writers only, an action, a field or a
value the previous checkpoint has no column for, a commit missing or not JSON, more than
MAX_COMMITS commits since. Removes are kept as tombstones for `delta.deletedFileRetentionDuration`
(a week unless the table sets it), as Spark and delta-rs keep them.

    state = replay(table_path, 1_234)        # NotReplayable: leave it to delta-rs
    if checkpoint_due(1_234, last, actions, state.configuration):
        state.write()
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.delta_log import (
    LAST_CHECKPOINT,
    checkpoint_path,
    commit_path,
    last_checkpoint,
    log_folder,
)
from databuild_assets.runtime.file_modes import link_new_file, write_new_file

pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")
pq = deferred("pyarrow.parquet")

# The row kinds of a classic checkpoint, and the checkpoint-only ones this writer leaves to delta-rs.
_KINDS = ("protocol", "metaData", "txn", "domainMetadata", "add", "remove")
_V2_KINDS = ("sidecar", "checkpointMetadata")
_SKIPPED = ("commitInfo", "cdc")  # in commits, never in a checkpoint
# Writer features a replay of adds and removes keeps: they constrain writers, not the log's state.
_KEPT_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "generatedColumns"})
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
_DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000
_UNIT_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
_UNIT_MS["week"] = 7 * _UNIT_MS["day"]
# Commits one replay reads at most: more (a lock holder stuck for long) are left to delta-rs.
MAX_COMMITS = 2_000
_CHUNKS = 32  # the kept table's chunks (one more a checkpoint) combined past this many
# Properties that ask a checkpoint for parsed statistics, or for none as JSON: left to delta-rs.
_STATS_PROPERTIES = {"delta.checkpoint.writeStatsAsStruct": "false", "delta.checkpoint.writeStatsAsJson": "true"}
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+([a-z]+?)s?\s*$", re.IGNORECASE)


class NotReplayable(Exception):
    """Why this writer leaves a checkpoint to delta-rs."""


@dataclass
class CheckpointState:
    """The state of a table at `version`: the previous checkpoint's rows, and what the commits
    after it changed (the Python work follows those commits, not the table: the checkpoint is
    written in a thread beside a service's appends, which wait for the interpreter while it runs
    Python). `write` writes it as that version's checkpoint."""

    table_path: str
    version: int
    previous: Any  # pa.Table: the previous checkpoint, read whole
    files: dict[str, tuple[str, dict]] = field(default_factory=dict)  # path: ("add" or "remove", action)
    single: dict[str, dict] = field(default_factory=dict)  # protocol, metaData: the newest action, if any
    txns: dict[str, dict] | None = None  # by appId, when a commit set one
    domains: dict[str, dict] | None = None  # by domain, when a commit set one
    added: Any = None  # pa.Table of the rows the commits changed (`_added`), built by `replay`

    @functools.cached_property
    def configuration(self) -> dict[str, str]:
        """The table's configuration at `version`."""
        meta = self.single.get("metaData") or _previous_single(self.previous, "metaData")
        return dict(meta.get("configuration") or {})

    def write(self, now_ms: int | None = None) -> bool:
        """Write the checkpoint of `version` and point `_last_checkpoint` at it (unless a newer
        one is named meanwhile); False when that checkpoint exists (another writer's)."""
        table = self._rows(int(time.time() * 1000) if now_ms is None else now_ms)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="snappy", use_dictionary=False, write_statistics=False)
        data = sink.getvalue()
        final = checkpoint_path(self.table_path, self.version)
        if not link_new_file(str(final), data):
            return False
        with _kept_lock:  # the next checkpoint of this table in this process starts from it, unread
            _kept[self.table_path] = (self.version, file_identity(final), table)
        adds = table.num_rows - table.column("add").null_count
        pointer = {"version": self.version, "size": table.num_rows, "sizeInBytes": len(data), "numOfAddFiles": adds}
        named = last_checkpoint(self.table_path)
        if named is None or named[0] < self.version:
            _replace(log_folder(self.table_path) / LAST_CHECKPOINT, json.dumps(pointer).encode())
        return True

    def _rows(self, now_ms: int) -> Any:
        previous = self.previous
        keep = pc.or_kleene(pc.is_valid(previous.column("add")), pc.is_valid(previous.column("remove")))
        if self.files:
            keep = pc.and_not(keep, _touched(previous, self.files))
        rebuilt = {  # the kinds whose rows `added` holds whole: the previous ones go
            "protocol": "protocol" in self.single,
            "metaData": "metaData" in self.single,
            "txn": self.txns is not None,
            "domainMetadata": self.domains is not None,
        }
        for kind, replaced in rebuilt.items():
            if kind in previous.column_names and not replaced:
                keep = pc.or_(keep, pc.is_valid(previous.column(kind)))
        kept = previous if pc.all(keep).as_py() else previous.filter(keep)  # appends alone drop nothing
        table = pa.concat_tables([kept, self.added]) if self.added is not None else kept
        # Tombstones past the retention (one without a time has none left), as Spark and delta-rs.
        stamps = pc.struct_field(table.column("remove"), "deletionTimestamp")
        oldest = now_ms - _retention_ms(self.configuration)
        expired = pc.and_kleene(pc.is_valid(table.column("remove")), pc.fill_null(pc.less(stamps, oldest), True))
        if pc.any(expired).as_py():
            table = table.filter(pc.invert(expired))
        return table.combine_chunks() if table.column("add").num_chunks > _CHUNKS else table


def replay(
    table_path: str, version: int, known: Mapping[int, tuple[tuple[int, int, int], Sequence[dict]]] | None = None
) -> CheckpointState:
    """The state of the local table at `table_path` at `version`, from the checkpoint
    `_last_checkpoint` names and the commits after it up to `version`. `known`: by version, the
    identity (`file_identity`) of a commit file this process wrote and the actions it wrote
    there, used while the file at that version is still that one (a repair may have moved it
    aside and committed another); the others are read. Raises NotReplayable when this writer
    should leave the checkpoint to delta-rs (the module's docstring)."""
    known = known or {}
    named = last_checkpoint(table_path)
    if named is None or named[0] >= version:
        raise NotReplayable("no earlier checkpoint to start from")
    path = checkpoint_path(table_path, named[0])
    try:
        previous, kept = _kept_or_read(table_path, named[0], path)
    except FileNotFoundError:
        raise NotReplayable(f"checkpoint {named[0]} is not a single file") from None
    if not kept:  # one this process wrote was checked when it was replayed
        _check_schema(previous)
    state = CheckpointState(table_path, version, previous)
    if version - named[0] > MAX_COMMITS:  # Python beside the appends for that long: delta-rs's, off the GIL
        raise NotReplayable(f"{version - named[0]:,} commits since checkpoint {named[0]}")
    for at in range(named[0] + 1, version + 1):
        try:
            if at in known and file_identity(commit_path(table_path, at)) == known[at][0]:
                actions: Iterable[dict] = known[at][1]
            else:
                data = commit_path(table_path, at).read_bytes()
                actions = (json.loads(line) for line in data.splitlines() if line.strip())
        except FileNotFoundError:
            raise NotReplayable(f"commit {at} is missing") from None
        try:
            for action in actions:
                _apply(state, action, at)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:  # JSONDecodeError too
            raise NotReplayable(f"commit {at} does not read as Delta actions ({error!r})") from None
    for kind in ("protocol", "metaData"):
        if kind not in state.single and _previous_single(previous, kind) is None:
            raise NotReplayable(f"no {kind} action")
    _check_protocol(state.single.get("protocol") or _previous_single(previous, "protocol"))
    _retention_ms(state.configuration)  # one this replay cannot read raises here, not in `write`
    for name, value in _STATS_PROPERTIES.items():  # what the checkpoint must hold besides `stats`
        if state.configuration.get(name, value).lower() != value:
            raise NotReplayable(f"{name}={state.configuration[name]}")
    state.added = _added(state)
    return state


def _added(state: CheckpointState) -> Any:
    """The rows of the actions the commits since set, in the previous checkpoint's schema; a
    value of a type that schema does not take raises NotReplayable (not later, in `write`)."""
    new: list[dict] = [{kind: state.single[kind]} for kind in ("protocol", "metaData") if kind in state.single]
    new += [{"txn": action} for action in (state.txns or {}).values()]
    new += [{"domainMetadata": action} for action in (state.domains or {}).values()]
    new += [{kind: action} for kind, action in state.files.values()]
    if not new:
        return None
    try:
        return pa.Table.from_pylist(new, schema=state.previous.schema)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        raise NotReplayable(f"an action the checkpoint's schema does not take ({error})") from None


# The checkpoint this process wrote last, per table, with the file's identity: a service's appender
# writes one every few dozen commits, and need not read back what it wrote.
_kept: dict[str, tuple[int, tuple[int, int, int], Any]] = {}
_kept_lock = threading.Lock()


def forget(table_path: str) -> None:
    """Drop the checkpoint kept for the table at `table_path` (its appender is done with it)."""
    with _kept_lock:
        _kept.pop(table_path, None)


def file_identity(path: os.PathLike) -> tuple[int, int, int]:
    """A file's (inode, size, modification time): another file put at its path has another."""
    status = os.stat(path)
    return status.st_ino, status.st_size, status.st_mtime_ns


def _kept_or_read(table_path: str, version: int, path: os.PathLike) -> tuple[Any, bool]:
    """The checkpoint of `version` at `path`, and whether it is the table this process wrote
    there (still that file), else read (one file, one thread: not the dataset machinery of
    `read_table`, nor Arrow's pool beside the appends)."""
    with _kept_lock:
        kept = _kept.get(table_path)
    if kept is not None and kept[0] == version and kept[1] == file_identity(path):
        return kept[2], True
    return pq.ParquetFile(path).read(use_threads=False), False


def _check_schema(previous: Any) -> None:
    names = set(previous.column_names)
    if not {"protocol", "metaData", "add", "remove"} <= names or names - set(_KINDS) - set(_V2_KINDS):
        raise NotReplayable(f"a checkpoint of columns {sorted(names)}")
    for kind in _V2_KINDS:
        if kind in names and previous.column(kind).null_count != previous.num_rows:
            raise NotReplayable(f"a V2 checkpoint ({kind} rows)")
    for kind in ("add", "remove"):
        fields = _fields(previous, kind)
        if {"stats_parsed", "partitionValues_parsed"} & fields:
            raise NotReplayable(f"{kind} has parsed statistics or partition values")
        if "deletionVector" in fields:
            if pc.any(pc.is_valid(pc.struct_field(previous.column(kind), "deletionVector"))).as_py():
                raise NotReplayable("a deletion vector")


def _touched(previous: Any, files: dict[str, tuple[str, dict]]) -> Any:
    """Which rows of the previous checkpoint are adds or removes of a path in `files` (decoded,
    as Delta compares paths): a path without `%` is its own decoding and is looked up in Arrow;
    the few with one are decoded here."""
    keys = pa.array(list(files), type=pa.string())
    masks = []
    for kind in ("add", "remove"):
        paths = pc.struct_field(previous.column(kind), "path")
        encoded = pc.fill_null(pc.match_substring(paths, "%"), False)
        mask = pc.and_not(pc.fill_null(pc.is_in(paths, value_set=keys), False), encoded)
        if pc.any(encoded).as_py():
            rows = pc.indices_nonzero(encoded)
            hits = [
                row
                for row, path in zip(rows.to_pylist(), paths.take(rows).to_pylist(), strict=True)
                if unquote(path) in files
            ]
            if hits:
                flags = [False] * len(paths)
                for row in hits:
                    flags[row] = True
                mask = pc.or_(mask, pa.array(flags))
        masks.append(mask)
    return pc.or_(*masks)


def _apply(state: CheckpointState, action: dict, version: int) -> None:
    if not isinstance(action, dict) or len(action) != 1:
        raise NotReplayable(f"commit {version}: a line that is not one action")
    ((kind, body),) = action.items()
    if kind in _SKIPPED:
        return
    if kind not in _KINDS or kind not in state.previous.column_names:
        raise NotReplayable(f"commit {version}: a {kind} action")
    if not isinstance(body, dict) or set(body) - _fields(state.previous, kind):
        raise NotReplayable(f"commit {version}: a {kind} with fields the checkpoint has no place for")
    if kind in ("add", "remove"):
        if body.get("deletionVector") is not None:
            raise NotReplayable(f"commit {version}: a deletion vector")
        state.files[unquote(body["path"])] = (kind, {**body, "dataChange": False})  # as Spark's checkpoints
    elif kind == "txn":
        if state.txns is None:
            state.txns = _previous_rows(state.previous, "txn", "appId")
        state.txns[body["appId"]] = body
    elif kind == "domainMetadata":
        if state.domains is None:
            state.domains = _previous_rows(state.previous, "domainMetadata", "domain")
        state.domains[body["domain"]] = body
        if body.get("removed"):
            del state.domains[body["domain"]]
    else:
        state.single[kind] = body


def _previous_rows(previous: Any, kind: str, key: str) -> dict[str, dict]:
    if kind not in previous.column_names:
        return {}
    return {action[key]: action for action in previous.column(kind).drop_null().to_pylist()}


def _check_protocol(protocol: dict) -> None:
    features = set(protocol.get("writerFeatures") or ())
    if protocol.get("minReaderVersion") != 1 or protocol.get("readerFeatures") or features - _KEPT_WRITER_FEATURES:
        raise NotReplayable(f"protocol {protocol}")


def _fields(table: Any, kind: str) -> set[str]:
    return {child.name for child in table.schema.field(kind).type}


def _previous_single(previous: Any, kind: str) -> dict | None:
    values = previous.column(kind).drop_null().to_pylist()
    return values[-1] if values else None


def _retention_ms(configuration: dict[str, str]) -> int:
    text = configuration.get(RETENTION_PROPERTY)
    if text is None:
        return _DEFAULT_RETENTION_MS
    match = _INTERVAL.match(text)
    if match is None or match.group(2).lower() not in _UNIT_MS:
        raise NotReplayable(f"{RETENTION_PROPERTY}={text!r}")
    return int(match.group(1)) * _UNIT_MS[match.group(2).lower()]


def _replace(path: os.PathLike, data: bytes) -> None:
    """Replace `path` whole (a finished temporary file renamed over it)."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    write_new_file(temporary, data)
    try:
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


__all__ = ["MAX_COMMITS", "CheckpointState", "NotReplayable", "file_identity", "forget", "replay"]
