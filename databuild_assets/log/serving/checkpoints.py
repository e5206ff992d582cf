"""Checkpoints of a local table the JVM-free appends commit to, written as its log grows.

Spark writes a checkpoint only when its own commit lands on a multiple of the table's interval,
and delta-rs only after its own commits (its post-commit hook, which `commit_exactly` keeps on
S3); a commit file written by `append_files` triggers neither. A log grown by those appends alone
would make every open by Spark or delta-rs replay every commit since the last checkpoint. So
after an append commits a version, still under the table's commit lock, `checkpoint_if_due`
writes a checkpoint of it when it is `delta.checkpointInterval` commits or more past the newest
one (`_last_checkpoint`; 100 unless the table sets the interval, delta-rs's own default): a
checkpoint missed by an appender that died is written by the next append.

A checkpoint lists every live file (about 95 bytes each), and the log keeps every checkpoint for
its retention (7 days). While compaction is behind, a raw log of many small files would so write
gigabytes of checkpoints a day at a service's append rate. So the interval also stretches to one
commit per `FILES_PER_COMMIT` live files of the last checkpoint: the checkpoint bytes written per
commit stay below a few commit files' size, and an open replays at most a small share of what it
reads in the checkpoint anyway.

The checkpoint is delta-rs's classic single-file one, which Spark, delta-rs and
runtime/delta_log.py read. It copies each add's `stats` string as committed and writes no
`stats_parsed`, so it holds statistics of `delta.dataSkippingStatsColumns` only: no erasable
value (runtime/lake.py, COMMON_TABLE_PROPERTIES).

    checkpoint_if_due(table_path, table, version)
"""

from __future__ import annotations

import json
import logging

import deltalake
import deltalake.exceptions

from databuild_assets.runtime.delta_log import log_folder

log = logging.getLogger(__name__)

CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"
# delta-rs's default interval: the one its post-commit hook follows on the other append paths.
DEFAULT_CHECKPOINT_INTERVAL = 100
# A commit file of an append is a few KB, a checkpoint ~95 B per live file: one commit per this many
# live files keeps the checkpoints' bytes per commit within a few commit files.
FILES_PER_COMMIT = 100


def checkpoint_interval(configuration: dict[str, str]) -> int:
    """The table's `delta.checkpointInterval`, or DEFAULT_CHECKPOINT_INTERVAL when it sets none
    (or one that is not a positive whole number)."""
    try:
        interval = int(configuration.get(CHECKPOINT_INTERVAL_PROPERTY, DEFAULT_CHECKPOINT_INTERVAL))
    except ValueError:
        return DEFAULT_CHECKPOINT_INTERVAL
    return interval if interval > 0 else DEFAULT_CHECKPOINT_INTERVAL


def checkpoint_due(version: int, last: int | None, live_files: int, configuration: dict[str, str]) -> bool:
    """Whether `version` is far enough past the newest checkpoint `last` (holding `live_files`):
    the table's interval, stretched to one commit per FILES_PER_COMMIT live files.

        checkpoint_due(100, None, 0, {})   # True: 101 commits and no checkpoint
    """
    interval = max(checkpoint_interval(configuration), live_files // FILES_PER_COMMIT)
    return version - (-1 if last is None else last) >= interval


def checkpoint_if_due(table_path: str, table: deltalake.DeltaTable, version: int) -> int | None:
    """Write a checkpoint of the local table at `path` once `version` (just committed, under the
    table's commit lock) is its interval past the newest checkpoint; `table` is brought up to
    date first. Returns the version checkpointed, or None. A failed checkpoint is logged, not
    raised: the commit before it stands, and the next append tries again."""
    last, live_files = _last_checkpoint(table_path)
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
    return table.version()


def _last_checkpoint(table_path: str) -> tuple[int | None, int]:
    """(version, live files) of the newest checkpoint `_last_checkpoint` names; (None, 0): none."""
    try:
        named = json.loads((log_folder(table_path) / "_last_checkpoint").read_bytes())
        return int(named["version"]), int(named.get("numOfAddFiles") or 0)
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None, 0


__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL",
    "FILES_PER_COMMIT",
    "checkpoint_due",
    "checkpoint_if_due",
    "checkpoint_interval",
]
