"""The landing folder as ingestion would see it now, summed up in one fingerprint, read without a
JVM: what the landing-files sensor compares with its cursor to request one ingestion per change.

    state = landing_state(lake.landing)
    state.fingerprint if state else None  # None: no landing file
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from databuild_assets.ingest.landing import DEFAULT_SETTLE_SECONDS, LANDING_SUFFIXES, still_being_written


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


def landing_state(
    landing: str, settle_seconds: float = DEFAULT_SETTLE_SECONDS, now_s: float | None = None
) -> LandingState | None:
    """The fingerprint of the landing folder, or None when it holds no landing file. No JVM.

    Any file added, grown or touched changes it, whatever its modification time (a file moved in
    keeps its old one), and so does a file that was waiting (partial last line) once it has
    settled: then ingestion will take it, so the sensor must ask for a run.
    """
    folder = Path(landing)  # local: Lake keeps a file: root as its plain path
    if not folder.is_dir():
        return None
    now_s = time.time() if now_s is None else now_s
    digest, files, waiting = hashlib.sha256(), 0, 0
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not entry.is_file() or entry.name.startswith((".", "_")) or not entry.name.endswith(LANDING_SUFFIXES):
            continue
        stat = entry.stat()
        waits = still_being_written(
            now_s - stat.st_mtime_ns / 1e9,
            settle_seconds,
            partial(_ends_with_newline_on_disk, entry.path, stat.st_size),
        )
        digest.update(f"{entry.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0{int(waits)}\n".encode())
        files, waiting = files + 1, waiting + waits
    return LandingState(digest.hexdigest()[:32], files, waiting) if files else None
