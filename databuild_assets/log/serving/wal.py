"""The serving index's write-ahead log copied into its file on a thread, not inside an append.

SQLite copies a WAL-mode file's write-ahead log into the file (a checkpoint) once the log holds
`index.WAL_CHECKPOINT_PAGES` pages, inside the COMMIT that crossed that size: the append whose
index update happened to cross it waited for the copy of thousands of pages and an fsync. So an
appender asks for a PASSIVE checkpoint on a thread of its own, with its own connection, every
`EVERY_COMMITS` of its index updates: the log is copied while the appends go on (sqlite3 leaves
the GIL while SQLite works; a PASSIVE checkpoint takes no lock a writer or a reader waits for),
and stays well below the size at which a COMMIT would copy it. A checkpoint that fails is
logged and the next one tried; SQLite's own stays the backstop.

    copier = WalCopier()
    copier.after_commit(index.path)   # after each index update of this process's appends
    copier.close()                    # done: waits for the copy under way
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from urllib.parse import quote

log = logging.getLogger(__name__)


class WalCopier:
    """Starts a PASSIVE checkpoint of an index every `EVERY_COMMITS` commits, one at a time."""

    EVERY_COMMITS = 100
    WAIT_S = 120.0

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._commits = 0
        self._copying = False

    def after_commit(self, path: str) -> bool:
        """Count one commit to the index at `path`; start a checkpoint of it when `EVERY_COMMITS`
        have been counted and none is under way. Whether one was started."""
        self._commits += 1
        if self._commits < self.EVERY_COMMITS:
            return False
        with self._guard:
            if self._copying:
                return False
            self._copying, self._commits = True, 0
        self._thread = threading.Thread(target=self._copy, args=(path,), name=f"wal checkpoint {path}")
        self._thread.start()
        return True

    def _copy(self, path: str) -> None:
        try:
            connection = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, isolation_level=None, timeout=0)
            try:
                connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            finally:
                connection.close()
        except sqlite3.Error as error:  # gone (a new generation), busy: the next one, or SQLite's own
            level = logging.WARNING if os.path.exists(path) else logging.DEBUG
            log.log(level, "serving index %s: its write-ahead log was not copied (%s)", path, error)
        finally:
            with self._guard:
                self._copying = False

    def close(self) -> None:
        """Wait for the checkpoint under way, if any (at most WAIT_S, then a warning)."""
        if self._thread is not None:
            self._thread.join(self.WAIT_S)
            if self._thread.is_alive():
                log.warning("%s is still running after %.0f s", self._thread.name, self.WAIT_S)
            self._thread = None


__all__ = ["WalCopier"]
