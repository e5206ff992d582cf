"""What a projection of the Build Event Log is (`Projection`), and the column expressions the
three projections share: canonical order, "latest"/"first" by it, and status names from the enums.

Every projection is a pure function of a set of events, so that recomputing some keys from their
events gives exactly the rows a full recomputation would (EVENTS.md, Projections).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, LongType, MapType, StringType, StructField, StructType

# Status counts, one entry per status name of the enum (zeros included, in code order).
STATUS_COUNTS_TYPE = MapType(StringType(), LongType(), valueContainsNull=False)


@dataclass(frozen=True)
class Projection:
    """One read model of the log: how to build it, and how to rebuild only some of its rows.

    - `build(events)`: one row per `key` value found in `events`, computed from all of them,
      with the columns of `schema` in its order. Pure: no I/O, no actions.
    - `keys_of(events)`: the distinct, non-null `key` values that `events` touch, as a
      one-column DataFrame whose column is named after `key` (e.g. "partition_ref").
    - `events_for_keys(events, keys)`: the subset of `events` (same columns) that `build` needs
      to compute the rows of `keys` (a DataFrame with that column, as from `keys_of`).

    For any split of the log into `old` and `new` events, with `all = old ∪ new`:

        build(events_for_keys(all, keys_of(new))) == build(all) restricted to keys_of(new)
        build(old) restricted to keys not in keys_of(new) == build(all) restricted to the same

    so a refresh merges the first into the table and leaves every other row alone:

        keys = projection.keys_of(new_events)
        rows = projection.build(projection.events_for_keys(all_events, keys))

    The same holds when `new` are events that disappear (erased): a key of `keys` with no
    events left has no row in `rows`, and its row must be deleted.

    `events` may carry more columns than `EVENT_SCHEMA` (the raw log's event_date, source_*):
    `build` ignores them and `events_for_keys` keeps them.
    """

    name: str
    key: str
    schema: StructType
    build: Callable[[DataFrame], DataFrame]
    keys_of: Callable[[DataFrame], DataFrame]
    events_for_keys: Callable[[DataFrame, DataFrame], DataFrame]


def column(name: str, data_type: DataType, nullable: bool, comment: str) -> StructField:
    """A documented output column; the comment becomes the Delta column comment."""
    return StructField(name, data_type, nullable, metadata={"comment": comment})


# ---------------------------------------------------------------------------------------------
# Canonical order: (timestamp, event_id). event_id is unique, so "latest" and "first" are exact.
# ---------------------------------------------------------------------------------------------


def canonical_position() -> Column:
    """An event's position in the canonical order, comparable with < and >."""
    return F.struct(F.col("timestamp"), F.col("event_id"))


def event_with(**fields: Column) -> Column:
    """A struct of the event's timestamp and event_id plus `fields`: a value for `latest` or
    `first` to pick, which `later` can then compare with another."""
    return F.struct(F.col("timestamp"), F.col("event_id"), *(value.alias(name) for name, value in fields.items()))


def latest(value: Column, where: Column | None = None) -> Column:
    """Aggregate: `value` of the latest event (of those matching `where`); null if none match."""
    position = canonical_position() if where is None else F.when(where, canonical_position())
    return F.max_by(value, position)  # rows whose position is null are skipped


def first(value: Column, where: Column | None = None) -> Column:
    """Aggregate: `value` of the first event (of those matching `where`); null if none match."""
    position = canonical_position() if where is None else F.when(where, canonical_position())
    return F.min_by(value, position)


def later(this: Column, other: Column) -> Column:
    """Whether the event `this` (an `event_with` struct) comes after the event `other`;
    true when `other` is null (there is no such event), false when `this` is null."""
    this_position = F.struct(this["timestamp"], this["event_id"])
    other_position = F.struct(other["timestamp"], other["event_id"])
    return F.coalesce(this.isNotNull() & (other.isNull() | (this_position > other_position)), F.lit(False))


# ---------------------------------------------------------------------------------------------
# Status codes and names: derived from the enums, the one place they are defined.
# ---------------------------------------------------------------------------------------------


def status_name(enum: type[IntEnum], code: Column) -> Column:
    """The enum member name of the status `code` (null for a code outside the enum)."""
    members = iter(enum)
    member = next(members)
    name = F.when(code == member.value, F.lit(member.name))
    for member in members:
        name = name.when(code == member.value, F.lit(member.name))
    return name


def codes(statuses: Iterable[IntEnum]) -> list[int]:
    """Sorted int codes of a set of enum members, for `Column.isin`."""
    return sorted(int(status) for status in statuses)


def status_counts(enum: type[IntEnum], code: Column) -> Column:
    """Aggregate: {status name: number of rows whose `code` is that status} for every member
    of `enum`, zeros included, in code order: the dicts of `log.interface.status_counts`."""
    entries = []
    for member in enum:
        entries += [F.lit(member.name), F.count_if(code == member.value)]
    return F.create_map(*entries)


def semi_join_on_keys(events: DataFrame, event_key: Column, keys: DataFrame, key: str) -> DataFrame:
    """The rows of `events` whose `event_key` is one of `keys[key]`, with the columns of `events`."""
    wanted = keys.select(F.col(key).alias("_projection_key"))
    return events.join(wanted, event_key == wanted["_projection_key"], "left_semi")
