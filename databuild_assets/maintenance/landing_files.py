"""Landing files once ingested: retention (archive or delete after an age) and erasure (rewrite
without the lines a tombstone matches). Only files the ingest ledger records as read by a
committed batch are touched, so nothing is lost and nothing is ingested twice.

Retention runs with vacuum; erasure runs in compaction. Both act on a local lake root or one on
S3 (runtime/files.py: each store's own way to replace a file whole), and refuse, changing nothing,
on any other (docs/decisions/0017-landing-files-and-erasure.md).

    retain_landing_files(spark, Lake("/data/lake"), retention_days=7, mode="archive")
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from databuild_assets.events.erasure_rule import matches
from databuild_assets.events.validation import parse_line
from databuild_assets.ingest.landing import IngestedFile, ingested_files
from databuild_assets.ingest.landing_folder import LandingFile, list_landing_files
from databuild_assets.ingest.lines import read_landing_lines
from databuild_assets.maintenance.tombstones import (
    Tombstone,
    event_matches,
    line_matcher,
    text_mentions,
    with_erasure_data,
)
from databuild_assets.runtime.files import LocalFiles, ObjectFiles, files_for, lines_of
from databuild_assets.runtime.lake import Lake, is_local
from databuild_assets.runtime.object_store import is_s3

log = logging.getLogger(__name__)

RETENTION_MODES = ("archive", "delete")
DEFAULT_RETENTION_DAYS = 7.0
DEFAULT_RETENTION_MODE = "archive"
# Rewrites are written under this hidden name in the archive folder, then renamed: neither
# ingestion nor retention lists a hidden name, and a crash leaves only a temp file to clear.
TEMP_PREFIX = ".erasure-"
_DAY_MS = 86_400_000
# Up to this many tombstones, only the lines that may hold one are parsed, here
# (`_matching_lines_without_spark`); past it, one substring search per value and line costs
# more than Spark's parse of every line.
_PREFILTER_MAX_VALUES = 64
_SCAN_CHUNK = 8 << 20
# The only JSON escapes that can spell a printable ASCII character other than '"', '\\' or '/':
# a writer that escapes letters or digits, or some '/' of a value and not others.
_ESCAPES = (b"\\u", b"\\/")


class LandingFilesError(RuntimeError):
    """Landing files cannot be archived, deleted or rewritten as asked; what it names is unchanged."""


@dataclass(frozen=True)
class LandingInventory:
    """The landing and archive folders, sorted by what the ingest ledger says of each file."""

    # (file, its ledger record): a committed batch read exactly this file
    ingested: tuple[tuple[LandingFile, IngestedFile], ...] = ()
    # no committed batch read it (new, planned by a batch not yet committed, or not settled)
    not_ingested: tuple[LandingFile, ...] = ()
    # a committed batch read this path, but the file has grown or changed since: it holds
    # bytes no batch read, so it is neither retained nor rewritten (it is logged)
    changed: tuple[tuple[LandingFile, IngestedFile], ...] = ()
    # files in the archive folder, with the ledger record of the landing file they came from
    archived: tuple[tuple[LandingFile, IngestedFile | None], ...] = ()


@dataclass(frozen=True)
class LandingRetentionResult:
    mode: str
    retention_days: float | None
    archived: tuple[str, ...] = ()  # landing files moved to the archive folder
    deleted: tuple[str, ...] = ()  # landing (or, in delete mode, archived) files deleted
    bytes_deleted: int = 0
    not_ingested: int = 0  # landing files kept: not ingested yet
    changed: tuple[str, ...] = ()  # landing files kept: changed since their batch read them
    younger: int = 0  # ingested files kept: ingested less than retention_days ago
    conflicts: tuple[str, ...] = ()  # landing files kept: the archive already holds that name


@dataclass(frozen=True)
class LandingRewrite:
    source: str  # the file that held erased lines
    target: str | None  # its rewrite in the archive folder; None when every line was erased
    lines_read: int
    lines_removed: int


@dataclass(frozen=True)
class LandingErasureResult:
    files_scanned: int = 0  # ingested landing files and archived files read
    files_parsed: int = 0  # of those, the ones with a line that may hold a tombstone's value (parsed)
    rewrites: tuple[LandingRewrite, ...] = ()
    not_ingested: int = 0  # landing files not read: not ingested yet (the next compaction after does)
    changed: tuple[str, ...] = ()  # landing files not read: changed since their batch read them

    @property
    def files_rewritten(self) -> int:
        return sum(rewrite.target is not None for rewrite in self.rewrites)

    @property
    def files_removed(self) -> int:
        return sum(rewrite.target is None for rewrite in self.rewrites)

    @property
    def lines_removed(self) -> int:
        return sum(rewrite.lines_removed for rewrite in self.rewrites)


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _qualified(spark: SparkSession, path: str) -> str:
    """`path` spelled as Hadoop lists it (file:/..., s3a://...): the ledger's spelling."""
    hadoop_path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path)
    filesystem = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return filesystem.makeQualified(hadoop_path).toString()


def _list(spark: SparkSession, folder: str) -> list[LandingFile]:
    """The landing files (JSON Lines, not hidden) in `folder`; none when it does not exist."""
    hadoop_path = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(folder)
    if not hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(hadoop_path):
        return []
    return list_landing_files(spark, folder)


def landing_inventory(spark: SparkSession, lake: Lake) -> LandingInventory:
    """Which landing files are ingested, by the ledger's committed batches (any filesystem).

    A file counts as ingested when a committed batch planned its path at its present size and
    it has not been modified since that plan: a name used again, or a file appended to after
    its batch, holds bytes no batch read.
    """
    ledger = ingested_files(spark, lake)
    ingested, not_ingested, changed = [], [], []
    for landing_file in _list(spark, lake.landing):
        record = ledger.get(landing_file.path)
        if record is None:
            not_ingested.append(landing_file)
        elif landing_file.size != record.size or landing_file.modified_ms > record.planned_at_ms:
            changed.append((landing_file, record))
        else:
            ingested.append((landing_file, record))
    landing = _qualified(spark, lake.landing)
    archived = [(f, ledger.get(f"{landing}/{_name(f.path)}")) for f in _list(spark, lake.landing_archive)]
    for landing_file, record in changed:
        log.warning(
            "landing file %s is not retained or rewritten: ingestion batch %d read %d bytes of it, and it is now %d "
            "bytes and modified since. Those bytes were never ingested (a path is ingested once): land them "
            "under a new name, then remove this file.",
            landing_file.path,
            record.batch_id,
            record.size,
            landing_file.size,
        )
    return LandingInventory(tuple(ingested), tuple(not_ingested), tuple(changed), tuple(archived))


def _check_retention(retention_days: float, mode: str) -> None:
    if mode not in RETENTION_MODES:
        raise LandingFilesError(
            f"landing retention mode {mode!r} is not one of {', '.join(RETENTION_MODES)}; nothing was changed"
        )
    if retention_days < 0:
        raise LandingFilesError(f"landing retention of {retention_days} days is negative; nothing was changed")


def _refuse_remote(lake: Lake, what: str, paths: list[str]) -> None:
    if paths and not (is_local(lake.root) or is_s3(lake.root)):
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        raise LandingFilesError(
            f"{what} {len(paths)} landing files under {lake.root}, which is neither a local folder nor on S3; "
            f"this release changes landing files there only, and nothing was changed: {shown}. Move or delete "
            "them with the storage's own tools (docs/erasure.md)."
        )


def retain_landing_files(
    spark: SparkSession,
    lake: Lake,
    retention_days: float | None,
    mode: str = DEFAULT_RETENTION_MODE,
    now_ms: int | None = None,
) -> LandingRetentionResult:
    """Move (mode "archive") or delete (mode "delete") the landing files ingested at least
    `retention_days` ago; in delete mode, also delete archived files that old. `None` keeps every file.

    A file no committed batch read is never touched, nor one changed since its batch read it.
    An archived file's age counts from its ingestion too. Deletes and renames are made durable
    (the folder is fsynced) before the call returns.

        result = retain_landing_files(spark, lake, retention_days=30, mode="delete")
    """
    if retention_days is None:
        log.info("landing retention is off: every landing file is kept")
        return LandingRetentionResult(mode, None)
    _check_retention(retention_days, mode)
    inventory = landing_inventory(spark, lake)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms

    def due(record: IngestedFile) -> bool:
        return now_ms - record.committed_at_ms >= retention_days * _DAY_MS

    landing_due = [f for f, record in inventory.ingested if due(record)]
    archive_due = [f for f, record in inventory.archived if mode == "delete" and record is not None and due(record)]
    _refuse_remote(lake, f"landing retention ({mode}) would act on", [f.path for f in landing_due + archive_due])

    archived, deleted, conflicts, bytes_deleted = [], [], [], 0
    files = files_for(lake.root)
    archive_folder = files.path(_qualified(spark, lake.landing_archive)) if landing_due else None
    for landing_file in landing_due:
        if mode == "delete":
            files.remove(landing_file.path)
            deleted.append(landing_file.path)
            bytes_deleted += landing_file.size
            continue
        target = f"{archive_folder}/{_name(landing_file.path)}"
        if files.exists(target) and files.same_content(landing_file.path, target):
            # A move interrupted after its copy (on S3 a move is a copy, then a delete): finish it.
            files.remove(landing_file.path)
            archived.append(landing_file.path)
            continue
        if files.exists(target):
            # An erasure rewrite interrupted between its rename and the removal of its source
            # leaves both; the next compaction completes it. Anything else is for a person.
            log.warning("landing file %s is not archived: %s already exists", landing_file.path, target)
            conflicts.append(landing_file.path)
            continue
        files.move(landing_file.path, target)
        archived.append(landing_file.path)
    for archived_file in archive_due:
        files.remove(archived_file.path)
        deleted.append(archived_file.path)
        bytes_deleted += archived_file.size
    if landing_due or archive_due:
        files.sync(_qualified(spark, lake.landing), _qualified(spark, lake.landing_archive))

    result = LandingRetentionResult(
        mode,
        retention_days,
        tuple(archived),
        tuple(deleted),
        bytes_deleted,
        len(inventory.not_ingested),
        tuple(f.path for f, _ in inventory.changed),
        len(inventory.ingested) - len(landing_due),
        tuple(conflicts),
    )
    log.info(
        "landing retention (%s after %s days): %d archived, %d deleted (%d bytes); kept %d not ingested, %d younger, "
        "%d changed since ingestion, %d already in the archive",
        mode,
        retention_days,
        len(archived),
        len(deleted),
        bytes_deleted,
        result.not_ingested,
        result.younger,
        len(result.changed),
        len(conflicts),
    )
    return result


def _matching_lines(
    spark: SparkSession, paths: list[str], tombstones: list[Tombstone]
) -> dict[str, tuple[int, set[int]]]:
    """For each of `paths` holding a line a tombstone matches: (lines in the file, those lines' numbers).

    A good line matches by the event rule (`event_matches` on the event it parses to, as the
    raw log holds it); a bad line, which has no fields, when its text contains a value (the
    rule that purges the quarantine). Lines are numbered as ingestion numbers them.
    """
    lines = with_erasure_data(read_landing_lines(spark, paths), tombstones)
    matched = F.when(F.col("reason").isNull(), event_matches(tombstones)).otherwise(text_mentions("line", tombstones))
    per_file = (
        lines.groupBy("source_file")
        .agg(F.count(F.lit(1)).alias("lines"), F.collect_list(F.when(matched, F.col("line_number"))).alias("matched"))
        .where(F.size("matched") > 0)
        .collect()
    )
    return {row.source_file: (row.lines, set(row.matched)) for row in per_file}


def _literal_core(value: str) -> bytes:
    """The longest run of `value` that every JSON spelling of it without a \\u escape writes as is:
    printable ASCII but '"', '\\' and '/' (which writers may escape)."""
    runs = re.split(r'[^\x20-\x7e]|["\\\\/]', value)
    return max(runs, key=len).encode("ascii")


def _matching_lines_without_spark(
    files: LocalFiles | ObjectFiles, paths: list[str], tombstones: list[Tombstone]
) -> tuple[dict[str, tuple[int, set[int]]], int] | None:
    """`_matching_lines` read line by line here, for few tombstones, and how many files had a line
    to parse (None: too many tombstones, or a value with no literal core: Spark parses them all).

    A line that matches holds its value (in a field, or in a JSON text field inside one) in some
    JSON spelling, and every spelling without a \\u escape holds the value's literal core as is: a
    line holding no core and no escape that could spell one otherwise cannot match, and is not
    parsed. The others are parsed as ingestion parses them (`parse_line`) and matched by the same
    rule (`erasure_rule.matches`; a bad line by its text, as `text_mentions`)."""
    cores = sorted({_literal_core(t.value) for t in tombstones})
    if len(cores) > _PREFILTER_MAX_VALUES or not all(cores):
        return None
    needles = [*cores, *_ESCAPES]
    values_by_key: dict[str, set[str]] = {}
    for tombstone in tombstones:
        values_by_key.setdefault(tombstone.key, set()).add(tombstone.value)
    mentions = line_matcher(tombstones)  # a bad line's text, by the quarantine's rule
    found, parsed = {}, 0
    for path in paths:
        with files.open_read(files.path(path)) as stream:
            lines, candidates = _lines_holding(stream, needles)
        matched = set()
        for number, raw in candidates.items():
            event, reason = parse_line(raw)
            if reason is None:
                hit = matches(event, values_by_key)
            else:  # a bad line: its text, as the quarantine holds it
                hit = mentions(raw.decode("utf-8", errors="replace"))
            if hit:
                matched.add(number)
        parsed += bool(candidates)
        if matched:
            found[path] = (lines, matched)
    return found, parsed


def _lines_holding(stream, needles: list[bytes]) -> tuple[int, dict[int, bytes]]:
    """How many lines the stream has (split after b"\\n" only, as ingestion splits them), and the
    lines holding any of `needles` by their number (without their b"\\n"). The bytes are searched
    a chunk of whole lines at a time; only the lines around a hit are cut out.

    Linear in the stream's size, however long a line: the pieces of a line that spans chunks
    are kept apart and joined once, when its newline (or the end) comes, never copied again per
    chunk read."""
    lines, found = 0, {}
    pending: list[bytes] = []  # the pieces of the line not ended yet (none holds a b"\\n")
    while True:
        chunk = stream.read(_SCAN_CHUNK)
        if chunk:
            end = chunk.rfind(b"\n") + 1
            if end == 0:  # still inside one line
                pending.append(chunk)
                continue
            whole = b"".join([*pending, chunk[:end]]) if pending else chunk[:end]
            pending = [chunk[end:]] if end < len(chunk) else []
        else:
            whole, pending = b"".join(pending), []
        starts = set()  # of the lines holding a needle
        for needle in needles:
            at = whole.find(needle)
            while at >= 0:
                starts.add(whole.rfind(b"\n", 0, at) + 1)
                next_line = whole.find(b"\n", at) + 1
                at = whole.find(needle, next_line) if next_line else -1
        number, counted_to = lines, 0
        for start in sorted(starts):
            number += whole.count(b"\n", counted_to, start)
            counted_to = start
            stop = whole.find(b"\n", start)
            found[number + 1] = whole[start : len(whole) if stop < 0 else stop]
        lines += whole.count(b"\n") + (1 if not chunk and whole and not whole.endswith(b"\n") else 0)
        if not chunk:
            return lines, found


def _rewrite(
    files: LocalFiles | ObjectFiles, source: str, target: str, drop: set[int], expected_lines: int
) -> LandingRewrite:
    """Copy `source` to `target` byte for byte but for the lines numbered in `drop`, through a
    hidden temp file beside `target` (made durable, then moved over it); then remove `source` if
    it is another file. Every line is erased: no target, `source` removed."""
    temp = f"{target.rsplit('/', 1)[0]}/{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{_name(target)}"
    read = kept = 0
    try:
        with files.open_read(source) as lines, files.open_new(temp) as out:
            for number, raw in enumerate(lines_of(lines), 1):
                read = number
                if number not in drop:
                    out.write(raw)
                    kept += 1
            files.finish(out)
        if read != expected_lines or max(drop) > read:
            raise LandingFilesError(
                f"{source}: not rewritten, unchanged: it has {read} lines now and had {expected_lines} when compaction "
                "read it, so the lines to erase cannot be told apart. Landed files must not change; the next "
                "compaction tries again."
            )
        if kept == 0:
            files.remove(temp)
        elif source != target and files.exists(target) and not files.same_content(target, temp):
            raise LandingFilesError(
                f"{source} holds erased lines, but {target} already exists with other content: nothing was "
                f"changed. Compare the two, move the one that is not a copy of {_name(source)} "
                "elsewhere, then run compaction again."
            )
        else:
            files.move(temp, target)
            files.sync(target.rsplit("/", 1)[0])
        if source != target or kept == 0:
            files.remove(source)
            files.sync(source.rsplit("/", 1)[0])
    finally:
        if files.exists(temp):
            files.remove(temp)
    return LandingRewrite(source, target if kept else None, read, read - kept)


def erase_from_landing_files(spark: SparkSession, lake: Lake, tombstones: list[Tombstone]) -> LandingErasureResult:
    """Rewrite every ingested landing file and every archived file that holds a line a tombstone
    matches: into the archive folder without those lines (the others byte for byte), the
    original removed; a file whose every line matches is removed. Landing files not ingested
    yet are not touched: ingestion must read them as they are, and the compaction after does.

    The ledger keys files by path, so a landing file moved out is never read again. A file
    whose line count changed between the scan and the rewrite is left unchanged (an error).

        result = erase_from_landing_files(spark, lake, read_tombstones(spark, lake))
    """
    if not tombstones:
        return LandingErasureResult()
    inventory = landing_inventory(spark, lake)
    if is_local(lake.root) or is_s3(lake.root):
        _remove_stale_temps(spark, lake)
    paths = [f.path for f, _ in inventory.ingested] + [f.path for f, _ in inventory.archived]
    not_read = {"not_ingested": len(inventory.not_ingested), "changed": tuple(f.path for f, _ in inventory.changed)}
    if not paths:
        return LandingErasureResult(**not_read)
    files = files_for(lake.root)
    here = _matching_lines_without_spark(files, paths, tombstones) if is_local(lake.root) or is_s3(lake.root) else None
    matching, parsed = here if here is not None else (_matching_lines(spark, paths, tombstones), len(paths))
    _refuse_remote(lake, "erasure would rewrite", sorted(matching))
    archive = files.path(_qualified(spark, lake.landing_archive))
    rewrites, failures = [], []
    # Archived files first: a landing file's rewrite then finds an archived copy from an
    # interrupted run already rewritten for the same tombstones, and completes that run.
    archived_paths = {f.path for f, _ in inventory.archived}
    for path, (lines, drop) in sorted(matching.items(), key=lambda match: (match[0] not in archived_paths, match[0])):
        try:
            rewrites.append(_rewrite(files, files.path(path), f"{archive}/{_name(path)}", drop, lines))
        except LandingFilesError as error:  # the other files are still rewritten; the run fails below
            log.error("%s", error)
            failures.append(str(error))
            continue
        log.info(
            "erasure: %s -> %s, %d of %d lines removed",
            path,
            rewrites[-1].target or "(removed: every line erased)",
            rewrites[-1].lines_removed,
            lines,
        )
    if failures:
        raise LandingFilesError(f"{len(failures)} landing files still hold erased lines: " + " | ".join(failures))
    result = LandingErasureResult(len(paths), parsed, tuple(rewrites), **not_read)
    log.info(
        "erasure in landing files: %d read, %d of them parsed (the others hold no value), %d rewritten, %d removed, "
        "%d lines removed; %d not ingested yet (not read)",
        result.files_scanned,
        result.files_parsed,
        result.files_rewritten,
        result.files_removed,
        result.lines_removed,
        result.not_ingested,
    )
    return result


def _remove_stale_temps(spark: SparkSession, lake: Lake) -> None:
    """Temp files a crashed rewrite left (compaction runs one at a time: none is in use)."""
    files = files_for(lake.root)
    archive = _qualified(spark, lake.landing_archive)
    for name in files.list_names(archive):
        if name.startswith(TEMP_PREFIX):
            log.warning("removing %s/%s, left by an interrupted erasure rewrite", archive, name)
            files.remove(f"{archive}/{name}")
