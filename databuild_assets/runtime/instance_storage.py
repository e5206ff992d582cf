"""Refuses, before any run, Dagster instance storage in PostgreSQL that SQLAlchemy would reach
through psycopg 3, with which dagster-postgres 0.29.27 fails.

SQLAlchemy 2.1 gives the bare scheme `postgresql://` to psycopg 3. dagster-postgres is written for
psycopg2: with psycopg 3 installed, its `NOTIFY run_events, %(notify_id)s` fails at a run's first
event (`syntax error at or near "$1"`); without it (this project pins psycopg2 only), the instance
does not load (`No module named 'psycopg'`), from a `postgres_url` or from `postgres_db`, whose
default scheme is the same bare `postgresql`. Both say nothing of the fix, which is one word in
dagster.yaml: `postgresql+psycopg2://`. The check reads DAGSTER_HOME/dagster.yaml itself, so it
holds whichever driver is installed (docs/decisions/0048-postgres-instance-storage.md).

    refuse_psycopg3_storage(os.environ.get("DAGSTER_HOME"))   # definitions.py, at load
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

DRIVER_SCHEME = "postgresql+psycopg2"
_STORAGES = ("run_storage", "event_log_storage", "schedule_storage")


def _postgres_configs(settings: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where in dagster.yaml, the dagster-postgres config) of each storage in PostgreSQL."""
    storage = settings.get("storage")
    if isinstance(storage, dict) and isinstance(storage.get("postgres"), dict):
        yield "storage.postgres", storage["postgres"]
    for name in _STORAGES:
        entry = settings.get(name)
        if isinstance(entry, dict) and str(entry.get("module", "")).startswith("dagster_postgres"):
            if isinstance(entry.get("config"), dict):
                yield f"{name}.config", entry["config"]


def _string(value: Any) -> str | None:
    """A string setting as Dagster reads it: itself, or `{env: NAME}` from the environment."""
    if isinstance(value, dict) and "env" in value:
        return os.environ.get(str(value["env"]))
    return value if isinstance(value, str) else None


def refuse_psycopg3_storage(dagster_home: str | None) -> None:
    """Raise ValueError, one line naming the file and the setting (never the URL: it holds a
    password), when DAGSTER_HOME/dagster.yaml puts storage in PostgreSQL under a scheme other than
    postgresql+psycopg2. No DAGSTER_HOME, no file, or a file Dagster itself will refuse: nothing."""
    if not dagster_home:
        return
    path = Path(dagster_home) / "dagster.yaml"
    try:
        settings = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return  # Dagster reads it next and says what is wrong
    if not isinstance(settings, dict):
        return
    for where, config in _postgres_configs(settings):
        if "postgres_url" in config:
            url, setting = _string(config["postgres_url"]), f"{where}.postgres_url"
            scheme = url.split("://", 1)[0] if url and "://" in url else None
        elif isinstance(config.get("postgres_db"), dict):
            setting = f"{where}.postgres_db.scheme"
            scheme = _string(config["postgres_db"].get("scheme", "postgresql"))
        else:
            continue
        if scheme is not None and scheme != DRIVER_SCHEME:
            raise ValueError(
                f"{path}: {setting} uses the scheme {scheme!r}, which SQLAlchemy 2.1 gives to psycopg 3, with which "
                f"dagster-postgres fails; write postgresql+psycopg2:// (postgres_url) or "
                f"scheme: {DRIVER_SCHEME} (postgres_db)"
            )
