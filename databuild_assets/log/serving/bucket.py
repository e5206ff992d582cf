"""How `DeltaRsEventLog` (backend.py) uses what the pipeline publishes of a lake on S3 (publish.py):
a new reader starts from the published index instead of building one from the whole raw log, a
reader drops the publications (and any fetched segments) the bucket no longer names, and the
pipeline's refresh publishes when one is due (docs/decisions/0054, 0060).

    class DeltaRsEventLog(..., BucketPublication, BuildEventLog): ...
    self._start_from_publication()     # in _rebuild, under the build lock, on S3
"""

from __future__ import annotations

import logging
import math
import time

from databuild_assets.log.serving.index import IndexUnusableError, ServingIndex
from databuild_assets.log.serving.publish import (
    Publication,
    PublicationError,
    generation_of,
    publication_of,
    publish_interval_s,
)
from databuild_assets.log.serving.reader_cache import drop_unpublished, keep_manifest
from databuild_assets.log.serving.store import remove_index_files

log = logging.getLogger(__name__)

# A reader on S3 asks the bucket which segments are still published (and drops the others from its
# cache) after a catch-up that deleted events, and at most this often otherwise.
PUBLICATION_CHECK_S = 60.0


class BucketPublication:
    """Mixed into DeltaRsEventLog, which provides the lake, its index folder and `_replace`."""

    _publication_checked_at = -math.inf

    def _start_from_publication(self) -> bool:
        """(Under the build lock.) The index the pipeline published in the bucket, downloaded as
        this machine's, when there is one this process can follow; False when there is none."""
        publication = Publication.of(self.lake.root)
        building, why = None, ""
        try:
            manifest = publication.manifest()
            if manifest is None:
                return False
            building = self._folder.new_building_path()
            publication.download(manifest.snapshot, building, manifest.snapshot_bytes, manifest.snapshot_frames)
            index = ServingIndex.open(building)
            try:
                if publication_of(index._connection) != manifest.id:
                    why = f"{manifest.snapshot} names another publication than its manifest's"
                else:
                    why = self._unfollowable_stamp(index.stamp())
            finally:
                index.close()
        except (FileNotFoundError, PublicationError, IndexUnusableError) as error:
            why = str(error)
        if why:
            log.warning("%r: the published serving index cannot be used (%s): building one", self, why)
            if building is not None:
                remove_index_files(building)
            return False
        keep_manifest(self._folder.path, manifest, publication)
        final = self._folder.publish(building)
        self._marker = self._folder.marker()
        self._replace(ServingIndex.open(final))
        drop_unpublished(self._folder.path, manifest, manifest.id)
        self._publication_checked_at = time.monotonic()
        log.info("%r: started from the published index %s (%d bytes)", self, manifest.snapshot, manifest.snapshot_bytes)
        return True

    def _publication_replaced(self) -> bool:
        """Whether the bucket's publication is another than the one this index was downloaded
        from (a segment gone from the bucket then means: start again from the new one)."""
        try:
            manifest = Publication.of(self.lake.root).manifest()
        except PublicationError:
            return True
        mine = publication_of(self._store()._connection)
        return mine is not None and (manifest is None or manifest.id != mine)

    def _check_publication(self, deleted: bool) -> None:
        """On S3: drop what of the bucket's publications it no longer names (an erasure's
        rewrite), after a catch-up that `deleted` events, else at a read at most every
        PUBLICATION_CHECK_S, whether the lake moved or not."""
        if not deleted and time.monotonic() - self._publication_checked_at < PUBLICATION_CHECK_S:
            return
        self._publication_checked_at = time.monotonic()
        try:
            manifest = Publication.of(self.lake.root).manifest()
        except (PublicationError, OSError) as error:  # a read is still answered; the next check drops
            log.warning("%r: the bucket's publication could not be read (%s)", self, error)
            return
        if manifest is not None:
            drop_unpublished(self._folder.path, manifest, publication_of(self._store()._connection))

    def _publish(self, index: ServingIndex) -> None:
        """Publish the index and its segments in the bucket for new readers when one is due
        (publish.py): none yet, the index written whole since (an erasure), or the last too old."""
        connection = index._connection
        if connection.execute("SELECT EXISTS (SELECT 1 FROM main.cold_segments WHERE stale)").fetchone()[0]:
            return  # a stale segment may hold an erased event: the refresh that rewrites it publishes
        with self._folder.build_lock():
            publication = Publication.of(self.lake.root)
            source = generation_of(index.path)
            if publication.due(source, publish_interval_s()):
                segments = [row[0] for row in connection.execute("SELECT segment FROM main.cold_segments")]
                publication.publish(index, source, segments)


__all__ = ["PUBLICATION_CHECK_S", "BucketPublication"]
