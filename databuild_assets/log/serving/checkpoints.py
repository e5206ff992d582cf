"""Checkpoints of a local table the JVM-free appends commit to, written as its log grows.

Spark writes a checkpoint only when its own commit lands on a multiple of the table's interval,
and delta-rs only after its own commits (its post-commit hook, which `commit_exactly` keeps on
S3); a commit file written by `append_files` triggers neither. A log grown by those appends alone
would make every open by Spark or delta-rs replay every commit since the last checkpoint. So
after an append commits a version, still under the table's commit lock, `checkpoint_if_due`
writes a checkpoint of it when it is far enough past the newest one (`_last_checkpoint`): a
checkpoint missed by an appender that died is written by the next append.

How far: an open reads the newest checkpoint, about 2 microseconds per live file it lists plus a
few milliseconds, then replays each commit after it, about 0.17 ms each (delta-rs, local disk).
So the interval grows with the live files: CHECKPOINT_BASE commits plus one per
FILES_PER_COMMIT live files of the last checkpoint (16 commits with none, 99 at 10,000 files),
which keeps an open within about 2x of a freshly checkpointed table's whatever the file count,
and the checkpoint bytes written per commit within a few tens of KB (a checkpoint is ~450 bytes
per live file; compaction thins old ones, maintenance/log_checkpoints.py). A table that sets
`delta.checkpointInterval` gets that interval instead.

The checkpoint is delta-rs's classic single-file one, which Spark, delta-rs and
runtime/delta_log.py read. It copies each add's `stats` string as committed and writes no
`stats_parsed`, so it holds statistics of `delta.dataSkippingStatsColumns` only: no erasable
value (runtime/lake.py, COMMON_TABLE_PROPERTIES).

    checkpoint_if_due(table_path, table, version)
"""

from __future__ import annotations

import logging
import os

import deltalake
import deltalake.exceptions

from databuild_assets.runtime.delta_log import last_checkpoint, log_folder

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"
# An open's cost of replaying this many commits is about its cost of reading a checkpoint of no
# files, and of FILES_PER_COMMIT live files about one more commit (bench figures: the module's
# docstring).
CHECKPOINT_BASE = 16
FILES_PER_COMMIT = 120


def checkpoint_interval(configuration: dict[str, str], live_files: int) -> int:
    """The table's `delta.checkpointInterval` when it sets a positive whole number; else
    CHECKPOINT_BASE commits plus one per FILES_PER_COMMIT live files."""
    try:
        interval = int(configuration.get(CHECKPOINT_INTERVAL_PROPERTY, 0))
    except ValueError:
        interval = 0
    return interval if interval > 0 else CHECKPOINT_BASE + live_files // FILES_PER_COMMIT


def checkpoint_due(version: int, last: int | None, live_files: int, configuration: dict[str, str]) -> bool:
    """Whether `version` is its interval past the newest checkpoint `last` (holding `live_files`).

    checkpoint_due(15, None, 0, {})   # True: versions 0 to 15 and no checkpoint
    """
    return version - (-1 if last is None else last) >= checkpoint_interval(configuration, live_files)


def checkpoint_if_due(table_path: str, table: deltalake.DeltaTable, version: int) -> int | None:
    """Write a checkpoint of the local table at `path` once `version` (just committed, under the
    table's commit lock) is its interval past the newest checkpoint; `table` is brought up to
    date first. Returns the version checkpointed, or None. A failed checkpoint is logged, not
    raised: the commit before it stands, and the next append tries again."""
    last, live_files = last_checkpoint(table_path) or (None, 0)
    if not checkpoint_due(version, last, live_files, table.metadata().configuration):
        return None
    try:
        table.update_incremental()
        table.create_checkpoint()
    except Exception as error:  # noqa: BLE001 - the commit has landed: an append must not report it failed
        log.warning(
            "%s: v%d is committed; its checkpoint failed and the next append retries it (%s)",
            table_path,
            version,
            error,
        )
        return None
    _drop_stale_checksum(table_path)
    return table.version()


def _drop_stale_checksum(table_path: str) -> None:
    """Spark writes `_last_checkpoint` through Hadoop's local filesystem, which keeps a checksum
    of it in `._last_checkpoint.crc` and checks it at every read; delta-rs rewrites the file and
    not that checksum. Spark would then fail the check, sleep and retry, and fall back to listing
    the log at every open. Without the checksum file Hadoop reads the file unchecked."""
    try:
        os.unlink(log_folder(table_path) / "._last_checkpoint.crc")
    except FileNotFoundError:
        pass


__all__ = [
    "CHECKPOINT_BASE",
    "FILES_PER_COMMIT",
    "checkpoint_due",
    "checkpoint_if_due",
    "checkpoint_interval",
]
