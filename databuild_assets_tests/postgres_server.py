"""A real PostgreSQL server on loopback for the tests that put Dagster's instance storage in Postgres.

Debian's `postgresql` package provides the binaries (`make test` installs it with apt-get when it
is missing); the server is a private cluster of the test's own: `initdb` into a fresh 0700 folder,
run as an unprivileged user because initdb and postgres refuse root (the `postgres` system user the
package creates, else `nobody`, switched to with setpriv; a non-root test process runs it as
itself). It listens on 127.0.0.1 only, on a free port, with its unix socket in the private folder;
loopback connections need the superuser's random password (scram-sha-256), socket ones are trusted
(only the server's user and root can reach the folder). Stopping it removes the folder.

    with postgres_server() as pg:
        pg.url                        # postgresql+psycopg2://databuild:...@127.0.0.1:PORT/dagster
        pg.dagster_storage_config()   # the `storage:` mapping of a dagster.yaml
        pg.data_folder                # the cluster's data directory (its files, as the server writes them)

    @needs_postgres
    def test_...(postgres): ...
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

SUPERUSER = "databuild"
DATABASE = "dagster"
STARTUP_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
# Users the server may run as when the test process is root, first found wins: Debian's package
# creates `postgres`; `nobody` is on every machine.
SERVER_USERS = ("postgres", "nobody")
# A small cluster: the tests store a few thousand rows. fsync stays on, so what the data folder
# holds is what a server configured as in production would have written.
DEFAULT_SETTINGS = {
    "shared_buffers": "16MB",
    "max_connections": "50",
    "log_min_messages": "warning",
    # As docs/deployment.md asks of a server holding Dagster's storage: WAL segments no longer
    # needed are removed, not renamed for reuse with the old writes in them (decision 0048).
    "wal_recycle": "off",
}


def postgres_bin_folder() -> Path | None:
    """The folder of initdb/postgres: Debian's newest /usr/lib/postgresql/N/bin, else initdb on PATH."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name or 0)
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _unavailable_reason() -> str | None:
    if postgres_bin_folder() is None:
        return (
            "PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin or on PATH): "
            "`make test` installs Debian's postgresql package with apt-get"
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing: a root test process needs it to run PostgreSQL as another user"
    return None


UNAVAILABLE_REASON = _unavailable_reason()
needs_postgres = pytest.mark.skipif(UNAVAILABLE_REASON is not None, reason=UNAVAILABLE_REASON or "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as when this process is root; None runs it as this process."""
    if os.geteuid() != 0:
        return None
    for name in SERVER_USERS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError(f"none of the users {', '.join(SERVER_USERS)} exists to run PostgreSQL as (it refuses root)")


class PostgresServer:
    """A private PostgreSQL cluster on 127.0.0.1, its superuser's database `dagster` created."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.password = secrets.token_urlsafe(18)
        self.port = 0
        self.url = ""
        self.folder: Path | None = None
        self.data_folder: Path | None = None
        self.socket_folder: Path | None = None
        self.log_file: Path | None = None
        self.process: subprocess.Popen | None = None
        self.bin_folder = postgres_bin_folder()
        self.user = None

    # -- what tests and Dagster read ---------------------------------------------------------------

    def dagster_storage_config(self) -> dict[str, Any]:
        """The `storage:` mapping of a dagster.yaml (dagster-postgres's DagsterPostgresStorage)."""
        return {"postgres": {"postgres_url": self.url}}

    def connect(self, database: str = DATABASE):
        """A psycopg2 connection (autocommit) as the superuser, over loopback with the password."""
        import psycopg2

        connection = psycopg2.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, password=self.password, dbname=database
        )
        connection.autocommit = True
        return connection

    def sql(self, statement: str, params: Any = None, database: str = DATABASE) -> list[tuple]:
        """The rows of one statement (none for a statement that returns none)."""
        connection = self.connect(database)
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                return cursor.fetchall() if cursor.description is not None else []
        finally:
            connection.close()

    # -- life cycle ----------------------------------------------------------------------------------

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if self.user is None:
            return argv
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}", "--clear-groups", *argv]

    def start(self) -> PostgresServer:
        if UNAVAILABLE_REASON is not None:
            raise RuntimeError(UNAVAILABLE_REASON)
        self.user = _server_user()
        self.folder = Path(tempfile.mkdtemp(prefix="databuild-pg-"))
        os.chmod(self.folder, 0o700)
        if self.user is not None:
            os.chown(self.folder, self.user.pw_uid, self.user.pw_gid)
        self.data_folder = self.folder / "data"
        self.socket_folder = self.folder
        self.log_file = self.folder / "server.log"
        password_file = self.folder / "password"
        password_file.write_text(self.password + "\n")
        os.chmod(password_file, 0o600)
        if self.user is not None:
            os.chown(password_file, self.user.pw_uid, self.user.pw_gid)
        try:
            self._initdb(password_file)
            password_file.unlink()
            self._start_server()
            self.sql(f"CREATE DATABASE {DATABASE}", database="postgres")
        except BaseException:
            self.stop()
            raise
        self.url = f"postgresql+psycopg2://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"
        return self

    def _initdb(self, password_file: Path) -> None:
        argv = [
            str(self.bin_folder / "initdb"),
            "--pgdata",
            str(self.data_folder),
            "--username",
            SUPERUSER,
            "--pwfile",
            str(password_file),
            "--auth-host",
            "scram-sha-256",
            "--auth-local",
            "trust",
            "--encoding",
            "UTF8",
            "--no-locale",
            "--no-instructions",
        ]
        done = subprocess.run(self._as_server_user(argv), capture_output=True, text=True, timeout=120, cwd=self.folder)
        if done.returncode != 0:
            raise RuntimeError(f"initdb into {self.data_folder} failed: {done.stderr.strip() or done.stdout.strip()}")
        # Loopback only, and only with the password; everything else is refused.
        (self.data_folder / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")

    def _start_server(self) -> None:
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            self.port = _free_port()
            argv = [
                str(self.bin_folder / "postgres"),
                "-D",
                str(self.data_folder),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"port={self.port}",
                "-c",
                f"unix_socket_directories={self.socket_folder}",
            ]
            for name, value in self.settings.items():
                argv += ["-c", f"{name}={value}"]
            log = open(self.log_file, "ab")  # the server writes it while it runs
            try:
                self.process = subprocess.Popen(
                    self._as_server_user(argv), stdout=log, stderr=subprocess.STDOUT, cwd=self.folder
                )
            finally:
                log.close()
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    break
                try:
                    self.connect("postgres").close()
                    return
                except Exception as error:  # not accepting connections yet
                    last_error = str(error).strip()
                    time.sleep(0.1)
            self._stop_process()
            last_error = self.log_file.read_text(errors="replace")[-2000:] or last_error
        raise RuntimeError(f"PostgreSQL in {self.data_folder} did not start: {last_error}")

    def _stop_process(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # SIGINT is PostgreSQL's fast shutdown: sessions ended, a checkpoint, then exit.
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGQUIT)  # immediate shutdown
            self.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        self._stop_process()
        self.process = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def checkpoint(self) -> None:
        """Forces a CHECKPOINT: every dirty page written to the data folder's files."""
        self.sql("CHECKPOINT")

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextmanager
def postgres_server(settings: dict[str, str] | None = None) -> Iterator[PostgresServer]:
    """A started PostgresServer, stopped and removed on exit. For a module's fixture:

    @pytest.fixture(scope="module")
    def postgres():
        with postgres_server() as server:
            yield server
    """
    with PostgresServer(settings) as server:
        yield server
