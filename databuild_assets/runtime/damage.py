"""A damaged or missing file of a local lake, as one line: the table, the file, what is wrong and
the commands to run. Every reader turns what it met into it: the JVM-free backend (a Parquet read,
a delta-rs open, a commit that does not parse), the sensors, and the Spark jobs (a Java error
whose message names the file, or none: then the tables' logs are read to find it).

A file that is gone is damage only while the table's log still references it at its latest
version: a file a compaction removed and a vacuum deleted while a reader was behind is not, and
the callers go on as before (they read the newer snapshot). Everything here runs only once a
read has failed, so the read path pays nothing for it.

    raise DamagedTableError("raw_event_log", "tables/raw_event_log/_delta_log/00000000000000000007.json",
                            "commit file does not parse", "/data/lake")
    # raw_event_log: tables/raw_event_log/_delta_log/00000000000000000007.json: commit file does not
    # parse. See every damaged file: databuild-assets check delta:///data/lake; mend them:
    # databuild-assets repair delta:///data/lake
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from databuild_assets.runtime.delta_log import (
    LogDamage,
    LogState,
    OutsideTableError,
    commit_path,
    is_table,
    parse_commit,
    read_log,
)

log = logging.getLogger(__name__)


def _captured() -> tuple[type, ...]:
    """Spark's captured JVM error class, when pyspark is loaded: a process that never imported it
    (the query path, which this module serves too) has no Spark error to classify."""
    module = sys.modules.get("pyspark.errors.exceptions.captured")
    return (module.CapturedException,) if module is not None else ()


def _spark_errors() -> tuple[type, ...]:
    """Py4J's and Spark's JVM error classes, of those loaded (`_captured`)."""
    module = sys.modules.get("py4j.protocol")
    return ((module.Py4JJavaError,) if module is not None else ()) + _captured()


_WHAT_CHARS = 240  # an error's own text is cut to this in the line


class DamagedTableError(RuntimeError):
    """A file of a table cannot be read: `file` relative to the lake `root`. Its str() is the
    one line a user sees, naming the `check` and `repair` commands for the lake."""

    def __init__(self, table: str, file: str, what: str, root: str) -> None:
        self.table, self.file, self.what, self.root = table, file, _one_line(what).rstrip("."), root
        super().__init__(
            f"{table}: {file}: {self.what}. See every damaged file: databuild-assets check delta://{root}; "
            f"mend them: databuild-assets repair delta://{root}"
        )

    def __reduce__(self):  # pickled across processes with the fields it was made from
        return (type(self), (self.table, self.file, self.what, self.root))


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _WHAT_CHARS else text[: _WHAT_CHARS - 3] + "..."


def _error_text(error: BaseException) -> str:
    return _one_line(str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__)


def _table_and_root(table_path: str) -> tuple[str, str, str]:
    """(table path, table name, lake root) of a table path: `<root>/tables/<name>`."""
    path = os.path.normpath(table_path.removeprefix("file://").removeprefix("file:"))
    parent = os.path.dirname(path)
    root = os.path.dirname(parent) if os.path.basename(parent) == "tables" else parent
    return path, os.path.basename(path), root


def _in_lake(table_path: str, root: str, file: str) -> str:
    return os.path.relpath(os.path.join(table_path, file), root)


def _log_damage_error(table_path: str, state: LogState) -> DamagedTableError | None:
    """The damage readers of the latest version meet first (the newest), the rest counted."""
    if not state.damage:
        return None
    path, name, root = _table_and_root(table_path)
    damage: LogDamage = max(state.damage, key=lambda d: d.version)
    more = len(state.damage) - 1
    what = damage.what + (f" (and {more} more damaged log file{'s' if more > 1 else ''})" if more else "")
    return DamagedTableError(name, _in_lake(path, root, damage.file), what, root)


def _newest_unreadable(table_path: str, state: LogState) -> DamagedTableError | None:
    """The log's damage when it keeps the latest version from being read (a commit or
    checkpoint beyond the newest whole version); None when only older versions are hurt."""
    whole = -1 if state.version is None else state.version
    if not any(damage.version > whole for damage in state.damage) and state.version is not None:
        return None
    return _log_damage_error(table_path, state)


def log_damage(table_path: str) -> DamagedTableError | None:
    """The damage of a table's Delta log, read file by file (`delta_log.read_log`), or None when
    every commit and checkpoint reads: what a delta-rs or Spark failure to open a table is
    checked against."""
    return _log_damage_error(table_path, read_log(table_path))


def data_file_damage(table_path: str, file: str, error: BaseException) -> DamagedTableError | None:
    """`error`, met reading the data file `file` (relative to the table, unquoted), as damage:
    when the log references the file at its latest version (missing or unreadable), or the log
    itself is damaged. None when the latest version no longer has the file (removed by a commit,
    then vacuumed): the reader was behind, not the disk wrong. None for a PermissionError too:
    the file is there, this process may not read it, and moving it aside would not help."""
    if isinstance(error, PermissionError):
        return None
    state = read_log(table_path)
    path, name, root = _table_and_root(table_path)
    if file in state.files:
        if isinstance(error, FileNotFoundError):
            what = "data file is missing (the log references it)"
        else:
            what = f"data file does not read ({_error_text(error)})"
        return DamagedTableError(name, _in_lake(path, root, file), what, root)
    return _newest_unreadable(table_path, state)


def commit_damage(table_path: str, version: int, error: BaseException) -> DamagedTableError:
    """A commit file that exists but does not parse (commit files appear whole, by a rename, so
    this is never a write in progress), or names a path outside the table (OutsideTableError)."""
    path, name, root = _table_and_root(table_path)
    file = _in_lake(path, root, f"_delta_log/{version:020d}.json")
    if isinstance(error, OutsideTableError):
        return DamagedTableError(name, file, f"commit {version} refused: {_error_text(error)}", root)
    return DamagedTableError(name, file, f"commit file does not parse ({_error_text(error)})", root)


def outside_table_damage(table_path: str, error: OutsideTableError) -> DamagedTableError:
    """A reader's refusal of a path that leaves a local table, as damage: the symlink that leads
    out, or the commit (found by reading the log) that names the path."""
    path, name, root = _table_and_root(table_path)
    if error.link is not None:
        return DamagedTableError(name, _in_lake(path, root, os.path.relpath(error.link, path)), str(error), root)
    named = str(error).split(" (", 1)[0]  # "the log names '<path>'"
    found = next((d for d in read_log(table_path).damage if named in d.what), None)
    if found is not None:
        return DamagedTableError(name, _in_lake(path, root, found.file), found.what, root)
    return DamagedTableError(name, _in_lake(path, root, "_delta_log"), _error_text(error), root)


def new_commits_damage(table_path: str, after: int, newest: int, limit: int = 20) -> DamagedTableError | None:
    """The first commit file after version `after` up to `newest` (at most the last `limit`) that
    does not parse: what a sensor checks before it requests a run over those commits."""
    for version in range(max(after + 1, newest - limit + 1, 0), newest + 1):
        try:
            parse_commit(commit_path(table_path, version))
        except FileNotFoundError:
            continue  # cleaned up after a checkpoint
        except (OSError, ValueError, KeyError, TypeError) as error:
            return commit_damage(table_path, version, error)
    return None


# What Spark and Delta say when a file of a table does not read (the Java exception's text).
_SPARK_DAMAGE = re.compile(
    r"FAILED_READ_FILE|FileNotFoundException|ChecksumException|Corrupt|ParquetDecodingException|"
    r"can not read class org\.apache\.parquet|is not a Parquet file|DeltaFileNotFoundException|"
    r"DELTA_LOG_FILE_NOT_FOUND|DELTA_VERSIONS_NOT_CONTIGUOUS|DELTA_STATE_RECOVER_ERROR|"
    r"DELTA_CHECKPOINT_NON_EXIST|JsonParseException|JsonEOFException|MALFORMED_RECORD"
)


def _java_text(error: BaseException) -> str:
    texts = []
    for link in _chain(error):
        texts.append(str(link))
        if isinstance(link, _captured()):
            texts.append(getattr(link, "_stackTrace", None) or "")
    return "\n".join(texts)


def _spark_what(text: str, table_path: str, file: str) -> str:
    kind = "log file" if file.startswith("_delta_log/") else "data file"
    if not os.path.exists(os.path.join(table_path, file)):
        return f"{kind} is missing (the log references it)"
    if "ChecksumException" in text:
        return f"{kind} does not match its checksum (its .crc file): its bytes changed"
    # The innermost cause says what failed (a page that does not decompress); the path is named already.
    causes = re.findall(r"^(?:Caused by|): ([\w.$]+)(?:: ([^\n]*))?", text, re.MULTILINE)
    if not causes:
        return f"{kind} does not read (Spark gave no cause)"
    name, message = causes[-1]
    message = re.sub(r"(?:file:)?/\S+", "<file>", message).strip()[:120]
    return f"{kind} does not read (Spark: {name.rsplit('.', 1)[-1]}{': ' + message if message else ''})"


def spark_damage(error: BaseException, root: str) -> DamagedTableError | None:
    """A Spark or Delta failure of a job on the local lake at `root`, as damage: the file the
    Java message names (a data file only while the log still references it), else the first
    table whose log is damaged. None when it is no read failure of a file, or none is found."""
    if not isinstance(error, _spark_errors()) or not os.path.isabs(root):
        return None
    text = _java_text(error)
    if not _SPARK_DAMAGE.search(text):
        return None
    root = os.path.normpath(root)
    stale, states = False, {}
    for name, file in re.findall(re.escape(root) + r"/tables/([^/\s]+)/([^\s'\"\]]+)", text):
        file = file.rstrip(".,;:)")
        table_path = os.path.join(root, "tables", name)
        if name not in states:
            states[name] = read_log(table_path)
        state = states[name]
        if file.split("/")[0] == "_delta_log":  # Spark failed on the log: any damage of it
            found = next((d for d in state.damage if d.file == file), None)
            if found is not None:
                return DamagedTableError(name, f"tables/{name}/{file}", found.what, root)
            if (damage := _log_damage_error(table_path, state)) is not None:
                return damage
            if file != "_delta_log":
                return DamagedTableError(name, f"tables/{name}/{file}", _spark_what(text, table_path, file), root)
        elif file in state.files:
            return DamagedTableError(name, f"tables/{name}/{file}", _spark_what(text, table_path, file), root)
        else:
            stale = True  # a data file of an older version, gone since (a vacuum): not damage
            if (damage := _newest_unreadable(table_path, state)) is not None:
                return damage
    if stale:
        return None
    tables = Path(root, "tables")
    for table_path in sorted(tables.iterdir()) if tables.is_dir() else []:
        if is_table(str(table_path)) and (damage := log_damage(str(table_path))) is not None:
            return damage
    return None


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def damage_of(error: BaseException, root: str) -> DamagedTableError | None:
    """The damage a job's failure on the lake at `root` stands for: a DamagedTableError it was
    raised from (a JVM-free read in the job), or the first Spark or Delta failure in its chain
    that `spark_damage` locates. None: the failure is something else."""
    for link in _chain(error):
        if isinstance(link, DamagedTableError):
            return link
    for link in _chain(error):
        if isinstance(link, _spark_errors()):
            return spark_damage(link, root)
    return None


def is_listing_race(error: BaseException) -> bool:
    """Whether `error` is Delta finding a gap in a log listing (DELTA_VERSIONS_NOT_CONTIGUOUS):
    a directory read while commits are written may return a newer commit file and miss the one
    before it (ext4 lists a large folder in hash order). Raised by `damage_reported` only when the
    log shows no gap once read again: then it is that race, and reading again succeeds."""
    return isinstance(error, _spark_errors()) and "DELTA_VERSIONS_NOT_CONTIGUOUS" in _java_text(error)


@contextmanager
def damage_reported(root: str) -> Iterator[None]:
    """Run the block; a failure that is a damaged file of the lake at `root` is raised as its one
    DamagedTableError instead (the Java error it replaces is logged at debug level), anything
    else as it was.

        with damage_reported(lake.root):
            ingest_landing_files(spark, lake)
    """
    try:
        yield
    except Exception as error:
        damage = damage_of(error, root)
        if damage is None or damage is error:
            raise
        log.debug("%s, from:", damage, exc_info=error)
        raise damage from None


__all__ = [
    "DamagedTableError",
    "damage_of",
    "damage_reported",
    "is_listing_race",
    "commit_damage",
    "data_file_damage",
    "log_damage",
    "new_commits_damage",
    "outside_table_damage",
    "spark_damage",
]
