"""The lock files the project takes (a table's commit lock, the raw log's checkpoint lock, a
serving index's build lock): made 0600 and this user's, never a symbolic link, and waited on for
a bounded time, or not at all (`lock_if_free`: work one process does for all, skipped by the others).

flock works through any descriptor, a read-only one too, so a lock file others can read is a lock
others can hold, stalling every commit for as long as they like. So a lock file is created 0600
(set with fchmod, whatever the umask or an older file's mode), opened without following a symbolic
link, and refused when it belongs to another user (someone who could write the folder planted it).
A wait ends after DATABUILD_LOCK_TIMEOUT_S seconds (30 minutes by default: longer than a compaction
of a large log holds the raw log's lock) with an error naming the lock's holder: its pid, user and
command line, from /proc/locks.

    with held_lock(Path("/data/lake/tables/.raw_event_log.commit-lock"), "the commit lock"):
        ...
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import pwd
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_TIMEOUT_ENV = "DATABUILD_LOCK_TIMEOUT_S"
DEFAULT_LOCK_TIMEOUT_S = 30 * 60.0
_LOCK_FILE_MODE = 0o600
_FIRST_POLL_S = 0.001
_POLL_GROWTH = 1.1  # ~25 polls in the first 0.1 s; every 50 ms after ~0.5 s
_MAX_POLL_S = 0.05
_LOG_WAIT_AFTER_S = 1.0


class UnsafeLockFileError(RuntimeError):
    """A lock file is a symbolic link, not a file, or another user's; nothing was locked."""


class LockTimeoutError(TimeoutError):
    """Another process held a lock for longer than the wait allowed."""


def lock_timeout_s(environ: Mapping[str, str] = os.environ) -> float:
    """How long a wait on a lock lasts: DATABUILD_LOCK_TIMEOUT_S seconds, 30 minutes by default."""
    value = environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{LOCK_TIMEOUT_ENV}={value!r} is not a number of seconds above 0 (default 1800)")
    return seconds


def open_lock_file(path: Path | str) -> int:
    """A descriptor of the lock file at `path`, created 0600 if missing (its folder must exist).
    Raises UnsafeLockFileError naming it when it is a symbolic link, not a regular file, or owned
    by another user."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _LOCK_FILE_MODE)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeLockFileError(
                f"lock file {path} is a symbolic link, not a file of this user's; remove it and retry"
            ) from None
        raise
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise UnsafeLockFileError(f"lock file {path} is not a regular file; remove it and retry")
        if status.st_uid != os.geteuid():
            raise UnsafeLockFileError(
                f"lock file {path} belongs to uid {status.st_uid}, not to this user (uid {os.geteuid()}): "
                "another user, who can write its folder, made it; remove it, make the folder writable by this "
                "user alone, and retry"
            )
        if stat.S_IMODE(status.st_mode) != _LOCK_FILE_MODE:
            os.fchmod(descriptor, _LOCK_FILE_MODE)  # an older file made 0644, or a loose umask
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def acquire(descriptor: int, path: Path | str, what: str, timeout_s: float | None = None) -> None:
    """Take an exclusive flock on `descriptor` (the lock file `path`, `what` names it in
    messages), waiting at most `timeout_s` seconds (default `lock_timeout_s()`); raises
    LockTimeoutError naming the file and its holder after that."""
    if timeout_s is None:
        timeout_s = lock_timeout_s()
    started = time.monotonic()
    deadline = started + timeout_s
    pause, logged = _FIRST_POLL_S, False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                raise LockTimeoutError(
                    f"{what} {path} has been held for over {timeout_s:g} s by {lock_holder(descriptor)}; "
                    f"retry once it is done, stop that process if it is stuck, or wait longer with "
                    f"{LOCK_TIMEOUT_ENV}"
                ) from None
            if not logged and now - started >= _LOG_WAIT_AFTER_S:  # /proc/locks is read once, for a long wait
                log.info("waiting for %s %s, held by %s", what, path, lock_holder(descriptor))
                logged = True
            # A commit holds the lock for milliseconds: polled every millisecond at first (a
            # system call each), then less often, at most every _MAX_POLL_S.
            time.sleep(min(pause, left))
            pause = min(pause * _POLL_GROWTH, _MAX_POLL_S)


@contextmanager
def held_lock(path: Path | str, what: str, timeout_s: float | None = None) -> Iterator[None]:
    """Hold the lock file at `path` (`open_lock_file`, then `acquire`) for the block; the OS
    releases it if this process dies.

        with held_lock(folder / "start.lock", "the warm driver's start lock"):
            ...
    """
    descriptor = open_lock_file(path)
    try:
        acquire(descriptor, path, what, timeout_s)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


@contextmanager
def lock_if_free(path: Path | str) -> Iterator[bool]:
    """Hold the lock file at `path` for the block if no one holds it (True), without waiting
    (False): for work one process does on behalf of all, which the others then skip.

        with lock_if_free(folder / ".raw_event_log.checkpoint-lock") as held:
            if held:
                ...
    """
    descriptor = open_lock_file(path)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def lock_holder(descriptor: int) -> str:
    """Who holds a lock on the file open at `descriptor`: "pid N (user U: command line)", from
    /proc/locks (its `major:minor:inode` field) and /proc/<pid>; or why that is unknown."""
    status = os.fstat(descriptor)
    pids: list[tuple[bool, int]] = []
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            for line in locks:
                fields = line.split()
                if len(fields) < 6 or fields[1] == "->":  # "->": a waiter, not a holder
                    continue
                device, _, inode = fields[5].rpartition(":")
                major, _, minor = device.partition(":")
                if inode != str(status.st_ino):
                    continue
                try:
                    same_device = os.makedev(int(major, 16), int(minor, 16)) == status.st_dev
                    pid = int(fields[4])
                except ValueError:
                    continue
                if pid != os.getpid():
                    pids.append((same_device, pid))
    except OSError:
        return "a process this host does not name (/proc/locks unreadable)"
    if not pids:
        return "a process /proc/locks does not show (on another machine sharing the folder, or another pid namespace)"
    # An inode number is unique on its device only; overlay filesystems may show another device.
    pid = sorted(pids, reverse=True)[0][1]
    return f"pid {pid} ({_process(pid)})"


def _process(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            command = file.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as file:
            uid = next(int(line.split()[1]) for line in file if line.startswith("Uid:"))
    except (OSError, StopIteration, ValueError):
        return "gone, or not visible here"
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = f"uid {uid}"
    if len(command) > 200:
        command = command[:200] + "..."
    return f"user {user}: {command or '?'}"


__all__ = [
    "DEFAULT_LOCK_TIMEOUT_S",
    "LOCK_TIMEOUT_ENV",
    "LockTimeoutError",
    "UnsafeLockFileError",
    "acquire",
    "lock_holder",
    "lock_if_free",
    "lock_timeout_s",
    "open_lock_file",
]
