"""Segment files opened with their footers kept in memory (the recently read, within a bound),
and the bounds of their row groups taken from those footers: a cold read finds the groups that
can hold its keys or times without reading the others (docs/decisions/0051, 0059).

    file, footer = opened(segment_paths(folder, 3)[1])
    groups = footer.bounds(file, "key").meeting([("data/a", "data/a")])
"""

from __future__ import annotations

import bisect
import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from databuild_assets.log.serving.publish import Publication, PublicationError
from databuild_assets.log.serving.reader_cache import published_object, touch_read
from databuild_assets.log.serving.segment_files import SORTED_BY
from databuild_assets.runtime.deferred import deferred

pq = deferred("pyarrow.parquet")


def _never_decreasing(values: list[Any]) -> bool:
    return all(a <= b for a, b in zip(values, values[1:], strict=False))


class _Bounds:
    """Each row group's min and max of a column, and whether both never decrease (the file is
    sorted by it): then the groups that can hold a value are found by bisection."""

    def __init__(self, lows: list[Any], highs: list[Any]) -> None:
        self.lows, self.highs = lows, highs
        self.ordered = _never_decreasing(lows) and _never_decreasing(highs)

    def meeting(self, intervals: Iterable[tuple[Any, Any]], among: set[int] | None = None) -> set[int]:
        """The row groups (of `among`, when given) whose (min, max) meets one of `intervals`
        ((low, high), both included)."""
        chosen: set[int] = set()
        for low, high in intervals:
            if self.ordered:
                chosen.update(range(bisect.bisect_left(self.highs, low), bisect.bisect_right(self.lows, high)))
            else:
                pairs = enumerate(zip(self.lows, self.highs, strict=True))
                chosen.update(group for group, (a, b) in pairs if low <= b and a <= high)
        return chosen if among is None else chosen & among


class _GroupBounds:
    """The row-group bounds of a column, each group's read from the statistics once, when a
    read first asks for it: the groups of a file sorted by another column (SORTED_BY) that its
    key chose are the few a read asks about, and reading every group's first walked all of them."""

    def __init__(self, metadata: pq.FileMetaData, index: int) -> None:
        self.metadata, self.index, self._seen = metadata, index, {}

    def meeting(self, intervals: Iterable[tuple[Any, Any]], among: set[int] | None = None) -> set[int]:
        """The row groups (of `among`, when given) whose (min, max) meets one of `intervals`
        ((low, high), both included), and those without statistics."""
        intervals, kept = list(intervals), set()
        for group in range(self.metadata.num_row_groups) if among is None else among:
            try:
                low_bound, high_bound = self._bound(group)
            except _Unbounded:
                kept.add(group)
                continue
            if any(low <= high_bound and low_bound <= high for low, high in intervals):
                kept.add(group)
        return kept

    def _bound(self, group: int) -> tuple[Any, Any]:
        if group not in self._seen:  # concurrent readers may both fill it: with the same value
            statistics = self.metadata.row_group(group).column(self.index).statistics
            has = statistics is not None and statistics.has_min_max
            self._seen[group] = (statistics.min, statistics.max) if has else None
        if self._seen[group] is None:
            raise _Unbounded
        return self._seen[group]


class _SortedBounds(_GroupBounds):
    """The row-group bounds of the column a file is sorted by across its groups (segment_files
    SORTED_BY): found by bisection, reading the statistics of a few groups, each once. Taking
    every group's bounds first made a fresh process's first read of a partition walk every row
    group of every segment holding it."""

    def meeting(self, intervals: Iterable[tuple[Any, Any]], among: set[int] | None = None) -> set[int]:
        """The row groups (of `among`, when given) whose (min, max) meets one of `intervals`
        ((low, high), both included); every group when a probed one has no statistics."""
        groups, chosen = range(self.metadata.num_row_groups), set()
        try:
            for low, high in intervals:
                first = bisect.bisect_left(groups, low, key=lambda group: self._bound(group)[1])
                chosen.update(range(first, bisect.bisect_right(groups, high, key=lambda group: self._bound(group)[0])))
        except _Unbounded:
            chosen = set(groups)
        return chosen if among is None else chosen & among


class _Unbounded(Exception):
    """A row group without min/max statistics of the column asked about."""


class _Footer:
    """A file's footer, read once while the process keeps it, and each column's row-group bounds
    taken from it once: walking the metadata's Python objects for every row group of every
    segment on each read was most of a partition's read (decision 0051). A published segment's
    keeps its object's handle too (`source`)."""

    def __init__(self, metadata: pq.FileMetaData) -> None:
        self.metadata = metadata
        self.source: Any = None
        self._bounds: dict[str, _Bounds | _GroupBounds | None] = {}
        self._lock = threading.Lock()

    def bounds(self, file: pq.ParquetFile, column: str) -> _Bounds | _GroupBounds | None:
        """Each row group's min and max of `column`, None when a group has none (in a file sorted
        by a column, each group's as a read asks for it)."""
        with self._lock:
            sorted_by = _sorted_by(file) if column not in self._bounds else None
            if sorted_by is not None:  # by this column: bisected; by another: group by group
                kind = _SortedBounds if sorted_by == column else _GroupBounds
                self._bounds[column] = kind(self.metadata, file.schema_arrow.get_field_index(column))
            if column not in self._bounds:
                index = file.schema_arrow.get_field_index(column)
                lows, highs = [], []
                for group in range(self.metadata.num_row_groups):
                    statistics = self.metadata.row_group(group).column(index).statistics
                    if statistics is None or not statistics.has_min_max:
                        self._bounds[column] = None
                        break
                    lows.append(statistics.min)
                    highs.append(statistics.max)
                else:
                    self._bounds[column] = _Bounds(lows, highs)
            return self._bounds[column]


def _sorted_by(file: pq.ParquetFile) -> str | None:
    sorted_by = (file.schema_arrow.metadata or {}).get(SORTED_BY.encode())
    return sorted_by.decode() if sorted_by is not None else None


# The footers kept, by path, least recently used first, within a bound: the footers of every
# segment grow with the history, and a segment merged away or rewritten would leave its footer
# behind under a name no segment has again (docs/decisions/0059).
FOOTER_CACHE_BYTES = 192 * 2**20
_FOOTER_MEMORY_PER_BYTE = 10
_footers: OrderedDict[str, tuple[tuple[int, int], _Footer]] = OrderedDict()
_footers_lock = threading.Lock()
_held = 0  # the estimated bytes of the footers in `_footers`


def _after_fork() -> None:
    """The locks anew in a forked child: one a reading thread of the parent held at the fork
    would stay held there, with no thread to release it. A published segment's handle is the
    parent's (its S3 client and connections): the child opens its own."""
    global _footers_lock
    _footers_lock = threading.Lock()
    for _, footer in _footers.values():
        footer._lock = threading.Lock()
        footer.source = None


os.register_at_fork(after_in_child=_after_fork)


def _cached(path: str, identity: tuple[int, int]) -> _Footer | None:
    with _footers_lock:
        entry = _footers.get(path)
        if entry is None or entry[0] != identity:
            return None
        _footers.move_to_end(path)
        return entry[1]


def _keep(path: str, identity: tuple[int, int], metadata: pq.FileMetaData) -> _Footer:
    """The footer of `path` as `identity` ((inode, size), or (0, size) of an object) kept, in
    place of any other footer of that path, and the least recently used dropped while they hold
    more than the bound."""
    global _held
    with _footers_lock:
        entry = _footers.get(path)
        if entry is not None and entry[0] == identity:  # another thread kept it meanwhile
            _footers.move_to_end(path)
            return entry[1]
        if entry is not None:
            _held -= footer_bytes(entry[1].metadata)
        footer = _Footer(metadata)
        _footers[path] = (identity, footer)
        _footers.move_to_end(path)
        _held += footer_bytes(metadata)
        while _held > FOOTER_CACHE_BYTES and len(_footers) > 1:
            _, (_, dropped) = _footers.popitem(last=False)
            _held -= footer_bytes(dropped.metadata)
        return footer


def footer_bytes(metadata: pq.FileMetaData) -> int:
    """The memory a parsed footer is estimated to take: ten times its serialized size (decision 0059)."""
    return _FOOTER_MEMORY_PER_BYTE * metadata.serialized_size


def kept_footers() -> tuple[int, int]:
    """How many footers this process keeps, and their estimated bytes (at most FOOTER_CACHE_BYTES
    but for the last one read)."""
    with _footers_lock:
        return len(_footers), _held


def opened(path: str) -> tuple[pq.ParquetFile, _Footer]:
    """The file, its footer read again only when it has left the recently read (FOOTER_CACHE_BYTES;
    keyed by its path and its inode and size, or a published object's size: a name never names
    two segments at once, but a rebuilt index may reuse it). A reader's segment of a publication,
    which is not on its disk, is read by ranges from the bucket (`published_object`): its footer,
    then the row groups a read needs."""
    for attempt in range(2):  # a file removed between stat and open (a merge, an adoption's bound)
        try:
            status = os.stat(path)
        except FileNotFoundError:
            remote = published_object(path)
            if remote is None:
                raise
            return _opened_remote(path, *remote)
        identity = (status.st_ino, status.st_size)
        footer = _cached(path, identity)
        try:
            file = pq.ParquetFile(path, metadata=footer.metadata if footer is not None else None)
            break
        except FileNotFoundError:
            if attempt:
                raise
    touch_read(path)
    if footer is None:
        footer = _keep(path, identity, file.metadata)
    return file, footer


def _opened_remote(path: str, publication: Publication, name: str, size: int) -> tuple[pq.ParquetFile, _Footer]:
    """A published segment's object opened for reads by ranges (a HEAD and its footer while they
    are not kept, then the column chunks of each row group read in one request): a cold read on
    a bucket moves the groups it needs, not the segment, and leaves nothing on the reader's disk."""
    identity = (0, size)  # a publication's object is immutable: its name holds its bytes' digest
    footer = _cached(path, identity)
    source = footer.source if footer is not None else None
    if source is None:
        source = publication.open_object(name)
        if source.size() != size:  # a publication's object is what its manifest says, or unusable
            raise PublicationError(f"{publication.base}/{name} holds {source.size()} bytes, its manifest says {size}")
    file = _remote_segment_class()(
        source, publication, name, metadata=footer.metadata if footer is not None else None, pre_buffer=True
    )
    if footer is None:
        footer = _keep(path, identity, file.metadata)
    footer.source = source  # (two threads may each set one: either is the object's)
    return file, footer


@functools.cache
def _remote_segment_class() -> type:
    """pq.ParquetFile whose reads, on a handle kept while its object has since left the bucket (a
    republication after an erasure), raise FileNotFoundError as a local segment gone does: the
    reader then starts again from the current publication. Made on first use (pyarrow's import)."""

    def gone_or_raised(read: Any) -> Any:
        @functools.wraps(read)
        def reading(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return read(self, *args, **kwargs)
            except OSError:
                self._publication.open_object(self._name)  # FileNotFoundError when the object is gone
                raise

        return reading

    class RemoteSegment(pq.ParquetFile):
        def __init__(self, source: Any, publication: Publication, name: str, **options: Any) -> None:
            super().__init__(source, **options)
            self._publication, self._name = publication, name

        read = gone_or_raised(pq.ParquetFile.read)
        read_row_group = gone_or_raised(pq.ParquetFile.read_row_group)
        read_row_groups = gone_or_raised(pq.ParquetFile.read_row_groups)

    return RemoteSegment


def parquet_file(path: str) -> pq.ParquetFile:
    """The file at `path`, its footer kept while recently read (`opened`)."""
    return opened(path)[0]


__all__ = ["FOOTER_CACHE_BYTES", "footer_bytes", "kept_footers", "opened", "parquet_file"]
