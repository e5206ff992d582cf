"""The landing folder as ingestion would see it now, summed up in one fingerprint, read without a
JVM: what the landing-files sensor compares with its cursor to request one ingestion per change.
A folder on a local disk is scanned; a landing prefix on S3 is listed (one request per thousand
objects), and only an object young enough to be waiting is read, its last byte.

    state = landing_state(lake.landing)
    state.fingerprint if state else None  # None: no landing file
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from databuild_assets.ingest.landing import DEFAULT_SETTLE_SECONDS, still_being_written
from databuild_assets.ingest.landing_names import LANDING_SUFFIXES
from databuild_assets.runtime.object_store import arrow_filesystem, is_s3


@dataclass(frozen=True)
class LandingState:
    """The landing folder as ingestion would see it now, summed up in one fingerprint."""

    fingerprint: str  # sha256 over every landing file's name, size, mtime and waiting flag
    files: int
    waiting: int  # files ingestion would leave for later: empty or no final newline, not settled


def _ends_with_newline_on_disk(path: str, size: int) -> bool:
    """`ingest.landing.ends_with_newline` for a local file, without a JVM."""
    if size <= 0:
        return False
    with open(path, "rb") as handle:
        handle.seek(size - 1)
        return handle.read(1) == b"\n"


def _local_entries(landing: str) -> Iterator[tuple[str, int, int, Callable[[], bool]]]:
    folder = Path(landing)  # local: Lake keeps a file: root as its plain path
    if not folder.is_dir():
        return
    for entry in os.scandir(folder):
        if entry.name.startswith((".", "_")) or not entry.name.endswith(LANDING_SUFFIXES):
            continue  # a writer's temp file may be renamed away at any moment: never stat it
        if entry.is_file(follow_symlinks=False):  # a link, FIFO or device is never read (landing_names.py)
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed (archived) since it was listed
            ends_with_newline = partial(_ends_with_newline_on_disk, entry.path, stat.st_size)
            yield entry.name, stat.st_size, stat.st_mtime_ns, ends_with_newline


def _ends_with_newline_in_store(filesystem, key: str, size: int) -> bool:
    if size <= 0:
        return False
    with filesystem.open_input_file(key) as handle:
        return handle.read_at(1, size - 1) == b"\n"


def _object_entries(landing: str) -> Iterator[tuple[str, int, int, Callable[[], bool]]]:
    from pyarrow import fs

    filesystem, prefix = arrow_filesystem(landing)
    for info in filesystem.get_file_info(fs.FileSelector(prefix, allow_not_found=True)):
        if info.type == fs.FileType.File:
            yield (
                info.base_name,
                info.size,
                info.mtime_ns or 0,
                partial(_ends_with_newline_in_store, filesystem, info.path, info.size),
            )


def landing_state(
    landing: str, settle_seconds: float = DEFAULT_SETTLE_SECONDS, now_s: float | None = None
) -> LandingState | None:
    """The fingerprint of the landing folder, or None when it holds no landing file. No JVM.

    Any file added, grown or touched changes it, whatever its modification time (a file moved in
    keeps its old one), and so does a file that was waiting (partial last line) once it has
    settled: then ingestion will take it, so the sensor must ask for a run.
    """
    entries = _object_entries(landing) if is_s3(landing) else _local_entries(landing)
    now_s = time.time() if now_s is None else now_s
    digest, files, waiting = hashlib.sha256(), 0, 0
    for name, size, mtime_ns, ends_with_newline in sorted(entries, key=lambda entry: entry[0]):
        if name.startswith((".", "_")) or not name.endswith(LANDING_SUFFIXES):
            continue
        waits = still_being_written(now_s - mtime_ns / 1e9, settle_seconds, ends_with_newline)
        digest.update(f"{name}\0{size}\0{mtime_ns}\0{int(waits)}\n".encode())
        files, waiting = files + 1, waiting + waits
    return LandingState(digest.hexdigest()[:32], files, waiting) if files else None
