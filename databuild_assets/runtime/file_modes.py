"""The modes of the files and folders the project writes: its owner's alone (files 0600, folders
0700) by default, or readable by the lake's group too (0640, 0750) with DATABUILD_LAKE_GROUP_READ=1.
Never readable or writable by others, whatever the umask the process was started with: a lake holds
values not yet erased, and the serving index and the index caches copies of them.

Three writers, three mechanisms:
- Spark: Hadoop's filesystem applies `fs.permissions.umask-mode` (not the JVM's umask) to every
  file and folder it makes, local disks included: spark_config sets it from `lake_umask()`
  (runtime/spark.py).
- delta-rs, SQLite and Python's own files follow the process umask: `restrict_umask()` narrows it
  (never widens it) in every process that writes a lake: at its entry points, when a lake root is
  made ready for writing (runtime/lake.py), and when a commit lock or a serving index's build lock
  is taken; the umask stays narrowed for the process's life.
- Files whose mode matters on their own (lock files, index files) are created with an explicit mode
  and set to it with fchmod, so an existing file's or the umask's mode does not decide.

    restrict_umask()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Mapping

GROUP_READ_ENV = "DATABUILD_LAKE_GROUP_READ"
_OWNER_ONLY = 0o077
_GROUP_READ = 0o027


def lake_umask(environ: Mapping[str, str] = os.environ) -> int:
    """The umask of everything the project writes: 0o077 (owner only), or 0o027 with
    DATABUILD_LAKE_GROUP_READ=1 (the group may read, never write). Another value is refused."""
    value = environ.get(GROUP_READ_ENV, "").strip()
    if value in ("", "0"):
        return _OWNER_ONLY
    if value == "1":
        return _GROUP_READ
    raise ValueError(
        f"{GROUP_READ_ENV}={value!r} is neither 0 nor 1: set 1 to let the lake's group read the files the "
        "project writes (0640, folders 0750), or 0 or nothing for its owner alone (0600, 0700)"
    )


def file_mode() -> int:
    """The mode of a file the project creates: 0600, or 0640 with the group."""
    return 0o666 & ~lake_umask() & ~0o111


def folder_mode() -> int:
    """The mode of a folder the project creates: 0700, or 0750 with the group."""
    return 0o777 & ~lake_umask()


def current_umask() -> int:
    """This process's umask, read without changing it (Linux's /proc), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(_OWNER_ONLY)
    os.umask(umask)
    return umask


def restrict_umask() -> int:
    """Narrow this process's umask to take away at least `lake_umask()`'s bits (a stricter umask
    the operator set is kept); returns the umask now in force."""
    umask = current_umask()
    narrowed = umask | lake_umask()
    if narrowed != umask:
        os.umask(narrowed)
    return narrowed


def create_new_file(path: str) -> int:
    """A descriptor, open for writing, of a new file at `path` made with `file_mode()` (narrower
    under a stricter umask), whatever the umask: refused (FileExistsError) when anything is there,
    a symbolic link too."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())


def write_new_file(path: str, data: bytes | memoryview) -> None:
    """Write `data` as a new file at `path` (`create_new_file`).

    write_new_file(os.path.join(folder, name), parquet_bytes)
    """
    descriptor = create_new_file(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
    finally:
        os.close(descriptor)


def link_new_file(path: str, data: bytes | memoryview) -> bool:
    """Write `data` as `path` whole or not at all, and only if nothing is there: a hard link of a
    finished temporary file beside it (`write_new_file`), atomic on a local filesystem. False,
    with nothing changed, when `path` exists (another writer's).

    link_new_file(commit_path(table, 12), commit_text.encode())
    """
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    write_new_file(temporary, data)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)


def make_folders(path: str) -> None:
    """`path` and its missing parents, each made with `folder_mode()` (existing ones left as
    they are). Narrows the umask first (`restrict_umask`), so no folder is wider for a moment."""
    restrict_umask()
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    mode = folder_mode()
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            continue


POINTER_BYTES = 64 * 1024  # `_last_checkpoint` is a line of JSON (a V2 one may add a schema)


def read_pointer(path: str | os.PathLike) -> bytes | None:
    """The bytes of a small file that only names another (`_last_checkpoint`), or None when it
    is missing, a symbolic link, not a regular file, or over POINTER_BYTES: every sensor tick and
    append reads it, and a link to /dev/zero or a FIFO planted there must not hold them (a read
    without end, or one that waits for a writer forever)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # missing, or ELOOP: a link
        return None
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            return None
        data = file.read(POINTER_BYTES + 1)
    return data if len(data) <= POINTER_BYTES else None


__all__ = [
    "GROUP_READ_ENV",
    "create_new_file",
    "current_umask",
    "file_mode",
    "folder_mode",
    "lake_umask",
    "link_new_file",
    "make_folders",
    "read_pointer",
    "restrict_umask",
    "write_new_file",
]
