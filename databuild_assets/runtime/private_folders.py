"""Folders only this user may hold: the warm driver's registry, serving index caches, scratch
folders. A folder in a place others can write (the temp dir, a shared cache) may have been made
first by someone else, with files planted in it for this user's processes to trust; each such
folder is checked before anything is read from it or written into it (docs/security.md).

    drivers = private_folder(Path(tempfile.gettempdir()) / f"databuild-spark-drivers-{os.getuid()}")
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafeFolderError(RuntimeError):
    """A folder this user's processes would trust is not this user's alone; nothing was read or
    written in it."""


def private_folder(path: Path | str, create: bool = True) -> Path:
    """`path` as a folder of this user's alone: made with mode 0700 when missing (its parents with
    the usual mode), else checked to be a real folder (not a symbolic link), owned by this user,
    and writable by no one else; a folder of this user's that others may read is narrowed to 0700.
    Raises UnsafeFolderError naming the folder otherwise.

        scratch = private_folder("/tmp/databuild-scratch-1000")
    """
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
    status = os.lstat(path)
    if stat.S_ISLNK(status.st_mode):
        raise UnsafeFolderError(f"{path} is a symbolic link, not a folder of this user's; remove it and retry")
    if not stat.S_ISDIR(status.st_mode):
        raise UnsafeFolderError(f"{path} is not a folder; remove it and retry")
    if status.st_uid != os.geteuid():
        raise UnsafeFolderError(
            f"{path} belongs to uid {status.st_uid}, not to this user (uid {os.geteuid()}): someone else made it "
            "first; remove it (or point the setting that names it elsewhere) and retry"
        )
    if status.st_mode & 0o022:
        raise UnsafeFolderError(
            f"{path} is writable by other users (mode {stat.S_IMODE(status.st_mode):04o}), so what is in it "
            "cannot be trusted; remove it and retry"
        )
    if status.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


__all__ = ["UnsafeFolderError", "private_folder"]
