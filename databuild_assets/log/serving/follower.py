"""Follow a Delta table on a local disk or on S3 commit by commit, without a JVM.

A follower knows the version it has read up to. Whether the table moved is one `stat` of the
next commit file (Delta versions are contiguous and each commit file appears atomically), so
asking before every read is cheap. What changed is read from the commit files themselves (the
Delta protocol's JSON actions): the data files added and removed. A reader that fell behind
past the log's retention, or that meets a commit it cannot follow, reloads the table's
snapshot (its files as delta-rs lists them) instead.

    follower = DeltaFollower("/data/lake/tables/raw_event_log")   # follower_for(path) for any store
    rows = follower.load(["event_id"])     # every live row, at the latest version
    changes = follower.changes()          # the commits since, or None: load() again
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from databuild_assets.runtime.damage import commit_damage, data_file_damage, log_damage, outside_table_damage
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.delta_local import (
    arrow_schema,
    concatenated,
    latest_version_on_disk,
    read_local_table,
    schema_version_of,
    with_columns,
)
from databuild_assets.runtime.delta_log import (
    COMMIT_FILE,
    OutsideTableError,
    last_checkpoint,
    resolve_in_table,
    table_relative,
)
from databuild_assets.runtime.object_store import arrow_filesystem, delta_rs_options, delta_rs_uri, is_s3

deltalake = deferred("deltalake")
pa = deferred("pyarrow")
pq = deferred("pyarrow.parquet")
fs = deferred("pyarrow.fs")

# Reader features whose files a plain Parquet read would misread: rows only marked deleted,
# physical column names that differ from the schema's.
_UNFOLLOWABLE_READER_FEATURES = frozenset({"deletionVectors", "columnMapping"})
# faccessat with AT_EACCESS where the platform has it: the effective user, as a stat would check.
_EFFECTIVE_IDS = os.access in os.supports_effective_ids


class UnfollowableTableError(RuntimeError):
    """The table uses a Delta feature this reader cannot follow (deletion vectors, column mapping)."""


@dataclass
class Changes:
    """The data files that commits after a version added and removed (dataChange only: an
    OPTIMIZE that rearranges rows changes no data), up to `version`."""

    version: int
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # The rows of each added file, from its add's statistics (None when it has none).
    added_rows: list[int | None] = field(default_factory=list)


def _records(add: dict) -> int | None:
    """The `numRecords` of an add action's statistics, if it has them."""
    try:
        records = json.loads(add.get("stats") or "{}").get("numRecords")
    except (ValueError, AttributeError):
        return None
    return records if isinstance(records, int) and records >= 0 else None


class DeltaFollower:
    """One Delta table on a local disk, followed by version. See the module doc."""

    def __init__(self, path: str) -> None:
        self.path = path.removeprefix("file://").removeprefix("file:")
        self._log_dir = Path(self.path) / "_delta_log"
        self._log_prefix = f"{self._log_dir}/"
        self._next_commit: tuple[int, str] = (-1, "")  # (version, the name of the commit after it)
        # A process whose real and effective ids differ (setuid, seteuid) asks as its effective
        # user, as a stat would; any other asks access(2) plainly, the cheaper call (glibc checks
        # AT_EACCESS itself). Read at the follower's creation: ids changed later are not seen.
        self._effective_ids = _EFFECTIVE_IDS and (os.getuid(), os.getgid()) != (os.geteuid(), os.getegid())
        self.version: int | None = None  # the version read up to (`load`, `changes`), or None
        self._schema: pa.Schema | None = None  # the table's, as `open_table` last found it

    def _commit_file(self, version: int) -> Path:
        return self._log_dir / f"{version:020d}.json"

    def exists(self) -> bool:
        """Whether the table has a first commit (or a checkpoint, if its early commits aged out).
        A lake that never erased has no tombstones table, and every read asks this of it: one
        look-up of its log folder, as cheap as `moved_since`'s, before any listing."""
        return self._found(self._log_prefix) and any(
            name.endswith((".json", ".parquet")) for name in os.listdir(self._log_dir)
        )

    def moved_since(self, version: int) -> bool:
        """Whether the table has a commit after `version` (-1: whether it exists at all): one
        look-up of the next commit file (every read of a local lake asks, for both tables)."""
        if version < 0:
            return self.exists()
        asked, path = self._next_commit
        if asked != version:  # the name kept for the version asked last: reads ask the same one
            path = f"{self._log_prefix}{version + 1:020d}.json"
            self._next_commit = (version, path)
        return self._found(path)

    def _found(self, path: str) -> bool:
        """access(F_OK) as this process's user: the stat of os.path.exists without its wrapper."""
        if self._effective_ids:
            return os.access(path, os.F_OK, effective_ids=True)
        return os.access(path, os.F_OK)

    def commit_mark(self, version: int) -> str | None:
        """The size and modification time of `version`'s commit file (None when it is gone):
        what tells the table that wrote it from another table later made at the same path."""
        try:
            status = self._commit_file(version).stat()
        except FileNotFoundError:
            return None
        return f"{status.st_size}:{status.st_mtime_ns}"

    def newest_version(self) -> int | None:
        """The newest commit in the table's log (`latest_version_on_disk`); None when there is none."""
        return latest_version_on_disk(self.path)

    def last_checkpoint(self) -> int | None:
        """The version of the table's newest checkpoint (`_last_checkpoint`), if any."""
        named = last_checkpoint(self.path)
        return None if named is None else named[0]

    def open_table(self) -> deltalake.DeltaTable:
        """The table at its latest version, through delta-rs, checked to be followable; a log
        that does not read raises DamagedTableError naming its damaged file."""
        try:
            table = deltalake.DeltaTable(self.path)
        except (deltalake.exceptions.DeltaError, OSError):
            if (damage := log_damage(self.path)) is not None:
                raise damage from None
            raise
        return self._followable(table)

    def load(self, columns: Iterable[str]) -> pa.Table:
        """`columns` of every live row at the table's latest version: its live files as delta-rs
        lists them, read with pyarrow (`read_local_table`: a column a file was written without
        is null there); sets `version`. For small tables (the tombstones): the raw log is read a
        few files at a time (`runtime.delta_local.iter_local_table`).

        Not delta-rs's own `to_pyarrow_table`: a process that exits soon after it (a one-shot
        `databuild-assets query`) aborts at exit in most tries (deltalake 1.6.6, pyarrow 26)."""
        table = self.open_table()
        rows = read_local_table(table, list(columns))
        self.version = table.version()
        return rows

    def changes(self) -> Changes | None:
        """What the commits after `version` changed, advancing `version` to the last of them;
        None when they cannot be followed one by one (a commit file cleaned up, a new protocol
        or schema version): the caller loads the snapshot again."""
        if self.version is None:
            return None
        changes = Changes(self.version)
        while True:
            try:
                text = self._commit_text(changes.version + 1)
            except FileNotFoundError:
                break
            except UnicodeDecodeError as error:
                raise commit_damage(self.path, changes.version + 1, error) from None
            try:
                for line in text.splitlines():
                    if not line.strip():
                        continue
                    action = json.loads(line)
                    if "add" in action and action["add"].get("dataChange", True):
                        changes.added.append(table_relative(action["add"]["path"]))
                        changes.added_rows.append(_records(action["add"]))
                    elif "remove" in action and action["remove"].get("dataChange", True):
                        changes.removed.append(table_relative(action["remove"]["path"]))
                    elif "metaData" in action or "protocol" in action:
                        return None  # a schema or protocol change: reload and check it
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise commit_damage(self.path, changes.version + 1, error) from None
            changes.version += 1
        self.version = changes.version
        return changes

    def _commit_text(self, version: int) -> str:
        """The commit file of `version`; FileNotFoundError when there is none (yet)."""
        return self._commit_file(version).read_text(encoding="utf-8")

    def _followable(self, table: deltalake.DeltaTable) -> deltalake.DeltaTable:
        """`table`, once checked to be followable, its schema kept (`_joined` types by it)."""
        blocked = sorted(set(table.protocol().reader_features or ()) & _UNFOLLOWABLE_READER_FEATURES)
        if blocked:
            raise UnfollowableTableError(
                f"{self.path} uses the Delta reader feature(s) {', '.join(blocked)}, which this JVM-free reader "
                "does not follow; open the log with a SparkSession (open_event_log(uri, spark=spark))"
            )
        schema_version_of(self.path, table.metadata().configuration)
        self._schema = arrow_schema(table)
        return table

    def read(self, files: Iterable[str], columns: Iterable[str]) -> pa.Table | None:
        """`columns` of the data files `files` (relative paths) as one table; None when a file
        is gone or unreadable and the latest version no longer has it (vacuumed after a long
        pause): the caller loads the snapshot again. DamagedTableError when the log still
        references it, or a symlink inside the table leads the file out of it."""
        tables = []
        for relative in files:
            try:
                local = resolve_in_table(self.path, relative)
            except OutsideTableError as error:
                raise outside_table_damage(self.path, error) from None
            try:
                # One file's reader, not pq.read_table: that imports pyarrow.dataset, which takes
                # a second in a new process (a reader's first catch-up, a `query` call).
                with pq.ParquetFile(local) as file:
                    tables.append(file.read(columns=list(columns)))
            except (OSError, pa.ArrowException) as error:
                if (damage := data_file_damage(self.path, relative, error)) is not None:
                    raise damage from None
                if isinstance(error, PermissionError):
                    raise
                return None
        return self._joined(tables, files, columns)

    def _joined(self, tables: list[pa.Table], files: Iterable[str], columns: Iterable[str]) -> pa.Table | None:
        """The files' tables as one of `columns`, a column no file holds null (`with_columns`),
        typed by the table's schema."""
        if not tables:
            return None if files else pa.table({})
        rows, columns = concatenated(tables), list(columns)
        if set(columns) <= set(rows.column_names):
            return rows.select(columns)
        if self._schema is None:
            self.open_table()
        return with_columns(rows, columns, self._schema)


class ObjectStoreFollower(DeltaFollower):
    """One Delta table on S3, followed by version: the same protocol through pyarrow's S3
    filesystem (whether the table moved is one HEAD of the next commit object) and delta-rs's
    own object store (runtime/object_store.py). Damage is reported as the store's error, which
    names the object; the local damage diagnosis does not apply."""

    def __init__(self, path: str) -> None:
        self.path = path.rstrip("/")
        self._filesystem, self._root = arrow_filesystem(self.path)
        self._log_prefix = f"{self._root}/_delta_log/"
        self.version = None
        self._schema = None

    def _object(self, version: int) -> str:
        return f"{self._log_prefix}{version:020d}.json"

    def _info(self, key: str):
        return self._filesystem.get_file_info(key)

    def _log_listing(self) -> list[fs.FileInfo]:
        """Every object of the table's `_delta_log/` (none when there is none)."""
        return self._filesystem.get_file_info(fs.FileSelector(self._log_prefix.rstrip("/"), allow_not_found=True))

    def exists(self) -> bool:
        return any(info.path.endswith((".json", ".parquet")) for info in self._log_listing())

    def moved_since(self, version: int) -> bool:
        if version < 0:
            return self.exists()
        # Opening the object is one HEAD request; get_file_info would follow a miss, the common
        # answer, with a listing to tell a missing object from a folder.
        try:
            self._filesystem.open_input_file(self._object(version + 1)).close()
        except FileNotFoundError:
            return False
        return True

    def newest_version(self) -> int | None:
        versions = [int(match.group(1)) for info in self._log_listing() if (match := COMMIT_FILE.match(info.base_name))]
        return max(versions, default=None)

    def commit_mark(self, version: int) -> str | None:
        info = self._info(self._object(version))
        return None if info.type == fs.FileType.NotFound else f"{info.size}:{info.mtime_ns}"

    def last_checkpoint(self) -> int | None:
        try:
            with self._filesystem.open_input_stream(f"{self._log_prefix}_last_checkpoint") as stream:
                return int(json.loads(stream.read().decode("utf-8"))["version"])
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def open_table(self) -> deltalake.DeltaTable:
        table = deltalake.DeltaTable(delta_rs_uri(self.path), storage_options=delta_rs_options())
        return self._followable(table)

    def _commit_text(self, version: int) -> str:
        with self._filesystem.open_input_stream(self._object(version)) as stream:
            return stream.read().decode("utf-8")

    def read(self, files: Iterable[str], columns: Iterable[str]) -> pa.Table | None:
        tables, files, columns = [], list(files), list(columns)
        for relative in files:
            try:
                # One file's reader: it leaves out a column the file lacks (filled in `_joined`),
                # with one read of the footer.
                with self._filesystem.open_input_file(f"{self._root}/{relative}") as source:
                    tables.append(pq.ParquetFile(source).read(columns=columns))
            except FileNotFoundError:
                return None  # vacuumed after a long pause: the caller loads the snapshot again
        return self._joined(tables, files, columns)


def follower_for(path: str) -> DeltaFollower:
    """The follower for a table at `path`: on S3 or on a local disk."""
    return ObjectStoreFollower(path) if is_s3(path) else DeltaFollower(path)


__all__ = ["Changes", "DeltaFollower", "ObjectStoreFollower", "UnfollowableTableError", "follower_for"]
