"""Assets, checks and ops that read the lake report a damaged file as one line: the Spark or Delta
failure a step meets is located and raised as the DamagedTableError it stands for
(runtime/damage.py), here once for every step instead of in each job; on S3, a request the store
failed is raised as one ObjectStoreError naming the store and the object. Dagster still records the
step's failure; its message is the line, naming the table, the file, and `check` and `repair`. A gap
Delta saw in a log only while appends wrote commits retries the step.

    @asset
    @reports_damage
    def raw_event_log(context, lakehouse: LakehouseResource): ...
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dagster import RetryRequested

from databuild_assets.defs.resources import LakehouseResource
from databuild_assets.runtime.damage import damage_reported, is_listing_race
from databuild_assets.runtime.lake import Lake, is_local
from databuild_assets.runtime.object_store import is_s3, store_errors_reported

F = TypeVar("F", bound=Callable[..., Any])
LISTING_RACE_RETRIES = 3


def _lake_root(arguments: Mapping[str, Any]) -> str | None:
    """The lake root of the step's lakehouse resource (None: none)."""
    for value in arguments.values():
        if isinstance(value, LakehouseResource):
            return Lake(value.lake_root).root
    return None


@contextlib.contextmanager
def _damage_or_retried(root: str):
    """A damaged file of the local lake at `root` as its DamagedTableError; a gap Delta saw in a
    log listing that a second read does not show (appends wrote commits while Spark listed:
    runtime/damage.py `is_listing_race`) as a retry of the step a few seconds later."""
    try:
        with damage_reported(root):
            yield
    except Exception as error:
        if is_listing_race(error):
            raise RetryRequested(max_retries=LISTING_RACE_RETRIES, seconds_to_wait=5) from error
        raise


def _reported(root: str | None):
    """What a failure on this root is reported as: a damaged file on a local lake (a listing race
    retried), a failure of the store on S3 (runtime/object_store.py); nothing else is translated."""
    if root is None:
        return contextlib.nullcontext()
    if is_local(root):
        return _damage_or_retried(root)
    return store_errors_reported() if is_s3(root) else contextlib.nullcontext()


def reports_damage(compute: F) -> F:
    """`compute` (an asset's, a check's or an op's function, given its lakehouse resource by
    keyword, as Dagster does) with a damaged file it meets raised as one DamagedTableError.
    Its signature is kept, and a generator stays one, so Dagster sees the function it wraps."""
    if inspect.isgeneratorfunction(compute):

        @functools.wraps(compute)
        def generating(*args: Any, **kwargs: Any) -> Any:
            with _reported(_lake_root(kwargs)):
                return (yield from compute(*args, **kwargs))

        return generating

    @functools.wraps(compute)
    def returning(*args: Any, **kwargs: Any) -> Any:
        with _reported(_lake_root(kwargs)):
            return compute(*args, **kwargs)

    return returning


__all__ = ["reports_damage"]
