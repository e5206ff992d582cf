"""Bad input: mutated landing lines never crash ingestion, every bad line lands in quarantine with
a reason, good lines land unchanged, and the counts reconcile. Plus the files that are not
JSON Lines at all, empty files, and files still being written (docs/decisions/0002-landing-files-ingested-once.md,
0005-msgspec-first-pass.md)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from databuild_assets.events.fast_check import decode
from databuild_assets.events.schema import event_from_row, normalize_event
from databuild_assets.events.validation import MAX_LINE_BYTES, OVER_LIMIT_KEPT_BYTES, event_error, parse_line
from databuild_assets.ingest.landing import _Ledger, ensure_ingest_tables, ingest_landing_files
from databuild_assets.ingest.landing_folder import list_landing_files
from databuild_assets.ingest.lines import _LINES_ARROW, _number_and_validate, _validated, read_landing_lines
from databuild_assets.log.sqlite.backend import payload_of
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events
from databuild_assets_tests.support import ONE_EVENT_OF_EACH_TYPE, partition_event_at, write_landing

# Valid events to mutate: one of each type, plus a realistic sample (configs, manifests, graphs).
BASE_EVENTS = ONE_EVENT_OF_EACH_TYPE + list(generate_events(60, seed=5))

MUTATIONS = (
    "none",
    "truncate",
    "flip_type",
    "drop_field",
    "wrong_enum",
    "invalid_utf8",
    "long_string",
    "deep_nesting",
    "unknown_field",
    "duplicate_key",
    "crlf",
    "not_an_object",
    "random_bytes",
)
_OTHER_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _fields_of(event: dict) -> list[tuple[str, ...]]:
    """Every (top-level) and (payload, field) path of `event`."""
    paths = [(key,) for key in event]
    paths += [(key, inner) for key, value in event.items() if isinstance(value, dict) for inner in value]
    return paths


def _set(event: dict, path: tuple[str, ...], value) -> dict:
    copy = json.loads(json.dumps(event))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return copy


def _drop(event: dict, path: tuple[str, ...]) -> dict:
    copy = json.loads(json.dumps(event))
    target = copy
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return copy


@st.composite
def mutated_lines(draw, event_id: str | None = None) -> tuple[str, bytes]:
    """(mutation, line bytes without the newline) from a valid event."""
    event = dict(draw(st.sampled_from(BASE_EVENTS)))
    if event_id is not None:
        event["event_id"] = event_id
    mutation = draw(st.sampled_from(MUTATIONS))
    if mutation == "flip_type":
        event = _set(event, draw(st.sampled_from(_fields_of(event))), draw(_OTHER_VALUES))
    elif mutation == "drop_field":
        event = _drop(event, draw(st.sampled_from(_fields_of(event))))
    elif mutation == "wrong_enum":
        payload = event["event_type"]
        if payload in ("partition_event", "job_event", "build_request_event"):
            code = draw(
                st.one_of(st.integers(min_value=8, max_value=2**31 - 1), st.integers(max_value=-1, min_value=-(2**31)))
            )
            event = _set(event, (payload, "status_code"), code)
        else:
            event = _set(
                event, ("event_type",), draw(st.sampled_from(["PARTITION_EVENT", "partition", "", "job_events"]))
            )
    elif mutation == "long_string":
        size = draw(st.sampled_from([10_000, 200_000, MAX_LINE_BYTES + 1]))
        event = _set(event, draw(st.sampled_from([("event_id",), ("build_request_id",)])), "x" * size)
    elif mutation == "unknown_field":
        event = _set(event, (draw(st.sampled_from(["extra", "eventId", "status"])),), 1)
    text = json.dumps(event, ensure_ascii=draw(st.booleans()))
    line = text.encode("utf-8")
    if mutation == "truncate":
        line = line[: draw(st.integers(min_value=1, max_value=len(line) - 1))]
    elif mutation == "invalid_utf8":
        at = draw(st.integers(min_value=0, max_value=len(line)))
        line = (
            line[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf8\x88\x80\x80\x80"]))
            + line[at:]
        )
    elif mutation == "deep_nesting":
        depth = draw(st.sampled_from([10, 1_000, 100_000]))
        line = text.replace('"event_id"', '"nested": ' + "[" * depth + "]" * depth + ', "event_id"', 1).encode()
    elif mutation == "duplicate_key":
        line = text.replace('"event_id"', '"event_id": "the-other-one", "event_id"', 1).encode()
    elif mutation == "crlf":
        line = line + b"\r"
    elif mutation == "not_an_object":
        line = json.dumps(
            draw(st.one_of(st.lists(st.integers(), max_size=3), st.integers(), st.text(max_size=10), st.none()))
        ).encode()
    elif mutation == "random_bytes":
        line = draw(st.binary(max_size=200)).replace(b"\n", b" ")
    return mutation, line


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_lines())
def test_parse_line_never_raises_and_says_why_a_mutated_line_is_bad(mutated):
    mutation, line = mutated

    event, reason = parse_line(line)

    assert (event is None) != (reason is None)
    if event is not None:
        assert event_error(event) is None
        assert mutation not in (
            "truncate",
            "invalid_utf8",
            "deep_nesting",
            "not_an_object",
            "unknown_field",
            "wrong_enum",
        )
    else:
        assert isinstance(reason, str) and reason.strip()
        assert mutation != "none", reason
    expected_prefix = {"truncate": "not valid JSON", "invalid_utf8": "not valid UTF-8"}.get(mutation)
    if expected_prefix and len(line) <= MAX_LINE_BYTES:
        assert reason.startswith(expected_prefix), reason


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_lines())
def test_the_first_pass_decodes_only_lines_parse_line_accepts_and_to_the_same_event(mutated):
    mutation, line = mutated

    decoded = decode(line)

    event, reason = parse_line(line)
    if decoded is None:
        assert mutation != "none" or len(line) > MAX_LINE_BYTES, "the first pass refused a valid line"
    else:
        assert reason is None, f"the first pass took a line parse_line refuses: {reason}"
        assert normalize_event(msgspec.to_builtins(decoded)) == normalize_event(event)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(mutated_lines(), min_size=1, max_size=30))
def test_a_worker_batch_is_the_same_with_and_without_the_first_pass(mutated):
    lines = [line for _mutation, line in mutated]
    files, numbers = ["landing/a.jsonl"] * len(lines), list(range(1, len(lines) + 1))

    with_first_pass = _validated(files, numbers, lines, parse_line, decode)
    line_by_line = _validated(files, numbers, lines, parse_line, None)

    assert with_first_pass.equals(line_by_line), (with_first_pass.to_pylist(), line_by_line.to_pylist())


def test_a_worker_batch_of_no_lines_is_an_empty_batch():
    # A byte range whose lines all lie past the size the batch planned hands the workers none.
    batch = _validated([], [], [], parse_line, decode)

    assert (batch.num_rows, batch.schema) == (0, _LINES_ARROW)


def test_a_json_duplicate_key_keeps_the_last_value_in_validation():
    # Spark's from_json must then store the same value: the fuzz below checks the round trip.
    event, reason = parse_line(
        json.dumps(partition_event_at("first")).replace('"event_id"', '"event_id": "x", "event_id"', 1)
    )
    assert (reason, event["event_id"]) == (None, "first")


def test_an_escaped_lone_surrogate_is_refused_and_a_surrogate_pair_is_kept():
    # Python's json accepts "\\ud800" but it is no text Spark can store: it would become U+FFFD.
    lone = json.dumps(partition_event_at("lone", ref="data/lone")).replace('"data/lone"', '"data/\\ud800"')
    pair = json.dumps(partition_event_at("pair", ref="data/pair")).replace('"data/pair"', '"data/\\ud83d\\ude00"')

    assert (
        parse_line(lone)[1] == "not valid JSON text: a string holds an unpaired UTF-16 surrogate escape (e.g. \\ud800)"
    )
    event, reason = parse_line(pair)
    assert (reason, event["partition_event"]["partition_ref"]) == (None, "data/\U0001f600")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, ascii_only=st.booleans())
def test_a_stored_payload_reads_as_json_loads_reads_it(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert payload_of(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    ['{"ref": "data/\\ud800"}', '{"n": 123456789012345678901234567890}', '{"x": NaN}', "[1e400]", '{"a": 1, "a": 2}'],
)
def test_a_payload_msgspec_refuses_or_another_parser_reads_its_own_way_reads_as_json_loads_reads_it(text):
    assert repr(payload_of(text)) == repr(json.loads(text))


def test_a_json_syntax_reason_reads_as_one_phrase():
    assert parse_line(b'{"event_id": "p2", "times')[1] == "not valid JSON: Unterminated string starting at column 20"


def _differences(found: dict, expected: dict) -> list[tuple]:
    """(key, found, expected) for every key where the two differ, values cut short to be readable."""
    return [
        (key, str(found.get(key))[:300], str(expected.get(key))[:300])
        for key in sorted(set(found) | set(expected), key=str)
        if found.get(key) != expected.get(key)
    ]


def _expected_from_content(content: bytes) -> tuple[dict[int, str], dict[str, dict]]:
    """The spec as an oracle: (bad line number -> reason, first good event per event_id)."""
    pieces = content.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    bad, good = {}, {}
    for number, piece in enumerate(pieces, start=1):
        event, reason = parse_line(piece)
        if reason is not None:
            bad[number] = reason
        else:
            good.setdefault(event["event_id"], normalize_event(event))
    return bad, good


# Few examples of many lines each (every example is a Spark ingestion); no shrinking: a failing
# file is reported whole, which is readable enough and takes seconds, not minutes.
@settings(
    max_examples=int(os.environ.get("FUZZ_SPARK_EXAMPLES", 4)),
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=40), st.booleans()), min_size=60, max_size=80), st.data())
def test_ingesting_a_file_of_mutated_lines_never_crashes_and_every_line_is_accounted_for(spark, plan, data):
    # Each line: a mutation of a valid event whose event_id is its number (some repeat: redeliveries).
    lines = [data.draw(mutated_lines(event_id=f"fuzz-{n}"))[1] for n, _resend in plan]
    content = b"\n".join(lines) + b"\n"
    root = tempfile.mkdtemp(prefix="fuzz-lake-")
    try:
        lake = Lake(root)
        Path(lake.landing).mkdir(parents=True)
        (Path(lake.landing) / "fuzz.jsonl").write_bytes(content)
        expected_bad, expected_good = _expected_from_content(content)

        result = ingest_landing_files(spark, lake)

        quarantined = spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).collect()
        reasons = {row.line_number: row.reason for row in quarantined}
        pieces = content.split(b"\n")
        assert _differences(reasons, expected_bad) == [], [
            pieces[n - 1][:300] for n, *_ in _differences(reasons, expected_bad)
        ]
        # A line over the limit keeps its first bytes only (the reason says its size).
        assert all(
            bytes(row.raw_line)
            == pieces[row.line_number - 1][: OVER_LIMIT_KEPT_BYTES if row.reason.startswith("line is") else None]
            for row in quarantined
        )
        stored = {
            row.event_id: event_from_row(row)
            for row in spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).collect()
        }
        assert _differences(stored, expected_good) == []
        assert (result.lines_read, result.accepted, result.quarantined) == (
            len(lines),
            len(expected_good),
            len(expected_bad),
        )
        assert result.lines_read == result.accepted + result.duplicates + result.quarantined
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


def test_a_file_whose_last_line_has_no_newline_waits_and_is_ingested_whole_once_completed(spark, lake):
    good = [json.dumps(partition_event_at("p1")), json.dumps(partition_event_at("p2", 1))]
    third = json.dumps(partition_event_at("p3", 2)).encode()
    path = Path(lake.landing) / "being-written.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes("\n".join(good).encode() + b"\n" + third[:25])  # the writer is mid-line

    waiting = ingest_landing_files(spark, lake)

    assert (waiting.batches, waiting.incomplete) == ((), (list_landing_files(spark, lake.landing)[0].path,))
    assert spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).count() == 0

    with open(path, "ab") as out:  # the writer finishes the line
        out.write(third[25:] + b"\n")
    done = ingest_landing_files(spark, lake)

    assert (done.lines_read, done.accepted, done.quarantined, done.incomplete) == (3, 3, 0, ())
    ids = sorted(r.event_id for r in spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).collect())
    assert ids == ["p1", "p2", "p3"]


def test_a_file_left_without_a_final_newline_is_ingested_once_it_has_settled(spark, lake):
    path = Path(lake.landing) / "writer-died.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(json.dumps(partition_event_at("p1")).encode() + b"\n" + b'{"event_id": "p2", "times')
    _age(path, 3600)  # its writer has been gone an hour

    result = ingest_landing_files(spark, lake, settle_seconds=600)

    assert (result.lines_read, result.accepted, result.quarantined, result.incomplete) == (2, 1, 1, ())
    [row] = spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).collect()
    assert (row.line_number, bytes(row.raw_line)) == (2, b'{"event_id": "p2", "times')
    assert row.reason.startswith("not valid JSON: Unterminated string")


def test_an_empty_file_waits_until_settled_then_is_recorded_with_no_lines(spark, lake):
    path = Path(lake.landing) / "empty.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")

    fresh = ingest_landing_files(spark, lake)
    assert (fresh.batches, len(fresh.incomplete)) == ((), 1)

    _age(path, 3600)
    settled = ingest_landing_files(spark, lake)

    assert (len(settled.batches), settled.lines_read, settled.incomplete) == (1, 0, ())
    assert ingest_landing_files(spark, lake).batches == ()  # recorded: not read again


def test_a_batch_reads_a_file_only_up_to_the_size_it_planned(spark, lake):
    write_landing(lake, "a.jsonl", [partition_event_at("a1"), partition_event_at("a2", 1)])
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    ledger.plan(list_landing_files(spark, lake.landing), ledger.rows())  # the run dies after planning
    with open(Path(lake.landing) / "a.jsonl", "ab") as out:  # a writer (wrongly) appends half a line
        out.write(b'{"event_id": "a3", "timest')

    result = ingest_landing_files(spark, lake)  # the replay reads what the plan saw

    assert [(b.replayed, b.lines_read, b.accepted, b.quarantined) for b in result.batches] == [(True, 2, 2, 0)]
    assert spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).count() == 0


def test_files_that_are_not_json_lines_at_all_are_quarantined_line_by_line(spark, lake):
    write_landing(lake, "array.json", ["[", json.dumps(partition_event_at("in-array")) + ",", "]"])
    write_landing(lake, "table.jsonl", ["event_id,timestamp", "e1,1"])
    write_landing(lake, "binary.ndjson", [b"\x89PNG\r\n\x1a\x00\x00\x00\rIHDR\x00"])
    write_landing(lake, "mixed.jsonl", [partition_event_at("good-1"), "{}", partition_event_at("good-2", 1)])

    result = ingest_landing_files(spark, lake)

    reasons = {
        (Path(r.source_file).name, r.line_number): r.reason
        for r in spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).collect()
    }
    assert reasons == {
        ("array.json", 1): "not valid JSON: Expecting value at column 2",
        ("array.json", 2): "not valid JSON: Extra data at column "
        + str(len(json.dumps(partition_event_at("in-array"))) + 1),
        ("array.json", 3): "not valid JSON: Expecting value at column 1",
        ("table.jsonl", 1): "not valid JSON: Expecting value at column 1",
        ("table.jsonl", 2): "not valid JSON: Expecting value at column 1",
        ("binary.ndjson", 1): "not valid UTF-8: byte 0x89 at offset 0",  # "\x89PNG\r"
        ("binary.ndjson", 2): "not valid JSON: Expecting value at column 1",  # the rest, after its "\n"
        ("mixed.jsonl", 2): "missing required field 'event_id'",
    }
    assert (result.lines_read, result.accepted, result.duplicates, result.quarantined) == (10, 2, 0, 8)


def test_a_file_read_in_many_byte_ranges_gives_the_lines_one_read_of_it_gives(spark, tmp_path):
    """Spark reads a large landing file in byte ranges, one task each. Here the ranges are
    tiny, so lines straddle them and one line spans several, and the file is cut at a planned
    size inside a line: the numbers, bytes and reasons must be those of one read of the
    file's first `planned` bytes."""
    lines = [json.dumps(event).encode() for event in BASE_EVENTS[:30]]
    lines[3] = b""  # a blank line
    lines[7] = lines[7][:-1] + b"\r"  # a CRLF ending: the "\r" is part of the line
    lines[11] = b"\xff" + lines[11]  # not UTF-8
    lines[15] = json.dumps({"event_id": "x" * 2_000}).encode()  # longer than a range
    whole = b"\n".join(lines)
    planned = len(whole) - len(lines[-1]) // 2  # the plan ends inside the last line
    content = whole + b"\n" + b'{"event_id": "late", "timest'  # then a writer went on
    path = tmp_path / "big file %41.jsonl"  # Spark names it file:/...big%20file%20%2541.jsonl
    path.write_bytes(content)

    session = spark.newSession()
    session.conf.set("spark.sql.files.maxPartitionBytes", "700")
    session.conf.set("spark.sql.files.openCostInBytes", "700")
    read = read_landing_lines(session, [f"file:{path}"], {f"file:{path}": planned})
    rows = read.collect()

    pieces = content[:planned].split(b"\n")
    parsed = [(number, piece, *parse_line(piece)) for number, piece in enumerate(pieces, start=1)]
    # A good line comes back as its event, a bad one as its exact bytes and the reason.
    expected = [
        (number, piece if reason else normalize_event(event), reason) for number, piece, event, reason in parsed
    ]
    assert read.rdd.getNumPartitions() >= len(content) // 700
    assert {row.source_file for row in rows} == {f"file:{path}"}
    assert parsed[-1][1] == lines[-1][: len(lines[-1]) - len(lines[-1]) // 2]  # the cut line, cut
    read_back = [
        (row.line_number, row.raw_line if row.reason else event_from_row(row), row.reason)
        for row in sorted(rows, key=lambda row: row.line_number)
    ]
    assert read_back == expected


def test_a_byte_range_without_a_line_count_stops_the_read_and_names_the_file():
    """A file that grew after its lines were counted is split into ranges the count did not see:
    numbering those lines from 0 would be wrong, so the read stops."""
    batch = pa.RecordBatch.from_pydict(
        {"path": ["file:/landing/a%20b.jsonl"], "range_start": [4096], "raw": [b"{}"], "size": [2]}
    )
    lines = _number_and_validate(
        iter([batch]), range_starts={}, sources={"file:/landing/a%20b.jsonl": "file:/landing/a b.jsonl"}, sizes={}
    )
    with pytest.raises(
        RuntimeError, match="^file:/landing/a b.jsonl: Spark read a byte range at 4096 that the line count did not see"
    ):
        list(lines)
