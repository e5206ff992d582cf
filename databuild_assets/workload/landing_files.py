"""JSON Lines landing files of a generated workload, as real writers leave them: numbered files
published atomically, some events handed over late, some redelivered, some broken lines.

    summary = write_landing_files("/tmp/landing", 1_000_000, bad_line_rate=0.001, duplicate_rate=0.01)
"""

from __future__ import annotations

import heapq
import os
import random
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import NamedTuple

from databuild_assets.events.enums import BuildRequestStatus, JobStatus, PartitionStatus
from databuild_assets.workload.encoding import encode_json, uuid4
from databuild_assets.workload.event_stream import DEFAULT_START_NS, StreamEvent, event_dict, stream_events
from databuild_assets.workload.simulation import check_workload

# Share of events a writer hands over late, in a later file than their neighbours in time.
DEFAULT_LATE_ARRIVAL_RATE = 0.002


class HeldLine(NamedTuple):
    """A line held back (late, or a redelivery) until `release_after` good lines are written."""

    release_after: int
    sequence: int  # the order lines held for the same release are written in
    line: str


_escape = encode_basestring_ascii
# Escaped JobConfig JSON by its text: a config is shared by every event of its job and jobs repeat.
_escaped_configs: dict[str, str] = {}


def _strings(values: list[str]) -> str:
    return "[" + ",".join(map(_escape, values)) + "]"


def _event_line(item: StreamEvent) -> str:
    """`encode_json(event_dict(item)) + "\n"`, byte for byte, about three times faster: the frequent
    payloads are formatted from templates (tests compare every line with json.dumps)."""
    timestamp, _sequence, event_type, p, event_id, build_request_id = item
    if event_type == "partition_event":
        if "job_run_id" in p:
            body = '{"partition_ref":%s,"status_code":%d,"status_name":"%s","message":%s,"job_run_id":"%s"}' % (
                _escape(p["partition_ref"]),
                p["status_code"],
                p["status_name"],
                _escape(p["message"]),
                p["job_run_id"],
            )
        else:
            body = '{"partition_ref":%s,"status_code":%d,"status_name":"%s","message":%s}' % (
                _escape(p["partition_ref"]),
                p["status_code"],
                p["status_name"],
                _escape(p["message"]),
            )
    elif event_type == "job_event":
        config = _escaped_configs.get(p["config"])
        if config is None:
            if len(_escaped_configs) > 100_000:
                _escaped_configs.clear()
            config = _escaped_configs[p["config"]] = _escape(p["config"])
        body = (
            '{"job_run_id":"%s","job_label":%s,"target_partitions":%s,"status_code":%d,"status_name":"%s",'
            '"message":%s,"config":%s%s}'
            % (
                p["job_run_id"],
                _escape(p["job_label"]),
                _strings(p["target_partitions"]),
                p["status_code"],
                p["status_name"],
                _escape(p["message"]),
                config,
                ',"manifests":' + _escape(p["manifests"]) if "manifests" in p else "",
            )
        )
    elif event_type == "build_request_event":
        body = '{"status_code":%d,"status_name":"%s","requested_partitions":%s,"message":%s}' % (
            p["status_code"],
            p["status_name"],
            _strings(p["requested_partitions"]),
            _escape(p["message"]),
        )
    else:
        body = encode_json(p)
    return '{"event_id":"%s","timestamp":%d,"build_request_id":"%s","event_type":"%s","%s":%s}\n' % (
        event_id,
        timestamp,
        build_request_id,
        event_type,
        event_type,
        body,
    )


@dataclass(frozen=True)
class WorkloadSummary:
    """What `write_landing_files` wrote. Lines reconcile like ingestion's counts must:
    lines_written == events_written + bad_lines_written + duplicate_lines_written."""

    files: tuple[Path, ...]  # in write order, which is also their sorted order
    events_written: int  # distinct events
    bad_lines_written: int
    duplicate_lines_written: int  # good events written again, byte for byte
    lines_written: int
    late_arrivals: int  # events held back and written after later ones, often in a later file


_BAD_KINDS = (
    "not_json",
    "truncated",
    "unknown_event_type",
    "status_out_of_range",
    "status_name_mismatch",
    "missing_event_id",
    "empty",
)
_NOT_JSON = (
    "WARN bel-writer: flush failed, retrying batch {n}",
    "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>",
    "event_id={id},event_type=job_event,status=JOB_RUNNING",
    "{{'event_id': '{id}', 'event_type': 'partition_event'}}",
)
_UNKNOWN_EVENT_TYPES = ("job_retry_event", "partition_evnt", "PartitionEvent", "build_request")
_STATUS_ENUMS = {"build_request_event": BuildRequestStatus, "partition_event": PartitionStatus, "job_event": JobStatus}

# A status-bearing event to corrupt when a bad line is due before any such event was written.
_FALLBACK_STATUS_EVENT = {
    "event_id": "00000000-0000-4000-8000-000000000000",
    "timestamp": DEFAULT_START_NS,
    "build_request_id": "00000000-0000-4000-8000-000000000000",
    "event_type": "build_request_event",
    "build_request_event": {"status_code": 1, "status_name": "BUILD_REQUEST_RECEIVED", "requested_partitions": []},
}


def _bad_line(rng: random.Random, event: dict, status_event: dict) -> str:
    """One line that ingestion must quarantine, made from a good event by a typical writer bug."""
    kind = rng.choice(_BAD_KINDS)
    if kind == "empty":
        return rng.choice(("", "   "))
    if kind == "not_json":
        return rng.choice(_NOT_JSON).format(n=rng.randint(1, 99_999), id=uuid4(rng))
    bad = dict(event, event_id=uuid4(rng))  # a fresh id: a bad line never shadows a good event
    if kind == "truncated":  # a writer killed mid-line
        text = encode_json(bad)
        return text[: rng.randint(1, len(text) - 1)]
    if kind == "missing_event_id":
        del bad["event_id"]
        return encode_json(bad)
    if kind == "unknown_event_type":
        bad["event_type"] = rng.choice(_UNKNOWN_EVENT_TYPES)
        return encode_json(bad)
    event_type = status_event["event_type"]
    payload = dict(status_event[event_type])
    bad = dict(status_event, event_id=uuid4(rng))
    bad[event_type] = payload
    enum = _STATUS_ENUMS[event_type]
    if kind == "status_out_of_range":
        payload["status_code"] = rng.choice((-1, max(enum) + 1, 42, 99))
    else:  # status_name_mismatch: a writer with a stale enum table
        payload["status_name"] = rng.choice([m.name for m in enum if m != payload["status_code"]])
    return encode_json(bad)


class _LandingFiles:
    """Writes numbered landing files, each atomically: to a hidden temp name, then renamed, so that
    ingestion (which skips names starting with "." or "_") never reads half a file."""

    _BUFFER_LINES = 4096  # one write() per this many lines: much faster than one per line

    def __init__(self, out_dir: Path, events_per_file: int) -> None:
        self.out_dir = out_dir
        self.events_per_file = events_per_file
        self.files: list[Path] = []
        self.handle = None
        self.temp_path: Path | None = None
        self.good_in_file = 0
        self.buffer: list[str] = []

    def write_good(self, line: str) -> None:
        if self.handle is None or self.good_in_file == self.events_per_file:
            self._next_file()
        self.good_in_file += 1
        self.write_extra(line)

    def write_extra(self, line: str) -> None:
        """A bad or duplicate line: it goes with the current file and does not count toward its size."""
        self.buffer.append(line)
        if len(self.buffer) >= self._BUFFER_LINES:
            self.handle.write("".join(self.buffer))
            self.buffer.clear()

    def _next_file(self) -> None:
        self.close()
        final = self.out_dir / f"events-{len(self.files):05d}.jsonl"
        self.temp_path = self.out_dir / f".{final.name}.tmp"
        self.handle = open(self.temp_path, "w", encoding="utf-8", newline="\n")
        self.files.append(final)
        self.good_in_file = 0

    def close(self) -> None:
        """Publish the current file under its final name."""
        if self.handle is not None:
            self.handle.write("".join(self.buffer))
            self.buffer.clear()
            self.handle.close()
            self.handle = None
            os.replace(self.temp_path, self.files[-1])
            self.temp_path = None

    def abandon(self) -> None:
        """After a failure: remove the unfinished temp file, publish nothing more."""
        self.buffer.clear()
        if self.handle is not None:
            self.handle.close()
            self.handle = None
            self.files.pop()
        if self.temp_path is not None:
            self.temp_path.unlink(missing_ok=True)
            self.temp_path = None


def write_landing_files(
    out_dir: str | os.PathLike,
    n_events: int,
    seed: int = 0,
    events_per_file: int = 100_000,
    days: int = 3,
    bad_line_rate: float = 0.0,
    duplicate_rate: float = 0.0,
    *,
    start_ns: int = DEFAULT_START_NS,
    late_arrival_rate: float = DEFAULT_LATE_ARRIVAL_RATE,
) -> WorkloadSummary:
    """Write `generate_events(n_events, seed, days, start_ns)` as JSON Lines landing files
    `events-00000.jsonl`, ... into `out_dir` (created if missing, refused if it already holds
    landing files), `events_per_file` distinct events per file. Use it to stage input for ingestion.

    Like real writers, it hands over a share `late_arrival_rate` of events late (often in a later
    file), and adds EXTRA lines: after each event, with probability `bad_line_rate`, one bad line
    (not JSON, truncated, unknown event_type, status code out of range, status name not matching
    its code, no event_id, empty), and each event is redelivered with probability `duplicate_rate`,
    later in the same or a later file. Same arguments, same bytes.
    Example: `write_landing_files("/tmp/landing", 1_000_000, bad_line_rate=0.001, duplicate_rate=0.01)`.
    """
    for name, rate in (
        ("bad_line_rate", bad_line_rate),
        ("duplicate_rate", duplicate_rate),
        ("late_arrival_rate", late_arrival_rate),
    ):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{name} is {rate}; it must be a fraction between 0 and 1")
    if events_per_file < 1:
        raise ValueError(f"events_per_file is {events_per_file}; it must be 1 or more")
    check_workload(n_events, days, start_ns)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(out.glob("events-*.jsonl"))
    if existing:
        raise FileExistsError(
            f"{out} already holds landing files ({existing[0].name} and {len(existing) - 1} more); "
            "write each workload into an empty directory so that two workloads never mix"
        )
    # One generator per kind of noise, so that changing one rate leaves the rest of the output alone.
    late_rng, duplicate_rng, bad_rng = (
        random.Random(f"databuild-workload/{seed}/{kind}") for kind in ("late", "duplicate", "bad")
    )
    held: list[HeldLine] = []  # late events
    redeliveries: list[HeldLine] = []  # duplicates, the same way
    sequence = good = bad = duplicates = late = 0
    status_event: StreamEvent | None = None
    files = _LandingFiles(out, events_per_file)

    def write_good(line: str) -> None:
        nonlocal good, sequence
        files.write_good(line)
        good += 1
        if duplicate_rate and duplicate_rng.random() < duplicate_rate:
            delay = (
                duplicate_rng.randint(1, 1000)
                if duplicate_rng.random() < 0.7
                else duplicate_rng.randint(1, events_per_file)
            )
            heapq.heappush(redeliveries, HeldLine(good + delay, sequence, line))
            sequence += 1

    def write_due_duplicates(final: bool = False) -> None:
        nonlocal duplicates
        while redeliveries and (final or redeliveries[0].release_after <= good):
            files.write_extra(heapq.heappop(redeliveries).line)
            duplicates += 1

    try:
        for item in stream_events(n_events, seed, days, start_ns):
            line = _event_line(item)
            if late_arrival_rate and late_rng.random() < late_arrival_rate:
                delay = (
                    late_rng.randint(1, 200)
                    if late_rng.random() < 0.5
                    else late_rng.randint(events_per_file // 2 + 1, 2 * events_per_file)
                )
                heapq.heappush(held, HeldLine(good + delay, sequence, line))
                sequence += 1
                late += 1
            else:
                write_good(line)
            while held and held[0].release_after <= good:
                write_good(heapq.heappop(held).line)
            if bad_line_rate:
                if item.event_type in _STATUS_ENUMS:
                    status_event = item
                if files.handle is not None and bad_rng.random() < bad_line_rate:
                    status = event_dict(status_event) if status_event else _FALLBACK_STATUS_EVENT
                    files.write_extra(_bad_line(bad_rng, event_dict(item), status) + "\n")
                    bad += 1
            if redeliveries:
                write_due_duplicates()
        while held:
            write_good(heapq.heappop(held).line)
        write_due_duplicates(final=True)
        files.close()
    except BaseException:
        files.abandon()
        raise
    return WorkloadSummary(
        files=tuple(files.files),
        events_written=good,
        bad_lines_written=bad,
        duplicate_lines_written=duplicates,
        lines_written=good + bad + duplicates,
        late_arrivals=late,
    )
