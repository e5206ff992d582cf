"""Whether a process still runs, for the files named after a process that are cleaned up once it
is gone (the warm driver's clients, private serving index copies), and whether it is this user's
(a pid read from a file is signalled only when it runs what that file says, as this user)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z"):
            return False
    return True


def process_of_this_user(pid: int) -> list[str] | None:
    """The command line of process `pid` when it runs as this user (real and effective uid), else
    None (another user's, or gone). Linux's /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    uids = next((line.split()[1:3] for line in status.splitlines() if line.startswith("Uid:")), [])
    if uids != [str(os.geteuid())] * 2:
        return None
    return [part.decode(errors="replace") for part in command.split(b"\0")[:-1]]


__all__ = ["process_alive", "process_of_this_user"]
