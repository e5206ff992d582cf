"""The Delta BEL's serving index against SQLite on the same events, side by side in one run.

    python -m bench.serving_index --events 1000000 [--workdir /var/tmp/bench-serving] [--loops 200]
    python -m bench.serving_index --lake /var/tmp/lake-10m     # a lake `databuild-assets demo` made

Builds (or reuses, in --workdir) a lake whose raw log holds `generate_events(N, seed=7)`, or
takes the lake given (the bench appends to it), and a SQLite BEL of the same events, packs the
small files earlier runs appended (`bin_pack_locally`, as the file-count compaction does), brings
the serving index up to date as the pipeline does (`refresh_serving_index`), then prints, each
figure from fresh processes (median of 3):
- open to the first answer, and the peak resident memory of a process that opened and answered;
- a `databuild-assets query URI get_latest_partition_status REF` call, whole process (the median
  of 15, the backends taking turns);
- catch-up: opening after N commits the index has not seen (N = 1, 10, 100), and the slope;
- the service loop (append 5 events, then the partition's status and the build's events; each
  step and the whole loop, and the append's tail), the backends taking turns in blocks of 25 loops, and every query
  method, on keys drawn from the whole log and on the loop's own (hot) keys, p50/p95 in one
  process, with the p95 ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import deltalake

from bench.lakes import write_events
from bench.query_path import ms, percentile, query_methods, service_build, timings
from databuild_assets.events.schema import EVENT_COLUMNS
from databuild_assets.log import SqliteEventLog, load_events
from databuild_assets.log.interface import canonical_event
from databuild_assets.log.serving.append import raw_log_rows
from databuild_assets.log.serving.backend import DeltaRsEventLog, refresh_serving_index
from databuild_assets.maintenance.local_bin_pack import bin_pack_locally
from databuild_assets.runtime.delta_local import iter_local_table
from databuild_assets.runtime.lake import RAW_EVENT_LOG, Lake
from databuild_assets.workload import generate_events

BATCH = 250_000
_LOOP_BLOCK = 25  # service loops a backend runs before the other takes its turn
REPO_ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: the backend's imports first (not timed, as a service has them
# loaded), then the open and the first answer; prints seconds and the process's peak resident memory.
_OPEN_AND_ANSWER = """
import json, sys, time
from databuild_assets.log import open_event_log
if sys.argv[1].startswith("delta"):
    import databuild_assets.log.serving.backend
started = time.perf_counter()
log = open_event_log(sys.argv[1])
log.get_latest_partition_status(sys.argv[2])
seconds = time.perf_counter() - started
# VmHWM, not getrusage's ru_maxrss: that one keeps the parent's size across fork and exec.
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "peak_rss": peak * 1024}))
"""


def build(workdir: Path, events: int) -> tuple[Lake, Path]:
    """The lake and the SQLite BEL of `events` generated events, made once per workdir."""
    lake, sqlite_path = Lake(str(workdir / "lake")), workdir / "bel.db"
    done = workdir / "built.json"
    if done.exists() and json.loads(done.read_text())["events"] == events:
        return lake, sqlite_path
    workdir.mkdir(parents=True, exist_ok=True)
    written = write_events(lake, generate_events(events, seed=7), BATCH)
    load_events(sqlite_path, written)  # one bulk load: SQLite's indexes built once, at the end
    done.write_text(json.dumps({"events": events}))
    return lake, sqlite_path


def sqlite_of_lake(lake: Lake, sqlite_path: Path) -> None:
    """A SQLite BEL of the lake's raw log (made once), read a few files at a time."""
    if sqlite_path.exists():
        return
    table = deltalake.DeltaTable(lake.table_path(RAW_EVENT_LOG))

    def events():
        loaded = 0
        for batch, total in iter_local_table(table, list(EVENT_COLUMNS)):
            yield from batch.to_pylist()
            loaded += batch.num_rows
            print(f"  {loaded:,} of {total:,} events loaded into SQLite", flush=True)

    loading = sqlite_path.with_suffix(".loading")
    for leftover in loading.parent.glob(loading.name + "*"):  # an earlier load that was stopped
        leftover.unlink()
    load_events(loading, events())
    loading.rename(sqlite_path)


def fresh(uri: str, ref: str, runs: int = 3) -> dict[str, float]:
    """Open to the first answer and peak memory in fresh processes: the median of `runs`."""
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _OPEN_AND_ANSWER, uri, ref],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()[-1]
        )
        for _ in range(runs)
    ]
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def cli_seconds(uris: list[str], ref: str, runs: int = 15) -> list[float]:
    """The median seconds of a whole `query ... get_latest_partition_status REF` process per URI,
    the URIs taking turns run by run: a process is ~0.1 s, and this VM's speed drifts over seconds,
    so runs in a block would compare one moment with another."""
    times: list[list[float]] = [[] for _ in uris]
    for _ in range(runs):
        for uri, samples in zip(uris, times, strict=True):
            command = [str(Path(sys.executable).parent / "databuild-assets"), "query", uri]
            command += ["get_latest_partition_status", ref]
            started = time.perf_counter()
            subprocess.run(command, cwd=REPO_ROOT, capture_output=True, check=True)
            samples.append(time.perf_counter() - started)
    return [statistics.median(samples) for samples in times]


def commits_behind(lake: Lake, commits: int, seed: int) -> None:
    """`commits` commits of 5 events each that the index has not applied (written by delta-rs)."""
    for number in range(commits):
        batch, _, _ = service_build(seed * 1_000 + number)
        rows = raw_log_rows(enumerate(map(canonical_event, batch)), "bench-behind")
        deltalake.write_deltalake(lake.table_path(RAW_EVENT_LOG), rows, mode="append")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--workdir", default=None, help="where the lake and the SQLite BEL are kept between runs")
    parser.add_argument("--lake", default=None, help="an existing lake to use (its SQLite BEL is kept in --workdir)")
    parser.add_argument("--loops", type=int, default=200, help="service loop iterations")
    parser.add_argument("--calls", type=int, default=200, help="calls per query method")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or f"/var/tmp/bench-serving-index-{args.lake and Path(args.lake).name or args.events}")
    started = time.perf_counter()
    if args.lake:
        lake, sqlite_path = Lake(args.lake), workdir / "bel.db"
        workdir.mkdir(parents=True, exist_ok=True)
        sqlite_of_lake(lake, sqlite_path)
    else:
        lake, sqlite_path = build(workdir, args.events)
    print(f"lake and SQLite BEL ready in {time.perf_counter() - started:.0f} s ({workdir})")
    # The small files earlier runs appended, packed as the file-count compaction packs them: each
    # run starts from a lake the pipeline keeps, not one grown by every run before it.
    packed = bin_pack_locally(lake.table_path(RAW_EVENT_LOG), closed_before=None, packed_bytes=64 * 2**20)
    print(f"small files of earlier runs packed: {packed or 0:,}")
    delta_uri, sqlite_uri = f"delta://{lake.root}", f"sqlite://{sqlite_path}"

    started = time.perf_counter()
    status = refresh_serving_index(lake)
    print(
        f"serving index: {time.perf_counter() - started:.1f} s to bring up to date (a build when new), "
        f"{status.events:,} events, {status.bytes / 1e6:,.0f} MB; "
        f"SQLite BEL {os.path.getsize(sqlite_path) / 1e6:,.0f} MB"
    )
    with SqliteEventLog(sqlite_path) as sqlite_log:
        connection = sqlite_log._connection
        refs = [
            r[0] for r in connection.execute("SELECT partition_ref FROM partition_state ORDER BY random() LIMIT 500")
        ]
        builds = [
            r[0] for r in connection.execute("SELECT build_request_id FROM build_requests ORDER BY random() LIMIT 500")
        ]
        jobs = [r[0] for r in connection.execute("SELECT job_run_id FROM job_runs ORDER BY random() LIMIT 500")]
        times = [r[0] for r in connection.execute("SELECT timestamp FROM events ORDER BY random() LIMIT 500")]
    ref = refs[0]

    print("\n| fresh process | SQLite | Delta, serving index | ratio |\n|---|---:|---:|---:|")
    sqlite_open, delta_open = fresh(sqlite_uri, ref), fresh(delta_uri, ref)
    print(
        f"| open to the first answer | {sqlite_open['seconds']:.3f} s | {delta_open['seconds']:.3f} s "
        f"| {delta_open['seconds'] / sqlite_open['seconds']:.2f}x |"
    )
    print(
        f"| peak resident memory | {sqlite_open['peak_rss'] / 1e6:,.0f} MB | {delta_open['peak_rss'] / 1e6:,.0f} MB "
        f"| +{(delta_open['peak_rss'] - sqlite_open['peak_rss']) / 1e6:,.0f} MB |"
    )
    sqlite_cli, delta_cli = cli_seconds([sqlite_uri, delta_uri], ref)
    print(
        f"| `query ... get_latest_partition_status`, whole process | {sqlite_cli:.2f} s | {delta_cli:.2f} s "
        f"| {delta_cli / sqlite_cli:.2f}x |"
    )

    print("\n| commits behind the index | open to the first answer (median of 3) |\n|---:|---:|")
    catch_up = {}
    for commits in (0, 1, 10, 100):
        opens = []
        for attempt in range(3):
            commits_behind(lake, commits, seed=commits * 10 + attempt + 1)
            opens.append(fresh(delta_uri, ref, runs=1)["seconds"])  # this open catches up
        catch_up[commits] = statistics.median(opens)
        print(f"| {commits} | {catch_up[commits]:.3f} s |")
    print(f"slope: {(catch_up[100] - catch_up[1]) / 99 * 1000:.1f} ms per commit of 5 events")

    rng = random.Random(1)
    methods = query_methods(rng, builds, refs, jobs, times)
    steps: dict[str, dict[str, list[float]]] = {"sqlite": {}, "delta": {}}
    answers: dict[str, dict[str, list[float]]] = {"sqlite": {}, "delta": {}}
    hot_answers: dict[str, dict[str, list[float]]] = {"sqlite": {}, "delta": {}}
    # The keys of the loop's own builds (in the hot window): each backend's build ids and times.
    hot: dict[str, dict[str, list]] = {name: {"builds": [], "times": []} for name in ("sqlite", "delta")}
    hot_refs = [f"data/bench/part={10**6 + index}" for index in range(args.loops)]
    hot_jobs = [f"bench-job-{10**6 + index}" for index in range(args.loops)]
    with SqliteEventLog(sqlite_path) as sqlite_log, DeltaRsEventLog(lake) as delta_log:
        logs = {"sqlite": sqlite_log, "delta": delta_log}
        # The backends take turns, a block of loops each, so that both meet the machine in the
        # same states (a disk's stall, another process's burst), not one after the other.
        block = max(1, min(_LOOP_BLOCK, args.loops // 8))
        for start in range(0, args.loops, block):
            for name, log in logs.items():
                for index in range(start, min(start + block, args.loops)):
                    batch, build_id, build_ref = service_build(10**6 + index)
                    hot[name]["builds"].append(build_id)
                    hot[name]["times"].append(batch[0]["timestamp"])
                    whole = 0.0
                    for step, action in (
                        ("append 5 events", partial(log.append_events, batch)),
                        (
                            "get_latest_partition_status after the append",
                            partial(log.get_latest_partition_status, build_ref),
                        ),
                        ("get_build_request_events after the append", partial(log.get_build_request_events, build_id)),
                    ):
                        spent = timings(action, 1)
                        steps[name].setdefault(step, []).extend(spent)
                        whole += spent[0]
                    steps[name].setdefault("the whole loop", []).append(whole)
                if name == "delta" and log._checkpoints is not None:
                    log._checkpoints.wait()  # its appends' checkpoint thread runs in its own turn only
        for name, log in logs.items():
            rng.seed(2)
            for method, call in methods:
                # SQLite's calls within a time budget (a slow method gets fewer), the same number here.
                calls = len(answers["sqlite"][method]) if name == "delta" else args.calls
                answers[name][method] = timings(
                    partial(call, log), calls, budget_s=float("inf") if name == "delta" else 15.0
                )
        for name, log in logs.items():
            rng.seed(3)
            for method, call in query_methods(rng, hot[name]["builds"], hot_refs, hot_jobs, hot[name]["times"]):
                calls = len(hot_answers["sqlite"][method]) if name == "delta" else args.calls
                hot_answers[name][method] = timings(
                    partial(call, log), calls, budget_s=float("inf") if name == "delta" else 15.0
                )

    def rows(table: dict[str, dict[str, list[float]]]) -> None:
        for step in table["sqlite"]:
            a, b = table["sqlite"][step], table["delta"][step]
            print(
                f"| {step} | {ms(percentile(a, 0.5))} / {ms(percentile(a, 0.95))} | "
                f"{ms(percentile(b, 0.5))} / {ms(percentile(b, 0.95))} | "
                f"{percentile(b, 0.95) / percentile(a, 0.95):.2f}x |"
            )

    print("\n| service loop | SQLite p50 / p95 ms | Delta p50 / p95 ms | p95 ratio |\n|---|---:|---:|---:|")
    rows(steps)
    tails = {
        name: " / ".join(ms(percentile(steps[name]["append 5 events"], q)) for q in (0.99, 0.999, 1.0))
        for name in steps
    }
    print(f"append tail, p99 / p99.9 / max ms: SQLite {tails['sqlite']}, Delta {tails['delta']}")
    print("\n| method | SQLite p50 / p95 ms | Delta p50 / p95 ms | p95 ratio |\n|---|---:|---:|---:|")
    rows(answers)
    print("\n| method, the loop's own keys (hot) | SQLite p50 / p95 ms | Delta p50 / p95 ms | p95 ratio |")
    print("|---|---:|---:|---:|")
    rows(hot_answers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
