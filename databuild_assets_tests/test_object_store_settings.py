"""Lakes on S3 without a store: how roots and URIs are spelled, what Spark is told (and never the
keys), where a reader keeps its serving index, how a failure of the store reads, and the line
splitting of landing objects. The tests against a real S3 server are in test_object_store.py."""

from __future__ import annotations

import io

import pytest

from databuild_assets.log import parse_event_log_uri
from databuild_assets.log.serving.store import INDEX_DIR_ENV, index_folder_of
from databuild_assets.runtime import files
from databuild_assets.runtime.files import LocalFiles, lines_of
from databuild_assets.runtime.lake import Lake
from databuild_assets.runtime.object_store import is_s3, spark_s3_config, store_error

ENVIRONMENT = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_REGION": "eu-west-1",
    "AWS_ACCESS_KEY_ID": "made-up-key",
    "AWS_SECRET_ACCESS_KEY": "made-up-secret",
}


def test_a_root_on_s3_has_one_spelling_whatever_the_scheme_it_was_given_with() -> None:
    assert Lake("s3://bucket/lake").root == Lake("s3a://bucket/lake").root == "s3a://bucket/lake"
    assert parse_event_log_uri("delta+s3://bucket/lake").lake == Lake("s3a://bucket/lake")
    assert is_s3("s3a://bucket/lake") and is_s3("S3://bucket/lake")
    assert not is_s3("/data/s3://lake") and not is_s3("abfss://container@account/lake")


def test_spark_is_told_the_endpoint_and_region_and_never_the_keys() -> None:
    config = spark_s3_config(ENVIRONMENT)
    assert config["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert config["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert config["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert config["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert config["spark.delta.logStore.s3a.impl"] == config["spark.delta.logStore.s3.impl"]
    assert not any("made-up" in value for value in config.values())
    # On AWS itself: no endpoint, no path-style access.
    assert "spark.hadoop.fs.s3a.endpoint" not in spark_s3_config({"AWS_REGION": "eu-west-1"})


def test_a_lake_on_s3_keeps_its_serving_index_on_the_readers_disk(tmp_path, monkeypatch) -> None:
    assert index_folder_of("/data/lake") == "/data/lake/serving_index"
    monkeypatch.setenv(INDEX_DIR_ENV, str(tmp_path))
    assert index_folder_of("s3a://bucket/prefix/lake") == str(tmp_path / "bucket" / "prefix" / "lake")


def test_a_failure_of_the_store_reads_as_one_line_naming_the_store_and_the_object() -> None:
    java = RuntimeError(
        "An error occurred while calling o87.save.\n: org.apache.hadoop.fs.s3a.AWSClientIOException: "
        "getFileStatus on s3a://bucket/lake/tables/raw_event_log/_delta_log/00000000000000000412.json: "
        "software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request: "
        "Connection refused (SDK Attempt Count: 6)\n\tat org.apache.hadoop.fs.s3a.S3AUtils"
    )
    error = store_error(java, ENVIRONMENT)
    assert str(error).startswith(
        "the object store at http://127.0.0.1:9000 failed: getFileStatus on "
        "s3a://bucket/lake/tables/raw_event_log/_delta_log/00000000000000000412.json: Connection refused."
    )
    assert "\n" not in str(error)
    assert store_error(ValueError("no such column: event_idd"), ENVIRONMENT) is None


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 64])
def test_landing_lines_split_after_each_newline_whatever_the_read_size(chunk, monkeypatch) -> None:
    monkeypatch.setattr(files, "_CHUNK", chunk)
    data = b'{"a": 1}\n\n{"b": 2}\r\nno final newline'
    assert list(lines_of(io.BytesIO(data))) == [b'{"a": 1}\n', b"\n", b'{"b": 2}\r\n', b"no final newline"]
    assert list(lines_of(io.BytesIO(b""))) == []
    assert LocalFiles.path("file:/data/lake/landing/a.jsonl") == "/data/lake/landing/a.jsonl"
