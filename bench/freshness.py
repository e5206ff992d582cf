"""Freshness as a user sees it (issue 18): the seconds from a small landing file appearing to its
events being in partition_state, with `dagster dev`'s daemon and the sensors on.

    python -m bench.freshness --lake /tmp/bench1m/base [--files 20] [--keep]

Copies the lake root (`tables/`, `serving_index/`, and `landing/` without the files its ingest
ledger already took) into a fresh work folder, starts `dagster dev` there as a user does (this repo's
`workspace.yaml`, a temporary DAGSTER_HOME holding a copy of its `dagster.yaml`,
DATABUILD_LAKE_ROOT at the copy), turns every sensor on with `dagster sensor start --start-all`,
and waits for the runs the first sensor ticks request to end. Then, one file at a time, it writes
a landing file of a few dozen events (the 5 events of each of a few new builds, each build a
partition ref of its own) under a name starting with '.' and renames it, and polls every
`--poll` seconds, without a JVM (delta-rs, and a listing of `_delta_log`), for the raw log's next
commit and for every one of the file's partition refs in partition_state. It prints, per file,
the seconds from the rename to the raw log commit and to partition_state, and the load average
then; p50, p95 and max over the measured files (the `--warmup` files first are printed apart);
the Dagster runs (queued, started, ended) by job. It asserts nothing about speed.

`--arrival` says when the next file lands: `back-to-back` (default) as soon as the previous one
is in partition_state, so its run may wait in the queue for the previous run, still folding the
other projections; `idle` once no run is in flight, so each file lands on an idle pipeline (the
latency of one file on its own).

`--in-place` runs on the lake given instead of a copy (for a lake that is a working copy already,
as `bench.scale`'s). `--repo` runs another checkout's code, `dagster.yaml` and `workspace.yaml`
(e.g. a `git worktree` of an older commit, to measure before and after side by side); `--env
KEY=VALUE` adds to `dagster dev`'s environment (e.g. `DATABUILD_SPARK_CONF=...`). It stops
`dagster dev` and every process it started (its process group) and removes the work folder unless
`--keep`; Ctrl-C or `kill` (SIGTERM) first prints the figures of the files measured so far.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import deltalake
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bench.lakes import copy_serving_index, link_tables
from bench.measuring import load_average
from bench.query_path import percentile, service_build
from databuild_assets.runtime.delta_local import latest_version_on_disk
from databuild_assets.runtime.warm_driver import DRIVERS_DIR_ENV, stop_hosts
from databuild_assets.workload.encoding import encode_json

REPO = Path(__file__).resolve().parents[1]
BUILDS_PER_FILE = 8  # 5 events each: 40 events a file


@dataclass
class Landed:
    """One landing file: its partition refs, and when (seconds after its rename) the raw log got
    a commit and partition_state held every one of its refs; None while not yet seen."""

    name: str
    refs: list[str]
    load: float
    raw_s: float | None = None
    state_s: float | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def copy_lake(source: Path, target: Path) -> list[str]:
    """`source`'s tables (data files hard-linked, `bench.lakes`) and serving index, and the landing
    files its ingest ledger has not taken (by name: the ledger keys files by their full path, so a
    copied file would be a new one to ingest); the names of the files left out."""
    link_tables(source, target)
    copy_serving_index(source, target)  # a pipeline's lake has one; else the first run builds it
    (target / "landing").mkdir(parents=True)
    ledger_path = target / "tables" / "ingest_ledger"
    taken = set()
    if (ledger_path / "_delta_log").is_dir():
        paths = deltalake.DeltaTable(str(ledger_path)).to_pyarrow_table(columns=["file_path"]).column(0)
        taken = {Path(p).name for p in paths.to_pylist() if p}
    left_out = []
    landing = source / "landing"
    for entry in sorted(landing.iterdir()) if landing.is_dir() else []:
        if entry.name in taken:
            left_out.append(entry.name)
        elif entry.is_file():
            shutil.copy2(entry, target / "landing" / entry.name)
    return left_out


def write_landing_file(landing: Path, index: int, run_tag: str) -> tuple[str, list[str]]:
    """A landing file of BUILDS_PER_FILE new builds, written under a '.' name and renamed, as
    landing writers must; its name and its partition refs."""
    lines, refs = [], []
    for k in range(BUILDS_PER_FILE):
        events, _build, _ref = service_build(index * 1000 + k)
        ref = f"bench/freshness/{run_tag}/file={index}/part={k}"
        for event in events:
            if event["event_type"] == "partition_event":
                event["partition_event"]["partition_ref"] = ref
            elif event["event_type"] == "build_request_event" and "requested_partitions" in event[event["event_type"]]:
                event["build_request_event"]["requested_partitions"] = [ref]
            elif event["event_type"] == "job_event":
                event["job_event"]["target_partitions"] = [ref]
            lines.append(encode_json(event))
        refs.append(ref)
    name = f"freshness-{run_tag}-{index:03d}.jsonl"
    hidden = landing / f".{name}"
    hidden.write_text("".join(line + "\n" for line in lines))
    os.rename(hidden, landing / name)
    return name, refs


class StateWatcher:
    """partition_state's refs, read with delta-rs when the table's version moved (no JVM)."""

    def __init__(self, path: Path):
        self.path = path
        self.version: int | None = None
        self.refs: set[str] = set()

    def poll(self) -> None:
        version = latest_version_on_disk(str(self.path))
        if version is None or version == self.version:
            return
        try:
            table = deltalake.DeltaTable(str(self.path), version=version)
            column = table.to_pyarrow_dataset().to_table(
                columns=["partition_ref"], filter=pc.starts_with(ds.field("partition_ref"), "bench/freshness/")
            )
        except deltalake.exceptions.DeltaProtocolError:
            return  # a projection of an earlier release with deletion vectors: its next refresh drops them
        self.version = version
        self.refs = set(column.column(0).to_pylist())


def start_dagster(repo: Path, env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen:
    """`dagster dev` as `make ui` runs it, in a process group of its own (so that stopping it
    stops its daemon, code server, run workers and their JVMs)."""
    log = open(log_path, "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dagster"),
            "dev",
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=repo,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_dagster(process: subprocess.Popen) -> None:
    """SIGTERM to dagster dev's process group (it stops its children), then SIGKILL what is left.
    A Ctrl-C while it waits goes straight to the SIGKILL, so the group never outlives the bench."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # run workers and JVMs the group still holds
    except ProcessLookupError:
        pass
    process.wait()


def wait_for_webserver(port: int, process: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dagster dev exited with {process.returncode} before its webserver answered")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"dagster dev's webserver did not answer on port {port} within {timeout_s:.0f} s")


def runs_in_flight(instance) -> int:
    from dagster import DagsterRunStatus, RunsFilter

    statuses = [
        DagsterRunStatus.QUEUED,
        DagsterRunStatus.NOT_STARTED,
        DagsterRunStatus.STARTING,
        DagsterRunStatus.STARTED,
    ]
    return len(instance.get_run_records(RunsFilter(statuses=statuses)))


def settle(instance, quiet_s: float, timeout_s: float = 900) -> None:
    """Wait until no run has been in flight for `quiet_s` (longer than a sensor interval: the
    sensors' first ticks and the runs they request are over)."""
    deadline, quiet_since = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        if runs_in_flight(instance):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(1)
    raise RunsInFlight(f"runs still in flight after {timeout_s:.0f} s")


class RunsInFlight(RuntimeError):
    """Runs did not end within `settle`'s timeout."""


def print_runs(instance) -> None:
    """Every Dagster run, by job: how many, how they ended, and the median seconds queued (created
    to started) and running (started to ended: a new process, its JVM and the work)."""
    from dagster import RunsFilter

    by_job: dict[str, list] = {}
    for record in instance.get_run_records(RunsFilter()):
        by_job.setdefault(record.dagster_run.job_name, []).append(record)
    print("\nDagster runs (median seconds; a run is a new process, its Spark work on the warm driver)")
    print(f"  {'job':<28}  {'runs':>4}  {'queued':>6}  {'running':>7}  statuses")
    for job, records in sorted(by_job.items()):
        queued = [r.start_time - r.create_timestamp.timestamp() for r in records if r.start_time]
        running = [r.end_time - r.start_time for r in records if r.start_time and r.end_time]
        statuses = sorted({r.dagster_run.status.value for r in records})
        print(
            f"  {job:<28}  {len(records):>4}  {median(queued) if queued else float('nan'):>6.1f}  "
            f"{median(running) if running else float('nan'):>7.1f}  {', '.join(statuses)}"
        )


def measure_file(landing: Path, raw_log: Path, watcher: StateWatcher, index: int, run_tag: str, args) -> Landed:
    raw_before = latest_version_on_disk(str(raw_log))
    load = os.getloadavg()[0]
    name, refs = write_landing_file(landing, index, run_tag)
    renamed = time.monotonic()
    landed = Landed(name, refs, load)
    while time.monotonic() - renamed < args.timeout:
        now = time.monotonic() - renamed
        if landed.raw_s is None and latest_version_on_disk(str(raw_log)) != raw_before:
            landed.raw_s = now
        watcher.poll()
        if all(ref in watcher.refs for ref in refs):
            landed.state_s = now
            landed.raw_s = landed.raw_s if landed.raw_s is not None else now
            return landed
        time.sleep(args.poll)
    return landed


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", required=True, help="a lake root (tables/, landing/) to copy; never modified")
    parser.add_argument(
        "--in-place", action="store_true", help="run on the lake given, not a copy (for a lake that is a copy itself)"
    )
    parser.add_argument("--files", type=int, default=20, help="landing files measured")
    parser.add_argument("--warmup", type=int, default=1, help="landing files first, printed apart")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between reads of partition_state")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a file may take before it counts as lost")
    parser.add_argument(
        "--arrival",
        choices=("back-to-back", "idle"),
        default="back-to-back",
        help="the next file lands as soon as the last is in partition_state, or once no run is in flight",
    )
    parser.add_argument("--settle", type=float, default=40, help="seconds without a run before measuring")
    parser.add_argument("--repo", default=str(REPO), help="the checkout whose code and Dagster settings run")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="for dagster dev")
    parser.add_argument("--workdir", help="where the work folder is made (default: system temp)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (lake, DAGSTER_HOME, dagster log)")
    args = parser.parse_args(argv)
    repo = Path(args.repo).resolve()
    # `kill` stops the bench as Ctrl-C does: the figures so far, then dagster dev and the warm
    # driver stopped and the work folder removed. Without it SIGTERM ends Python without its
    # `finally`, and dagster dev's process group (a session of its own) would run on. (A run
    # started with `&` from a script ignores SIGINT, as the shell sets it: stop it with kill.)
    signal.signal(signal.SIGTERM, _interrupt)
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when run in the background

    work = Path(tempfile.mkdtemp(prefix="bench-freshness-", dir=args.workdir))
    lake, home = (Path(args.lake).resolve() if args.in_place else work / "lake"), work / "dagster_home"
    process = None
    try:
        print(f"work folder {work}; code and Dagster settings of {repo}; the lake {lake}")
        if not args.in_place:
            left_out = copy_lake(Path(args.lake), lake)
            if left_out:
                print(f"  not copied (the ingest ledger took them already): {len(left_out)} landing files")
        (lake / "landing").mkdir(exist_ok=True)
        home.mkdir()
        shutil.copy(repo / "dagster.yaml", home / "dagster.yaml")
        env = {**os.environ, "DAGSTER_HOME": str(home), "DATABUILD_LAKE_ROOT": str(lake)}
        env["PYTHONPATH"] = str(repo)  # the code of --repo, not this venv's editable install
        # The runs' warm Spark driver registers here, so the bench can stop it (it outlives the runs).
        env[DRIVERS_DIR_ENV] = str(work / "spark-drivers")
        env.update(pair.split("=", 1) for pair in args.env)
        port = free_port()
        print(f"starting dagster dev on 127.0.0.1:{port}; {load_average()}")
        process = start_dagster(repo, env, port, work / "dagster-dev.log")
        wait_for_webserver(port, process)
        subprocess.run(
            [str(Path(sys.executable).parent / "dagster"), "sensor", "start", "--start-all", "-w", "workspace.yaml"],
            cwd=repo,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        os.environ["DAGSTER_HOME"] = str(home)
        from dagster import DagsterInstance

        instance = DagsterInstance.get()
        settle(instance, args.settle)
        print(f"sensors on, first runs done; files land {args.arrival}; {load_average()}")

        run_tag = uuid.uuid4().hex[:8]
        watcher = StateWatcher(lake / "tables" / "partition_state")
        raw_log = lake / "tables" / "raw_event_log"
        results: list[Landed] = []
        interrupted = False
        print(f"\n  {'file':<32}  {'raw log s':>9}  {'partition_state s':>17}  {'load 1m':>7}")
        for index in range(args.warmup + args.files):
            try:
                if args.arrival == "idle":
                    settle(instance, 0, timeout_s=args.timeout)
                landed = measure_file(lake / "landing", raw_log, watcher, index, run_tag, args)
            except KeyboardInterrupt:  # Ctrl-C or kill (SIGINT, SIGTERM): report the files measured so far
                print("  interrupted: the figures below are of the files measured so far")
                interrupted = True
                break
            except RunsInFlight as error:  # idle arrival: the last file's runs never ended
                print(f"  {error}: stopping; the figures below are of the files measured so far")
                interrupted = True
                break
            results.append(landed)
            tag = " (warm-up)" if index < args.warmup else ""
            raw = f"{landed.raw_s:>9.1f}" if landed.raw_s is not None else f"{'-':>9}"
            state = f"{landed.state_s:>17.1f}" if landed.state_s is not None else f"{'lost':>17}"
            print(f"  {landed.name:<32}  {raw}  {state}  {landed.load:>7.2f}{tag}", flush=True)
            if landed.state_s is None:
                print(f"  not in partition_state after {args.timeout:.0f} s: stopping")
                break

        measured = [r for r in results[args.warmup :] if r.state_s is not None]
        if measured:
            state, raw = [r.state_s for r in measured], [r.raw_s for r in measured]
            print(f"\nFreshness over {len(measured)} landing files ({BUILDS_PER_FILE * 5} events each)")
            print(f"  {'seconds to':<16}  {'p50':>6}  {'p95':>6}  {'max':>6}")
            summary = {}
            for label, values in (("raw_event_log", raw), ("partition_state", state)):
                summary[label] = {"p50": percentile(values, 0.5), "p95": percentile(values, 0.95), "max": max(values)}
                print(f"  {label:<16}  " + "  ".join(f"{value:>6.1f}" for value in summary[label].values()))
            print(json.dumps(summary))  # for bench.scale
        # The runs the last file started end before dagster dev is stopped, so that none is cut
        # off and counted; after a Ctrl-C, the runs so far are reported and the rest stopped.
        if not interrupted:
            settle(instance, 0, timeout_s=args.timeout)
        print_runs(instance)
        print(f"\n{load_average()}")
        return 0 if len(measured) == args.files else 1
    finally:
        if process is not None:
            stop_dagster(process)
        stop_hosts(work / "spark-drivers")
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
