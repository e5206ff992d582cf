"""Which entries of a landing folder ingestion may read, and how a path is handed to Spark so that
it names that one file (docs/security.md: a writer of the landing folder).

A landing folder is written by other systems, so its entries are not trusted:
- a name with a control character, a ':' (Hadoop's Path takes what is before it for a URI
  scheme, so Spark cannot open the file) or bytes that are not UTF-8 (the JVM does not list
  it) cannot be read by that name: the file is quarantined as a whole (`unreadable_name`), by
  name only, and left in place; renamed, it is ingested;
- a symbolic link, a FIFO, a device, a socket or a file another user owns is skipped
  (`refused_entry`), never opened, and left in place: reading it would copy into the lake
  whatever this user can read (a link to a private file), or block on a pipe. Writers
  that run as another user are allowed by `DATABUILD_LANDING_WRITER_UIDS`;
- Spark's file reader expands glob characters in a path (`a[.jsonl` is an invalid pattern,
  `x*.jsonl` matches other files): every path is read with them escaped (`literal_glob`).
"""

from __future__ import annotations

import os
import re
import stat

LANDING_SUFFIXES = (".jsonl", ".json", ".ndjson")
# Extra owners whose files in a landing folder are read, besides this process's user: a
# comma-separated list of uids (or user names), for writers that run as another user.
WRITER_UIDS_SETTING = "DATABUILD_LANDING_WRITER_UIDS"

# Hadoop's GlobPattern: these are special, and a backslash makes the next character literal.
_GLOB_SPECIAL = re.compile(r"([\\*?\[\]{}])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def is_landing_name(name: str | bytes) -> bool:
    """A JSON Lines name that is not hidden: writers write under a '.' or '_' name, then rename."""
    text = os.fsdecode(name)
    return not text.startswith((".", "_")) and text.endswith(LANDING_SUFFIXES)


def literal_glob(path: str) -> str:
    """`path` with Hadoop's glob characters escaped: Spark's reader then matches exactly that
    file, whatever its name holds (`a[.jsonl`, `x*.jsonl`, `b{c,d}.jsonl`, `q?.jsonl`)."""
    return _GLOB_SPECIAL.sub(r"\\\1", path)


def unreadable_name(name: str | bytes) -> str | None:
    """Why a landing file cannot be read by its name (None: it can): the quarantine's reason."""
    raw = os.fsencode(name)
    shown = shown_name(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        problem = f"is not valid UTF-8 (byte 0x{raw[error.start]:02x} at offset {error.start})"
    else:
        control = _CONTROL.search(text)
        if control is not None:
            problem = f"holds a control character (0x{ord(control.group()):02x})"
        elif ":" in text:
            problem = "holds a ':', which Hadoop's paths cannot name"
        else:
            return None
    return (
        f"landing file name {shown} {problem}: the file was not read. Rename it (printable UTF-8, no ':'); "
        "the next ingestion reads it"
    )


def shown_name(name: str | bytes) -> str:
    """A name as one printable line: control characters and bytes that are not UTF-8 escaped."""
    text = os.fsencode(name).decode("utf-8", errors="backslashreplace")
    return repr(text) if _CONTROL.search(text) or "\\x" in text else text


def writer_uids(folder: str | bytes | None = None) -> frozenset[int]:
    """The owners whose landing files are read: this process's user, the owner of the landing
    `folder` (who decides what lands in it anyway: a writer that owns the folder it writes to
    keeps being read), and the setting's."""
    uids = {os.geteuid()}
    if folder is not None:
        uids.add(os.stat(folder).st_uid)
    for item in os.environ.get(WRITER_UIDS_SETTING, "").split(","):
        item = item.strip()
        if not item:
            continue
        if item.isdigit():
            uids.add(int(item))
            continue
        import pwd

        try:
            uids.add(pwd.getpwnam(item).pw_uid)
        except KeyError:
            raise ValueError(
                f"{WRITER_UIDS_SETTING}: {item!r} is neither a uid nor a user of this machine; "
                "give uids or user names, comma-separated"
            ) from None
    return frozenset(uids)


_KINDS = (
    (stat.S_ISLNK, "a symbolic link (its target is not followed)"),
    (stat.S_ISDIR, None),  # a folder is not a landing file: ignored, as before
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def refused_entry(entry: os.stat_result, uids: frozenset[int]) -> str | None:
    """Why a landing folder's entry (its `os.lstat`) is skipped, unread; "" for a folder (ignored
    silently); None when it is a regular file of an allowed owner."""
    for test, kind in _KINDS:
        if test(entry.st_mode):
            return "" if kind is None else f"{kind}, not a regular file: not read; landing files must be regular files"
    if entry.st_uid not in uids:
        return (
            f"owned by uid {entry.st_uid}, not by this pipeline's user (uid {os.geteuid()}) nor the landing "
            f"folder's owner: not read. Have the writer run as one of them, or list its uid in {WRITER_UIDS_SETTING}"
        )
    return None
