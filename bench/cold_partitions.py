"""A cold partition's events, `get_partition_events`, on lakes whose serving index is built,
against SQLite on the same events, the same refs in one run.

    python -m bench.cold_partitions --lake /var/tmp/new10m [--lake /var/tmp/old10m] [--calls 200] [--fresh 10]

Draws `--calls` refs (seed 3) among those the first lake's index keeps cold
(`cold_partition_events`), then for each lake (in the order given) and for a SQLite BEL of the
first lake's raw log (made once, in `--workdir`) answers each ref once in one process, after one
warm-up call, and prints p50/p95 with the events and segments per ref. Several lakes of the same
events compare index layouts (a lake built at another commit, or its segments rewritten). Then,
for the `--fresh` refs held by the most segments, a new process per ref and backend: imports,
open and the ref's events (what a `databuild-assets query` call pays before it prints).
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

from bench.query_path import ms, percentile
from bench.serving_index import sqlite_of_lake
from databuild_assets.log import SqliteEventLog
from databuild_assets.log.serving.backend import DeltaRsEventLog
from databuild_assets.runtime.lake import Lake


def _cold_refs(lake: Lake, calls: int) -> tuple[list[str], list[int]]:
    """`calls` cold refs of `lake`'s index (with repeats) and how many segments hold each."""
    with DeltaRsEventLog(lake) as log:
        connection = log._store()._connection
        held = dict(connection.execute("SELECT partition_ref, COUNT(*) FROM cold_partition_events GROUP BY 1"))
    rng, cold = random.Random(3), sorted(held)
    refs = [rng.choice(cold) for _ in range(calls)]
    return refs, [held[ref] for ref in refs]


def _answer_times(log, refs: list[str]) -> tuple[list[float], list[int]]:
    log.get_partition_events(refs[0])
    seconds, sizes = [], []
    for ref in refs:
        started = time.perf_counter()
        sizes.append(len(log.get_partition_events(ref)))
        seconds.append(time.perf_counter() - started)
    return seconds, sizes


_FRESH = (
    "import sys\nfrom databuild_assets.log import open_event_log\n"
    "with open_event_log(sys.argv[1]) as log:\n    log.get_partition_events(sys.argv[2])"
)


def _fresh_seconds(uri: str, refs: list[str]) -> list[float]:
    """Seconds of a new process per ref that opens `uri` and answers the ref's events."""
    seconds = []
    for ref in refs:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", _FRESH, uri, ref], check=True, stdout=subprocess.DEVNULL)
        seconds.append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", action="append", required=True, help="a lake with its index built (repeatable)")
    parser.add_argument("--workdir", default=None, help="where the SQLite BEL is kept between runs")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--fresh", type=int, default=10, help="refs answered by a new process each")
    args = parser.parse_args(argv)
    lakes = [Lake(root) for root in args.lake]
    workdir = Path(args.workdir or f"/var/tmp/bench-cold-partitions-{Path(args.lake[0]).name}")
    workdir.mkdir(parents=True, exist_ok=True)
    sqlite_of_lake(lakes[0], workdir / "bel.db")
    refs, segments = _cold_refs(lakes[0], args.calls)
    print(
        f"{len(refs)} cold refs: segments holding one p50 {percentile(segments, 0.5)}, "
        f"p95 {percentile(segments, 0.95)}, max {max(segments)}"
    )
    print("\n| backend | p50 ms | p95 ms | events a ref p50 / p95 |\n|---|---:|---:|---:|")
    runs = [(f"Delta, {lake.root}", lambda lake=lake: DeltaRsEventLog(lake)) for lake in lakes]
    runs.append(("SQLite", lambda: SqliteEventLog(workdir / "bel.db")))
    for name, opener in runs:
        with opener() as log:
            seconds, sizes = _answer_times(log, refs)
        print(
            f"| {name} | {ms(percentile(seconds, 0.5))} | {ms(percentile(seconds, 0.95))} "
            f"| {percentile(sizes, 0.5)} / {percentile(sizes, 0.95)} |"
        )
    if args.fresh:
        spread = [ref for _, ref in sorted(zip(segments, refs, strict=True), reverse=True)]
        chosen = list(dict.fromkeys(spread))[: args.fresh]
        print(f"\n{len(chosen)} refs in the most segments, a new process each:")
        print("\n| backend | p50 s | max s |\n|---|---:|---:|")
        uris = [(f"Delta, {lake.root}", f"delta://{lake.root}") for lake in lakes]
        for name, uri in [*uris, ("SQLite", f"sqlite://{workdir / 'bel.db'}")]:
            seconds = _fresh_seconds(uri, chosen)
            print(f"| {name} | {percentile(seconds, 0.5):.2f} | {max(seconds):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
