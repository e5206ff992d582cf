"""Old checkpoints of a local table thinned to one an hour: the log's bytes bounded under a
service's appends.

The JVM-free appends write a checkpoint every `delta.checkpointInterval` commits or more
(log/serving/checkpoints.py), and every checkpoint lists every live file and every file removed
in the tombstone retention (7 days): under a service's append rate, with up to the file-count
compaction's threshold of small files live, that is gigabytes of checkpoints an hour, which the
log keeps for its retention (7 days) when nothing removes them. Only the newest checkpoint
serves an open; an older one serves time travel to the versions after it, which any older
checkpoint also serves, with more commits to replay.

So `thin_checkpoints` deletes every checkpoint older than `keep_recent_s` (by its file's
modification time) but the first one of each hour: time travel to a version of the last 7 days
replays at most an hour of commits after a checkpoint. The newest checkpoint and the one
`_last_checkpoint` names are never deleted, nor one written in the last `keep_recent_s`: a
reader that listed the log before may still be reading it. Commit files are left to Delta's
own cleanup of expired log files (Spark's, at its checkpoints). Compaction calls it for each of
its tables; a lake on S3 is left as it is (delta-rs's post-commit hook checkpoints there).

    thin_checkpoints("/lake/tables/raw_event_log")   # -> how many checkpoint files it deleted
"""

from __future__ import annotations

import logging
import os
import time

from databuild_assets.runtime.delta_log import CHECKPOINT_FILE, last_checkpoint, log_folder

log = logging.getLogger(__name__)

KEEP_RECENT_S = 600
KEEP_ONE_PER_S = 3600


def thin_checkpoints(
    table_path: str,
    now: float | None = None,
    keep_recent_s: float = KEEP_RECENT_S,
    keep_one_per_s: float = KEEP_ONE_PER_S,
) -> int:
    """Delete the checkpoints of the local table at `table_path` that are older than
    `keep_recent_s` and not the first of their `keep_one_per_s` window; the newest and the one
    `_last_checkpoint` names stay. Returns how many files were deleted."""
    folder = log_folder(table_path)
    now = time.time() if now is None else now
    checkpoints: dict[int, list[os.DirEntry]] = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if (match := CHECKPOINT_FILE.match(entry.name)) and entry.is_file(follow_symlinks=False):
                    checkpoints.setdefault(int(match.group(1)), []).append(entry)
    except FileNotFoundError:
        return 0
    keep = {max(checkpoints, default=-1), (last_checkpoint(table_path) or (-1, 0))[0]}
    first_of_window: dict[int, int] = {}
    old: dict[int, int] = {}  # version -> its window
    for version, parts in checkpoints.items():
        written = max(part.stat(follow_symlinks=False).st_mtime for part in parts)
        window = int(written // keep_one_per_s)
        first_of_window[window] = min(version, first_of_window.get(window, version))
        if written < now - keep_recent_s:
            old[version] = window
    deleted = 0
    for version, window in sorted(old.items()):
        if version in keep or first_of_window[window] == version:
            continue
        for part in checkpoints[version]:
            try:
                os.unlink(part.path)
                deleted += 1
            except FileNotFoundError:  # another compaction thinned it first
                pass
            try:  # the checksum Hadoop's local filesystem wrote beside a checkpoint of Spark's
                os.unlink(folder / f".{part.name}.crc")
            except FileNotFoundError:
                pass
    if deleted:
        log.info("%s: %d old checkpoint files deleted (one an hour kept for time travel)", table_path, deleted)
    return deleted


__all__ = ["KEEP_ONE_PER_S", "KEEP_RECENT_S", "thin_checkpoints"]
