"""What a projection of the Build Event Log is (`Projection`), and the column expressions the
three projections share: canonical order, "latest"/"first" by it, and status names from the enums.

Every projection is a pure function of a set of events, so that recomputing some keys from their
events gives exactly the rows a full recomputation would (EVENTS.md, Projections).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, IntegerType, LongType, MapType, StringType, StructField, StructType

# Status counts, one entry per status name of the enum (zeros included, in code order).
STATUS_COUNTS_TYPE = MapType(StringType(), LongType(), valueContainsNull=False)


# The columns every projection table carries besides its read model: the state that incremental
# refreshes fold new events into, and the log version the row was last computed at.
STATE = "_fold_state"
STATE_LOG_VERSION = "_fold_log_version"


@dataclass(frozen=True)
class Projection:
    """One read model of the log: how to build it, and how to fold new events into it.

    Every projection is a fold. Its rows come from a per-key *state* of mergeable aggregates
    (counts, minima, maxima, and "latest"/"first" by canonical position, each kept with the
    position that decides it):

    - `aggregate(events)`: one row per `key` value found in `events`, columns `key` and
      `STATE` (a struct). Pure: no I/O, no actions.
    - `fold(states, events)`: the states (`key`, `STATE`) of the keys whose rows `events` change,
      given the stored `states` (rows with `key` and `STATE`, such as the projection table's)
      and new `events` that are not in them. Mostly from `by_key`: merge each key's stored
      state with the state of its new events (merges are associative and commutative).
    - `finish(state)`: the read model's columns (those of `schema` after the key, in its order)
      from a state.
    - `keys_of(events)`: the distinct, non-null `key` values that `events` touch, as a
      one-column DataFrame whose column is named after `key` (e.g. "partition_ref").
    - `affected(states, log, changed)`: the keys whose rows can differ once the events `changed`
      are added to or removed from the log (`log`: the log after the change; `states`: the stored
      states, as in `fold`), as `keys_of` gives them.
    - `events_of(log, keys)`: the events of `log` that the rows of `keys` (as `keys_of` gives
      them) are computed from: `aggregate` of them gives those keys' rows exactly.

    So for any split of the log into `old` and `new` events:

        build(old ∪ new) == rows(fold(aggregate(old), new)) for the keys fold returns,
                            and build(old) for every other key

    which is what an incremental refresh relies on: it reads the new events and the stored
    states of their keys, never the rest of the log. A late event (an older timestamp in a newer
    commit) needs nothing special: "latest" and "first" compare positions, not arrival. States
    cannot take an event out, so when events leave the log (an erasure) a refresh recomputes the
    `affected` keys from their `events_of` the log instead.

    `events` may carry more columns than `EVENT_SCHEMA` (the raw log's event_date, source_*):
    they are ignored.
    """

    name: str
    key: str
    schema: StructType
    aggregate: Callable[[DataFrame], DataFrame]
    fold: Callable[[DataFrame, DataFrame], DataFrame]
    finish: Callable[[Column], list[Column]]
    keys_of: Callable[[DataFrame], DataFrame]
    affected: Callable[[DataFrame, DataFrame, DataFrame], DataFrame]
    events_of: Callable[[DataFrame, DataFrame], DataFrame]

    def rows(self, states: DataFrame) -> DataFrame:
        """The read model's rows (the columns of `schema`) of `states` (`key`, `STATE`)."""
        return states.select(F.col(self.key), *self.finish(F.col(STATE)))

    def build(self, events: DataFrame) -> DataFrame:
        """One row per `key` value found in `events`, computed from all of them."""
        return self.rows(self.aggregate(events))


def by_key(
    key: str, key_of_event: Callable[[], Column], state: Callable[[], tuple[Column, Merge]]
) -> tuple[Callable[[DataFrame], DataFrame], Callable[[DataFrame, DataFrame], DataFrame]]:
    """`aggregate` and `fold` of a projection whose rows depend on their own key's events only:
    the `state()` (a `fold_state`) of each `key_of_event()` value, and the states of the keys
    new events touch, each merged with its stored state (if any). A fold builds `state()` once."""

    def aggregate_with(events: DataFrame, state_aggregate: Column) -> DataFrame:
        return (
            events.select(key_of_event().alias(key), "*")
            .where(F.col(key).isNotNull())
            .groupBy(key)
            .agg(state_aggregate)
        )

    def aggregate(events: DataFrame) -> DataFrame:
        state_aggregate, _ = state()
        return aggregate_with(events, state_aggregate)

    def fold(states: DataFrame, events: DataFrame) -> DataFrame:
        state_aggregate, merge = state()
        new = aggregate_with(events, state_aggregate).alias("new")
        old = stored_states_of(states.select(key, STATE), new.select(key)).alias("old")
        merged = merge(F.col(f"old.{STATE}"), F.col(f"new.{STATE}"))
        return new.join(old, key, "left").select(F.col(key), merged.alias(STATE))

    return aggregate, fold


def events_by_key(
    key_of_event: Callable[[], Column], keys_of: Callable[[DataFrame], DataFrame]
) -> tuple[Callable[[DataFrame, DataFrame, DataFrame], DataFrame], Callable[[DataFrame, DataFrame], DataFrame]]:
    """`affected` and `events_of` of a projection whose rows depend on their own key's events
    only: the keys of the changed events, and the events whose `key_of_event()` is one of them."""

    def affected(_states: DataFrame, _log: DataFrame, changed: DataFrame) -> DataFrame:
        return keys_of(changed)

    def events_of(log: DataFrame, keys: DataFrame) -> DataFrame:
        wanted = keys.select(F.col(keys.columns[0]).alias("_recomputed_key"))
        return (
            log.withColumn("_recomputed_key", key_of_event())
            .join(F.broadcast(wanted), "_recomputed_key", "left_semi")
            .drop("_recomputed_key")
        )

    return affected, events_of


def stored_states_of(states: DataFrame, keys: DataFrame) -> DataFrame:
    """The rows of `states` whose key is one of `keys` (a one-column DataFrame named like the
    key column), filtered where the states are read: the keys a refresh touches are few, so
    they are broadcast, and the whole stored table is not shuffled to join them
    (docs/decisions/0011-incremental-fold.md)."""
    return states.join(F.broadcast(keys), keys.columns[0], "left_semi")


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
# Folding: a state is a struct of fields, each an aggregate with the way to merge two of its
# values. `None` stands for "no events": every merge returns the other side then.
# ---------------------------------------------------------------------------------------------

Merge = Callable[[Column, Column], Column]


def merge_latest(a: Column, b: Column) -> Column:
    """Of two `event_with` structs (or nulls), the later one."""
    return F.when(later(b, a), b).otherwise(a)


def merge_first(a: Column, b: Column) -> Column:
    """Of two `event_with` structs (or nulls), the earlier one."""
    return F.when(b.isNotNull() & (a.isNull() | later(a, b)), b).otherwise(a)


def merge_sum(a: Column, b: Column) -> Column:
    return F.coalesce(a, F.lit(0)) + F.coalesce(b, F.lit(0))


def merge_min(a: Column, b: Column) -> Column:
    return F.least(a, b)  # nulls ignored


def merge_max(a: Column, b: Column) -> Column:
    return F.greatest(a, b)


def merge_struct(fields: Mapping[str, Merge]) -> Merge:
    """Merge two structs (or nulls) field by field, each with its own merge."""

    def merge(a: Column, b: Column) -> Column:
        merged = F.struct(*(field_merge(a[name], b[name]).alias(name) for name, field_merge in fields.items()))
        return F.when(a.isNull(), b).when(b.isNull(), a).otherwise(merged)

    return merge


def merge_map(merge_values: Merge) -> Merge:
    """Merge two maps (or nulls) key by key: a key's values merged with `merge_values`."""

    def merge(a: Column, b: Column) -> Column:
        merged = F.map_zip_with(a, b, lambda _key, x, y: merge_values(x, y))
        return F.when(a.isNull(), b).when(b.isNull(), a).otherwise(merged)

    return merge


def fold_state(fields: Mapping[str, tuple[Column, Merge]]) -> tuple[Column, Merge]:
    """The aggregate that makes a state of `fields` ({name: (aggregate, merge)}), as `STATE`,
    and the merge of two such states."""
    aggregate = F.struct(*(value.alias(name) for name, (value, _) in fields.items())).alias(STATE)
    return aggregate, merge_struct({name: field_merge for name, (_, field_merge) in fields.items()})


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


def status_counts(enum: type[IntEnum], codes: Column) -> Column:
    """{status name: how many of `codes` (an array of status codes; null for none) are that
    status} for every member of `enum`, zeros included, in code order: the dicts of
    `log.interface.status_counts`."""
    codes = F.coalesce(codes, F.array().cast(ArrayType(IntegerType())))

    def how_many(value: int) -> Column:
        return F.size(F.filter(codes, lambda code: code == value)).cast("long")

    entries = []
    for member in enum:
        entries += [F.lit(member.name), how_many(member.value)]
    return F.create_map(*entries)
