"""Tombstone values never appear in a Spark plan's text (issue 42): every plan Spark keeps of a
query (what `explain` prints, what the Spark UI's SQL tab shows of each query and each node of
its graph, what an event log records) is readable by whoever reaches the UI or the logs, so the
values to erase reach Spark as data, never as SQL literals."""

import json

from databuild_assets.ingest.landing import ingest_landing_files
from databuild_assets.log.spark.backend import DeltaEventLog
from databuild_assets.log.spark.time_travel import log_diff
from databuild_assets.maintenance.compaction import compact
from databuild_assets.maintenance.filtered_log import refresh_filtered_log
from databuild_assets.maintenance.tombstones import (
    read_tombstones,
    request_erasure,
    request_erasures,
    visible_events,
)
from databuild_assets.runtime.lake import RAW_EVENT_LOG
from databuild_assets_tests.support import one_partition_build, write_landing

ERASED_REF = "data/users/id=zq7-erased-ref"
ERASED_TOKEN = "zq7tokenvalue"  # accepted with allow_ambiguous: matched as a whole token in text


def plan_texts(spark, after_execution: int) -> list[str]:
    """Every text Spark's SQL status store (the UI's SQL tab, what an event log records) holds of
    the queries run after execution id `after_execution`: each query's description, details and
    physical plan (final, after adaptive execution) and each node of its graph."""
    jvm_context = spark.sparkContext._jsc.sc()
    jvm_context.listenerBus().waitUntilEmpty()
    store = spark._jsparkSession.sharedState().statusStore()
    executions = store.executionsList()
    texts = []
    for index in range(executions.size()):
        execution = executions.apply(index)
        if execution.executionId() <= after_execution:
            continue
        texts += [execution.description(), execution.details(), execution.physicalPlanDescription()]
        nodes = store.planGraph(execution.executionId()).allNodes()
        texts += [f"{nodes.apply(i).name()} {nodes.apply(i).desc()}" for i in range(nodes.size())]
    return texts


def last_execution(spark) -> int:
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    return max((executions.apply(i).executionId() for i in range(executions.size())), default=-1)


def test_no_plan_of_a_read_refresh_or_purge_holds_a_tombstone_value(spark, lake):
    events = one_partition_build("br-erased", ERASED_REF, 0) + one_partition_build("br-kept", "data/kept", 10)
    bad_line = f"not json, but naming {ERASED_REF} and {ERASED_TOKEN}"
    write_landing(lake, "builds.jsonl", [json.dumps(event) for event in events] + [bad_line])
    ingest_landing_files(spark, lake, settle_seconds=0)
    refresh_filtered_log(spark, lake)
    before = last_execution(spark)

    request_erasure(spark, lake, "partition_ref", ERASED_REF, actor="alice", reason="ticket 1")
    request_erasures(spark, lake, "job_run_id", [ERASED_TOKEN], "alice", "ticket 2", overridden="a test")
    tombstones = read_tombstones(spark, lake)
    raw = spark.read.format("delta").load(lake.table_path(RAW_EVENT_LOG))
    visible = visible_events(raw, tombstones)
    assert sorted(row.event_id for row in visible.collect()) == ["br-kept-1", "br-kept-2", "br-kept-3"]
    explained = [visible._jdf.queryExecution().toString(), visible._jdf.queryExecution().executedPlan().toString()]
    assert refresh_filtered_log(spark, lake).deleted == 3
    assert DeltaEventLog(spark, lake).get_build_request_events("br-erased") == []  # a query naming no value
    log_diff(spark, lake, 0, 1)
    result = compact(spark, lake)
    assert result.rows_purged_per_tombstone, "the compaction purged nothing: the test would prove nothing"

    texts = explained + plan_texts(spark, before)
    assert len(texts) > 50, "too few plans captured to prove anything"
    for value in (ERASED_REF, ERASED_TOKEN, json.dumps(ERASED_REF)[1:-1]):
        holding = [text for text in texts if value in text]
        assert holding == [], f"{value!r} appears in {len(holding)} plan texts, e.g.: {holding[0][:400]}"
