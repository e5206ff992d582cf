"""Reading landing files line by line, in Spark: each line numbered in its file, validated in
Spark's Python workers, and handed back as its typed event or, when bad, as its bytes and the
reason (`read_landing_lines`). Ingestion (`landing.py`) and the erasure of landing files
(`maintenance/landing_files.py`) read lines this way, so both number a file's lines alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_type

from databuild_assets.events.fast_check import STRUCTS, decode, event_type_of
from databuild_assets.events.schema import CORE_FIELDS, EVENT_SCHEMA, EVENT_TYPES
from databuild_assets.events.validation import MAX_LINE_BYTES, OVER_LIMIT_KEPT_BYTES, over_limit_reason, parse_line
from databuild_assets.ingest.landing_names import literal_glob

# What the Python workers hand back for each line of a landing file (Arrow), and as Spark sees it:
# where the line is, and either the event it parsed to (typed, EVENT_SCHEMA's columns) or, for a
# bad line, its text, its exact bytes and the reason. The worker parses each line once to validate
# it; handing back the typed event spares the JVM a second parse of the same text.
_LINES_ARROW = pa.schema(
    [
        ("source_file", pa.string()),
        ("line_number", pa.int64()),
        ("line", pa.string()),
        ("raw_line", pa.binary()),
        ("reason", pa.string()),
    ]
    + [pa.field(field.name, to_arrow_type(field.dataType), nullable=True) for field in EVENT_SCHEMA.fields]
)
_LINES_SCHEMA = from_arrow_schema(_LINES_ARROW)
_EVENT_ARROW = pa.schema(list(_LINES_ARROW)[5:])
_CORE_COLUMNS = tuple(field.name for field in CORE_FIELDS)


def _number_and_validate(
    batches: Iterator[pa.RecordBatch],
    range_starts: Mapping[tuple[str, int], tuple[int, int]],
    sources: Mapping[str, str],
    sizes: Mapping[str, int],
    validate: Callable[[bytes], tuple[dict | None, str | None]] = parse_line,
    first_pass: Callable[[bytes], object | None] | None = decode,
) -> Iterator[pa.RecordBatch]:
    """Runs in Spark's Python workers over one task's lines, which come range by range and, in a
    range, in file order. Numbers each line from its range's start (`range_starts`: lines and
    bytes before the range; a file's first range starts at (0, 0)), cuts a file in `sizes` at
    that many bytes, and validates (`_validated`). `sources` maps Spark's name of each file to
    the name the caller gave."""
    at: dict[tuple[str, int], list[int]] = {}  # range -> [lines, bytes] read so far
    for batch in batches:
        files, numbers, raws, line_sizes = [], [], [], []
        for path, range_start, raw, size in zip(
            batch.column("path").to_pylist(),
            batch.column("range_start").to_pylist(),
            batch.column("raw").to_pylist(),
            batch.column("size").to_pylist(),
            strict=True,
        ):
            position = at.get((path, range_start))
            if position is None:
                start = (0, 0) if range_start == 0 else range_starts.get((path, range_start))
                if start is None:  # the file grew past what the count saw, so Spark split it anew
                    raise RuntimeError(
                        f"{sources[path]}: Spark read a byte range at {range_start} that the line count did not see, "
                        "so its lines cannot be numbered: the file grew while this batch read it. Landed files must "
                        "not change; run the ingestion again (it reads the bytes the batch planned)."
                    )
                position = at[(path, range_start)] = list(start)
            line_index, offset = position
            position[0], position[1] = line_index + 1, offset + size + 1  # + the newline
            source = sources[path]
            planned_size = sizes.get(source)
            if planned_size is not None:
                if offset >= planned_size:
                    continue
                raw, size = raw[: planned_size - offset], min(size, planned_size - offset)
            files.append(source)
            numbers.append(line_index + 1)
            raws.append(raw[:OVER_LIMIT_KEPT_BYTES] if size > MAX_LINE_BYTES else raw)
            line_sizes.append(size)
        yield _validated(files, numbers, raws, validate, first_pass, line_sizes)


def _validated(files, numbers, raws, validate, first_pass, line_sizes=None) -> pa.RecordBatch:
    """One Arrow batch of `_LINES_ARROW` for these lines, in their order: a good line with its
    event, a bad one with its text, its exact bytes and the reason.

    The lines `first_pass` decodes (msgspec, in C: `events/fast_check.py`) go to Arrow column by
    column; `validate` decides the others one by one and words the reason. A line whose size
    (`line_sizes`, each line's length when not given) is over MAX_LINE_BYTES is bad unread: its
    raw bytes are then only its first bytes, as `read_raw_lines` cut it."""
    line_sizes = [len(raw) for raw in raws] if line_sizes is None else line_sizes
    decoded = (
        [None if size > MAX_LINE_BYTES else first_pass(raw) for raw, size in zip(raws, line_sizes, strict=True)]
        if first_pass
        else [None] * len(raws)
    )
    passed = [index for index, event in enumerate(decoded) if event is not None]
    if len(passed) == len(raws):
        return _decoded_batch(files, numbers, decoded)
    rest = [index for index, event in enumerate(decoded) if event is None]
    checked = _checked_batch(
        [files[i] for i in rest],
        [numbers[i] for i in rest],
        [raws[i] for i in rest],
        validate,
        [line_sizes[i] for i in rest],
    )
    if not passed:
        return checked
    good = _decoded_batch([files[i] for i in passed], [numbers[i] for i in passed], [decoded[i] for i in passed])
    in_order = pa.compute.sort_indices(pa.array(passed + rest, pa.int64()))
    return pa.Table.from_batches([good, checked]).take(in_order).combine_chunks().to_batches()[0]


def _checked_batch(files, numbers, raws, validate, line_sizes) -> pa.RecordBatch:
    """Lines `validate` decides one by one (one over the limit is bad unread): a bad one keeps its
    text and exact bytes (an over-limit one, its first bytes)."""
    checked = [
        (None, over_limit_reason(size)) if size > MAX_LINE_BYTES else validate(raw)
        for raw, size in zip(raws, line_sizes, strict=True)
    ]
    bad = [reason is not None for _, reason in checked]
    return _lines_batch(
        files,
        numbers,
        [raw.decode("utf-8", errors="replace") if is_bad else None for raw, is_bad in zip(raws, bad, strict=True)],
        [raw if is_bad else None for raw, is_bad in zip(raws, bad, strict=True)],
        [reason for _, reason in checked],
        [event or {} for event, _ in checked],
    )


def _decoded_batch(files, numbers, events: list) -> pa.RecordBatch:
    """Lines `fast_check.decode` took, with their events (structs)."""
    count = len(events)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(files, pa.string()),
            pa.array(numbers, pa.int64()),
            pa.nulls(count, pa.string()),
            pa.nulls(count, pa.binary()),
            pa.nulls(count, pa.string()),
            *_event_columns(events),
        ],
        schema=_LINES_ARROW,
    )


def _event_columns(events: list) -> list[pa.Array]:
    """EVENT_SCHEMA's columns of structs `fast_check.decode` returned: each payload column built
    from the events of its type, null in the other rows."""
    size = len(events)
    columns = [
        pa.array([event.event_id for event in events], pa.string()),
        pa.array([event.timestamp for event in events], pa.int64()),
        pa.array([event.build_request_id for event in events], pa.string()),
        pa.array([event_type_of(event) for event in events], pa.string()),
    ]
    rows_of: dict[type, list[int]] = {}
    for row, event in enumerate(events):
        rows_of.setdefault(type(event), []).append(row)
    for event_type in EVENT_TYPES:
        struct_type = _EVENT_ARROW.field(event_type).type
        rows = rows_of.get(STRUCTS[event_type], [])
        payloads = [getattr(events[row], event_type) for row in rows]
        children = []
        for field in struct_type:
            values: list = [None] * size
            for row, payload in zip(rows, payloads, strict=True):
                values[row] = getattr(payload, field.name)
            children.append(pa.array(values, field.type))
        absent = [True] * size
        for row in rows:
            absent[row] = False
        columns.append(
            pa.StructArray.from_arrays(children, fields=list(struct_type), mask=pa.array(absent, pa.bool_()))
        )
    return columns


def _lines_batch(files, numbers, texts, raw_lines, reasons, events: list[dict]) -> pa.RecordBatch:
    """One Arrow batch of `_LINES_ARROW` (an event of a bad line is {}: every event column null)."""
    columns = [files, numbers, texts, raw_lines, reasons]
    columns += [[event.get(name) for event in events] for name in _CORE_COLUMNS]
    types = columns[-1]  # event_type: the one payload an event sets
    columns += [
        [event.get(name) if kind == name else None for event, kind in zip(events, types, strict=True)]
        for name in EVENT_TYPES
    ]
    return pa.RecordBatch.from_arrays(
        [pa.array(values, type=field.type) for values, field in zip(columns, _LINES_ARROW, strict=True)],
        schema=_LINES_ARROW,
    )


def read_landing_lines(
    spark: SparkSession,
    paths: list[str],
    sizes: Mapping[str, int] | None = None,
    validate: Callable[[bytes], tuple[dict | None, str | None]] = parse_line,
    first_pass: Callable[[bytes], object | None] | None = decode,
) -> DataFrame:
    """Every line of `paths` with its file and 1-based line number; a good line with its event
    (EVENT_SCHEMA's columns), a bad one with its text, its bytes and the reason. Files named in
    `sizes` are read only up to that size. `validate` decides each line `first_pass` does not
    pass (None: every line).

    Spark's text source splits the files into lines, a large file in byte ranges read by
    separate tasks (`spark.sql.files.maxPartitionBytes`, 128 MB by default), so no task holds a
    whole file. A line is numbered by its place in its range plus the lines before the range,
    which one count per range gives; files too small to be split need no count.
    """
    if not paths:
        return spark.createDataFrame([], _LINES_SCHEMA)
    hadoop_path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path
    sources = {hadoop_path(path).toUri().toString(): path for path in paths}  # how _metadata names a file
    lines = read_raw_lines(spark, paths)
    range_starts = _range_starts(lines) if _may_be_split(spark, paths) else {}
    worker = functools.partial(
        _number_and_validate,
        range_starts=range_starts,
        sources=sources,
        sizes=dict(sizes or {}),
        validate=validate,
        first_pass=first_pass,
    )
    return lines.mapInArrow(worker, _LINES_SCHEMA)


def read_raw_lines(spark: SparkSession, paths: list[str]) -> DataFrame:
    """The lines of `paths` as Spark's text source splits them, unnumbered and unchecked: the file
    (`path`, as Spark names it), the start of the byte range read (`range_start`), the line's
    exact bytes (`raw`, valid UTF-8 or not) and their number (`size`). Lines end at a newline
    only, as JSON Lines says: a carriage return stays in its line.

    A line over MAX_LINE_BYTES is cut here to its first OVER_LIMIT_KEPT_BYTES bytes (`size` stays
    whole): no Python worker, quarantine row or shuffle holds it whole. Spark's text reader still
    reads the whole line into the JVM's memory (it has no length limit), so an executor needs a
    few times the longest line's size, which the file's size bounds.

    Each path is read literally: its glob characters are escaped (`literal_glob`)."""
    value = F.col("value").cast("binary")
    return (
        spark.read.option("lineSep", "\n")
        .text([literal_glob(path) for path in paths])
        .select(
            F.col("_metadata.file_path").alias("path"),
            F.col("_metadata.file_block_start").alias("range_start"),
            value.alias("raw"),
        )
        .select(
            "path",
            "range_start",
            F.when(F.length("raw") > MAX_LINE_BYTES, F.substring("raw", 1, OVER_LIMIT_KEPT_BYTES))
            .otherwise(F.col("raw"))
            .alias("raw"),
            F.length("raw").alias("size"),
        )
    )


def _may_be_split(spark: SparkSession, paths: list[str]) -> bool:
    """Whether Spark will read some file of `paths` in more than one range: one larger than the
    split size Spark computes for this read (FilePartition.maxSplitBytes: the configured maximum,
    or less when the read is small for the cores, never below spark.sql.files.openCostInBytes).
    The sizes come from one listing per folder, not one request per file (on object storage, a
    request per file would add up). Were this ever wrong, the workers stop on a range they cannot
    number (`_number_and_validate`); they never number a line wrongly."""
    jvm, hadoop_conf = spark.sparkContext._jvm, spark.sparkContext._jsc.hadoopConfiguration()
    sizes: dict[str, int] = {}
    for folder in {str(jvm.org.apache.hadoop.fs.Path(path).getParent().toString()) for path in paths}:
        folder_path = jvm.org.apache.hadoop.fs.Path(folder)
        for status in folder_path.getFileSystem(hadoop_conf).listStatus(folder_path):
            sizes[status.getPath().toString()] = status.getLen()
    if any(path not in sizes for path in paths):  # named otherwise than the listing names it
        return True
    conf = spark._jsparkSession.sessionState().conf()
    open_cost = conf.filesOpenCostInBytes()
    min_partitions = conf.filesMinPartitionNum()
    partitions = (
        min_partitions.get() if min_partitions.isDefined() else spark._jsparkSession.leafNodeDefaultParallelism()
    )
    bytes_per_core = sum(sizes[path] + open_cost for path in paths) // partitions
    split_bytes = min(conf.filesMaxPartitionBytes(), max(open_cost, bytes_per_core))
    return any(sizes[path] > split_bytes for path in paths)


def _range_starts(lines: DataFrame) -> dict[tuple[str, int], tuple[int, int]]:
    """(file, range start) -> (lines, bytes) before that range, from a count of each range's lines."""
    counts = (
        lines.groupBy("path", "range_start")
        .agg(F.count(F.lit(1)).alias("lines"), F.sum(F.col("size") + 1).alias("bytes"))
        .collect()
    )
    starts, before = {}, {}
    for row in sorted(counts, key=lambda row: (row["path"], row["range_start"])):
        line_count, byte_count = before.get(row["path"], (0, 0))
        starts[(row["path"], row["range_start"])] = (line_count, byte_count)
        before[row["path"]] = (line_count + row["lines"], byte_count + row["bytes"])
    return starts
