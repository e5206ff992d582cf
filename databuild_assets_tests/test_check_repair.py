"""Damage injected into real tables on disk: what `check` says (the table and the file, in one
line), that `repair` loses no event a kept landing file holds and states the ones it cannot put
back, and that every table after the repair equals the undamaged lake's.

One lake is built per module (two ingestion batches, then events appended through the writer
API, which no landing file holds); each test damages a copy of it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest

from databuild_assets.cli import main as cli_main
from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.log.serving.store import SERVING_INDEX_FOLDER, IndexFolder
from databuild_assets.maintenance.check import check_lake, format_check
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.repair import repair_lake
from databuild_assets.projections.refresh_all import refresh_all_projections
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events, write_landing_files
from databuild_assets_tests.support import REPO_ROOT, AppenderProcess

APPENDED = 40  # events appended through the writer API: in no landing file
# Columns that say when and from where an event was stored, not what it is: an event put back
# from its landing file is stored again, later. Columns starting with "_" are a fold's bookkeeping.
STORAGE_COLUMNS = {"ingested_at", "source_file", "source_line"}
COMPARED_TABLES = ("raw_event_log", "filtered_event_log", "partition_state", "job_runs", "build_requests")


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory) -> Lake:
    """Two ingestion batches, APPENDED events through the writer API, every derived table
    refreshed, then APPENDED more through the writer API: the serving index holds those last
    ones, and no landing file nor the filtered log does."""
    lake = Lake(str(tmp_path_factory.mktemp("built") / "lake"))
    os.makedirs(lake.root)
    write_landing_files(lake.landing, 1_500, seed=5, events_per_file=500, bad_line_rate=0.01)
    ingest_landing_files(spark, lake, settle_seconds=0)
    write_landing_files(Path(lake.root) / "more", 1_500, seed=6, events_per_file=500)
    for path in sorted((Path(lake.root) / "more").iterdir()):
        path.rename(Path(lake.landing) / f"later-{path.name}")
    ingest_landing_files(spark, lake, settle_seconds=0)
    appended = list(generate_events(2 * APPENDED, seed=7))
    with DeltaRsEventLog(lake) as log:
        log.append_events(appended[:APPENDED])
    refresh_filtered_log(spark, lake)
    refresh_all_projections(spark, lake, full=True)
    with DeltaRsEventLog(lake) as log:
        log.append_events(appended[APPENDED:])
    assert check_lake(lake).ok
    return lake


@pytest.fixture(scope="module")
def reference(spark, built, tmp_path_factory) -> Lake:
    """The built lake with every derived table rebuilt from its raw log: what a repair that
    loses nothing must leave."""
    lake = Lake(str(tmp_path_factory.mktemp("reference") / "lake"))
    shutil.copytree(built.root, lake.root)
    refresh_filtered_log(spark, lake, full=True)
    refresh_all_projections(spark, lake, full=True)
    return lake


@pytest.fixture
def copy(built, tmp_path) -> Lake:
    shutil.copytree(built.root, tmp_path / "lake")
    return Lake(str(tmp_path / "lake"))


def _tables(lake: Lake) -> dict[str, list[tuple]]:
    """Every compared table's rows, sorted, without the storage columns."""
    rows = {}
    for name in COMPARED_TABLES:
        table = deltalake.DeltaTable(os.path.join(lake.path("tables"), name)).to_pyarrow_table()
        kept = [c for c in table.column_names if c not in STORAGE_COLUMNS and not c.startswith("_")]
        rows[name] = sorted(json.dumps(row, sort_keys=True, default=str) for row in table.select(kept).to_pylist())
    return rows


def _adds(lake: Lake, table: str) -> list[dict]:
    return pa.table(deltalake.DeltaTable(lake.path("tables", table)).get_add_actions(flatten=True)).to_pylist()


def _count(lake: Lake) -> int:
    return sum(add["num_records"] for add in _adds(lake, "raw_event_log"))


def _landing_data_files(lake: Lake) -> list[Path]:
    """The data files of raw_event_log written by an ingestion (not by the writer API)."""
    table = Path(lake.table_path(RAW_EVENT_LOG))
    return sorted(table / add["path"] for add in _adds(lake, "raw_event_log") if add["num_records"] > APPENDED)


def _landing_data_file(lake: Lake) -> Path:
    return _landing_data_files(lake)[0]


def _commit(lake: Lake, table: str, version: int) -> Path:
    return Path(lake.path("tables", table, "_delta_log", f"{version:020d}.json"))


def _newest_version(lake: Lake, table: str = "raw_event_log") -> int:
    return deltalake.DeltaTable(lake.path("tables", table)).version()


def _check_lines(lake: Lake, capsys) -> tuple[int, list[str]]:
    code = cli_main(["check", f"delta://{lake.root}"])
    return code, capsys.readouterr().out.splitlines()


def _problem_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "Repair: databuild-assets repair" in line]


def _repaired_equals(spark, lake: Lake, reference: Lake, lost: int = 0):
    """Repair `lake`: every table then equals `reference`'s but for `lost` events, which the
    repair states as lost."""
    result = repair_lake(spark, lake)
    assert result.after is not None and result.after.ok, [p.line() for p in result.after.problems]
    assert result.events_unrecovered == lost
    if lost == 0:
        assert _tables(lake) == _tables(reference)
    with DeltaRsEventLog(lake) as log, DeltaRsEventLog(reference) as expected:
        assert log.get_activity_summary().total_events == expected.get_activity_summary().total_events - lost
    return result


# -- data files ------------------------------------------------------------------------------------


def test_zeroed_cut_and_missing_data_files_are_each_named_and_their_events_come_back_from_landing(
    spark, reference, copy, capsys
):
    zeroed, cut, missing = _landing_data_files(copy)[:3]
    with open(zeroed, "r+b") as file:
        file.seek(zeroed.stat().st_size // 2)
        file.write(b"\0" * 4096)
    os.truncate(cut, cut.stat().st_size - 100)
    missing.unlink()

    code, lines = _check_lines(copy, capsys)

    assert code == 1
    problems = sorted(_problem_lines(lines))
    named = {os.path.relpath(path, copy.root): path for path in (zeroed, cut, missing)}
    assert sorted(line.split(": ")[1] for line in problems) == sorted(named)
    said = {line.split(": ")[1]: line.split(": ", 2)[2] for line in problems}
    assert said[os.path.relpath(zeroed, copy.root)].startswith("data file does not read")
    assert said[os.path.relpath(cut, copy.root)].startswith("data file has")
    assert "bytes, the log recorded" in said[os.path.relpath(cut, copy.root)]
    assert said[os.path.relpath(missing, copy.root)].startswith("data file is missing")
    result = _repaired_equals(spark, copy, reference)
    assert result.events_lost > 0 and result.events_recovered == result.events_lost
    for relative in (os.path.relpath(zeroed, copy.root), os.path.relpath(cut, copy.root)):
        assert os.path.exists(os.path.join(result.aside_folder, relative))  # moved aside, not deleted


def test_events_no_landing_file_keeps_are_put_back_from_the_filtered_log(spark, reference, copy, capsys):
    shutil.rmtree(copy.landing)  # landing retention in delete mode has run
    damaged = _landing_data_file(copy)
    damaged.unlink()

    code, _ = _check_lines(copy, capsys)

    assert code == 1
    result = _repaired_equals(spark, copy, reference)
    assert result.events_from_landing == 0 and result.events_from_filtered_log == result.events_lost > 0


def test_a_damaged_projection_file_and_a_cut_serving_index_are_named_and_rebuilt(spark, reference, copy, capsys):
    damaged = Path(copy.path("tables", "job_runs")) / _adds(copy, "job_runs")[0]["path"]
    damaged.write_bytes(b"not parquet")
    index, _ = IndexFolder(copy.path(SERVING_INDEX_FOLDER)).current()
    os.truncate(index, os.path.getsize(index) // 2)

    code, lines = _check_lines(copy, capsys)

    assert code == 1
    problems = _problem_lines(lines)
    assert [line.split(":")[0] for line in problems] == ["job_runs", "serving_index"]
    assert problems[0].startswith(f"job_runs: {os.path.relpath(damaged, copy.root)}: data file has 11 bytes")
    assert problems[1].startswith(f"serving_index: serving_index/{os.path.basename(index)}: ")
    _repaired_equals(spark, copy, reference)


# -- the Delta log -----------------------------------------------------------------------------------


def test_the_newest_commit_cut_in_half_restores_the_version_before_and_states_the_events_lost(
    spark, reference, copy, capsys
):
    newest = _newest_version(copy)
    commit = _commit(copy, "raw_event_log", newest)
    os.truncate(commit, commit.stat().st_size // 2)

    code, lines = _check_lines(copy, capsys)

    assert code == 1
    problems = _problem_lines(lines)
    assert any(
        line.startswith(f"raw_event_log: tables/raw_event_log/_delta_log/{commit.name}: commit file does not parse")
        and f"it reads as of version {newest - 1}" in line
        for line in problems
    ), problems
    # The newest commit was the writer API's append after the last refresh: no landing file nor
    # the filtered log holds its events; the serving index saw them, so the loss is counted.
    result = _repaired_equals(spark, copy, reference, lost=APPENDED)
    assert result.events_from_landing == result.events_from_filtered_log == 0


def test_a_garbled_commit_in_the_middle_restores_the_version_before_and_ingests_landing_files_again(
    spark, reference, copy, capsys
):
    commit = _commit(copy, "raw_event_log", 1)  # the first ingestion batch
    data = bytearray(commit.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 20] = b"\xff" * 20
    commit.write_bytes(bytes(data))

    code, lines = _check_lines(copy, capsys)

    assert code == 1
    assert any(f"_delta_log/{commit.name}: commit file does not parse" in line for line in lines)
    result = _repaired_equals(spark, copy, reference, lost=APPENDED)
    assert result.events_from_landing == 3_000  # both batches' events, from their landing files
    assert result.events_from_filtered_log == APPENDED  # the append the filtered log saw


def test_a_missing_commit_is_named_and_the_versions_after_it_are_restored(spark, reference, copy, capsys):
    commit = _commit(copy, "raw_event_log", 2)  # the second ingestion batch
    commit.unlink()

    code, lines = _check_lines(copy, capsys)

    assert code == 1
    assert any(f"_delta_log/{commit.name}: commit file is missing" in line for line in lines)
    _repaired_equals(spark, copy, reference, lost=APPENDED)


def test_a_corrupted_checkpoint_is_moved_aside_and_the_table_reads_from_its_commits(spark, reference, copy, capsys):
    path = copy.table_path(RAW_EVENT_LOG)
    deltalake.DeltaTable(path).create_checkpoint()
    [checkpoint] = Path(path, "_delta_log").glob("*.checkpoint.parquet")
    checkpoint.write_bytes(checkpoint.read_bytes()[:200])

    code, lines = _check_lines(copy, capsys)

    assert code == 1
    assert any(f"_delta_log/{checkpoint.name}: checkpoint does not read" in line for line in lines)
    _repaired_equals(spark, copy, reference)
    assert not checkpoint.exists()


def test_a_raw_log_behind_its_ingest_ledger_gets_the_missing_batch_again(spark, reference, copy, capsys):
    """The raw log's newest ingestion commit gone (and the appends after it): the ledger says
    batch 2 committed; the check says so, with the events that batch accepted."""
    newest = _newest_version(copy)
    for version in (newest, newest - 1, newest - 2):
        _commit(copy, "raw_event_log", version).unlink()

    code, lines = _check_lines(copy, capsys)

    assert code == 1
    behind = "the ingest ledger records 1 batch(es) committed (2) that the raw log does not hold"
    assert any(behind in line for line in lines)
    _repaired_equals(spark, copy, reference, lost=APPENDED)


# -- the serving index, landing files, the disk, permissions -----------------------------------------


def test_a_landing_file_cut_in_the_middle_of_a_line_waits_then_quarantines_only_the_cut_line(spark, copy):
    lines = [json.dumps(event) for event in generate_events(30, seed=99)]
    text = "\n".join(lines)
    landing = Path(copy.landing) / "cut.jsonl"
    landing.write_text(text[: len(text) - 25])  # the last line cut, no newline at the end
    before = _count(copy)

    # (The copy's ledger names the built lake's landing paths: its own files are read again as
    # new, and every event in them is a duplicate.)
    waiting = ingest_landing_files(spark, copy)  # may still be being written: not read yet
    assert waiting.incomplete == (f"file:{landing}",) and f"file:{landing}" not in waiting.files
    settled = ingest_landing_files(spark, copy, settle_seconds=0)

    assert settled.files == (f"file:{landing}",)
    assert (settled.accepted, settled.quarantined) == (29, 1)
    assert _count(copy) == before + 29
    assert check_lake(copy).ok


def _run_on_a_full_disk(script: str, limit_bytes: int) -> subprocess.CompletedProcess:
    """`script` in a Python process that cannot write files larger than `limit_bytes` (EFBIG),
    as on a full disk."""

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, preexec_fn=limited, timeout=600
    )


def test_a_full_disk_during_an_append_commits_nothing_and_the_next_append_succeeds(copy):
    version = _newest_version(copy)
    events = list(generate_events(20_000, seed=11))[-3_000:]
    script = (
        "import json, sys\nfrom databuild_assets.log import open_event_log\n"
        f"events = json.load(open({str(Path(copy.root) / 'events.json')!r}))\n"
        f"with open_event_log('delta://{copy.root}') as log:\n    log.append_events(events)\n"
    )
    (Path(copy.root) / "events.json").write_text(json.dumps(events))
    run = _run_on_a_full_disk(script, 64 * 1024)
    os.unlink(Path(copy.root) / "events.json")

    assert run.returncode != 0 and "File too large" in run.stderr, run.stderr[-2000:]
    assert _newest_version(copy) == version
    assert check_lake(copy).ok
    with DeltaRsEventLog(copy) as log:  # the disk has room again
        log.append_events(events)
    assert _newest_version(copy) == version + 1
    assert check_lake(copy).ok


def test_a_full_disk_during_compaction_fails_the_run_and_leaves_every_table_as_it_was(spark, built, copy):
    before = {name: _newest_version(copy, name) for name in COMPARED_TABLES}
    script = (
        "from databuild_assets.maintenance.compaction import compact\n"
        "from databuild_assets.runtime.lake import Lake\n"
        "from databuild_assets.runtime.spark import build_spark_session\n"
        "from databuild_assets_tests.support import TEST_SPARK_SETTINGS\n"
        f"compact(build_spark_session(TEST_SPARK_SETTINGS), Lake({copy.root!r}), open_days=0)\n"
    )
    run = _run_on_a_full_disk(script, 256 * 1024)

    assert run.returncode != 0, run.stdout[-2000:]
    assert "File too large" in run.stderr, run.stderr[-3000:]
    assert {name: _newest_version(copy, name) for name in COMPARED_TABLES} == before
    assert check_lake(copy).ok
    assert _tables(copy) == _tables(built)


def test_a_data_file_this_user_may_not_read_is_named(copy):
    damaged = _landing_data_file(copy)
    os.chmod(damaged, 0)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    run = subprocess.run(
        [*drop, sys.executable, "-m", "databuild_assets.cli", "check", f"delta://{copy.root}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )

    assert run.returncode == 1, run.stderr[-2000:]
    [problem] = _problem_lines(run.stdout.splitlines())
    assert problem.startswith(f"raw_event_log: {os.path.relpath(damaged, copy.root)}: data file")
    assert "Permission denied" in problem
    os.chmod(damaged, 0o644)
    assert check_lake(copy).ok


def test_an_undamaged_lake_checks_clean_and_repair_changes_nothing(spark, built, copy, capsys):
    code, lines = _check_lines(copy, capsys)
    assert code == 0 and lines[-1] == "no damage found"
    versions = {name: _newest_version(copy, name) for name in COMPARED_TABLES}

    result = repair_lake(spark, copy)

    assert result.before.ok and not result.moved_aside
    assert {name: _newest_version(copy, name) for name in COMPARED_TABLES} == versions


# -- a lake in service -------------------------------------------------------------------------------


def test_a_lake_a_service_appends_to_while_it_is_checked_shows_no_damage(tmp_path):
    # What lake_checks met under the soak's load (a false alarm at most minutes): the index's
    # pages added since its last checkpoint are in its write-ahead log, not yet in the file, and
    # the appends commit versions after the raw log was listed but before the index was read.
    lake = Lake(str(tmp_path / "lake"))
    events = list(generate_events(3_000, seed=11))
    with DeltaRsEventLog(lake) as log:
        log.append_events(events[:100])
        index, _ = IndexFolder(lake.path(SERVING_INDEX_FOLDER)).current()
        reader = sqlite3.connect(index)  # a reader's snapshot: no checkpoint copies the pages after it
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM events").fetchone()
        for start in range(100, 1_500, 20):
            log.append_events(events[start : start + 20])
        assert os.path.getsize(index + "-wal") > 0
        assert check_lake(lake, read_data=False).ok, format_check(check_lake(lake, read_data=False))
        reader.close()

    later = events[1_500:]
    appender = AppenderProcess.start(lake, [later[i : i + 5] for i in range(0, len(later), 5)], tmp_path, "svc")
    checks = []
    while appender.process.poll() is None:
        checks.append(check_lake(lake, read_data=False))
    assert appender.report()["accepted"] == len(later)
    assert len(checks) >= 3 and all(report.ok for report in checks), [
        format_check(report) for report in checks if not report.ok
    ][:1]
