"""A writer of the landing folder cannot stop ingestion, make it read outside the lake, or blow up
the quarantine (docs/security.md): names with glob or control characters, links, FIFOs, other
users' files, lines over the limit."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from dagster import materialize
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from databuild_assets.defs.event_log.assets import ingested_event_log, landing_files
from databuild_assets.events.validation import MAX_LINE_BYTES, OVER_LIMIT_KEPT_BYTES
from databuild_assets.ingest.landing import _Ledger, ensure_ingest_tables, ingest_landing_files
from databuild_assets.ingest.landing_folder import LandingFile
from databuild_assets.maintenance import landing_files as landing_maintenance
from databuild_assets.maintenance.landing_files import retain_landing_files
from databuild_assets.runtime import files
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG, Lake
from databuild_assets.workload import write_landing_files
from databuild_assets_tests.support import (
    OTHER_GID,
    OTHER_UID,
    lakehouse_for,
    needs_another_user,
    partition_event_at,
    write_landing,
)


def event_ids(spark, lake) -> list[str]:
    return sorted(row.event_id for row in spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).collect())


def quarantine_rows(spark, lake) -> list:
    return spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).collect()


def events(prefix: str, count: int = 2) -> list[dict]:
    return [partition_event_at(f"{prefix}-{n}", n) for n in range(count)]


def ingest_as_the_job_does(lake) -> dict:
    """The ingestion asset ingest_job materializes, in process: its raw_event_log metadata."""
    result = materialize([landing_files, ingested_event_log], resources={"lakehouse": lakehouse_for(lake)})
    assert result.success
    [raw] = [e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == RAW_EVENT_LOG.name]
    return {key: value.value for key, value in raw.materialization.metadata.items()}


GLOB_NAMES = {"a[.jsonl": "bracket", "x*.jsonl": "star", "xy.jsonl": "xy", "b{c,d}.jsonl": "brace", "q?.jsonl": "q"}
GLOB_NAMES["back\\slash.jsonl"] = "backslash"
UNREADABLE_NAMES = {b"new\nline.jsonl": "newline", b"tab\t.jsonl": "tab", b"c:d.jsonl": "colon", b"u\xff.jsonl": "utf8"}


def test_landing_files_named_with_glob_or_control_characters_never_wedge_ingestion(spark, lake):
    landed = write_landing_files(lake.landing, 300, seed=11, events_per_file=150)  # the demo's files
    for name, prefix in GLOB_NAMES.items():
        write_landing(lake, name, events(prefix))
    for name, prefix in UNREADABLE_NAMES.items():
        path = os.path.join(os.fsencode(lake.landing), name)
        Path(os.fsdecode(path)).write_bytes(json.dumps(partition_event_at(f"{prefix}-0")).encode() + b"\n")

    first = ingest_as_the_job_does(lake)

    glob_ids = [f"{prefix}-{n}" for prefix in GLOB_NAMES.values() for n in range(2)]
    assert len(event_ids(spark, lake)) == len(set(event_ids(spark, lake))) == landed.events_written + len(glob_ids)
    assert set(glob_ids) <= set(event_ids(spark, lake))  # each read once, literally: x*.jsonl not also xy.jsonl
    named = {bytes(row.raw_line): row for row in quarantine_rows(spark, lake) if row.line_number == 0}
    assert set(named) == set(UNREADABLE_NAMES)
    assert named[b"c:d.jsonl"].reason == (
        "landing file name c:d.jsonl holds a ':', which Hadoop's paths cannot name: the file was not read. "
        "Rename it (printable UTF-8, no ':'); the next ingestion reads it"
    )
    assert "holds a control character (0x0a)" in named[b"new\nline.jsonl"].reason
    assert "is not valid UTF-8 (byte 0xff at offset 1)" in named[b"u\xff.jsonl"].reason
    assert (first["files_not_read"], first["files_ingested"]) == (4, len(landed.files) + len(GLOB_NAMES))
    assert "quarantined file:" in first["files_not_read_why"]

    write_landing(lake, "later.jsonl", events("later"))
    second = ingest_as_the_job_does(lake)

    assert {"later-0", "later-1"} <= set(event_ids(spark, lake))
    assert (second["files_ingested"], second["accepted"], second["files_not_read"]) == (1, 2, 4)
    assert len([row for row in quarantine_rows(spark, lake) if row.line_number == 0]) == 4  # quarantined once
    assert all(os.path.exists(os.path.join(os.fsencode(lake.landing), name)) for name in UNREADABLE_NAMES)


def test_a_batch_an_earlier_release_planned_with_such_names_is_replayed_without_wedging(spark, lake):
    # The earlier release listed these through Hadoop and planned them; its run then failed.
    for name in ("a[.jsonl", "x*.jsonl", "xy.jsonl", "c:d.jsonl"):
        write_landing(lake, name, events(name[0] + name[1]))
    ensure_ingest_tables(spark, lake)
    ledger = _Ledger(spark, lake)
    planned = [
        LandingFile(f"file:{lake.landing}/{path.name}", path.stat().st_size) for path in Path(lake.landing).iterdir()
    ]
    ledger.plan(planned, ledger.rows())

    replay = ingest_landing_files(spark, lake)

    assert [(b.batch_id, b.replayed, b.accepted, b.quarantined) for b in replay.batches] == [(1, True, 6, 1)]
    assert event_ids(spark, lake) == ["a[-0", "a[-1", "x*-0", "x*-1", "xy-0", "xy-1"]
    [row] = quarantine_rows(spark, lake)
    assert (row.source_file, row.line_number, row.ingest_batch) == (f"file:{lake.landing}/c:d.jsonl", 0, 1)
    write_landing(lake, "later.jsonl", events("later"))
    assert ingest_landing_files(spark, lake).accepted == 2  # and nothing is replayed again


SECRET = b"TOP-SECRET-CONTENT"


@needs_another_user
def test_links_fifos_and_other_users_files_in_the_landing_folder_are_skipped_unread(spark, lake, tmp_path):
    secret = tmp_path / "private.jsonl"  # outside the lake, readable by this user only
    secret.write_bytes(json.dumps(partition_event_at("secret-event")).encode() + b"\n" + SECRET + b"\n")
    secret.chmod(0o600)
    write_landing(lake, "good.jsonl", events("good"))
    (Path(lake.landing) / "link.jsonl").symlink_to(secret)
    others = write_landing(lake, "others.jsonl", [partition_event_at("others-event"), SECRET.decode()])
    os.chown(others, OTHER_UID, OTHER_GID)
    os.mkfifo(Path(lake.landing) / "pipe.jsonl")  # opening it would block the read

    metadata = ingest_as_the_job_does(lake)

    assert event_ids(spark, lake) == ["good-0", "good-1"]
    assert quarantine_rows(spark, lake) == []
    landing = f"file:{lake.landing}"
    assert metadata["files_not_read_why"].splitlines() == [
        f"- `skipped {landing}/link.jsonl: a symbolic link (its target is not followed), not a regular file: not "
        "read; landing files must be regular files`",
        f"- `skipped {landing}/others.jsonl: owned by uid {OTHER_UID}, not by this pipeline's user (uid "
        f"{os.geteuid()}) nor the landing folder's owner: not read. Have the writer run as one of them, or list "
        "its uid in DATABUILD_LANDING_WRITER_UIDS`",
        f"- `skipped {landing}/pipe.jsonl: a FIFO, not a regular file: not read; landing files must be regular files`",
    ]
    # Retention and erasure act on ingested files only: nothing of the link's target reaches the archive.
    retain_landing_files(spark, lake, retention_days=0, mode="archive")
    assert os.listdir(lake.landing_archive) == ["good.jsonl"]
    assert sorted(os.listdir(lake.landing)) == ["link.jsonl", "others.jsonl", "pipe.jsonl"]  # left in place
    archived = (Path(lake.landing_archive) / "good.jsonl").read_bytes()
    assert SECRET not in archived and b"secret-event" not in archived


@needs_another_user
def test_a_writer_running_as_another_user_is_read_when_its_uid_is_allowed(spark, lake, monkeypatch):
    others = write_landing(lake, "others.jsonl", events("others"))
    os.chown(others, OTHER_UID, OTHER_GID)
    monkeypatch.setenv("DATABUILD_LANDING_WRITER_UIDS", str(OTHER_UID))

    result = ingest_landing_files(spark, lake)

    assert (result.accepted, result.refused) == (2, ())


@needs_another_user
def test_a_writer_that_owns_the_landing_folder_is_read(spark, lake):
    # Other systems often write the landing folder as an account of their own, which owns it: they
    # decide what lands there anyway, so their files are read without a setting.
    others = write_landing(lake, "others.jsonl", events("others"))
    os.chown(others, OTHER_UID, OTHER_GID)
    os.chown(lake.landing, OTHER_UID, OTHER_GID)

    result = ingest_landing_files(spark, lake)

    assert (result.accepted, result.refused) == (2, ())


def test_a_line_over_the_limit_is_quarantined_with_its_first_bytes_and_its_size_only(spark, lake):
    huge = b'{"event_id": "huge", "pad": "' + b"x" * (3 * MAX_LINE_BYTES) + b'"}'
    write_landing(lake, "big.jsonl", [partition_event_at("before"), huge, partition_event_at("after", 1)])
    session = spark.newSession()  # the file in several byte ranges: the long line spans them
    session.conf.set("spark.sql.files.maxPartitionBytes", str(MAX_LINE_BYTES))

    result = ingest_landing_files(session, lake)

    [row] = quarantine_rows(spark, lake)
    assert (row.line_number, bytes(row.raw_line), row.line) == (2, huge[:1024], huge[:1024].decode())
    assert row.reason == (
        f"line is {len(huge):,} bytes, over the 1,048,576-byte limit for one event (only its first 1,024 bytes are "
        "kept)"
    )
    assert OVER_LIMIT_KEPT_BYTES == 1024
    assert event_ids(spark, lake) == ["after", "before"]
    assert (result.lines_read, result.accepted, result.quarantined) == (3, 2, 1)


@pytest.mark.parametrize("chunk", [5, 64])
def test_the_erasure_scan_finds_and_numbers_lines_much_longer_than_its_chunk(chunk, monkeypatch):
    monkeypatch.setattr(landing_maintenance, "_SCAN_CHUNK", chunk)
    monkeypatch.setattr(files, "_CHUNK", chunk)
    long_line = b"y" * 1000 + b"needle" + b"y" * 1000
    data = b"a\n" + long_line + b"\n" + b"z" * 333 + b"\nneedle\n" + b"w" * 500  # no final newline

    assert landing_maintenance._lines_holding(io.BytesIO(data), [b"needle"]) == (5, {2: long_line, 4: b"needle"})
    assert list(files.lines_of(io.BytesIO(data))) == [
        b"a\n",
        long_line + b"\n",
        b"z" * 333 + b"\n",
        b"needle\n",
        b"w" * 500,
    ]


_NAME_PIECES = ["a", "[", "]", "*", "?", "{", "}", ",", "\\", " ", "%41", "é", ":", "\n", "\t", "\r", "\x7f", "-"]
_NAMES = st.tuples(
    st.lists(st.sampled_from(_NAME_PIECES), max_size=8).map("".join),
    st.sampled_from(["", "L" * 200]),  # a long name
    st.sampled_from([b"", b"\xff"]),  # bytes that are not UTF-8
    st.sampled_from([".jsonl", ".json", ".ndjson"]),
).map(lambda parts: b"f" + parts[0].encode() + parts[1].encode() + parts[2] + parts[3].encode())
_BAD_LINES = st.one_of(
    st.binary(max_size=60).map(lambda raw: raw.replace(b"\n", b" ")),
    st.just(b""),
    st.just(b'{"event_id": "cut-short", "times'),
)


def _name_is_readable(name: bytes) -> bool:
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return ":" not in text and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


@settings(
    max_examples=int(os.environ.get("FUZZ_SPARK_EXAMPLES", 3)),
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(_NAMES, min_size=1, max_size=4, unique=True),
    st.data(),
    st.booleans(),
    st.booleans(),
)
def test_any_landing_names_lines_and_links_ingest_each_good_line_once_and_never_wedge_a_later_run(
    spark, names, data, with_link, with_huge_line
):
    root = Path(tempfile.mkdtemp(prefix="fuzz-landing-"))
    try:
        lake = Lake(str(root / "lake"))
        landing = os.fsencode(lake.landing)
        os.makedirs(landing)
        good, bad, unreadable = set(), {}, set()
        for index, name in enumerate(names):
            lines = []
            for number in range(data.draw(st.integers(min_value=0, max_value=5))):
                if data.draw(st.booleans()):
                    lines.append(json.dumps(partition_event_at(f"{index}-{number}", number)).encode())
                else:
                    lines.append(data.draw(_BAD_LINES))
            if with_huge_line and index == 0:
                lines.append(b'{"event_id": "' + b"h" * MAX_LINE_BYTES + b'"}')
            with open(os.path.join(landing, name), "wb") as out:
                out.write(b"".join(line + b"\n" for line in lines))
            if not _name_is_readable(name):
                unreadable.add(name)
                continue
            for number, line in enumerate(lines, 1):
                if line.startswith(b'{"event_id": "') and b"partition_event" in line:
                    good.add(json.loads(line)["event_id"])
                else:
                    bad[number, name] = line[:OVER_LIMIT_KEPT_BYTES]
        if with_link:
            outside = root / "outside.jsonl"
            outside.write_bytes(json.dumps(partition_event_at("outside")).encode() + b"\n")
            os.symlink(outside, os.path.join(landing, b"link.jsonl"))

        first = ingest_landing_files(spark, lake)

        assert event_ids(spark, lake) == sorted(good)
        rows = quarantine_rows(spark, lake)
        assert {bytes(row.raw_line) for row in rows if row.line_number == 0} == unreadable
        line_rows = {(row.line_number, os.fsencode(row.source_file.rsplit("/", 1)[-1])): row for row in rows}
        assert {key: bytes(row.raw_line) for key, row in line_rows.items() if key[0] > 0} == bad
        assert len(first.refused) == len(unreadable) + with_link

        write_landing(lake, "later.jsonl", [partition_event_at("later")])
        second = ingest_landing_files(spark, lake)

        assert (second.accepted, second.quarantined, [b.replayed for b in second.batches]) == (1, 0, [False])
        assert len(quarantine_rows(spark, lake)) == len(rows)  # nothing quarantined twice
    finally:
        shutil.rmtree(root, ignore_errors=True)
