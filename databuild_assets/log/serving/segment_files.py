"""Writing a cold segment's two files (cold.py reads them; docs/decisions/0051).

A segment is `segment-<n>.parquet`, the index's `events` rows of the build requests it holds,
sorted by (timestamp, event_id), and `segment-<n>.by-partition.parquet`, one row per (ref, event)
for the refs an event carries (`partition_ref`) or lists (a build request's requested partitions,
a job's targets), sorted by ref. Rows arrive as Arrow (an eviction's rows from SQLite as one
struct array, a merge's from the segments' own files): a segment of 262,144 events is sorted,
fanned out by ref and written by Arrow, with Python touching only the payloads that list refs;
an index being built has its files written by a thread beside its SQLite work (`segment_writes`).

    low, high, groups, refs = write_segment(folder, 7, rows_table(connection.execute("SELECT * FROM events")))
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from databuild_assets.runtime.deferred import deferred
from databuild_assets.runtime.durable import fsync_file, fsync_folder
from databuild_assets.runtime.file_modes import file_mode, make_folders

pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")
pq = deferred("pyarrow.parquet")
msgspec = deferred("msgspec")
futures = deferred("concurrent.futures")  # a query's process, which never builds, never imports it
if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

ROWS_PER_GROUP = 4096
# The columns a main file's reads prune its groups by (a range's and a page's time, a thaw's
# build requests when their groups are not named): min/max of the others, the payloads' above
# all, were most of its footer, parsed by each process that reads the segment.
_MAIN_STATISTICS = ["timestamp", "build_request_id"]
# The by-partition file's groups are smaller: a partition's read decodes a group in each segment
# holding it, for its few rows there, and a partition spans many segments; only `key` (and
# `timestamp`) keep statistics: the others' strings made most of its footer (decision 0051).
BY_PARTITION_ROWS_PER_GROUP = 1024
_BY_PARTITION_STATISTICS = ["key", "timestamp"]
# The columns a dictionary encodes: a segment's ids and refs repeat, its payloads do not (trying a
# dictionary for them, then falling back, was a sixth of a file's write).
_DICTIONARY = ["build_request_id", "event_type", "partition_ref", "job_run_id", "status_code", "key"]
# The file's schema metadata naming the column its rows are sorted by across row groups: a
# reader bisects the groups' statistics for a key, reading a few of them, not every group's.
SORTED_BY = "databuild.sorted_by"
_SEGMENT_FIELDS = (
    ("event_id", "string"), ("timestamp", "int64"), ("build_request_id", "string"), ("event_type", "string"),
    ("payload", "string"), ("partition_ref", "string"), ("job_run_id", "string"), ("status_code", "int64"),
)  # fmt: skip
ROW_COLUMNS = tuple(name for name, _ in _SEGMENT_FIELDS)
_LISTS = {"build_request_event": "requested_partitions", "job_event": "target_partitions"}


@functools.cache
def segment_schema() -> pa.Schema:
    """A segment's main file's schema: made on first use, with pyarrow."""
    return pa.schema([(name, getattr(pa, kind)()) for name, kind in _SEGMENT_FIELDS])


@functools.cache
def _row_type() -> pa.StructType:
    return pa.struct(list(segment_schema()))


def segment_paths(folder: str, segment: int) -> tuple[str, str]:
    """The files of segment `segment`: its events by build request, and by partition."""
    base = os.path.join(folder, f"segment-{segment}")
    return base + ".parquet", base + ".by-partition.parquet"


def listed_partitions(event_type: str, payload: str) -> set[str]:
    """The partition refs an event row lists, as sqlite/schema.py `select_listed_partitions` lists
    them (the strings of its field's value, walked as json_each walks it; a stored payload has no
    key twice): that one field parsed by msgspec, or the payload by json where msgspec refuses it
    (log/sqlite/backend.py `payload_of`)."""
    field = _LISTS.get(event_type)
    if field is None:
        return set()
    try:
        listed = getattr(_listing_decoders()[event_type].decode(payload), field)
    except ValueError:  # msgspec.DecodeError and ValidationError are ones
        listed = json.loads(payload).get(field)
    if isinstance(listed, dict):  # json_each walks an object's values,
        listed = listed.values()
    elif not isinstance(listed, list):  # a scalar itself
        listed = [listed]
    return {ref for ref in listed if isinstance(ref, str)}


@functools.cache
def _listing_decoders() -> dict[str, Any]:
    """A decoder of each listing event's one field: the rest of its payload is skipped, not built."""
    return {
        event_type: msgspec.json.Decoder(msgspec.defstruct(f"Listing_{field}", [(field, Any, None)]))
        for event_type, field in _LISTS.items()
    }


def rows_table(rows: Iterable[tuple]) -> pa.Table:
    """Index `events` rows (tuples in ROW_COLUMNS order, as SQLite returns them) as a table of
    `segment_schema()`: one struct array, not a Python list per column."""
    return pa.Table.from_struct_array(pa.array(list(rows), _row_type()))


def write_segment(
    folder: str, segment: int, rows: pa.Table, writes: SegmentWrites | None = None
) -> tuple[int, int, dict[str, bytes], list[str]]:
    """Write segment `segment` of `rows` (`segment_schema()`, not empty) and its by-partition
    companion, here or, given `writes`, on its thread; returns their (min, max) timestamp, each
    build request's row groups (`cold_build_requests.row_groups`) and the refs the rows carry or
    list, sorted (the companion's keys: their payloads are parsed once, here)."""
    make_folders(folder)
    table = rows.select(list(ROW_COLUMNS)).sort_by([("timestamp", "ascending"), ("event_id", "ascending")])
    positions, keys = _fanned_out(table)
    refs = pc.unique(keys).sort()
    job = functools.partial(_write_files, folder, segment, table, positions, keys, refs)
    if writes is None:
        job()
    else:
        writes.submit(job, segment_paths(folder, segment))
    stamps = table.column("timestamp")
    return (
        pc.min(stamps).as_py(),
        pc.max(stamps).as_py(),
        _row_groups(table.column("build_request_id").to_pylist()),
        refs.to_pylist(),
    )


class SegmentWrites:
    """Segment files written by a thread of their own beside the caller's SQLite work (Arrow and
    Parquet let go of the GIL, and SQLite does), one segment at a time: a submit waits for the
    one before, so two segments' rows are in memory at most. For an index being built: nothing
    names its segments before `wait` has returned. A write's error is raised by the next call;
    a block left by an error removes every file it was handed (`segment_writes`).

        with segment_writes() as writes:
            write_segment(folder, 7, rows, writes)
            writes.wait()   # segment 7's files are on disk
    """

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._pending: Future | None = None
        self.paths: list[str] = []  # the files of every segment handed over

    def submit(self, job: Callable[[], None], paths: Iterable[str]) -> None:
        self.wait()
        self.paths.extend(paths)
        self._pending = self._pool.submit(job)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()


@contextlib.contextmanager
def segment_writes() -> Iterator[SegmentWrites]:
    """A SegmentWrites whose last write is waited for on the way out (its error raised, unless
    one is on its way already): its files are not written after the block, and when the block
    fails, every file it was handed is removed (a segment whose transaction rolled back has no
    row naming it)."""
    with futures.ThreadPoolExecutor(1, thread_name_prefix="segment-writes") as pool:
        writes = SegmentWrites(pool)
        try:
            yield writes
            writes.wait()
        except BaseException:
            with contextlib.suppress(Exception):
                writes.wait()
            for path in writes.paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            raise


def _fanned_out(table: pa.Table) -> tuple[pa.Array, pa.Array]:
    """For each ref a row of `table` carries or lists (one listed by the event that carries it,
    once), the row's position and the ref: the carried ones in row order, then the listed."""
    refs = table.column("partition_ref")
    carrying = pc.indices_nonzero(pc.is_valid(refs))
    listing = pc.indices_nonzero(pc.is_in(table.column("event_type"), value_set=pa.array(list(_LISTS))))
    positions, keys = [], []
    if len(listing):
        chosen = table.select(["event_type", "payload", "partition_ref"]).take(listing)
        for position, event_type, payload, ref in zip(
            listing.to_pylist(),
            *(chosen.column(name).to_pylist() for name in ("event_type", "payload", "partition_ref")),
            strict=True,
        ):
            listed = listed_partitions(event_type, payload)
            listed.discard(ref)
            positions.extend([position] * len(listed))
            keys.extend(sorted(listed))
    return (
        pa.concat_arrays([carrying.cast(pa.int64()), pa.array(positions, pa.int64())]),
        pa.concat_arrays([refs.take(carrying).combine_chunks(), pa.array(keys, pa.string())]),
    )


def _write_files(
    folder: str, segment: int, table: pa.Table, positions: pa.Array, keys: pa.Array, refs: pa.Array
) -> None:
    """A segment's two files, then their folder, durable."""
    main, partitions = segment_paths(folder, segment)
    companion = _by_partition(table, positions, keys, refs).replace_schema_metadata({SORTED_BY: "key"})
    _write_parquet(partitions, companion, BY_PARTITION_ROWS_PER_GROUP, _BY_PARTITION_STATISTICS)
    del companion
    _write_parquet(main, table, ROWS_PER_GROUP, _MAIN_STATISTICS)
    fsync_folder(folder)


def _by_partition(table: pa.Table, positions: pa.Array, keys: pa.Array, refs: pa.Array) -> pa.Table:
    """A row of `table` (sorted by timestamp, event_id) for each (position, key) of
    `_fanned_out`, with that ref as `key`, sorted by (key, timestamp, event_id): by the key's
    rank among `refs` (sorted), then by the row's position, two integers, not the strings
    themselves (decision 0051), and every column taken once."""
    sorting = pa.table({"rank": pc.index_in(keys, value_set=refs), "position": positions})
    ranks = pc.sort_indices(sorting, [("rank", "ascending"), ("position", "ascending")])
    return table.take(positions.take(ranks)).add_column(0, "key", keys.take(ranks))


def _write_parquet(path: str, table: pa.Table, rows_per_group: int, statistics: bool | list[str]) -> None:
    """`table` at `path` in groups of `rows_per_group` rows, with the min/max of the columns
    `statistics` names (True: all), made 0600 (file_modes) through a temporary name, fsynced
    (the temporary file removed when the write fails)."""
    building = path + ".building"
    descriptor = os.open(building, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, file_mode())
    os.fchmod(descriptor, file_mode())
    try:
        with os.fdopen(descriptor, "wb") as file:
            pq.write_table(
                table,
                file,
                row_group_size=rows_per_group,
                compression="zstd",
                write_statistics=statistics,
                use_dictionary=[name for name in _DICTIONARY if name in table.column_names],
            )
        fsync_file(building)
        os.replace(building, path)
    except BaseException:  # no half file left under its temporary name
        with contextlib.suppress(FileNotFoundError):
            os.unlink(building)
        raise


def _row_groups(build_request_ids: list[str]) -> dict[str, bytes]:
    """Each build request's row groups in a file of rows whose build requests are
    `build_request_ids`, in file order: a bitmask, bit g set when group g holds one of its rows.
    Its time span would name every group between its first and last event, and at 10M events a
    build request that ran an hour spans most of its segment."""
    masks: dict[str, int] = {}
    for position, build_request_id in enumerate(build_request_ids):
        masks[build_request_id] = masks.get(build_request_id, 0) | 1 << position // ROWS_PER_GROUP
    width = (len(build_request_ids) // ROWS_PER_GROUP) // 8 + 1
    return {build_request_id: mask.to_bytes(width, "little") for build_request_id, mask in masks.items()}


__all__ = [
    "BY_PARTITION_ROWS_PER_GROUP",
    "SORTED_BY",
    "ROWS_PER_GROUP",
    "ROW_COLUMNS",
    "SegmentWrites",
    "segment_schema",
    "listed_partitions",
    "rows_table",
    "segment_paths",
    "segment_writes",
    "write_segment",
]
