"""Arrow arrays of Python values, built from their buffers.

`pa.array()` (and `pa.scalar`, `Table.from_pylist`) first asks pandas whether the value is a
pandas object, importing pandas when it is installed (Dagster's dependencies install it): in a
one-shot process such as `databuild-assets query` on an old key, that import costs more than the
answer. The cold reads' value sets and masks are built here instead.

    table.filter(pc.is_in(table.column("build_request_id"), value_set=strings(["br-1", "br-2"])))
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from databuild_assets.runtime.deferred import deferred

pa = deferred("pyarrow")


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


def all_true(length: int) -> pa.Array:
    """A boolean array of `length` true values (a mask that selects every row)."""
    return pa.Array.from_buffers(pa.bool_(), length, [None, pa.py_buffer(b"\xff" * ((length + 7) // 8))])


__all__ = ["all_true", "strings"]
