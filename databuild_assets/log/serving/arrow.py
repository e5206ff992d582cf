"""Arrow arrays of Python values, built from their buffers, and tables put in time order.

`pa.array()` (and `pa.scalar`, `Table.from_pylist`) first asks pandas whether the value is a
pandas object, importing pandas when it is installed (Dagster's dependencies install it): in a
one-shot process such as `databuild-assets query` on an old key, that import costs more than the
answer. The cold reads' value sets and masks are built here instead.

    table.filter(pc.is_in(table.column("build_request_id"), value_set=strings(["br-1", "br-2"])))
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import TYPE_CHECKING

from databuild_assets.runtime.deferred import deferred

if TYPE_CHECKING:
    from databuild_assets.log.interface import EventFilter

pa = deferred("pyarrow")
pc = deferred("pyarrow.compute")

_TIME_ORDER = [("timestamp", "ascending"), ("event_id", "ascending")]


def strings(values: Iterable[str]) -> pa.Array:
    """A string array of `values` (Python strings), in order."""
    encoded = [value.encode() for value in values]
    offsets = array("i", [0] * (len(encoded) + 1))  # 32-bit offsets: a value set, never 2 GB
    total = 0
    for number, value in enumerate(encoded, start=1):
        total += len(value)
        offsets[number] = total
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), data])


def scalar(value: int | str) -> pa.Scalar:
    """An int64 or string Arrow scalar of a Python value (a compute kernel's operand)."""
    if isinstance(value, str):
        return strings([value])[0]
    return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(array("q", [value]))])[0]


def all_true(length: int) -> pa.Array:
    """A boolean array of `length` true values (a mask that selects every row)."""
    return pa.Array.from_buffers(pa.bool_(), length, [None, pa.py_buffer(b"\xff" * ((length + 7) // 8))])


def _positions(length: int) -> pa.Array:
    """The uint64 array 0, 1, ..., `length` - 1 (the indices that leave a table as it is)."""
    return pa.Array.from_buffers(pa.uint64(), length, [None, pa.py_buffer(array("Q", range(length)))])


def in_time_order(table: pa.Table) -> pa.Table:
    """`table` (of events' rows) in (timestamp, event_id) order: as it is when it is (a cold
    segment's rows are written so), else sorted."""
    order = pc.sort_indices(table, sort_keys=_TIME_ORDER)
    return table if order.equals(_positions(len(order))) else table.take(order)


def first_in_time_order(table: pa.Table, first: int) -> pa.Table:
    """The `first` rows of `table` in (timestamp, event_id) order: the `first` selected (a
    partial sort), then those sorted, not the whole table sorted and copied for a page."""
    if table.num_rows > first:
        table = table.take(pc.select_k_unstable(table, k=first, sort_keys=_TIME_ORDER))
    return table.sort_by(_TIME_ORDER)


def page_mask(
    table: pa.Table, after: tuple[int, str] | None, filter: EventFilter | None, listing: list[str]
) -> pa.Array:
    """Which rows of `table` (a cold segment's) are on a list_events page after `after` that
    `filter` selects (`listing`: the event ids that list one of its partitions), as a mask."""

    def among(column: str, values: Iterable[str]) -> pa.Array:
        return pc.is_in(table.column(column), value_set=strings(values))

    mask = all_true(table.num_rows)
    if after is not None:
        stamps, ids = table.column("timestamp"), table.column("event_id")
        stamp, last = scalar(after[0]), scalar(after[1])
        later = pc.or_(pc.greater(stamps, stamp), pc.and_(pc.equal(stamps, stamp), pc.greater(ids, last)))
        mask = pc.and_(mask, later)
    if filter is None:
        return mask
    if filter.event_types is not None:
        mask = pc.and_(mask, among("event_type", filter.event_types))
    if filter.build_request_ids is not None:
        mask = pc.and_(mask, among("build_request_id", filter.build_request_ids))
    if filter.job_run_ids is not None:
        mask = pc.and_(mask, among("job_run_id", filter.job_run_ids))
    if filter.partition_refs is not None:
        mask = pc.and_(mask, pc.or_(among("partition_ref", filter.partition_refs), among("event_id", listing)))
    return mask


__all__ = ["all_true", "first_in_time_order", "in_time_order", "page_mask", "scalar", "strings"]
