"""What the pipeline publishes of a lake's serving index on an object store, so that a new reader
starts from it instead of building its own from the whole raw log (docs/decisions/0054).

A lake on S3 keeps its serving index on each reading machine's disk (store.py). The pipeline's
refresh publishes one in the lake, beside the tables:

    <root>/serving_index/
        published.json                                  the manifest, replaced last
        snapshots/index-<id>/<n>.sqlite.zst             the index written whole (VACUUM INTO), zstd
        segments/segment-<n>-<key>.parquet              its cold segments (and .by-partition.parquet)

Objects are immutable: a snapshot is named by its publication's id, a segment by its number and
a digest of its bytes (a rewritten segment is another object).
After the manifest is replaced, every object it does not name is deleted: a snapshot or segment
that held an erased value leaves the bucket with the publication that follows the erasure.

The snapshot is zstd frames of 16 MiB of the file each (about half the bytes to move), an object
each: a reader fetches and unpacks them in parallel, each read costing its own size on any store
(ranges of one object each cost the whole object on the tests' S3 server; a one-object snapshot,
`index-<id>.sqlite.zst`, is still read). A reader with no usable index downloads it (sizes checked
against the manifest's) and catches up commit by commit, as from an index of its own. The snapshot
names its publication (`serving_publication`); a reader reads its segments by ranges from the
bucket (footers.py: nothing of them on its disk), as if at `<index folder>/published/<id>/
segments/`, where the pipeline adopting a publication fetches them (reader_cache.py, which keeps
that copy within its bound and drops what the bucket no longer names). A segment
gone from the bucket (republished after an erasure) makes the reader start again from the current
snapshot.

    publication = Publication.of("s3a://bucket/lake")
    publication.publish(index, generation_of(index.path), segments)   # the pipeline, under the build lock
    manifest = publication.manifest()                            # a new reader
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from databuild_assets.log.serving.store import remove_index_files
from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.file_modes import file_mode

if TYPE_CHECKING:  # publish.py is imported by cold.py, which index.py imports
    from databuild_assets.log.serving.index import ServingIndex

log = logging.getLogger(__name__)
hashlib = deferred("hashlib")  # OpenSSL's init: a read of a hot key needs none (decision 0057)

MANIFEST = "published.json"
PUBLISHED_FOLDER = "published"  # a reader's segments, per publication, under its index folder
_FORMAT = 2  # 2: a snapshot's frames an object each; 1 (one object of frames) is still read
# The pipeline publishes when none is published, when its index was written whole since (an
# erasure or purge deleted events: the published copy may hold their values), or when the
# published one is older than this: a new reader then catches up at most this much log.
PUBLISH_INTERVAL_ENV = "DATABUILD_SERVING_PUBLISH_INTERVAL_S"
DEFAULT_PUBLISH_INTERVAL_S = 3600.0
# The segment files fetched into `published/` (by a pipeline adopting a publication, and by older
# releases' readers; readers read segments by ranges now) take at most this many bytes of its
# disk: past it, the least recently read are removed after a fetch.
CACHE_BYTES_ENV = "DATABUILD_SERVING_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
_ID = re.compile(r"^[0-9a-f]{32}$")
_KEY = re.compile(r"^[0-9a-f]{16}$")
_CHUNK = 1 << 20
# A download reads this many byte ranges of this size at once (at most their product in memory).
_RANGE = 16 << 20
_PARALLEL_RANGES = 8


class PublicationError(RuntimeError):
    """A published manifest or snapshot that cannot be used (malformed, or not what it says)."""


@dataclass(frozen=True)
class Manifest:
    """A publication: its id, the snapshot's object, the index file's size and the sizes of its
    frames (zstd, `_RANGE` bytes of the file each), the index generation it was taken from, when,
    and each cold segment's number -> (key, main file's size, by-partition's size)."""

    id: str
    snapshot: str
    snapshot_bytes: int
    snapshot_frames: tuple[int, ...]
    source: str
    published_at: float
    segments: Mapping[int, tuple[str, int, int]]

    def snapshot_objects(self) -> list[str]:
        """The snapshot's object names (under serving_index/), in the order of its frames."""
        return snapshot_frame_names(self.snapshot, len(self.snapshot_frames))

    def segment_objects(self) -> dict[str, int]:
        """The segments' object names (under serving_index/) and sizes."""
        objects = {}
        for segment, (key, main, by_partition) in self.segments.items():
            names = segment_object_names(segment, key)
            objects[names[0]], objects[names[1]] = main, by_partition
        return objects

    def to_json(self) -> str:
        segments = {str(n): list(v) for n, v in self.segments.items()}
        body = {**self.__dict__, "format": _FORMAT, "segments": segments, "snapshot_frames": list(self.snapshot_frames)}
        return json.dumps(body, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            body = json.loads(text)
            if body.get("format") not in (1, _FORMAT):
                raise PublicationError(f"{where}: manifest format {body.get('format')!r}, reads 1 to {_FORMAT}")
            manifest = cls(
                id=str(body["id"]),
                snapshot=str(body["snapshot"]),
                snapshot_bytes=int(body["snapshot_bytes"]),
                snapshot_frames=tuple(int(size) for size in body["snapshot_frames"]),
                source=str(body["source"]),
                published_at=float(body["published_at"]),
                segments={int(n): (str(k), int(a), int(b)) for n, (k, a, b) in body["segments"].items()},
            )
        except (ValueError, KeyError, TypeError) as error:
            raise PublicationError(f"{where}: not a serving index manifest ({error})") from error
        # Names come from the bucket: a reader turns them into local paths, so only ours pass.
        if not _ID.match(manifest.id) or manifest.snapshot not in (
            snapshot_object_name(manifest.id),
            snapshot_object_name(manifest.id) + ".sqlite.zst",  # every frame in one object: read, no longer written
        ):
            raise PublicationError(f"{where}: id {manifest.id!r} or snapshot {manifest.snapshot!r} is not one we write")
        if any(not _KEY.match(key) for key, _, _ in manifest.segments.values()):
            raise PublicationError(f"{where}: a segment key is not one we write")
        frames = manifest.snapshot_frames  # each read whole into memory: bounded by zstd's worst case
        if len(frames) != -(-manifest.snapshot_bytes // _RANGE) or not all(0 < f <= 2 * _RANGE for f in frames):
            raise PublicationError(f"{where}: {len(frames)} frames for {manifest.snapshot_bytes} bytes, or too large")
        return manifest


def snapshot_object_name(publication_id: str) -> str:
    """The snapshot of a publication: a folder of its frames' objects (`snapshot_frame_names`)."""
    return f"snapshots/index-{publication_id}"


def snapshot_frame_names(snapshot: str, frames: int) -> list[str]:
    """The objects of a snapshot's frames, in order (one object for a one-object snapshot)."""
    if snapshot.endswith(".zst"):
        return [snapshot]
    return [_frame_object(snapshot, number) for number in range(frames)]


def _frame_object(snapshot: str, number: int) -> str:
    return f"{snapshot}/{number:05d}.sqlite.zst"


def segment_object_names(segment: int, key: str) -> tuple[str, str]:
    return f"segments/segment-{segment}-{key}.parquet", f"segments/segment-{segment}-{key}.by-partition.parquet"


def segment_key(paths: Iterable[str]) -> str:
    """A digest of a segment's two files' bytes: the same segment is the same object whatever
    machine, file time or number reuse; a rewritten one is another. (Reading them is about what
    uploading them costs, once per publication.)"""
    digest = hashlib.blake2b(digest_size=8)
    for path in paths:
        with open(path, "rb") as file:
            while chunk := file.read(_RANGE):
                digest.update(chunk)
    return digest.hexdigest()


def publication_of(connection: sqlite3.Connection) -> str | None:
    """The id of the publication an index was downloaded from (None: built or kept here)."""
    try:
        row = connection.execute("SELECT id FROM main.serving_publication").fetchone()
    except sqlite3.OperationalError:
        return None
    return row[0] if row and _ID.match(str(row[0])) else None


def mark_generation(path: str) -> None:
    """Give the index file at `path` (a new generation: built, rewritten or adopted) an id of
    its own, which a publication names as its source: file names restart on a new machine."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("CREATE TABLE IF NOT EXISTS serving_generation (id TEXT NOT NULL)")
        connection.execute("DELETE FROM serving_generation")
        connection.execute("INSERT INTO serving_generation VALUES (?)", (uuid.uuid4().hex,))
    finally:
        connection.close()


def generation_of(path: str) -> str:
    """The index file's name and generation id (`mark_generation`), as a publication's source."""
    connection = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)
    try:
        row = connection.execute("SELECT id FROM serving_generation").fetchone()
    except sqlite3.OperationalError:
        row = None
    finally:
        connection.close()
    return f"{os.path.basename(path)}#{row[0] if row else ''}"


def publication_folder(index_folder: str, publication_id: str) -> str:
    """Where a reader keeps the segments of publication `publication_id` (and its manifest)."""
    return os.path.join(index_folder, PUBLISHED_FOLDER, publication_id)


def _setting(environ: Mapping[str, str], name: str, default: float, unit: str) -> float:
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name}={raw!r}: a number of {unit}, 0 or more")
    return value


def publish_interval_s(environ: Mapping[str, str] = os.environ) -> float:
    return _setting(environ, PUBLISH_INTERVAL_ENV, DEFAULT_PUBLISH_INTERVAL_S, "seconds")


def cache_bytes(environ: Mapping[str, str] = os.environ) -> float:
    return _setting(environ, CACHE_BYTES_ENV, DEFAULT_CACHE_BYTES, "bytes")


class Publication:
    """The published serving index of one lake on an object store (`fs`: a pyarrow filesystem,
    `base`: the serving_index folder there)."""

    def __init__(self, fs: Any, base: str) -> None:
        self.fs = fs
        self.base = base.rstrip("/")

    @classmethod
    def of(cls, root: str) -> Publication:
        from databuild_assets.runtime.object_store import arrow_filesystem

        fs, path = arrow_filesystem(root.rstrip("/") + "/serving_index")
        return cls(fs, path)

    def __repr__(self) -> str:
        return f"Publication({self.base!r})"

    def _path(self, name: str) -> str:
        return f"{self.base}/{name}"

    def open_object(self, name: str) -> Any:
        """Object `name` for reads by ranges: one HEAD request; FileNotFoundError when it is gone."""
        return self.fs.open_input_file(self._path(name))

    def manifest(self) -> Manifest | None:
        """The current manifest, None when nothing is published."""
        try:
            with self.fs.open_input_stream(self._path(MANIFEST), compression=None) as stream:
                text = stream.read().decode("utf-8")
        except FileNotFoundError:
            return None
        return Manifest.from_json(text, self._path(MANIFEST))

    def due(self, source: str, interval_s: float) -> bool:
        """Whether the pipeline should publish its index `source` (`generation_of`) now (module doc)."""
        current = self.manifest()
        return current is None or current.source != source or time.time() - current.published_at >= interval_s

    def publish(self, index: ServingIndex, source: str, segments: Iterable[int]) -> Manifest:
        """Publish a snapshot of `index` (`source`: its `generation_of`; written whole, so no byte
        of a deleted row) and its cold `segments`, then delete what the new manifest does not
        name. The caller holds the index folder's build lock (no eviction meanwhile)."""
        publication_id = uuid.uuid4().hex
        named = {}
        for segment in sorted(segments):
            main, by_partition = (os.path.join(index.segment_folder, n) for n in local_names(segment))
            key = segment_key((main, by_partition))
            named[segment] = (key, os.path.getsize(main), os.path.getsize(by_partition))
            for local, remote in zip((main, by_partition), segment_object_names(segment, key), strict=True):
                if self.fs.get_file_info(self._path(remote)).size is None:
                    self._upload(local, remote)
        # Ends in .building: a publisher killed here leaves a file the next build lock removes.
        snapshot = os.path.join(os.path.dirname(index.path), f".publishing-{publication_id}.building")
        try:
            index.rewrite_into(snapshot)
            target = sqlite3.connect(snapshot, isolation_level=None)
            try:
                target.execute("DROP TABLE IF EXISTS serving_publication")
                target.execute("CREATE TABLE serving_publication (id TEXT NOT NULL)")
                target.execute("INSERT INTO serving_publication VALUES (?)", (publication_id,))
            finally:
                target.close()
            frames = self._upload_frames(snapshot, snapshot_object_name(publication_id))
            manifest = Manifest(
                publication_id,
                snapshot_object_name(publication_id),
                os.path.getsize(snapshot),
                tuple(frames),
                source,
                time.time(),
                named,
            )
        finally:
            remove_index_files(snapshot)
        with self.fs.open_output_stream(self._path(MANIFEST), compression=None) as stream:
            stream.write(manifest.to_json().encode("utf-8"))
        self._delete_unnamed(manifest)
        log.info(
            "%r: published %s (%d bytes), %d segments", self, manifest.snapshot, manifest.snapshot_bytes, len(named)
        )
        return manifest

    def _upload(self, local: str, name: str) -> None:
        with open(local, "rb") as source, self.fs.open_output_stream(self._path(name), compression=None) as stream:
            while chunk := source.read(_CHUNK):
                stream.write(chunk)

    def _upload_frames(self, local: str, name: str) -> list[int]:
        """`local` as zstd frames of `_RANGE` bytes each, an object each under `name`; their sizes."""
        codec, frames = _codec(), []
        with open(local, "rb") as source:
            while chunk := source.read(_RANGE):
                frame = codec.compress(chunk, asbytes=True)
                target = self._path(_frame_object(name, len(frames)))
                with self.fs.open_output_stream(target, compression=None) as stream:
                    stream.write(frame)
                frames.append(len(frame))
        return frames

    def _delete_unnamed(self, manifest: Manifest) -> None:
        from pyarrow import fs as pafs

        keep = {*manifest.snapshot_objects(), *manifest.segment_objects()}
        for folder in ("snapshots", "segments"):
            selector = pafs.FileSelector(self._path(folder), allow_not_found=True, recursive=True)
            for info in self.fs.get_file_info(selector):
                if not info.path.startswith(self._path(folder) + "/"):  # spelled otherwise: not ours to judge
                    continue
                name = info.path.removeprefix(self.base + "/")
                if info.type == pafs.FileType.File and name not in keep:
                    self.fs.delete_file(info.path)

    def download(self, name: str, target: str, expected_bytes: int, frames: tuple[int, ...] = ()) -> None:
        """Object `name` into `target` (a new file made with the lake's file mode, fsynced),
        unpacked from zstd `frames` (their sizes; a snapshot's, `snapshot_frame_names`) when
        given; FileNotFoundError when an object is gone, PublicationError when its size or a
        frame's is not the manifest's."""
        building = f"{target}.fetching-{uuid.uuid4().hex[:8]}.building"  # removed if stale: reader_cache
        stored = sum(frames) if frames else expected_bytes
        # (object, its size, offset in it, size there, offset in the file, size there)
        if frames:
            apart = not name.endswith(".zst")  # an object per frame, or all of them in one
            objects = snapshot_frame_names(name, len(frames))
            pieces = [
                (objects[i], size, 0, size, i * _RANGE, min(_RANGE, expected_bytes - i * _RANGE))
                if apart
                else (name, stored, sum(frames[:i]), size, i * _RANGE, min(_RANGE, expected_bytes - i * _RANGE))
                for i, size in enumerate(frames)
            ]
        else:
            pieces = [
                (name, stored, at, min(_RANGE, stored - at), at, min(_RANGE, stored - at))
                for at in range(0, stored, _RANGE)
            ]
        try:
            descriptor = os.open(building, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
            try:
                # Pieces read at once: one stream of small reads is several times slower.
                def copy(piece: tuple[str, int, int, int, int, int]) -> None:
                    object_name, object_size, at, length, offset, unpacked = piece
                    with self.fs.open_input_file(self._path(object_name)) as source:
                        if source.size() != object_size:
                            raise PublicationError(
                                f"{self._path(object_name)}: {source.size()} bytes, its manifest says {object_size}"
                            )
                        data = source.read_at(length, at)
                    if len(data) != length:
                        raise PublicationError(f"{self._path(object_name)}: {len(data)} bytes at {at}, not {length}")
                    if frames:
                        try:
                            data = _codec().decompress(data, decompressed_size=unpacked, asbytes=True)
                        except OSError as error:
                            raise PublicationError(f"{self._path(object_name)}: frame at {at}: {error}") from error
                    os.pwrite(descriptor, data, offset)

                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(_PARALLEL_RANGES) as pool:
                    list(pool.map(copy, pieces))
                if os.fstat(descriptor).st_size != expected_bytes:
                    raise PublicationError(f"{self._path(name)}: unpacked to other than {expected_bytes} bytes")
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(building, target)
        finally:
            if os.path.exists(building):
                os.unlink(building)


def _codec():
    import pyarrow as pa

    return pa.Codec("zstd", compression_level=1)


def local_names(segment: int) -> tuple[str, str]:
    return f"segment-{segment}.parquet", f"segment-{segment}.by-partition.parquet"


__all__ = [
    "DEFAULT_PUBLISH_INTERVAL_S",
    "MANIFEST",
    "PUBLISHED_FOLDER",
    "Manifest",
    "Publication",
    "PublicationError",
    "cache_bytes",
    "generation_of",
    "local_names",
    "mark_generation",
    "publication_folder",
    "publication_of",
    "publish_interval_s",
    "segment_object_names",
]
