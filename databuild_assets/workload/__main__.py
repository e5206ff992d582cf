"""Write a DataBuild workload as JSON Lines landing files.

Example: `python -m databuild_assets.workload --out /tmp/landing --events 1000000 --seed 7 --bad-line-rate 0.001`
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from databuild_assets.workload import DEFAULT_LATE_ARRIVAL_RATE, DEFAULT_START_NS, write_landing_files


def _epoch_ns(text: str) -> int:
    """An ISO 8601 instant (UTC unless it says otherwise) as Unix epoch nanoseconds."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1_000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m databuild_assets.workload", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write events-NNNNN.jsonl into (must hold none yet)")
    parser.add_argument("--events", type=int, required=True, help="number of distinct events")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    parser.add_argument(
        "--events-per-file", type=int, default=100_000, help="distinct events per file (default 100000)"
    )
    parser.add_argument("--days", type=int, default=3, help="days the build requests spread over (default 3)")
    parser.add_argument(
        "--start",
        type=_epoch_ns,
        default=DEFAULT_START_NS,
        help="ISO 8601 instant the workload ends at (default 2026-11-18T00:00:00Z)",
    )
    parser.add_argument("--bad-line-rate", type=float, default=0.0, help="extra bad lines per event (default 0)")
    parser.add_argument("--duplicate-rate", type=float, default=0.0, help="share of events redelivered (default 0)")
    parser.add_argument(
        "--late-arrival-rate",
        type=float,
        default=DEFAULT_LATE_ARRIVAL_RATE,
        help=f"share of events handed over late (default {DEFAULT_LATE_ARRIVAL_RATE})",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        summary = write_landing_files(
            args.out,
            args.events,
            seed=args.seed,
            events_per_file=args.events_per_file,
            days=args.days,
            bad_line_rate=args.bad_line_rate,
            duplicate_rate=args.duplicate_rate,
            start_ns=args.start,
            late_arrival_rate=args.late_arrival_rate,
        )
    except (ValueError, FileExistsError) as error:
        parser.exit(2, f"error: {error}\n")
    elapsed = time.perf_counter() - started
    print(
        f"wrote {summary.events_written:,} events + {summary.bad_lines_written:,} bad + "
        f"{summary.duplicate_lines_written:,} duplicate lines = {summary.lines_written:,} lines "
        f"({summary.late_arrivals:,} late) in {len(summary.files)} files to {args.out} in {elapsed:.1f} s"
    )


if __name__ == "__main__":
    main()
