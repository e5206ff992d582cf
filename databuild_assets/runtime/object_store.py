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
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

S3_SCHEMES = ("s3a", "s3")
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# Our LogStore (delta-jars/logstore): commits with S3's conditional writes, as delta-rs does.
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


_FILESYSTEMS: dict[tuple[str, ...], object] = {}


def arrow_filesystem(uri: str):
    """pyarrow's S3 filesystem for `uri` (s3a:// or s3://), configured from the environment as the
    AWS SDK is, and the path it names there ("bucket/prefix/..."). One per bucket, environment and
    process (a forked child does not share its parent's client): making one may ask AWS for the
    bucket's region."""
    from pyarrow import fs

    rest = uri.partition("://")[2].rstrip("/")
    bucket = rest.partition("/")[0]
    key = (bucket, endpoint() or "", region() or "", os.environ.get("AWS_ACCESS_KEY_ID", ""), str(os.getpid()))
    if key not in _FILESYSTEMS:
        _FILESYSTEMS[key], _ = fs.FileSystem.from_uri(f"s3://{bucket}")
    return _FILESYSTEMS[key], rest


def delta_rs_uri(uri: str) -> str:
    """`uri` as delta-rs opens it: s3:// (its object store takes s3a:// too, but says s3://)."""
    scheme, _, rest = uri.partition("://")
    return f"s3://{rest}" if scheme.lower() in S3_SCHEMES else uri


def delta_rs_options(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """delta-rs storage options beyond what it reads from the environment itself (credentials,
    endpoint, region): plain HTTP allowed when the endpoint is http:// (a store on loopback)."""
    url = endpoint(environ)
    return {"AWS_ALLOW_HTTP": "true"} if url and url.startswith("http://") else {}


class ObjectStoreError(RuntimeError):
    """The object store failed a request (stopped, unreachable, refusing): one line naming the store,
    the operation and the object. A Delta commit is all or nothing, so nothing half-written is
    visible; the step can run again once the store answers."""


# S3A's messages: "<operation> on s3a://bucket/key: <SDK error>"; the SDK's own reason after it.
_S3A_FAILURE = re.compile(r"(\w+) on (s3a?://[^\s:,]+)")
_SDK_REASON = re.compile(r"(?:Unable to execute HTTP request: |Caused by: [\w.$]+: )([^\n(]+)")


def store_error(error: BaseException, environ: Mapping[str, str] = os.environ) -> ObjectStoreError | None:
    """`error` (Spark's, through py4j) as the ObjectStoreError it stands for, when S3A raised it
    for a request the store failed; None for any other error."""
    text = str(error)
    failure = _S3A_FAILURE.search(text)
    if failure is None or "org.apache.hadoop.fs.s3a" not in text and "software.amazon.awssdk" not in text:
        return None
    reason = _SDK_REASON.search(text)
    operation, target = failure.groups()
    return ObjectStoreError(
        f"the object store at {endpoint(environ) or 'AWS S3'} failed: {operation} on {target}"
        f"{': ' + reason.group(1).strip() if reason else ''}. A commit is all or nothing, so nothing half-written "
        "is visible; run the step again once the store answers (ingestion takes each landing object once)."
    )


@contextmanager
def store_errors_reported() -> Iterator[None]:
    """Raise a failure of the object store met in the block as one ObjectStoreError line."""
    try:
        yield
    except ObjectStoreError:
        raise
    except Exception as error:
        if (translated := store_error(error)) is None:
            raise
        raise translated from None


__all__ = [
    "ObjectStoreError",
    "S3_SCHEMES",
    "arrow_filesystem",
    "delta_rs_options",
    "delta_rs_uri",
    "endpoint",
    "is_s3",
    "region",
    "spark_s3_config",
    "store_error",
    "store_errors_reported",
]
