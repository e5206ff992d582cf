"""Issue 42's lock files and file modes: no other local user can hold a lock of the lake's, a wait on
a lock ends naming its holder, and nothing the pipeline writes is readable by others, whatever the
umask it was started with (docs/security.md)."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.log import SqliteEventLog
from databuild_assets.log.serving.checkpoints import checkpoint_if_due
from databuild_assets.log.serving.store import IndexFolder, index_folder_of
from databuild_assets.runtime.commit_lock import checkpoint_lock_path, commit_lock, lock_path
from databuild_assets.runtime.files import LocalFiles
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.runtime.lock_files import UnsafeLockFileError
from databuild_assets.runtime.private_folders import UnsafeFolderError
from databuild_assets_tests.support import (
    ONE_EVENT_OF_EACH_TYPE,
    OTHER_UID,
    REPO_ROOT,
    as_other_user,
    needs_another_user,
    write_landing,
)


@pytest.fixture
def shared_lake():
    """A lake in a folder other users can reach (mode 0755 up from /tmp), as a lake on a shared
    host is: what keeps them from its lock files is the files' own mode."""
    folder = Path(tempfile.mkdtemp(prefix="databuild-shared-lake-"))
    os.chmod(folder, 0o755)
    tables = folder / "lake" / "tables"
    tables.mkdir(parents=True)
    for path in (folder / "lake", tables):
        os.chmod(path, 0o755)
    yield Lake(str(folder / "lake"))
    shutil.rmtree(folder)


def _wait_until_locked_or_exited(path: Path, holder: subprocess.Popen) -> None:
    """Until /proc/locks shows a lock on `path`, or `holder` has exited (it could not take it)."""
    inode = str(os.stat(path).st_ino)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and holder.poll() is None:
        with open("/proc/locks", encoding="ascii") as locks:
            if any(line.split()[5].rsplit(":", 1)[1] == inode for line in locks if "->" not in line):
                return
        time.sleep(0.05)


@needs_another_user
def test_another_user_cannot_hold_a_commit_lock_even_one_an_older_version_made_readable(shared_lake):
    table = shared_lake.table_path(RAW_EVENT_LOG)
    path = lock_path(table)
    path.touch(mode=0o644)  # as versions before issue 42 made it
    os.chmod(path, 0o644)
    with commit_lock(table):  # the first commit since narrows it
        pass
    holder = as_other_user("flock", "-s", str(path), "sleep", "30", wait=False, stderr=subprocess.PIPE)
    try:
        _wait_until_locked_or_exited(path, holder)
        started = time.monotonic()
        with commit_lock(table, timeout_s=10):
            pass
        assert time.monotonic() - started < 5
        assert holder.wait(timeout=5) != 0
        assert b"Permission denied" in holder.stderr.read()
    finally:
        holder.kill()
        holder.wait()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("which", ["commit lock", "serving index build lock"])
def test_a_wait_on_a_held_lock_ends_with_an_error_naming_the_holders_pid_and_command(lake, monkeypatch, which):
    os.makedirs(lake.path("tables"), exist_ok=True)
    table = lake.table_path(RAW_EVENT_LOG)
    folder = IndexFolder(lake.path("serving_index"))
    take = (lambda: commit_lock(table)) if which == "commit lock" else folder.build_lock
    with take():  # the lock file exists
        pass
    path = lock_path(table) if which == "commit lock" else Path(folder.path) / "build.lock"
    # No timeout passed: the default one is bounded, and a setting shortens it.
    monkeypatch.setenv("DATABUILD_LOCK_TIMEOUT_S", "1")
    holder = subprocess.Popen(["flock", str(path), "sleep", "15"])
    try:
        _wait_until_locked_or_exited(path, holder)
        started = time.monotonic()
        with pytest.raises(TimeoutError) as raised, take():
            pass
        assert time.monotonic() - started < 10
        message = str(raised.value)
        assert str(path) in message
        assert f"pid {holder.pid} " in message
        assert f"flock {path} sleep 15" in message
        assert "DATABUILD_LOCK_TIMEOUT_S" in message
    finally:
        holder.kill()
        holder.wait()


@needs_another_user
@pytest.mark.parametrize("planted", ["file", "symbolic link"])
def test_a_commit_lock_file_another_user_planted_is_refused_naming_it(shared_lake, planted):
    table = shared_lake.table_path(RAW_EVENT_LOG)
    path = lock_path(table)
    os.chmod(path.parent, 0o777)  # a tables folder others may write: a misconfigured lake
    target = path.parent.parent.parent / "elsewhere"
    target.write_text("not a lock file\n")
    os.chmod(target, 0o644)
    if planted == "file":
        as_other_user("touch", str(path))
    else:
        as_other_user("ln", "-s", str(target), str(path))

    refusal = f"lock file {re.escape(str(path))} (belongs to uid {OTHER_UID}|is a symbolic link)"
    with pytest.raises(RuntimeError, match=refusal):
        with commit_lock(table):
            pass
    assert target.read_text() == "not a lock file\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644  # not narrowed through the link either


def test_a_serving_index_cache_folder_and_its_files_are_made_for_their_owner_alone(tmp_path):
    previous = os.umask(0o022)
    try:
        folder = IndexFolder(str(tmp_path / "cache" / "databuild" / "serving_index" / "bucket" / "lake"))
        with folder.build_lock():
            building = folder.new_building_path()
        folder.publish(building)
    finally:
        os.umask(previous)
    for path in [tmp_path / "cache", *sorted((tmp_path / "cache").rglob("*"))]:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        assert mode & 0o077 == 0, f"{path} is {mode:04o}"


@needs_another_user
def test_a_serving_index_cache_folder_another_user_made_first_is_refused(monkeypatch):
    # A reader of a lake on S3 trusts the index in its cache folder: one planted there by another
    # user would answer its queries.
    shared = Path(tempfile.mkdtemp(prefix="databuild-shared-"))  # a place both users may write, as /tmp
    try:
        shared.chmod(0o1777)
        cache = shared / "serving-index-cache"
        as_other_user("mkdir", "-m", "0755", str(cache))
        monkeypatch.setenv("DATABUILD_SERVING_INDEX_DIR", str(cache))

        with pytest.raises(UnsafeFolderError, match=rf"^{re.escape(str(cache))} belongs to uid {OTHER_UID}, not"):
            index_folder_of("s3a://bucket/lake")
    finally:
        shutil.rmtree(shared)


def _modes_open_to_others(root: Path, skip: set[Path]) -> dict[str, str]:
    """Every file or folder under `root` (itself included) other users may read, write or enter."""
    paths = [root]
    for folder, folders, files in os.walk(root):
        paths += [Path(folder, name) for name in folders + files]
    found = {}
    for path in paths:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        if path not in skip and mode & 0o007:
            found[str(path.relative_to(root))] = f"{mode:04o}"
    return found


def test_nothing_the_pipeline_writes_is_open_to_other_users_whatever_the_umask(spark, lake):
    previous = os.umask(0o022)  # the usual default, which makes files 0644
    try:
        lake.ensure_root()  # as the lakehouse resource and the CLI do before writing
        landing = write_landing(lake, "events-00000.jsonl", ONE_EVENT_OF_EACH_TYPE)
        assert ingest_landing_files(spark, lake).accepted == len(ONE_EVENT_OF_EACH_TYPE)
        # A JVM-free writer started with umask 022: its Parquet, its commit and the serving index it
        # builds to deduplicate against.
        script = (
            "import os\nos.umask(0o022)\n"
            "from databuild_assets.log import open_event_log\n"
            f"open_event_log('delta://{lake.root}').append_event({{'event_id': 'e-appended', "
            "'timestamp': 1763424000000000099, 'build_request_id': 'br-2', 'event_type': 'partition_event', "
            "'partition_event': {'partition_ref': 'data/z', 'status_code': 4, 'status_name': 'PARTITION_AVAILABLE'}})\n"
        )
        subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, check=True, capture_output=True)
        # Another, on the lake as it is now (its log and index there): it writes its Parquet
        # before it takes the commit lock.
        again = script.replace("e-appended", "e-appended-2")
        subprocess.run([sys.executable, "-c", again], cwd=REPO_ROOT, check=True, capture_output=True)
    finally:
        os.umask(previous)

    root = Path(lake.root)
    assert any(root.joinpath("serving_index").glob("index-*.sqlite"))
    assert any(root.joinpath("tables", "raw_event_log").rglob("*.parquet"))
    # The landing file is its producer's, with the producer's mode: not the pipeline's to set.
    assert _modes_open_to_others(root, skip={landing, landing.parent}) == {}


def test_a_landing_file_rewrite_is_made_for_its_owner_alone_whatever_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        with LocalFiles().open_new(str(tmp_path / "landing_archive" / "events-00000.jsonl")) as out:
            out.write(b'{"kept": "line"}\n')
    finally:
        os.umask(previous)
    for path in (tmp_path / "landing_archive", tmp_path / "landing_archive" / "events-00000.jsonl"):
        assert stat.S_IMODE(os.lstat(path).st_mode) & 0o077 == 0, path


def test_a_sqlite_event_log_and_its_wal_are_made_for_their_owner_alone_whatever_the_umask(tmp_path):
    previous = os.umask(0o022)  # a service that embeds the SQLite backend, started as most are
    try:
        with SqliteEventLog(str(tmp_path / "bel.db")) as log:
            log.append_events(ONE_EVENT_OF_EACH_TYPE)
            made = sorted(path.name for path in tmp_path.iterdir())
            assert made == ["bel.db", "bel.db-shm", "bel.db-wal"]
            assert _modes_open_to_others(tmp_path, skip={tmp_path}) == {}
    finally:
        os.umask(previous)
    existing = tmp_path / "shared.db"  # a log its owner opened to a group keeps that mode
    existing.touch(mode=0o640)
    existing.chmod(0o640)
    SqliteEventLog(str(existing)).close()
    assert stat.S_IMODE(existing.stat().st_mode) == 0o640


def test_a_link_planted_as_the_checkpoint_lock_is_not_followed(lake):
    # The appends' checkpoint lock (log/serving/checkpoints.py) is opened as the commit lock is:
    # a link there is refused and named, the file it leads to left as it was, no checkpoint written.
    table = lake.table_path(RAW_EVENT_LOG)
    Path(table).parent.mkdir(parents=True, exist_ok=True)
    target = Path(lake.root).parent / "elsewhere"
    target.write_text("not a lock file\n")
    os.chmod(target, 0o644)
    checkpoint_lock_path(table).symlink_to(target)

    with pytest.raises(
        UnsafeLockFileError, match=f"lock file {re.escape(str(checkpoint_lock_path(table)))} is a symbolic link"
    ):
        checkpoint_if_due(table, 20)

    assert target.read_text() == "not a lock file\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644


_READ_POINTER = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a read without end fails here, not the machine
from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.delta_log import last_checkpoint, read_log
table = sys.argv[1]
print(last_checkpoint(table), latest_version_on_disk(table), [d.what for d in read_log(table).damage])
"""


@pytest.mark.parametrize("planted", ["a link to /dev/zero", "a FIFO"])
def test_a_last_checkpoint_that_is_no_plain_file_is_not_followed(tmp_path: Path, planted: str) -> None:
    # Every sensor tick and append reads `_last_checkpoint`: a link to /dev/zero read it without end
    # (memory until the process died), and a FIFO waited for a writer forever.
    import deltalake
    import pyarrow as pa

    table = str(tmp_path / "t")
    for n in range(3):
        deltalake.write_deltalake(table, pa.table({"n": [n]}), mode="append")
    pointer = Path(table) / "_delta_log" / "_last_checkpoint"
    if planted == "a FIFO":
        os.mkfifo(pointer, 0o600)
    else:
        pointer.symlink_to("/dev/zero")
    done = subprocess.run(
        [sys.executable, "-c", _READ_POINTER, table], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2_000:]
    none, newest, damage = done.stdout.strip().split(" ", 2)
    assert (none, newest) == ("None", "2")  # the log listed instead
    assert "not a plain file" in damage  # `check` names it
