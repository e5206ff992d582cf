"""A reader's copy of what the pipeline publishes (publish.py), under its index folder:

    <index folder>/published/<id>/published.json        the manifest it started from, and where
    <index folder>/published/<id>/segments/...          segment files fetched (a pipeline adopting
                                                        a publication; readers read by ranges)

Fetched segments take at most `cache_bytes()` of the disk (the least recently read go first), and
after a catch-up every file the bucket's current manifest no longer names is removed, so that a
value erased since leaves this machine's cache too.

    folder = keep_manifest(index_folder, manifest, publication)   # a new reader, before its download
    drop_unpublished(index_folder, publication.manifest(), keep_id)   # after a catch-up
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterable

from databuild_assets.log.serving.publish import (
    MANIFEST,
    PUBLISHED_FOLDER,
    Manifest,
    Publication,
    PublicationError,
    cache_bytes,
    local_names,
    publication_folder,
    publication_of,
    segment_object_names,
)
from databuild_assets.runtime.durable import fsync_file, fsync_folder
from databuild_assets.runtime.file_modes import file_mode, make_folders

_LOCAL_SEGMENT = re.compile(r"^segment-(\d+)\.(by-partition\.)?parquet$")
# A fetch's temporary file older than this is a killed process's: removed at the next drop.
_STALE_FETCH_S = 600.0


def keep_manifest(index_folder: str, manifest: Manifest, publication: Publication) -> str:
    """Record `manifest` (and where it was published) in the reader's folder of that publication,
    where `published_object` finds where a segment is; returns the folder."""
    folder = publication_folder(index_folder, manifest.id)
    make_folders(os.path.join(folder, "segments"))
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        building = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        descriptor = os.open(building, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(json.dumps({"base": publication.base, "manifest": json.loads(manifest.to_json())}))
        fsync_file(building)
        os.replace(building, path)
        fsync_folder(folder)
    return folder


def published_object(path: str) -> tuple[Publication, str, int] | None:
    """Where the segment file `path` of a reader's folder of a publication (`<index folder>/
    published/<id>/segments/`) is in the bucket: (publication, object name, size). None when
    `path` is not such a file, or its publication is no longer kept; FileNotFoundError when the
    publication names no such segment."""
    match = _LOCAL_SEGMENT.match(os.path.basename(path))
    folder = os.path.dirname(os.path.dirname(path))
    if not match or os.path.basename(os.path.dirname(folder)) != PUBLISHED_FOLDER:
        return None
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as file:
            kept = json.load(file)
    except FileNotFoundError:
        return None
    manifest = Manifest.from_json(json.dumps(kept["manifest"]), os.path.join(folder, MANIFEST))
    segment = int(match.group(1))
    if segment not in manifest.segments:
        raise FileNotFoundError(f"{path}: publication {manifest.id} names no segment {segment}")
    from databuild_assets.runtime.object_store import arrow_filesystem

    key, main_bytes, by_partition_bytes = manifest.segments[segment]
    which = 1 if match.group(2) else 0
    publication = Publication(arrow_filesystem("s3://" + str(kept["base"]))[0], str(kept["base"]))
    return publication, segment_object_names(segment, key)[which], (main_bytes, by_partition_bytes)[which]


def fetch_segment(path: str) -> bool:
    """Download the segment file `path` of a reader's folder of a publication (the
    pipeline adopting a publication; a reader reads segments by ranges, footers.py). False when
    `path` is not such a file; FileNotFoundError when the bucket no longer has it."""
    remote = published_object(path)
    if remote is None:
        return False
    publication, name, size = remote
    publication.download(name, path, size)
    _bound_cache(os.path.dirname(os.path.dirname(os.path.dirname(path))), cache_bytes(), keep=[path])
    return True


def _bound_cache(root: str, limit: float, keep: Iterable[str]) -> None:
    """Remove the least recently read fetched segments under `root` (`<index folder>/published/`)
    until they take at most `limit` bytes, never those in `keep`. A read touches its file
    (`touch_read`), so modification time orders them."""
    files = []
    for parent, _, names in os.walk(root):
        for name in names:
            if _LOCAL_SEGMENT.match(name):
                path = os.path.join(parent, name)
                try:
                    status = os.stat(path)
                except FileNotFoundError:
                    continue
                files.append((status.st_mtime_ns, status.st_size, path))
    total = sum(size for _, size, _ in files)
    kept = set(keep)
    for _, size, path in sorted(files):
        if total <= limit:
            break
        if path in kept:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        total -= size


def touch_read(path: str) -> None:
    """Mark a fetched segment as just read (the cache bound removes the least recently read)."""
    if os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(path)))) == PUBLISHED_FOLDER:
        try:
            os.utime(path)
        except FileNotFoundError:
            pass


def drop_unpublished(index_folder: str, manifest: Manifest, keep_id: str | None) -> list[str]:
    """The fetched segments that `manifest` (the bucket's current one) no longer names, and
    the folders of publications other than `keep_id` (the one its index reads) and the
    manifest's: removed, so that a value erased since leaves this machine's cache too."""
    root = os.path.join(index_folder, PUBLISHED_FOLDER)
    removed = []
    if not os.path.isdir(root):
        return removed
    current = {(n, key) for n, (key, _, _) in manifest.segments.items()}
    for publication_id in os.listdir(root):
        folder = os.path.join(root, publication_id)
        if publication_id not in (keep_id, manifest.id):
            _remove_tree(folder)
            removed.append(folder)
            continue
        try:
            with open(os.path.join(folder, MANIFEST), encoding="utf-8") as file:
                kept = Manifest.from_json(json.dumps(json.load(file)["manifest"]), folder)
        except (FileNotFoundError, PublicationError, KeyError, ValueError):
            _remove_tree(folder)
            removed.append(folder)
            continue
        segments_folder = os.path.join(folder, "segments")
        for name in os.listdir(segments_folder) if os.path.isdir(segments_folder) else []:
            match = _LOCAL_SEGMENT.match(name)
            segment = int(match.group(1)) if match else None
            path = os.path.join(segments_folder, name)
            stale_fetch = name.endswith(".building") and _older_than(path, _STALE_FETCH_S)
            if stale_fetch or (segment in kept.segments and (segment, kept.segments[segment][0]) not in current):
                _unlink(path)
                removed.append(path)
    return removed


def adopt(connection: sqlite3.Connection, index_folder: str) -> None:
    """Make a downloaded index the pipeline's own before it evicts into it: every segment it
    names fetched and linked into `<index folder>/segments/` (where evictions write), and its
    publication forgotten, so that later evictions and sweeps never touch a reader's fetched files."""
    publication_id = publication_of(connection)
    if publication_id is None:
        return
    fetched = os.path.join(publication_folder(index_folder, publication_id), "segments")
    own = os.path.join(index_folder, "segments")
    make_folders(own)
    named = [row[0] for row in connection.execute("SELECT segment FROM main.cold_segments")]
    for name in os.listdir(own):  # files of an older lineage: the index names none of them
        os.unlink(os.path.join(own, name))
    for segment in named:
        for name in local_names(segment):
            source = os.path.join(fetched, name)
            if not os.path.exists(source):
                fetch_segment(source)
            os.link(source, os.path.join(own, name))
    fsync_folder(own)
    connection.execute("DROP TABLE main.serving_publication")


def _remove_tree(folder: str) -> None:
    """Remove `folder`; another process of this machine may be removing or filling it too."""
    aside = f"{folder}.removing-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _older_than(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > seconds
    except FileNotFoundError:
        return False


__all__ = ["adopt", "drop_unpublished", "fetch_segment", "keep_manifest", "published_object", "touch_read"]
