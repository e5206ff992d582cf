"""What a reader on S3 takes from the bucket's published serving index (docs/decisions/0054),
checked without a bucket: a manifest's names are ours before they become local paths, and the
reader's fetched segments stay within the cache bound, least recently read first. The flow on a
bucket (publish, start from it, fetch, drop after an erasure) is test_object_store's."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from databuild_assets.log.serving import publish, reader_cache
from databuild_assets.log.serving.publish import Manifest, PublicationError


def _manifest(**changes) -> str:
    body = {
        "format": 1,
        "id": "0" * 32,
        "snapshot": "snapshots/index-" + "0" * 32 + ".sqlite.zst",
        "snapshot_bytes": 4096,
        "snapshot_frames": [1024],
        "source": "index-3.sqlite",
        "published_at": 1.0,
        "segments": {"1": ["ab" * 8, 10, 20]},
        **changes,
    }
    return json.dumps(body)


def test_a_manifest_written_by_the_pipeline_reads_back_whole():
    snapshot = "snapshots/index-" + "0" * 32  # an object per frame
    manifest = Manifest.from_json(_manifest(snapshot=snapshot, snapshot_bytes=40 << 20, snapshot_frames=[9, 8, 7]), "m")
    assert manifest.snapshot_objects() == [f"{snapshot}/0000{n}.sqlite.zst" for n in range(3)]
    assert Manifest.from_json(manifest.to_json(), "again") == manifest
    manifest = Manifest.from_json(_manifest(), "published.json")  # every frame in one object, as before
    assert manifest.snapshot_objects() == ["snapshots/index-" + "0" * 32 + ".sqlite.zst"]
    assert manifest.segments == {1: ("ab" * 8, 10, 20)}
    assert Manifest.from_json(manifest.to_json(), "again") == manifest
    assert manifest.segment_objects() == {
        "segments/segment-1-abababababababab.parquet": 10,
        "segments/segment-1-abababababababab.by-partition.parquet": 20,
    }


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"id": "../../../home/user/.ssh"}, "is not one we write"),
        ({"snapshot": "../../index-x.sqlite"}, "is not one we write"),
        ({"snapshot": "snapshots/index-" + "0" * 32 + "/../../x"}, "is not one we write"),
        ({"segments": {"1": ["../../../../etc/x", 1, 1]}}, "segment key is not one we write"),
        ({"segments": {"../1": ["ab" * 8, 1, 1]}}, "not a serving index manifest"),
        ({"format": 3}, "manifest format 3"),
        ({"snapshot_bytes": "many"}, "not a serving index manifest"),
        ({"snapshot_frames": []}, "0 frames for 4096 bytes"),
    ],
)
def test_a_manifest_naming_paths_we_never_write_is_refused_before_any_becomes_a_local_path(changes, says):
    with pytest.raises(PublicationError, match=says):
        Manifest.from_json(_manifest(**changes), "s3://bucket/lake/serving_index/published.json")


def _fetched(folder, name: str, size: int, mtime: int) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as file:
        file.write(b"x" * size)
    os.utime(path, ns=(mtime, mtime))
    return path


def test_the_fetched_segments_beyond_the_cache_bound_go_least_recently_read_first(tmp_path):
    root = tmp_path / "published"
    one, two = root / ("1" * 32) / "segments", root / ("2" * 32) / "segments"
    one.mkdir(parents=True)
    two.mkdir(parents=True)
    oldest = _fetched(one, "segment-1.parquet", 100, 1_000)
    older = _fetched(two, "segment-4.by-partition.parquet", 100, 2_000)
    newer = _fetched(one, "segment-2.parquet", 100, 3_000)
    just = _fetched(two, "segment-5.parquet", 100, 500)  # fetched now, kept whatever its time
    other = _fetched(one, "published.json", 1_000, 0)  # not a segment: never counted or removed

    reader_cache._bound_cache(str(root), 250, keep=[just])
    assert [os.path.exists(path) for path in (oldest, older, newer, just, other)] == [False, False, True, True, True]

    reader_cache.touch_read(newer)  # a read makes it the most recent
    assert os.stat(newer).st_mtime_ns > 3_000
    reader_cache._bound_cache(str(root), 0, keep=[])
    assert not os.path.exists(newer) and not os.path.exists(just) and os.path.exists(other)


def test_the_cache_bound_and_publish_interval_refuse_what_is_not_a_number():
    assert publish.cache_bytes({}) == publish.DEFAULT_CACHE_BYTES
    assert publish.publish_interval_s({"DATABUILD_SERVING_PUBLISH_INTERVAL_S": "60"}) == 60.0
    with pytest.raises(ValueError, match="DATABUILD_SERVING_CACHE_BYTES='-1': a number of bytes"):
        publish.cache_bytes({"DATABUILD_SERVING_CACHE_BYTES": "-1"})


def test_a_publication_names_its_index_by_generation_not_by_a_file_name_a_new_machine_reuses(tmp_path):
    # The pipeline on a new machine names its files from index-1 again: a rewrite after an
    # erasure must still make a publication due, so it is told by the id each generation gets.
    path = str(tmp_path / "index-2.sqlite")
    sqlite3.connect(path).close()
    publish.mark_generation(path)
    first = publish.generation_of(path)
    publish.mark_generation(path)  # the same name, another generation
    assert first.startswith("index-2.sqlite#") and publish.generation_of(path) != first
