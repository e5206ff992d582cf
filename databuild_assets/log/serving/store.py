"""Where a lake keeps its serving index, and how a new one replaces the old: generations.

    <root>/serving_index/
        CURRENT                         the name of the index file in use, replaced atomically
        index-<n>.sqlite (-wal, -shm)   the index (log/serving/index.py)
        build.lock                      held by the one process building a new generation
        .index-<n>.sqlite.building      a build in progress (a dead builder's is removed by the next)

A lake on S3 keeps its serving index on each reading machine's disk instead (SQLite needs a
local file): `$DATABUILD_SERVING_INDEX_DIR/<bucket>/<prefix>/`, by default under
`$XDG_CACHE_HOME/databuild` (`~/.cache/databuild`); see `index_folder_of`.

Its folders are made 0700, its files 0600 (0750 and 0640 with DATABUILD_LAKE_GROUP_READ=1:
runtime/file_modes.py): the index holds copies of the log's values. The build lock is a lock file
as runtime/lock_files.py makes them (this user's, 0600, a bounded wait naming its holder).

A process that cannot write the lake (a read-only mount) keeps a private copy in a temporary
folder named after its process id (`PrivateFolder`), removed when it closes or exits, or by
the next such process once its owner is dead.

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

import os
import re
import shutil
import stat
import tempfile
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

from databuild_assets.runtime.durable import fsync_file, fsync_folder
from databuild_assets.runtime.file_modes import create_new_file, file_mode, make_folders, restrict_umask
from databuild_assets.runtime.lake import is_local
from databuild_assets.runtime.lock_files import held_lock
from databuild_assets.runtime.private_folders import private_folder
from databuild_assets.runtime.processes import process_alive

SERVING_INDEX_FOLDER = "serving_index"
INDEX_DIR_ENV = "DATABUILD_SERVING_INDEX_DIR"
_CURRENT = "CURRENT"
_GENERATION = re.compile(r"^\.?index-(\d+)\.sqlite")
# A SQLite database's files: the main file first (a process can no longer open it by name), then
# the files beside it.
INDEX_FILE_SUFFIXES = ("", "-wal", "-shm", "-journal")
_PRIVATE_PREFIX = "databuild-serving-index-"


def index_folder_of(root: str) -> str:
    """Where the lake at `root` keeps its serving index: `<root>/serving_index` on a local disk;
    for a lake on an object store, a folder of this machine named after the bucket and prefix.

        index_folder_of("s3a://bucket/lake")   # '~/.cache/databuild/serving_index/bucket/lake'

    The cache folder is made, or checked to be, this user's alone (`private_folder`): an index a
    reader trusts must not be one another user planted there first (docs/security.md).
    """
    if is_local(root):
        return root.rstrip("/") + "/" + SERVING_INDEX_FOLDER
    cache = os.environ.get(INDEX_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "databuild", SERVING_INDEX_FOLDER
    )
    private_folder(cache)
    return os.path.join(cache, *root.partition("://")[2].strip("/").split("/"))


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
    def build_lock(self, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the folder's build lock (an OS lock the OS releases if the holder dies), and
        remove what a builder that died left behind. Waits at most `timeout_s` (default:
        DATABUILD_LOCK_TIMEOUT_S), then raises LockTimeoutError naming the holder."""
        make_folders(self.path)  # narrows the umask too: SQLite's files are made under it
        path = os.path.join(self.path, "build.lock")
        with held_lock(path, "the serving index's build lock", timeout_s):
            self._remove_leftovers()
            yield

    def new_building_path(self) -> str:
        """Where the next generation is built (under `build_lock`): an empty file made with
        `file_mode()`, which SQLite opens as a new database and gives its -wal and -shm files."""
        path = os.path.join(self.path, f".index-{self._last_generation() + 1}.sqlite.building")
        _create_private_file(path)
        return path

    def publish(self, building: str) -> str:
        """Make the index built at `building` the one in use, and remove the generations before
        it (a process still reading one keeps its open file until it sees CURRENT change)."""
        name = os.path.basename(building).lstrip(".").removesuffix(".building")
        final = os.path.join(self.path, name)
        fsync_file(building)
        os.replace(building, final)
        pointer = os.path.join(self.path, f".{_CURRENT}.tmp")
        with os.fdopen(_create_private_file(pointer, keep_open=True), "w", encoding="utf-8") as file:
            file.write(name + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(pointer, self._pointer)
        fsync_folder(self.path)
        self._remove_other_generations(name)
        return final

    def files(self) -> list[str]:
        """Every file of the folder."""
        if not os.path.isdir(self.path):
            return []
        return sorted(os.path.join(self.path, name) for name in os.listdir(self.path))

    def _last_generation(self) -> int:
        numbers = [int(match.group(1)) for name in os.listdir(self.path) if (match := _GENERATION.match(name))]
        return max(numbers, default=0)

    def _remove_leftovers(self) -> None:
        """What a process that died left: builds in progress, a CURRENT not yet in place, and
        generations CURRENT does not name (a builder killed between its rename and CURRENT)."""
        for name in os.listdir(self.path):
            if name.endswith(".building") or name.startswith(f".{_CURRENT}.tmp"):
                remove_index_files(os.path.join(self.path, name))
        current, _ = self.current()
        self._remove_other_generations(os.path.basename(current) if current else None)

    def _remove_other_generations(self, keep: str | None) -> None:
        mains = {
            name
            for name in os.listdir(self.path)
            if _GENERATION.match(name) and name.endswith(".sqlite") and not name.startswith(".")
        }
        for name in sorted(mains - {keep}):
            remove_index_files(os.path.join(self.path, name))
        # Files beside a main file that is gone (a process that had it open wrote them after).
        for name in os.listdir(self.path):
            base = name.removesuffix("-wal").removesuffix("-shm").removesuffix("-journal")
            if base != name and _GENERATION.match(base) and base != keep and base not in mains:
                remove_index_files(os.path.join(self.path, base))


def _create_private_file(path: str, keep_open: bool = False) -> int | None:
    """A new, empty file at `path` with `file_mode()` whatever the umask (one left there before
    is replaced); its descriptor, open for writing, with `keep_open`."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    descriptor = create_new_file(path)
    os.fchmod(descriptor, file_mode())
    if keep_open:
        return descriptor
    os.close(descriptor)
    return None


def remove_index_files(path: str) -> None:
    """Remove a SQLite database's files, the main file first (see INDEX_FILE_SUFFIXES)."""
    for suffix in INDEX_FILE_SUFFIXES:
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass


class PrivateFolder:
    """A temporary folder of this process's own, for an index on a lake it cannot write: named
    after the process id, removed when the owner is closed or collected, or at exit; the folders
    of processes that died are removed when the next one is made."""

    def __init__(self, owner: object) -> None:
        _remove_dead_private_folders()
        restrict_umask()  # mkdtemp makes it 0700; SQLite's files in it follow the umask
        self.path = tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{os.getpid()}-")
        self._finalizer = weakref.finalize(owner, shutil.rmtree, self.path, True)

    def new_index_path(self) -> str:
        return os.path.join(self.path, f"index-{uuid.uuid4().hex}.sqlite")

    def copy_of(self, path: str, attempts: int = 3) -> str:
        """A copy of the index file at `path` taken while no process changed it (its size and
        modification time the same before and after), in this folder."""
        for _ in range(attempts):
            before = os.stat(path)
            target = self.new_index_path()
            shutil.copyfile(path, target)
            os.chmod(target, 0o600)  # the copy of another user's index is this process's alone
            after = os.stat(path)
            if (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns):
                return target
            remove_index_files(target)
            time.sleep(0.2)
        raise RuntimeError(f"{path} changed during every copy of it; is a process rewriting it?")

    def remove(self) -> None:
        self._finalizer()


def _remove_dead_private_folders() -> None:
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        match = re.match(rf"^{_PRIVATE_PREFIX}(\d+)-", name)
        if match and not process_alive(int(match.group(1))):
            path = os.path.join(root, name)
            try:
                status = os.lstat(path)
            except FileNotFoundError:
                continue
            # Only this user's own folders: another user's, under the same name, is not ours to remove.
            if stat.S_ISDIR(status.st_mode) and status.st_uid == os.geteuid():
                shutil.rmtree(path, ignore_errors=True)


__all__ = [
    "INDEX_DIR_ENV",
    "INDEX_FILE_SUFFIXES",
    "SERVING_INDEX_FOLDER",
    "IndexFolder",
    "PrivateFolder",
    "index_folder_of",
    "remove_index_files",
]
