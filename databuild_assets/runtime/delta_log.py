"""A tolerant reader of a local Delta table's log: every commit file and checkpoint is parsed on
its own, so that damage is reported file by file instead of failing the whole read, and the
newest version that can still be read whole is known.

Readers (Spark, delta-rs) stop at the first damaged log file with an error that names no file;
`check` and `repair` need to know which file, what state the table had before it, and which
data files that state references. Only what they need is read: per version, the add and
remove actions (path, size, record count) and the idempotent-write transactions.

    state = read_log("/data/lake/tables/raw_event_log")
    state.version            # the newest version readable whole (None: no readable version)
    state.damage             # [LogDamage(file, version, what), ...]
    state.files["event_date=2024-01-01/part-0000.parquet"].records

Every path an add or remove action names goes through `table_relative` (and, before a file of
a local table is opened, `resolve_in_table`): a path that leaves the table is refused, whoever
wrote the commit, so that nothing outside the table is read, moved or deleted by its path.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from databuild_assets.runtime.file_modes import read_pointer

if TYPE_CHECKING:
    import pyarrow.parquet as pq

COMMIT_FILE = re.compile(r"^(\d{20})\.json$")  # a commit file's name; group 1: its version
# a classic checkpoint file's name (single-file, or part 2 of 3); group 1: its version
CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
# A log folder modified this recently when listed may change again within its mtime's resolution
# unseen: it is listed again at the next check (the same rule as git's racy index entries).
_RACY_NS = 2_000_000_000
# A log compaction file (commits X to Y as one): Delta reads it instead of those commits when present.
_COMPACTED = re.compile(r"^(\d{20})\.(\d{20})\.compacted\.json$")
LAST_CHECKPOINT = "_last_checkpoint"
LOG = "_delta_log"  # a table's log folder, relative to the table
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # file:, s3a:, C: (a relative path of ours has none)


class OutsideTableError(ValueError):
    """A path from a table's log that names no file inside the table: absolute, with a scheme,
    with a `..` segment, or through a symlink in the table that leads out of it. Delta allows
    absolute paths in add actions (shallow clones); this project's writers never write them, so
    one in our tables is damage or a plant, never a file to open, move or delete. `link`: the
    symlink inside the table the path goes through, when that is why."""

    def __init__(self, message: str, link: str | None = None) -> None:
        super().__init__(message)
        self.link = link


def table_relative(path: str) -> str:
    """An add or remove action's `path` (URL-encoded, as Delta writes it) unquoted: a path
    relative to the table. OutsideTableError when it would leave the table: absolute, a URI
    (any scheme), or holding a `..` segment once unquoted (`%2E%2E%2F` is `../`)."""
    name = unquote(path)
    if not name or "\x00" in name:
        why = "it is empty or holds a NUL"
    elif _SCHEME.match(path) or _SCHEME.match(name):
        why = "it is a URI"
    elif name.startswith("/"):
        why = "it is absolute"
    elif ".." in name.split("/"):
        why = "it holds a '..' segment"
    else:
        return name
    raise OutsideTableError(
        f"the log names {path!r}, outside the table ({why}); this project's tables hold only relative paths inside them"
    )


def resolve_in_table(table_path: str, relative: str) -> str:
    """The local file `relative` (from `table_relative`) of the table at `table_path`, refused
    with OutsideTableError naming the symlink when a symlink inside the table leads it out."""
    root = table_path.removeprefix("file://").removeprefix("file:")
    full = os.path.join(root, relative)
    real_root, real = os.path.realpath(root), os.path.realpath(full)
    if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
        return full
    link = full
    parts = relative.split("/")
    for count in range(1, len(parts) + 1):
        candidate = os.path.join(root, *parts[:count])
        if os.path.islink(candidate):
            link = candidate
            break
    target = os.readlink(link) if os.path.islink(link) else real
    raise OutsideTableError(
        f"{full} leads outside the table through the symlink {link} (-> {target}); a table holds only its own "
        "files: remove the link (databuild-assets repair moves it aside)",
        link,
    )


def symlinks_in(table_path: str) -> list[str]:
    """Every symlink inside a local table's folder (files and folders, not followed), sorted:
    none of our writers makes one, and Delta's VACUUM follows a linked folder and deletes
    the old files it finds there, wherever that is."""
    root = table_path.removeprefix("file://").removeprefix("file:")
    found = []
    for folder, folders, files in os.walk(root):  # followlinks=False: a linked folder is listed, not entered
        found += [path for name in (*folders, *files) if os.path.islink(path := os.path.join(folder, name))]
    return sorted(found)


@dataclass(frozen=True)
class LogDamage:
    """One log file that cannot be used: `file` relative to the table ("_delta_log/<name>", or
    "_delta_log" for the log as a whole), the version it is for."""

    file: str
    version: int
    what: str
    kind: str = "commit"  # "commit" (damaged or missing), "checkpoint", "pointer" (_last_checkpoint), "log"


@dataclass(frozen=True)
class LiveFile:
    """A data file the table's state references: its path relative to the table (unquoted), the
    size the log recorded, and its record count when the log's statistics have one."""

    path: str
    size: int
    records: int | None


@dataclass
class LogState:
    """What a table's log says, read as far as it can be read."""

    path: str
    version: int | None = None  # the newest version whose whole state could be read
    newest_on_disk: int | None = None  # the newest commit file present (damaged or not)
    files: dict[str, LiveFile] = field(default_factory=dict)  # the live files at `version`
    transactions: dict[str, int] = field(default_factory=dict)  # idempotent-write app id -> version
    checkpoint: int | None = None  # the checkpoint the state was read from (None: from version 0)
    commits_read: int = 0  # commit files parsed (all present, before and after the checkpoint)
    damage: list[LogDamage] = field(default_factory=list)
    # versions whose commit files parse, with their userMetadata (JSON text) when they have one
    user_metadata: dict[int, str] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(f.records or 0 for f in self.files.values())

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files.values())


def log_folder(table_path: str) -> Path:
    return Path(table_path.removeprefix("file://").removeprefix("file:")) / LOG


def last_checkpoint(table_path: str) -> tuple[int, int] | None:
    """(version, actions) of the checkpoint a local table's `_last_checkpoint` names: its `size`,
    every action an open reads (live files, and the removes kept as tombstones), or its live files
    when a writer left `size` out; None when there is none, it does not parse, or it is not a
    plain file of at most a few KB (`read_pointer`; a reader then lists the log)."""
    data = read_pointer(log_folder(table_path) / LAST_CHECKPOINT)
    try:
        named = json.loads(data) if data is not None else {}
        return int(named["version"]), int(named.get("size") or named.get("numOfAddFiles") or 0)
    except (ValueError, KeyError, TypeError):
        return None


def checkpoint_path(table_path: str, version: int) -> Path:
    """Where the single-file checkpoint of `version` of the local table at `table_path` is (or would be)."""
    return log_folder(table_path) / f"{version:020d}.checkpoint.parquet"


def commit_path(table_path: str, version: int) -> Path:
    """Where commit `version` of the local table at `table_path` is (or would be)."""
    return log_folder(table_path) / f"{version:020d}.json"


def is_table(table_path: str) -> bool:
    return log_folder(table_path).is_dir()


def _records(stats: str | None) -> int | None:
    if not stats:
        return None
    try:
        value = json.loads(stats).get("numRecords")
    except (json.JSONDecodeError, AttributeError):
        return None
    return int(value) if value is not None else None


@dataclass
class _Commit:
    adds: dict[str, LiveFile] = field(default_factory=dict)
    removes: set[str] = field(default_factory=set)
    transactions: dict[str, int] = field(default_factory=dict)
    user_metadata: str | None = None


def _actions(data: bytes) -> Iterator[tuple[int, dict]]:
    """(line number, action) of each non-blank line of a commit file's `data`; ValueError naming
    the line when one is not a JSON object."""
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"line {number} is not JSON ({error})") from None
        if not isinstance(action, dict):
            raise ValueError(f"line {number} is not a Delta action")
        yield number, action


def parse_commit(path: Path) -> _Commit:
    """The actions of one commit file; ValueError naming the line when a line does not parse."""
    commit = _Commit()
    with open(path, "rb") as handle:
        data = handle.read()
    if not data.strip():
        raise ValueError("the file is empty")
    for number, action in _actions(data):
        if (add := action.get("add")) is not None:
            name = _named(add, number)
            commit.adds[name] = LiveFile(name, int(add["size"]), _records(add.get("stats")))
            commit.removes.discard(name)
        elif (remove := action.get("remove")) is not None:
            name = _named(remove, number)
            commit.removes.add(name)
            commit.adds.pop(name, None)
        elif (txn := action.get("txn")) is not None:
            commit.transactions[txn["appId"]] = int(txn["version"])
        elif (info := action.get("commitInfo")) is not None:
            commit.user_metadata = info.get("userMetadata")
    return commit


def _named(action: dict, line: int) -> str:
    try:
        return table_relative(action["path"])
    except OutsideTableError as error:
        raise OutsideTableError(f"line {line}: {error}") from None


def _read_checkpoint(parts: list[Path]) -> tuple[dict[str, LiveFile], dict[str, int]]:
    """The live files and transactions a (possibly multi-part) checkpoint holds."""
    import pyarrow.parquet as pq  # here: a process that reads no checkpoint (a SQLite query) needs no Arrow

    files: dict[str, LiveFile] = {}
    transactions: dict[str, int] = {}
    for part in parts:
        names = set(pq.ParquetFile(part).schema_arrow.names)
        table = pq.read_table(part, columns=[c for c in ("add", "txn") if c in names])
        if "add" in table.column_names:
            for add in table.column("add").to_pylist():
                if add is not None:
                    name = table_relative(add["path"])
                    files[name] = LiveFile(name, int(add["size"]), _records(add.get("stats")))
        if "txn" in table.column_names:
            for txn in table.column("txn").to_pylist():
                if txn is not None:
                    transactions[txn["appId"]] = int(txn["version"])
    return files, transactions


_MISSED_COMMITS_CHECKED = 1_000  # a listing race misses a few versions; a longer run is damage


def log_files(folder: Path) -> tuple[dict[int, Path], dict[int, list[Path]]]:
    """The commit files and the checkpoint files (their parts) in the log folder, by version.
    A folder's read is no snapshot (on ext4 a commit linked during it may be missed and the next
    one seen), and commits are removed oldest first only: so a version missing between two listed
    ones is looked for by name, as Spark's log store does (`LocalLogStore.withMissedCommits`)."""
    commits: dict[int, Path] = {}
    checkpoints: dict[int, list[Path]] = {}
    for name in sorted(os.listdir(folder)):
        if match := COMMIT_FILE.match(name):
            commits[int(match.group(1))] = folder / name
        elif match := CHECKPOINT_FILE.match(name):
            checkpoints.setdefault(int(match.group(1)), []).append(folder / name)
    listed = sorted(commits)
    for low, high in zip(listed, listed[1:], strict=False):
        if high - low - 1 <= _MISSED_COMMITS_CHECKED:
            for version in range(low + 1, high):
                if (path := folder / f"{version:020d}.json").is_file():
                    commits[version] = path
    return dict(sorted(commits.items())), checkpoints


def read_log(table_path: str) -> LogState:
    """The table's state at the newest version that can be read whole, with every damaged or
    missing log file found on the way (see the module's docstring)."""
    state = LogState(table_path)
    folder = log_folder(table_path)
    if not folder.is_dir():
        return state
    commits, checkpoints = log_files(folder)
    state.newest_on_disk = max(commits, default=None)
    parsed: dict[int, _Commit] = {}
    for version, path in commits.items():
        try:
            parsed[version] = parse_commit(path)
        except OutsideTableError as error:
            state.damage.append(LogDamage(f"{LOG}/{path.name}", version, f"commit {version} refused: {error}"))
        except (OSError, ValueError, KeyError, TypeError) as error:
            state.damage.append(LogDamage(f"{LOG}/{path.name}", version, f"commit file does not parse: {error}"))
    state.commits_read = len(parsed)
    state.user_metadata = {v: c.user_metadata for v, c in parsed.items() if c.user_metadata}

    start, base_files, base_transactions = -1, {}, {}
    _check_last_checkpoint(folder, checkpoints, state)
    for version in sorted(checkpoints, reverse=True):
        parts = checkpoints[version]
        try:
            files, transactions = _read_checkpoint(parts)
        except (OSError, ValueError, KeyError, TypeError) as error:
            names = ", ".join(f"{LOG}/{p.name}" for p in parts)
            state.damage.append(LogDamage(names, version, f"checkpoint does not read: {error}", "checkpoint"))
            continue
        start, base_files, base_transactions = version, files, transactions
        state.checkpoint = version
        break
    if start == -1 and 0 not in parsed:
        if commits or checkpoints:
            state.damage.append(
                LogDamage(
                    LOG,
                    0,
                    "no readable checkpoint and no readable commit 0: the state cannot be rebuilt",
                    "log",
                )
            )
        return state
    files, transactions = dict(base_files), dict(base_transactions)
    version = start
    newest = max([*commits, *checkpoints], default=start)
    for next_version in range(start + 1, newest + 1):
        commit = parsed.get(next_version)
        if commit is None:
            if next_version not in commits:
                state.damage.append(
                    LogDamage(f"{LOG}/{next_version:020d}.json", next_version, "commit file is missing")
                )
            break
        for name in commit.removes:
            files.pop(name, None)
        files.update(commit.adds)
        transactions.update(commit.transactions)
        version = next_version
    state.version = version if version >= 0 else None
    state.files, state.transactions = files, transactions
    return state


def _complete(parts: list[str]) -> bool:
    """Whether checkpoint files of one version make a whole checkpoint: a single-file one, or
    every part 1..n of a multi-part one."""
    numbered = set()
    for name in parts:
        match = CHECKPOINT_FILE.match(name)
        if match is None or match.group(2) is None:
            return True
        numbered.add((int(match.group(2)), int(match.group(3))))
    totals = {total for _, total in numbered}
    return len(totals) == 1 and {part for part, _ in numbered} == set(range(1, totals.pop() + 1))


def _check_last_checkpoint(folder: Path, checkpoints: dict[int, list[Path]], state: LogState) -> None:
    path = folder / LAST_CHECKPOINT
    if not os.path.lexists(path):
        return
    try:
        data = read_pointer(path)
        if data is None:
            raise ValueError("not a plain file of at most 64 KB (a link, a FIFO, a folder?)")
        pointed = int(json.loads(data)["version"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        state.damage.append(LogDamage(f"{LOG}/{LAST_CHECKPOINT}", -1, f"does not parse: {error}", "pointer"))
        return
    # A checkpoint written after the folder was listed (an appender's thread writes one beside any
    # reader, then points to it) is on disk but not in the listing: not damage.
    if pointed not in checkpoints and not any(folder.glob(f"{pointed:020d}.checkpoint*.parquet")):
        state.damage.append(
            LogDamage(
                f"{LOG}/{LAST_CHECKPOINT}",
                pointed,
                f"names checkpoint version {pointed}, whose file is missing",
                "pointer",
            )
        )


# -- the paths a Spark read of a table would follow ----------------------------------------------


class LogFileRefusedError(Exception):
    """A log file Spark's Delta reader would use to open a table, refused: `error` says why (an
    OutsideTableError: it names a path that leaves the table; a ValueError: it does not parse).
    `file` is its name in `_delta_log`, `version` the version it is for, `kind` "commit" or
    "checkpoint"."""

    def __init__(self, file: str, version: int, kind: str, error: Exception) -> None:
        super().__init__(f"{LOG}/{file}: {error}")
        self.file, self.version, self.kind, self.error = file, version, kind, error


@dataclass
class _Checked:
    """What this process has checked of one table's log."""

    version: int = -1  # the newest commit whose paths were checked
    identity: tuple | None = None  # that commit file's identity: another table at the path starts over
    files: set[str] = field(default_factory=set)  # the checkpoint and log compaction files checked
    files_read: int = 0  # log files read to check them, since the first check (or the table's replacement)
    folder_stamp: tuple | None = None  # the log folder's (inode, mtime) when listed, if it can be trusted


_CHECKED: dict[str, _Checked] = {}
_CHECKED_LOCK = threading.Lock()


class _LogFiles:
    """A table's `_delta_log` on a local disk or on S3: its file names, a file's identity, bytes
    and Parquet."""

    def __init__(self, table_path: str) -> None:
        from databuild_assets.runtime.object_store import arrow_filesystem, is_s3

        self.filesystem, self.infos = None, {}
        if is_s3(table_path):
            self.filesystem, prefix = arrow_filesystem(table_path)
            self.folder = f"{prefix}/{LOG}"
        else:
            self.folder = str(log_folder(table_path))
        self.key = self.folder if self.filesystem is None else f"s3://{self.folder}"  # what is remembered by

    def stamp(self) -> tuple | None:
        """The local log folder's (inode, mtime): it changes when a file is added, removed or renamed
        in it. None on S3, or when there is no folder."""
        if self.filesystem is not None:
            return None
        try:
            status = os.stat(self.folder)
        except FileNotFoundError:
            return None
        return status.st_ino, status.st_mtime_ns

    def names(self) -> list[str]:
        if self.filesystem is None:
            return os.listdir(self.folder) if os.path.isdir(self.folder) else []
        from pyarrow import fs

        infos = self.filesystem.get_file_info(fs.FileSelector(self.folder, allow_not_found=True))
        self.infos = {info.base_name: (info.mtime_ns, info.size) for info in infos}
        return list(self.infos)

    def identity(self, name: str) -> tuple | None:
        if self.filesystem is not None:
            return self.infos.get(name)
        try:
            status = os.stat(os.path.join(self.folder, name))
        except FileNotFoundError:
            return None
        return status.st_ino, status.st_mtime_ns, status.st_size

    def read(self, name: str) -> bytes:
        if self.filesystem is None:
            with open(os.path.join(self.folder, name), "rb") as handle:
                return handle.read()
        with self.filesystem.open_input_stream(f"{self.folder}/{name}") as stream:
            return stream.read()

    def parquet(self, name: str) -> pq.ParquetFile:
        import pyarrow.parquet as pq  # as in _read_checkpoint

        if self.filesystem is None:
            return pq.ParquetFile(os.path.join(self.folder, name))
        return pq.ParquetFile(self.filesystem.open_input_file(f"{self.folder}/{name}"))


def _check_actions(data: bytes) -> None:
    """Refuse the commit (or log compaction file) `data` when an action names a path outside the
    table (`check_action_paths`), naming its line; ValueError when a line does not parse (a reader
    cannot tell what it names)."""
    for number, action in _actions(data):
        try:
            check_action_paths(action)
        except (OutsideTableError, ValueError) as error:
            raise type(error)(f"line {number}: {error}") from None


def check_action_paths(action: dict) -> None:
    """Refuse one action of a commit when its add, remove or cdc names a path outside the table
    (`table_relative`), or a deletion vector by an absolute path: OutsideTableError; ValueError when
    such an action has no path.

        check_action_paths({"add": {"path": "../x.parquet"}})   # raises OutsideTableError
    """
    for kind in ("add", "remove", "cdc"):
        if (named := action.get(kind)) is None:
            continue
        if not isinstance(named, dict) or not isinstance(named.get("path"), str):
            raise ValueError(f"its {kind} action has no path")
        table_relative(named["path"])
        vector = named.get("deletionVector")
        if isinstance(vector, dict) and vector.get("storageType") == "p":  # an absolute path of its own
            raise OutsideTableError(
                f"the log names the deletion vector {vector.get('pathOrInlineDv')!r}, outside the table (it is "
                "absolute); this project's tables hold only relative paths inside them"
            )


def _check_checkpoint_part(files: _LogFiles, name: str) -> None:
    """Refuse a checkpoint part whose add or remove actions name a path outside the table: only
    its `add.path` and `remove.path` columns are read."""
    try:
        parquet = files.parquet(name)
        present = set(parquet.schema_arrow.names)
        columns = [f"{kind}.path" for kind in ("add", "remove") if kind in present]
        table = parquet.read(columns=columns).flatten() if columns else None  # add.path, remove.path
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as error:  # pyarrow's errors are these
        raise ValueError(f"it does not read as a checkpoint ({error})") from None
    for index in range(table.num_columns if table is not None else 0):
        for path in table.column(index).to_pylist():
            if path is not None:
                if not isinstance(path, str):
                    raise ValueError(f"its {table.column_names[index]} column holds {path!r}, not a path")
                table_relative(path)


def check_log_paths(table_path: str) -> int | None:
    """Check, before Spark opens the table at `table_path` (local or on S3), the paths of the log
    files its Delta reader uses for the latest version that this process has not checked yet:
    the newest checkpoint (its `add.path` and `remove.path` columns), the commits after it, and
    any log compaction file. Returns the newest commit's version (None: no commit).

    Delta resolves an absolute path, a URI or a `../` path in an add action as it stands (Delta
    allows them for shallow clones), so a commit planted in the log would make a job read a file
    outside the lake, and a rewrite (a purge, an OPTIMIZE) copy it in. LogFileRefusedError names
    the first such file (and a log file that does not parse: what it names is unknown).

    Incremental: per table, the newest commit checked and the checkpoints checked are remembered,
    so a later call reads only the files written since; on a local disk, one with nothing new
    looks only at the log folder's modification time (a file added, removed or renamed changes
    it), and a table replaced at the path is checked from the start. A commit file rewritten in
    place after its check is not read again in this process.
    """
    files = _LogFiles(table_path)
    key = files.key
    stamp = files.stamp()
    if stamp is not None and (known := _CHECKED.get(key)) is not None and known.folder_stamp == stamp:
        return known.version  # no file added, removed or renamed in the log folder since it was checked
    listed_at = time.time_ns()
    with _CHECKED_LOCK:
        names = files.names()
        commits = {int(match.group(1)): name for name in names if (match := COMMIT_FILE.match(name))}
        if not commits:
            _CHECKED.pop(key, None)
            return None
        checked = _CHECKED.get(key)
        if checked is None or commits.get(checked.version) is None:
            checked = _Checked()
        elif files.identity(commits[checked.version]) != checked.identity:
            checked = _Checked()
        checkpoints: dict[int, list[str]] = {}
        for name in names:
            if match := CHECKPOINT_FILE.match(name):
                checkpoints.setdefault(int(match.group(1)), []).append(name)
        # The newest *complete* checkpoint, as Delta picks it: a part of a multi-part one planted
        # alone must not hide the commits Spark replays from an older checkpoint instead.
        base = max((version for version, parts in checkpoints.items() if _complete(parts)), default=-1)
        new: list[tuple[str, int, str]] = [
            (name, base, "checkpoint") for name in sorted(checkpoints.get(base, ())) if name not in checked.files
        ]
        newest = max(commits)
        new += [
            (commits[version], version, "commit")
            for version in range(max(checked.version, base) + 1, newest + 1)
            if version in commits
        ]
        new += [
            (name, int(match.group(2)), "commit")
            for name in sorted(names)
            if (match := _COMPACTED.match(name)) and name not in checked.files
        ]
        for name, version, kind in new:
            try:
                if kind == "checkpoint":
                    _check_checkpoint_part(files, name)
                else:
                    _check_actions(files.read(name))
            except (OutsideTableError, ValueError) as error:
                raise LogFileRefusedError(name, version, kind, error) from None
            except FileNotFoundError:
                continue  # cleaned up meanwhile (a checkpoint made the old commits unneeded)
        checked.files_read += len(new)
        checked.files.update(name for name, _, kind in new if kind == "checkpoint" or _COMPACTED.match(name))
        checked.version, checked.identity = newest, files.identity(commits[newest])
        checked.folder_stamp = stamp if stamp is not None and listed_at - stamp[1] > _RACY_NS else None
        _CHECKED[key] = checked
        return newest


def checked_log(table_path: str) -> tuple[int, int] | None:
    """What `check_log_paths` has checked of the table's log in this process: (the newest commit
    version checked, how many log files it read to check it), or None before its first check."""
    checked = _CHECKED.get(_LogFiles(table_path).key)
    return None if checked is None else (checked.version, checked.files_read)
