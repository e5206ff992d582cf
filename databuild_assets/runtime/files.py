"""Whole files on a local disk or in an object store, for the code that moves and rewrites landing
files (maintenance/landing_files.py): the few operations it needs, with each store's own guarantee.

- Local: a write goes to a hidden temp file, fsynced, then renamed over its target; the caller
  fsyncs the folders it changed (`sync`, once per batch of renames and deletes), so a crash leaves
  the old file or the new one, never half.
- S3 (pyarrow's S3 filesystem, reached as runtime/object_store.py describes): an object appears
  whole when its upload completes, or not at all; a "rename" is a copy, then a delete of the source.

    files = files_for("s3a://bucket/lake/landing/events-00001.jsonl")
    with files.open_read("s3a://bucket/lake/landing/events-00001.jsonl") as stream: ...
"""

from __future__ import annotations

import filecmp
import os
from collections.abc import Iterator
from typing import BinaryIO

from databuild_assets.runtime.durable import fsync_folder
from databuild_assets.runtime.file_modes import create_new_file, file_mode, make_folders
from databuild_assets.runtime.lake import is_local, plain_path
from databuild_assets.runtime.object_store import arrow_filesystem, is_s3

_CHUNK = 8 << 20


def lines_of(stream: BinaryIO) -> Iterator[bytes]:
    """The lines of a binary stream, each with its b"\\n" (the last one may lack it), as ingestion
    splits them: after b"\\n" only. Linear in the stream's size however long a line: a line that
    spans chunks is joined once, at its end (a line longer than a landing file's limit is still
    only as large as the file)."""
    pending: list[bytes] = []
    while chunk := stream.read(_CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start) + 1) > 0:
            yield b"".join([*pending, chunk[start:end]]) if pending else chunk[start:end]
            pending, start = [], end
        if start < len(chunk):
            pending.append(chunk[start:])
    if pending:
        yield b"".join(pending)


class LocalFiles:
    """Files on this machine's disks; paths are plain paths or file: URIs."""

    @staticmethod
    def path(uri: str) -> str:
        """The plain path of `uri` (file:/a/b -> /a/b): how paths are shown and recorded."""
        return plain_path(uri)

    def exists(self, uri: str) -> bool:
        return os.path.exists(self.path(uri))

    def open_read(self, uri: str) -> BinaryIO:
        return open(self.path(uri), "rb")

    def open_new(self, uri: str) -> BinaryIO:
        """A new file at `uri` (refused if one is there, or a link), in a folder made as needed,
        with the project's modes whatever the umask (runtime/file_modes.py): an erasure's rewrite
        of a landing file holds the values it kept."""
        make_folders(os.path.dirname(self.path(uri)))
        descriptor = create_new_file(self.path(uri))
        os.fchmod(descriptor, file_mode())
        return os.fdopen(descriptor, "wb")

    @staticmethod
    def finish(stream: BinaryIO) -> None:
        """Make what was written to `stream` durable (before a rename publishes it)."""
        stream.flush()
        os.fsync(stream.fileno())

    def same_content(self, a: str, b: str) -> bool:
        return filecmp.cmp(self.path(a), self.path(b), shallow=False)

    def move(self, source: str, target: str) -> None:
        """Rename `source` over `target` (atomic on one filesystem); `sync` makes it durable."""
        os.makedirs(os.path.dirname(self.path(target)), exist_ok=True)
        os.replace(self.path(source), self.path(target))

    def remove(self, uri: str) -> None:
        os.remove(self.path(uri))

    def sync(self, *folders: str) -> None:
        """Make the renames and deletes in `folders` durable (those that exist)."""
        for folder in map(self.path, folders):
            if os.path.isdir(folder):
                fsync_folder(folder)

    def list_names(self, folder: str) -> list[str]:
        folder = self.path(folder)
        return sorted(entry.name for entry in os.scandir(folder) if entry.is_file()) if os.path.isdir(folder) else []


class ObjectFiles:
    """Objects in S3 through pyarrow's S3 filesystem; paths are s3a:// or s3:// URIs."""

    def __init__(self) -> None:
        from pyarrow import fs

        self._fs_module = fs

    @staticmethod
    def path(uri: str) -> str:
        """`uri` itself: how objects are shown and recorded."""
        return uri

    _split = staticmethod(arrow_filesystem)

    def exists(self, uri: str) -> bool:
        filesystem, path = self._split(uri)
        return filesystem.get_file_info(path).type != self._fs_module.FileType.NotFound

    def open_read(self, uri: str) -> BinaryIO:
        filesystem, path = self._split(uri)
        return filesystem.open_input_stream(path)

    def open_new(self, uri: str) -> BinaryIO:
        # The object appears whole when the stream closes (a multipart upload's completion).
        filesystem, path = self._split(uri)
        return filesystem.open_output_stream(path)

    @staticmethod
    def finish(stream: BinaryIO) -> None:
        """Nothing to do: an object is durable once its upload completes, at close."""

    @staticmethod
    def sync(*folders: str) -> None:
        """Nothing to do: a copy or a delete is durable once the store answers."""

    def same_content(self, a: str, b: str) -> bool:
        with self.open_read(a) as first, self.open_read(b) as second:
            while True:
                left, right = first.read(_CHUNK), second.read(_CHUNK)
                if left != right:
                    return False
                if not left:
                    return True

    def move(self, source: str, target: str) -> None:
        filesystem, source_path = self._split(source)
        _, target_path = self._split(target)
        filesystem.copy_file(source_path, target_path)
        filesystem.delete_file(source_path)

    def remove(self, uri: str) -> None:
        filesystem, path = self._split(uri)
        filesystem.delete_file(path)

    def list_names(self, folder: str) -> list[str]:
        filesystem, path = self._split(folder)
        selector = self._fs_module.FileSelector(path, allow_not_found=True)
        return sorted(
            info.base_name for info in filesystem.get_file_info(selector) if info.type == self._fs_module.FileType.File
        )


def files_for(uri: str) -> LocalFiles | ObjectFiles:
    """The operations for where `uri` is: LocalFiles for a local path, ObjectFiles for S3."""
    if is_local(uri):
        return LocalFiles()
    if is_s3(uri):
        return ObjectFiles()
    raise ValueError(f"{uri}: landing files are moved and rewritten on a local disk or S3 only")


__all__ = ["LocalFiles", "ObjectFiles", "files_for", "lines_of"]
