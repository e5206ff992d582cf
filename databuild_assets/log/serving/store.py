"""Where a lake keeps its serving index, and how a new one replaces the old: generations.

    <root>/serving_index/
        CURRENT                         the name of the index file in use, replaced atomically
        index-<n>.sqlite (-wal, -shm)   the index (log/serving/index.py)
        build.lock                      held by the one process building a new generation
        .index-<n>.sqlite.building      a build in progress (a dead builder's is removed by the next)

An index is updated in place, one SQLite transaction per catch-up. A new generation is built
only when the old one cannot be followed (none yet, another format, older than the log's
retention, a replaced table): beside the old one, then published by replacing CURRENT, so a
reader sees the old index or the new one, never a half-built one. A new file name per generation
keeps SQLite's write-ahead log of the old file from ever being applied to the new one.

    folder = IndexFolder("/data/lake/serving_index")
    with folder.build_lock():
        building = folder.new_building_path()
        ...                                   # build it
        folder.publish(building)
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

SERVING_INDEX_FOLDER = "serving_index"
_CURRENT = "CURRENT"
_GENERATION = re.compile(r"^\.?index-(\d+)\.sqlite")
_SIDE_FILES = ("", "-wal", "-shm", "-journal")


class IndexFolder:
    """A lake's `serving_index/` folder: see the module doc."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pointer = os.path.join(path, _CURRENT)

    def __repr__(self) -> str:
        return f"IndexFolder({self.path!r})"

    def current(self) -> tuple[str | None, tuple[int, int] | None]:
        """The path of the index in use (None when there is none) and an identity of CURRENT that
        changes when a new generation is published (`marker`)."""
        pointer = os.path.join(self.path, _CURRENT)
        try:
            with open(pointer, encoding="utf-8") as file:
                name = file.read().strip()
                status = os.fstat(file.fileno())
        except FileNotFoundError:
            return None, None
        if not _GENERATION.match(name) or "/" in name:
            return None, (status.st_ino, status.st_mtime_ns)
        return os.path.join(self.path, name), (status.st_ino, status.st_mtime_ns)

    def marker(self) -> tuple[int, int] | None:
        """CURRENT's identity (inode, modification time): one `stat`, asked before every read."""
        try:
            status = os.stat(self._pointer)
        except FileNotFoundError:
            return None
        return status.st_ino, status.st_mtime_ns

    def writable(self) -> bool:
        """Whether this process can build and update the index here (the folder, or the lake
        root that would hold it)."""
        if os.path.isdir(self.path):
            return os.access(self.path, os.W_OK | os.X_OK)
        parent = os.path.dirname(self.path.rstrip("/"))
        return os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)

    @contextmanager
    def build_lock(self) -> Iterator[None]:
        """Hold the folder's build lock (an OS lock the OS releases if the holder dies), and
        remove what a builder that died left behind."""
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, "build.lock"), "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                self._remove_leftovers()
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def new_building_path(self) -> str:
        """Where the next generation is built (under `build_lock`)."""
        return os.path.join(self.path, f".index-{self._last_generation() + 1}.sqlite.building")

    def publish(self, building: str) -> str:
        """Make the index built at `building` the one in use, and remove the generations before
        it (a process still reading one keeps its open file until it sees CURRENT change)."""
        name = os.path.basename(building).lstrip(".").removesuffix(".building")
        final = os.path.join(self.path, name)
        _fsync(building)
        os.replace(building, final)
        pointer = os.path.join(self.path, f".{_CURRENT}.tmp")
        with open(pointer, "w", encoding="utf-8") as file:
            file.write(name + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(pointer, os.path.join(self.path, _CURRENT))
        _fsync_folder(self.path)
        for other in os.listdir(self.path):
            match = _GENERATION.match(other)
            if match and not other.startswith(name) and not other.endswith(".building"):
                _remove(os.path.join(self.path, other))
        return final

    def files(self) -> list[str]:
        """Every file of the folder (for the erasure report and checks)."""
        if not os.path.isdir(self.path):
            return []
        return sorted(os.path.join(self.path, name) for name in os.listdir(self.path))

    def _last_generation(self) -> int:
        numbers = [int(match.group(1)) for name in os.listdir(self.path) if (match := _GENERATION.match(name))]
        return max(numbers, default=0)

    def _remove_leftovers(self) -> None:
        for name in os.listdir(self.path):
            if name.endswith(".building") or name.startswith(f".{_CURRENT}.tmp"):
                _remove(os.path.join(self.path, name))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync(path: str) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def _fsync_folder(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


__all__ = ["SERVING_INDEX_FOLDER", "IndexFolder"]
