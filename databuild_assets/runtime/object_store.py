"""Lakes on S3 (or any S3-compatible store): which roots are, and how Spark and delta-rs reach them.

A lake root `s3a://bucket/prefix` (or `s3://`, the same object) is read and written by Spark through
Hadoop's S3A filesystem and by the JVM-free path through delta-rs's own object store. Both take
their credentials where the AWS SDKs look for them (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY,
a profile, an instance role), never from our settings, so no secret reaches a run config, Dagster's
run storage or Spark's environment page. What is not secret comes from the environment as well:

    AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL   a store other than AWS's (MinIO, moto on loopback)
    AWS_REGION (or AWS_DEFAULT_REGION)        the bucket's region

    spark_s3_config({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})["spark.hadoop.fs.s3a.endpoint"]
    # 'http://127.0.0.1:9000'
"""

from __future__ import annotations

import os
from collections.abc import Mapping

S3_SCHEMES = ("s3a", "s3")
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# Our LogStore (delta-jars/s3/logstore): commits with S3's conditional writes, as delta-rs does.
S3_LOG_STORE = "io.databuild.delta.S3ConditionalPutLogStore"


def is_s3(root: str) -> bool:
    """Whether `root` names an object in S3 (s3a://bucket/... or s3://bucket/...)."""
    return root.partition("://")[0].lower() in S3_SCHEMES and "://" in root


def endpoint(environ: Mapping[str, str] = os.environ) -> str | None:
    """The S3 endpoint the AWS SDKs would use: AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else AWS's."""
    return environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or None


def region(environ: Mapping[str, str] = os.environ) -> str | None:
    return environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or None


def spark_s3_config(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Spark settings for lakes on S3: S3A for both schemes, and the endpoint and region the
    environment names. No credentials: S3A's default chain reads them from the environment."""
    config = {
        # s3:// roots through S3A too (Hadoop has no s3:// filesystem of its own any more).
        "spark.hadoop.fs.s3.impl": S3A_FILESYSTEM,
        "spark.hadoop.fs.s3a.impl": S3A_FILESYSTEM,
        # Commit N is put-if-absent against every writer, other drivers and delta-rs included
        # (docs/decisions/0040-every-s3-writer-commits-with-conditional-writes.md).
        "spark.delta.logStore.s3a.impl": S3_LOG_STORE,
        "spark.delta.logStore.s3.impl": S3_LOG_STORE,
    }
    if url := endpoint(environ):
        config["spark.hadoop.fs.s3a.endpoint"] = url
        config["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(url.startswith("https://")).lower()
        # A store other than AWS's serves buckets by path (http://host/bucket/key), not by host name.
        config["spark.hadoop.fs.s3a.path.style.access"] = "true"
    if name := region(environ):
        config["spark.hadoop.fs.s3a.endpoint.region"] = name
    return config


def arrow_filesystem(uri: str):
    """pyarrow's S3 filesystem for `uri` (s3a:// or s3://), configured from the environment as the
    AWS SDK is, and the path it names there ("bucket/prefix/...")."""
    from pyarrow import fs

    rest = uri.partition("://")[2].rstrip("/")
    filesystem, _ = fs.FileSystem.from_uri(f"s3://{rest}")
    return filesystem, rest


def delta_rs_uri(uri: str) -> str:
    """`uri` as delta-rs opens it: s3:// (its object store takes s3a:// too, but says s3://)."""
    scheme, _, rest = uri.partition("://")
    return f"s3://{rest}" if scheme.lower() in S3_SCHEMES else uri


def delta_rs_options(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """delta-rs storage options beyond what it reads from the environment itself (credentials,
    endpoint, region): plain HTTP allowed when the endpoint is http:// (a store on loopback)."""
    url = endpoint(environ)
    return {"AWS_ALLOW_HTTP": "true"} if url and url.startswith("http://") else {}


__all__ = [
    "S3_SCHEMES",
    "arrow_filesystem",
    "delta_rs_options",
    "delta_rs_uri",
    "endpoint",
    "is_s3",
    "region",
    "spark_s3_config",
]
