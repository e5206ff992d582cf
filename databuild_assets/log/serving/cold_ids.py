"""The ids of the serving index's cold events, kept so that an append still dedupes against the
whole log once its events have left the index (evict.py), in about 8 bytes an id.

An id's digest is 80 bits of BLAKE2b: its first 16 bits name one of 65,536 buckets, its other
64 the entry kept in that bucket's row of `cold_event_ids`, a blob of sorted 8-byte entries. A
lookup reads one row per id; an eviction or a thaw rewrites the rows of the buckets it touches.
One row per bucket, not per id: a row per id (a 16-byte digest as the key of a WITHOUT ROWID
table) costs about 21 bytes an id, most of the cold tier's growth (docs/decisions/0051). With
65,536 buckets a row holds about 150 entries at 10M events and 1,500 at 100M; the chance that a
new id's digest equals one of 100M kept ones is about 1 in 10^16.

    with transaction(connection):
        add_cold_ids(connection, ["e-1", "e-2"])
    known_cold_ids(connection, ["e-1", "e-3"])  # {"e-1"}
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable, Mapping

from databuild_assets.runtime.deferred import deferred

# hashlib initialises OpenSSL on import: a read of a hot key needs none of it (decision 0057).
hashlib = deferred("hashlib")

_ENTRY = 8  # bytes of an entry in a bucket's blob

COLD_IDS_TABLE = """
CREATE TABLE IF NOT EXISTS cold_event_ids (
    bucket INTEGER PRIMARY KEY,  -- the digest's first 16 bits
    digests BLOB NOT NULL        -- its other 64 bits, one entry per cold id, sorted
);
"""


def _split(event_id: str) -> tuple[int, bytes]:
    digest = hashlib.blake2b(event_id.encode("utf-8"), digest_size=10).digest()
    return int.from_bytes(digest[:2], "big"), digest[2:]


def _by_bucket(event_ids: Iterable[str]) -> dict[int, dict[bytes, str]]:
    buckets: dict[int, dict[bytes, str]] = {}
    for event_id in event_ids:
        bucket, entry = _split(event_id)
        buckets.setdefault(bucket, {})[entry] = event_id
    return buckets


def _rows(connection: sqlite3.Connection, buckets: Iterable[int]) -> dict[int, bytes]:
    wanted = list(buckets)
    found: dict[int, bytes] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        found.update(
            connection.execute(f"SELECT bucket, digests FROM main.cold_event_ids WHERE bucket IN ({marks})", chunk)
        )
    return found


def _entries(blob: bytes) -> set[bytes]:
    return {blob[start : start + _ENTRY] for start in range(0, len(blob), _ENTRY)}


def _holds(blob: bytes, entry: bytes) -> bool:
    """Whether the sorted entries of `blob` hold `entry` (a binary search)."""
    low, high = 0, len(blob) // _ENTRY
    while low < high:
        middle = (low + high) // 2
        found = blob[middle * _ENTRY : (middle + 1) * _ENTRY]
        if found == entry:
            return True
        if found < entry:
            low = middle + 1
        else:
            high = middle
    return False


def known_cold_ids(connection: sqlite3.Connection, event_ids: Iterable[str]) -> set[str]:
    """Which of `event_ids` are kept as cold."""
    buckets = _by_bucket(event_ids)
    rows = _rows(connection, buckets)
    return {
        event_id for bucket, blob in rows.items() for entry, event_id in buckets[bucket].items() if _holds(blob, entry)
    }


def _rewrite(connection: sqlite3.Connection, buckets: Mapping[int, Collection[bytes]], adding: bool) -> None:
    """Add (or take off) the entries of each bucket in `buckets` and write its row again."""
    rows = _rows(connection, buckets)
    writes, emptied = [], []
    for bucket, entries in buckets.items():
        kept = _entries(rows.get(bucket, b""))
        kept = kept.union(entries) if adding else kept.difference(entries)
        if kept:
            writes.append((bucket, b"".join(sorted(kept))))
        elif bucket in rows:
            emptied.append((bucket,))
    connection.executemany("INSERT OR REPLACE INTO main.cold_event_ids VALUES (?, ?)", writes)
    connection.executemany("DELETE FROM main.cold_event_ids WHERE bucket = ?", emptied)


def add_cold_ids(connection: sqlite3.Connection, event_ids: Iterable[str]) -> None:
    """Keep `event_ids` as cold, inside the caller's write transaction."""
    _rewrite(connection, _by_bucket(event_ids), adding=True)


def drop_cold_ids(connection: sqlite3.Connection, event_ids: Iterable[str]) -> None:
    """Keep `event_ids` no longer (their events are back in the index), inside the caller's
    write transaction."""
    _rewrite(connection, _by_bucket(event_ids), adding=False)


class DeferredColdIds:
    """Cold ids gathered over many evictions and kept in one write: an eviction adds about four
    ids to every bucket per segment of 262,144 events, so adding them segment by segment rewrites
    every bucket each time (a first build of 10M events, 38 times). For an index being built."""

    def __init__(self) -> None:
        self._buckets: dict[int, bytearray] = {}

    def add(self, event_ids: Iterable[str]) -> None:
        for event_id in event_ids:
            bucket, entry = _split(event_id)
            self._buckets.setdefault(bucket, bytearray()).extend(entry)

    def write(self, connection: sqlite3.Connection) -> None:
        """Keep every id gathered, inside the caller's write transaction."""
        _rewrite(connection, {bucket: _entries(bytes(gathered)) for bucket, gathered in self._buckets.items()}, True)
        self._buckets.clear()


def count_cold_ids(connection: sqlite3.Connection) -> int:
    """How many cold ids are kept."""
    (size,) = connection.execute("SELECT COALESCE(SUM(length(digests)), 0) FROM main.cold_event_ids").fetchone()
    return size // _ENTRY


__all__ = ["COLD_IDS_TABLE", "DeferredColdIds", "add_cold_ids", "count_cold_ids", "drop_cold_ids", "known_cold_ids"]
