"""Making a local write durable before the next step relies on it: a file's bytes, and a
folder's entries (a rename or a new name in it), on disk."""

from __future__ import annotations

import os


def fsync_file(path: str) -> None:
    """The bytes of the file at `path` are on disk."""
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def fsync_folder(path: str) -> None:
    """The entries of the folder at `path` (names added, renamed or removed) are on disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


__all__ = ["fsync_file", "fsync_folder"]
