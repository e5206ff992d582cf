"""Landing files after ingestion: retention never touches a file not yet ingested, erasure rewrites
the ingested ones without the erased lines, and the erasure report reads them."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path

import pytest

from databuild_assets.defs.maintenance.jobs import (
    compaction_job,
    vacuum_job,
)
from databuild_assets.ingest.landing import _Ledger, ingest_landing_files
from databuild_assets.ingest.landing_folder import list_landing_files
from databuild_assets.maintenance import landing_files
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.erasure_report import erasure_report
from databuild_assets.maintenance.landing_files import (
    LandingFilesError,
    erase_from_landing_files,
    retain_landing_files,
)
from databuild_assets.maintenance.tombstones import read_tombstones, request_erasure
from databuild_assets.runtime.lake import EVENT_QUARANTINE, RAW_EVENT_LOG
from databuild_assets_tests.support import lakehouse_for, one_partition_build, op_output_metadata

REF, OTHER = "data/users/id=42", "data/sales/date=2025-11-18"
DAY_MS = 86_400_000


def build(br: str, ref: str, offset: int) -> list[str]:
    """A build of one partition as three JSON Lines lines: requested, job completed, available."""
    return [json.dumps(event) for event in one_partition_build(br, ref, offset)]


def land(folder: str, name: str, lines: list[str]) -> Path:
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / name
    path.write_bytes(b"".join(line.encode() + b"\n" for line in lines))
    return path


def raw_log_count(spark, lake) -> int:
    return spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG)).count()


def lines_holding(spark, lake, folder: str) -> int:
    return sum(f.rows_in_data_files for f in erasure_report(spark, lake) if f.table == folder)


def test_landing_retention_never_deletes_a_file_not_yet_ingested(spark, lake):
    landing = lake.landing
    ingested = land(landing, "a.jsonl", build("br-a", OTHER, 0))
    grown = land(landing, "g.jsonl", build("br-g", OTHER, 10))
    ingest_landing_files(spark, lake)
    # After that batch committed: a line appended to g (never read), a new file, a file a batch
    # planned and never committed (a crash), and a file still being written under a hidden name.
    with open(grown, "ab") as out:
        out.write(build("br-late", OTHER, 20)[0].encode() + b"\n")
    new = land(landing, "b.jsonl", build("br-b", OTHER, 30))
    planned = land(landing, "p.jsonl", build("br-p", OTHER, 40))
    ledger = _Ledger(spark, lake)
    ledger.plan([f for f in list_landing_files(spark, landing) if f.path.endswith("/p.jsonl")], ledger.rows())
    in_flight = land(landing, ".c.jsonl", build("br-c", OTHER, 50))
    kept = {path: path.read_bytes() for path in (grown, new, planned, in_flight)}

    delete_now = {
        "ops": {"vacuum_tables": {"config": {"landing_retention_days": 0, "landing_retention_mode": "delete"}}}
    }
    run = vacuum_job.execute_in_process(run_config=delete_now, resources={"lakehouse": lakehouse_for(lake)})

    assert not ingested.exists()
    assert {path: path.read_bytes() for path in kept} == kept
    metadata = op_output_metadata(run, "vacuum_tables")
    assert (
        metadata["landing_files_deleted"],
        metadata["landing_files_archived"],
        metadata["landing_files_not_ingested"],
    ) == (1, 0, 2)
    # Exactly once still: the replay takes p, a new batch takes b; neither a nor g is read again.
    again = ingest_landing_files(spark, lake)
    assert sorted(Path(path).name for path in again.files) == ["b.jsonl", "p.jsonl"]
    assert (again.accepted, raw_log_count(spark, lake)) == (6, 12)
    assert ingest_landing_files(spark, lake).files == ()


def test_landing_retention_archives_a_file_once_it_was_ingested_that_many_days_ago(spark, lake):
    original = land(lake.landing, "a.jsonl", build("br-a", OTHER, 0))
    content = original.read_bytes()
    ingest_landing_files(spark, lake)
    [record] = [row for row in _Ledger(spark, lake).rows() if row.stage == "committed"]
    committed_ms = int(record.recorded_at.timestamp() * 1000)

    early = retain_landing_files(spark, lake, retention_days=7, mode="archive", now_ms=committed_ms + 7 * DAY_MS - 1)
    assert (early.archived, early.younger, original.read_bytes()) == ((), 1, content)

    due = retain_landing_files(spark, lake, retention_days=7, mode="archive", now_ms=committed_ms + 7 * DAY_MS)

    archived = Path(lake.landing_archive) / "a.jsonl"
    assert [Path(path).name for path in due.archived] == ["a.jsonl"]
    assert (original.exists(), archived.read_bytes()) == (False, content)
    assert ingest_landing_files(spark, lake).files == ()
    assert raw_log_count(spark, lake) == 3
    # Delete mode takes archived files as old too.
    gone = retain_landing_files(spark, lake, retention_days=7, mode="delete", now_ms=committed_ms + 7 * DAY_MS)
    assert ([Path(path).name for path in gone.deleted], archived.exists()) == (["a.jsonl"], False)


def test_a_retention_with_an_unknown_mode_or_a_negative_age_is_refused_and_changes_nothing(spark, lake):
    original = land(lake.landing, "a.jsonl", build("br-a", OTHER, 0))
    ingest_landing_files(spark, lake)

    with pytest.raises(LandingFilesError, match="mode 'shred' is not one of archive, delete; nothing was changed"):
        retain_landing_files(spark, lake, retention_days=0, mode="shred")
    with pytest.raises(LandingFilesError, match="-1 days is negative; nothing was changed"):
        retain_landing_files(spark, lake, retention_days=-1, mode="delete")
    assert retain_landing_files(spark, lake, retention_days=None, mode="delete").deleted == ()
    assert original.exists()


def test_erasure_rewrites_an_ingested_landing_file_without_its_lines_and_the_report_counts_them(spark, lake):
    bad_with_value = '{"event_id": "broken", "partition_event": {"partition_ref": ' + json.dumps(REF)  # cut short
    # A writer may escape "/" (and non-ASCII) in a JSON string: the value is in that line all the same.
    bad_with_escaped_value = '{"event_id": "broken", "partition_event": {"partition_ref": "' + REF.replace("/", "\\/")
    bad_without = "not json at all"
    mixed_lines = (
        build("br-b", OTHER, 0)[:1]
        + build("br-a", REF, 10)
        + [bad_with_value, bad_with_escaped_value, bad_without]
        + build("br-b", OTHER, 0)[1:]
    )
    mixed = land(lake.landing, "mixed.jsonl", mixed_lines)
    only_erased = land(lake.landing, "only.jsonl", build("br-c", REF, 20))
    ingest_landing_files(spark, lake)
    late = land(lake.landing, "late.jsonl", build("br-d", REF, 30))  # not ingested yet
    late_content = late.read_bytes()
    request_erasure(spark, lake, "partition_ref", REF, actor="alice", reason="ticket 18")
    assert (lines_holding(spark, lake, "landing"), lines_holding(spark, lake, "landing_archive")) == (5 + 3 + 3, 0)
    resources = {"lakehouse": lakehouse_for(lake)}

    run = compaction_job.execute_in_process(resources=resources)

    metadata = op_output_metadata(run, "compact_lake")
    assert (
        metadata["landing_files_rewritten"],
        metadata["landing_files_removed"],
        metadata["landing_lines_removed"],
    ) == (1, 1, 8)
    assert metadata["landing_files_not_ingested"] == 1
    rewritten = Path(lake.landing_archive) / "mixed.jsonl"
    kept_lines = build("br-b", OTHER, 0) + [bad_without]
    assert sorted(rewritten.read_bytes().splitlines()) == sorted(line.encode() for line in kept_lines)
    assert rewritten.read_bytes() == b"".join(line.encode() + b"\n" for line in mixed_lines if line in kept_lines)
    assert sorted(os.listdir(lake.landing)) == ["late.jsonl"] and late.read_bytes() == late_content
    assert sorted(os.listdir(lake.landing_archive)) == ["mixed.jsonl"]
    assert not mixed.exists() and not only_erased.exists()
    assert (lines_holding(spark, lake, "landing"), lines_holding(spark, lake, "landing_archive")) == (3, 0)
    quarantined = spark.read.format("delta").load(lake.table_path(EVENT_QUARANTINE)).collect()
    assert [row.line for row in quarantined] == [bad_without]

    # Nothing moved or rewritten is ingested again; the late file is, and the next compaction's
    # landing step erases it (its purge of the raw log: test_maintenance, events that arrive again).
    assert [Path(path).name for path in ingest_landing_files(spark, lake).files] == ["late.jsonl"]
    assert raw_log_count(spark, lake) == 3 + 3  # br-b's, and the late file's (hidden, purged next)
    erase_from_landing_files(spark, lake, read_tombstones(spark, lake))
    assert (lines_holding(spark, lake, "landing"), lines_holding(spark, lake, "landing_archive")) == (0, 0)
    assert os.listdir(lake.landing) == []


def test_erasure_parses_only_the_landing_files_whose_bytes_may_hold_a_value_and_misses_no_spelling(spark, lake):
    land(lake.landing, "other.jsonl", build("br-b", OTHER, 0))  # no erased value: not parsed
    land(lake.landing, "plain.jsonl", build("br-a", REF, 10) + build("br-c", OTHER, 20))
    # A writer may escape any character as \\uXXXX: the value's text is then nowhere in the bytes.
    escaped = [line.replace("data/users", "\\u0064ata/users") for line in build("br-d", REF, 30)]
    land(lake.landing, "escaped.jsonl", escaped)
    ingest_landing_files(spark, lake)
    assert raw_log_count(spark, lake) == 12
    request_erasure(spark, lake, "partition_ref", REF, actor="alice", reason="ticket 30")

    result = erase_from_landing_files(spark, lake, read_tombstones(spark, lake))

    assert (result.files_scanned, result.files_parsed) == (3, 2)
    removed = sorted((Path(r.source).name, r.lines_removed) for r in result.rewrites)
    assert removed == [("escaped.jsonl", 3), ("plain.jsonl", 3)]
    assert os.listdir(lake.landing) == ["other.jsonl"]
    assert (lines_holding(spark, lake, "landing"), lines_holding(spark, lake, "landing_archive")) == (0, 0)


def test_an_archived_file_is_rewritten_in_place_and_one_in_the_way_of_a_rewrite_stops_it(spark, lake):
    land(lake.landing, "a.jsonl", build("br-a", REF, 0) + build("br-b", OTHER, 10))
    ingest_landing_files(spark, lake)
    retain_landing_files(spark, lake, retention_days=0, mode="archive")
    archived = Path(lake.landing_archive) / "a.jsonl"
    n_lines = build("br-n", REF, 40) + build("br-m", OTHER, 50)
    land(lake.landing, "n.jsonl", n_lines)
    ingest_landing_files(spark, lake)
    # A file of someone else's in the archive, under the name n's rewrite would take.
    blocker = land(lake.landing_archive, "n.jsonl", ["someone else's file"])
    request_erasure(spark, lake, "partition_ref", REF, actor="alice", reason="ticket 19")

    with pytest.raises(LandingFilesError, match="n.jsonl already exists with other content: nothing was changed"):
        erase_from_landing_files(spark, lake, read_tombstones(spark, lake))

    assert archived.read_bytes() == b"".join(line.encode() + b"\n" for line in build("br-b", OTHER, 10))
    assert blocker.read_bytes() == b"someone else's file\n"
    assert (Path(lake.landing) / "n.jsonl").read_bytes() == b"".join(line.encode() + b"\n" for line in n_lines)
    assert [t.pending for t in read_tombstones(spark, lake)] == [True]
    with pytest.raises(LandingFilesError):  # compaction fails too, and leaves the tombstone pending
        compact(spark, lake)
    assert [t.pending for t in read_tombstones(spark, lake)] == [True]
    assert not any(name.startswith(".erasure-") for name in os.listdir(lake.landing_archive))


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64])
def test_the_lines_erasure_parses_are_found_and_numbered_as_ingestion_splits_them(chunk, monkeypatch):
    monkeypatch.setattr(landing_files, "_SCAN_CHUNK", chunk)  # lines and needles across chunk ends
    rng = random.Random(chunk)
    pieces, needles = [b"ab", b"x", b"", b"zab", b"\\u", b"q\\/r", b"abab", b"\r"], [b"ab", b"\\u", b"\\/"]
    for _ in range(200):
        data = b"\n".join(rng.choice(pieces) + rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        data += rng.choice([b"", b"\n"]) if data else b""
        lines = data.split(b"\n")[: -1 if data.endswith(b"\n") else None] if data else []
        expected = {number: line for number, line in enumerate(lines, 1) if any(n in line for n in needles)}
        assert landing_files._lines_holding(io.BytesIO(data), needles) == (len(lines), expected), data
