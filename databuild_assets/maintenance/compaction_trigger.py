"""Compaction by file count: how many data files the raw log gained since its last whole-table
bin-pack, read from its Delta log without a JVM, for the sensor that launches compaction_job
when they reach `DATABUILD_COMPACT_AT_FILES` (defs/maintenance/sensors.py).

A service appending in small batches leaves one small Parquet file per append (per event date)
in the raw log; on the daily schedule they pile up, and every open by Spark or delta-rs lists
them all (and the appends' checkpoints grow with them: decisions/0047). Only a bin-pack of the
whole table (compaction with `open_days=0`, what the sensor requests) packs today's files too:
the daily run leaves the open dates alone, so its OPTIMIZE does not reset the count.

    count = files_since_pack("/data/lake/tables/raw_event_log", previous, stop_above=10_000)
    count.files        # data files added since the last whole-table bin-pack
    count.cursor()     # "v812@1732...,files=4211,requested_at=none"

The count is kept from tick to tick in the sensor's cursor: a tick reads only the commit files
written since the last one, probing versions upward (no listing of a log that may hold a
million commits). Without a cursor (or when the table was replaced) it walks back from the
newest commit to the last whole-table bin-pack, stopping once the count passes `stop_above`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace

from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.delta_log import commit_path

COMPACT_AT_FILES_ENV = "DATABUILD_COMPACT_AT_FILES"
# At ~13 appends/s (issue 43's service) about 13 minutes of appends, so compaction (7 s on an idle
# lake, up to 111 s under that load) holds the one run slot a small share of the time; and at
# 10k live files delta-rs opens the table from a checkpoint in ~30 ms, and the appends checkpoint
# about every 66 commits, plus one per 200 tombstones the checkpoint carries (decisions/0047).
DEFAULT_COMPACT_AT_FILES = 10_000
_CURSOR = re.compile(r"^v(\d+)@(\d+),files=(\d+),requested_at=(none|\d+)$")


class CompactionTriggerError(ValueError):
    """DATABUILD_COMPACT_AT_FILES is not a whole number of files above zero."""


def compact_at_files(environ: dict[str, str] | os._Environ = os.environ) -> int:
    """The file count at which the sensor requests compaction: `DATABUILD_COMPACT_AT_FILES`, else
    DEFAULT_COMPACT_AT_FILES; CompactionTriggerError naming the value when it is not an integer >= 1."""
    text = environ.get(COMPACT_AT_FILES_ENV, "").strip()
    if not text:
        return DEFAULT_COMPACT_AT_FILES
    if not text.isdigit() or int(text) < 1:
        raise CompactionTriggerError(
            f"{COMPACT_AT_FILES_ENV}={text!r} is not a number of files: set a whole number of at least 1 "
            f"(default {DEFAULT_COMPACT_AT_FILES}), or unset it"
        )
    return int(text)


@dataclass(frozen=True)
class FilesSincePack:
    """The raw log's count, as of commit `version` (its file's mtime `stamp` tells the same table
    from a replaced one): data files added since the last whole-table bin-pack, and the count at
    which compaction was last requested since then (None: not requested)."""

    version: int
    stamp: int
    files: int
    requested_at: int | None = None

    def cursor(self) -> str:
        requested = "none" if self.requested_at is None else str(self.requested_at)
        return f"v{self.version}@{self.stamp},files={self.files},requested_at={requested}"

    @classmethod
    def parse(cls, cursor: str | None) -> FilesSincePack | None:
        """The count a cursor holds; None for no cursor or one of another form (counted afresh)."""
        match = _CURSOR.match(cursor or "")
        if match is None:
            return None
        version, stamp, files, requested = match.groups()
        return cls(int(version), int(stamp), int(files), None if requested == "none" else int(requested))

    def requested(self) -> FilesSincePack:
        return replace(self, requested_at=self.files)


class DamagedCommitError(ValueError):
    """A commit file of the raw log that does not parse: the count stops before it."""


@dataclass(frozen=True)
class _Commit:
    adds: int  # add actions, but those of a bin-pack (its packed output)
    bin_pack: bool  # an OPTIMIZE
    whole_table: bool  # an OPTIMIZE with no partition predicate: every file it read is packed
    read_version: int | None  # the version an OPTIMIZE read: appends after it were not packed


def _read_commit(table_path: str, version: int) -> _Commit | None:
    """Commit `version`'s adds and whether it is a bin-pack; None when its file is absent."""
    path = commit_path(table_path, version)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    adds, info = 0, {}
    try:
        for line in data.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                adds += 1
            elif isinstance(action.get("commitInfo"), dict):
                info = action["commitInfo"]
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as error:
        raise DamagedCommitError(f"{path} does not parse ({error}); run `databuild-assets check`") from None
    if info.get("operation") != "OPTIMIZE":
        return _Commit(adds, False, False, None)
    predicate = (info.get("operationParameters") or {}).get("predicate")
    read_version = info.get("readVersion")
    return _Commit(0, True, predicate in ("[]", []), int(read_version) if read_version is not None else None)


def _stamp(table_path: str, version: int) -> int | None:
    try:
        return os.stat(commit_path(table_path, version)).st_mtime_ns
    except FileNotFoundError:
        return None


def _adds_between(table_path: str, first: int, last: int) -> int:
    """Adds of the commits first..last that are not bin-packs (those present)."""
    total = 0
    for version in range(first, last + 1):
        commit = _read_commit(table_path, version)
        if commit is not None and not commit.bin_pack:
            total += commit.adds
    return total


def _after_pack(table_path: str, version: int, commit: _Commit) -> int:
    """Files added but not packed by the whole-table bin-pack `commit` at `version`: those of the
    appends that committed while it ran (after the version it read)."""
    if commit.read_version is None:
        return 0
    return _adds_between(table_path, commit.read_version + 1, version - 1)


def _walk_back(table_path: str, newest: int, stop_above: int) -> int:
    """Files added from the last whole-table bin-pack (or the oldest commit on disk) to `newest`,
    counted from the newest commit back; past `stop_above` the exact figure does not matter."""
    files = 0
    for version in range(newest, -1, -1):
        commit = _read_commit(table_path, version)
        if commit is None:
            break  # cleaned up by Delta's log retention: counted from the oldest commit kept
        if commit.whole_table:
            return files + _after_pack(table_path, version, commit)
        files += commit.adds
        if files > stop_above:
            break
    return files


def files_since_pack(table_path: str, previous: FilesSincePack | None, stop_above: int) -> FilesSincePack | None:
    """The count at the raw log's newest commit (see the module's docstring), from `previous`
    when it is of this table; None when there is no table. DamagedCommitError when a commit it
    must read does not parse."""
    known = previous
    if known is not None and _stamp(table_path, known.version) != known.stamp:
        known = None  # that commit is gone or rewritten: another table at the path (a new lake)
    if known is None:
        newest = latest_version_on_disk(table_path)
        if newest is None:
            return None
        stamp = _stamp(table_path, newest)
        if stamp is None:  # removed between the listing and the stat
            return None
        return FilesSincePack(newest, stamp, _walk_back(table_path, newest, stop_above))
    version, files, requested_at = known.version, known.files, known.requested_at
    while (commit := _read_commit(table_path, version + 1)) is not None:
        version += 1
        if commit.whole_table:
            files, requested_at = _after_pack(table_path, version, commit), None
        else:
            files += commit.adds
    if version == known.version:
        return known
    stamp = _stamp(table_path, version)
    return FilesSincePack(version, stamp if stamp is not None else 0, files, requested_at)
