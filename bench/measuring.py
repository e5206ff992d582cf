"""What the benchmarks measure with and print: wall seconds and the CPU seconds of this process
tree and of the whole machine (`measure`), Spark's jobs and stages from its UI's REST API
(`SparkJobs`), and tables of phases (`Row`, `print_rows`).

    result, usage = measure(lambda: ingest_landing_files(spark, lake))
    print_rows("Ingest", [Row.of("ingest", usage, events=n_events)])
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession

# The longest Spark jobs and stages of a measured step that a report lists.
LONGEST_JOBS = 10

T = TypeVar("T")


@dataclass(frozen=True)
class Usage:
    """Wall seconds of a step, and the CPU seconds used meanwhile by this process tree (driver,
    JVM, Python workers) and by the whole machine: on a shared machine, `others` says how much
    CPU someone else took while we measured."""

    wall: float
    cpu: float
    machine_cpu: float

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.wall + other.wall, self.cpu + other.cpu, self.machine_cpu + other.machine_cpu)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.wall - other.wall, self.cpu - other.cpu, self.machine_cpu - other.machine_cpu)

    @property
    def others(self) -> float:
        return max(self.machine_cpu - self.cpu, 0.0)


_TICKS = os.sysconf("SC_CLK_TCK")


def _process_tree_ticks(root: int) -> dict[int, int]:
    """CPU clock ticks (user + system) of `root` and each of its descendants, from /proc."""
    parent_of, ticks_of = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:  # the process ended while we looked
            continue
        fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
        parent_of[int(entry)] = int(fields[1])
        ticks_of[int(entry)] = int(fields[11]) + int(fields[12])
    children = defaultdict(list)
    for pid, parent in parent_of.items():
        children[parent].append(pid)
    tree, pending = {}, [root]
    while pending:
        pid = pending.pop()
        if pid in ticks_of:
            tree[pid] = ticks_of[pid]
        pending.extend(children[pid])
    return tree


class CpuMeter:
    """CPU seconds used by this process and its descendants (JVM, Python workers), added up by a
    thread that samples /proc: Spark's Python daemon ignores SIGCHLD, so a worker that exits
    takes its CPU time with it, and reading /proc only at the start and end of a step would miss
    it (or count less than at the start). A process that exits loses at most one interval."""

    def __init__(self, interval_s: float = 0.2):
        self._last: dict[int, int] = {}
        self._total_ticks = 0
        self._lock = threading.Lock()
        self._sample()
        threading.Thread(target=self._sample_every, args=(interval_s,), name="cpu-meter", daemon=True).start()

    def _sample(self) -> None:
        with self._lock:
            ticks = _process_tree_ticks(os.getpid())
            for pid, now in ticks.items():
                before = self._last.get(pid, 0)
                self._total_ticks += now - before if now >= before else now  # a reused pid: a new process
            self._last = ticks

    def _sample_every(self, interval_s: float) -> None:
        while True:
            time.sleep(interval_s)
            self._sample()

    def seconds(self) -> float:
        self._sample()
        return self._total_ticks / _TICKS


_cpu_meter: CpuMeter | None = None


def _machine_cpu() -> float:
    """CPU seconds all processes have used since boot (not idle, not waiting for I/O)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICKS


def _now() -> Usage:
    global _cpu_meter
    if _cpu_meter is None:
        _cpu_meter = CpuMeter()
    return Usage(time.perf_counter(), _cpu_meter.seconds(), _machine_cpu())


def measure(action: Callable[[], T]) -> tuple[T, Usage]:
    """(what `action` returned, what it took)."""
    start = _now()
    result = action()
    return result, _now() - start


def evaluate(frame: DataFrame) -> None:
    """Compute every column of every row and write nothing: what a phase costs without a sink.
    (`count()` would let the optimizer drop the columns nobody reads, from_json included.)"""
    frame.write.format("noop").mode("overwrite").save()


def load_average() -> str:
    return "load average: " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


class SparkJobs:
    """The Spark jobs of this application, from the Spark UI's REST API: which jobs a step ran
    and how long each took, so that a slow step shows where its time went."""

    def __init__(self, spark: SparkSession):
        web_url = spark.sparkContext.uiWebUrl
        if web_url:
            # The UI listens on every interface; ask it on loopback, never over the network.
            web_url = re.sub(r"//[^:/]+", "//127.0.0.1", web_url, count=1)
        self.url = f"{web_url}/api/v1/applications/{spark.sparkContext.applicationId}" if web_url else None

    def _get(self, what: str) -> list[dict]:
        if self.url is None:
            return []
        with urllib.request.urlopen(f"{self.url}/{what}", timeout=30) as response:
            return json.load(response)

    def all(self) -> list[dict]:
        return self._get("jobs")

    def stages(self) -> list[dict]:
        return self._get("stages")

    def ids(self) -> set[int]:
        return {job["jobId"] for job in self.all()}


def ui_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%Z").replace(tzinfo=UTC).timestamp()


def job_label(job: dict) -> str:
    call_site = re.sub(
        r"/\S*/", "", job.get("name", "")
    )  # "collect at /work/.../landing.py:265" -> "... landing.py:265"
    description = job.get("description", "")
    label = f"{description} [{call_site}]" if description and description != job.get("name") else call_site
    return label if len(label) <= 100 else label[:97] + "..."


def print_stages(stages: list[dict]) -> None:
    """The stages that took the most task time: how many tasks, how long, how much they moved."""
    if not stages:
        return
    mb = 1e6
    print("  its stages with the most task time (task s: summed over tasks; jvm cpu: without the Python workers)")
    print(
        f"  {'stage':>5}  {'job':>4}  {'tasks':>5}  {'wall s':>6}  {'task s':>6}  {'jvm cpu':>7}  {'in MB':>6}  "
        f"{'shuf rd':>7}  {'shuf wr':>7}  {'out MB':>6}  {'spill':>6}  {'gc s':>5}  name"
    )
    for stage in sorted(stages, key=lambda stage: stage["executorRunTime"], reverse=True)[:LONGEST_JOBS]:
        wall = ui_time(stage["completionTime"]) - ui_time(stage["submissionTime"])
        name = re.sub(r"/\S*/", "", stage["name"])
        print(
            f"  {stage['stageId']:>5}  {stage['jobId']:>4}  {stage['numTasks']:>5}  {wall:>6.2f}  "
            f"{stage['executorRunTime'] / 1000:>6.2f}  {stage['executorCpuTime'] / 1e9:>7.2f}  "
            f"{stage['inputBytes'] / mb:>6.0f}  {stage['shuffleReadBytes'] / mb:>7.0f}  "
            f"{stage['shuffleWriteBytes'] / mb:>7.0f}  {stage['outputBytes'] / mb:>6.0f}  "
            f"{(stage['memoryBytesSpilled'] + stage['diskBytesSpilled']) / mb:>6.0f}"
            f"  {stage['jvmGcTime'] / 1000:>5.1f}  {name}"
        )


@dataclass(frozen=True)
class Row:
    """One line of a printed table: a phase, its seconds and, when it moves events, its events/s.
    `usage` adds the CPU seconds of this process tree and of everyone else meanwhile."""

    name: str
    seconds: float
    events: int | None = None
    note: str = ""
    usage: Usage | None = None

    @classmethod
    def of(cls, name: str, usage: Usage, events: int | None = None, note: str = "") -> Row:
        return cls(name, usage.wall, events, note, usage)

    @property
    def events_per_second(self) -> float | None:
        if self.events is None or self.seconds <= 0:
            return None
        return self.events / self.seconds


def print_rows(title: str, rows: Iterable[Row], total_seconds: float | None = None) -> None:
    """A table: phase / seconds / events/s / our CPU s / others' CPU s (/ share of `total_seconds`) / note."""
    rows = list(rows)
    width = max(len(row.name) for row in rows)
    print(f"\n{title}")
    share_header = "  share" if total_seconds else ""
    print(f"  {'phase':<{width}}  {'seconds':>8}  {'events/s':>10}  {'cpu s':>6}  {'others':>6}{share_header}  note")
    for row in rows:
        rate = row.events_per_second
        rate_text = f"{rate:>10,.0f}" if rate is not None else f"{'-':>10}"
        usage = f"{row.usage.cpu:>6.1f}  {row.usage.others:>6.1f}" if row.usage else f"{'':>6}  {'':>6}"
        share = f"  {row.seconds / total_seconds:>5.0%}" if total_seconds else ""
        print(f"  {row.name:<{width}}  {row.seconds:>8.2f}  {rate_text}  {usage}{share}  {row.note}".rstrip())
