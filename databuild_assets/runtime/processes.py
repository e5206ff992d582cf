"""Whether a process still runs, for the files named after a process that are cleaned up once it
is gone (the warm driver's clients, private serving index copies)."""

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


__all__ = ["process_alive"]
