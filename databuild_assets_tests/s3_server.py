"""An S3-compatible server on loopback for the object-store tests: moto's server mode, in a process
of its own (Spark's JVM, delta-rs and boto3 all reach it over HTTP, as they would reach S3).

moto is a well-kept package that serves S3 with conditional writes (If-None-Match, which delta-rs
commits with) and DynamoDB; its state lives in the server's memory, so a test's bucket is gone when
the server stops. Credentials are made up: no account of anyone's is ever used.

    with LoopbackS3() as s3:
        os.environ.update(s3.env)        # what Spark (S3A) and delta-rs read
        s3.client.list_objects_v2(Bucket=s3.bucket)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

BUCKET = "databuild-test"
# Made up: moto accepts any key. Never a real account's credentials.
ACCESS_KEY = "loopback-test-key"
SECRET_KEY = "loopback-test-secret-do-not-log"
REGION = "us-east-1"
STARTUP_TIMEOUT_S = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackS3:
    """A moto server on 127.0.0.1 with one bucket; `env` is what a process needs to reach it."""

    def __init__(self, log_dir: Path | None = None, bucket: str = BUCKET):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bucket = bucket
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            # No profile or instance metadata lookups: only these variables.
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    @property
    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def root(self, prefix: str) -> str:
        """A lake root in the bucket: s3a://<bucket>/<prefix>."""
        return f"s3a://{self.bucket}/{prefix.strip('/')}"

    def start(self) -> LoopbackS3:
        server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
        log = open(self.log_dir / "moto.log", "wb") if self.log_dir else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [server, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited ({self.process.returncode}) before it served {self.url}")
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            self.stop()
            raise TimeoutError(f"moto_server did not answer at {self.url} within {STARTUP_TIMEOUT_S} s")
        self.client.create_bucket(Bucket=self.bucket)
        return self

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under `prefix`, sorted."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> LoopbackS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_SLOW_DOWN = (
    b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>"
)
SLOW_DOWN_RESPONSE = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
    b"Content-Length: " + str(len(_SLOW_DOWN)).encode() + b"\r\n\r\n" + _SLOW_DOWN
)


class StoreOutage:
    """A TCP forwarder on loopback in front of the S3 server, which a test can take down and bring
    back: while down, every connection is cut at once (as a store that stops answering), and the
    server behind it keeps its objects. It can also answer chosen requests with S3's
    `503 Slow Down` instead of forwarding them (`slow_down_at`). `env` points a process at it.

        with StoreOutage(s3) as outage:
            ...                      # a run using outage.env
            outage.down(); ...; outage.up()      # or outage.down_at(b"/bucket/lake/tables/")
    """

    def __init__(self, s3: LoopbackS3):
        self.s3 = s3
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._up = threading.Event()
        self._up.set()
        self._listener: socket.socket | None = None
        self._trigger: bytes | None = None
        self._slow_down: tuple[bytes, int] | None = None  # (request bytes, answers left)
        self._lock = threading.Lock()  # one forwarding thread per connection and direction
        self.cut = 0  # requests and connections refused while down
        self.slowed = 0  # requests answered 503

    @property
    def env(self) -> dict[str, str]:
        return {**self.s3.env, "AWS_ENDPOINT_URL": self.url}

    def down(self) -> None:
        self._up.clear()

    def up(self) -> None:
        self._trigger = None
        self._up.set()

    def down_at(self, request: bytes) -> None:
        """Go down at the first request whose bytes hold `request` (e.g. a key's prefix), which is
        not forwarded: an outage at a known point of a run, whatever its speed."""
        self._trigger = request

    def slow_down_at(self, request: bytes, times: int) -> None:
        """Answer the next `times` requests whose bytes hold `request` with `503 Slow Down`, not
        forwarded (the connection then closes): a store throttling a run at a known point."""
        self._slow_down = (request, times)

    def _slowed_down(self, data: bytes) -> bool:
        with self._lock:
            request, left = self._slow_down or (b"", 0)
            if left <= 0 or request not in data:
                return False
            self._slow_down = (request, left - 1)
            self.slowed += 1
            return True

    def _pipe(self, source: socket.socket, target: socket.socket, upstream: bool) -> None:
        try:
            while self._up.is_set() and (data := source.recv(65536)):
                if upstream and self._slowed_down(data):
                    source.sendall(SLOW_DOWN_RESPONSE)
                    break
                if upstream and self._trigger is not None and self._trigger in data:
                    self._up.clear()
                if not self._up.is_set():
                    self.cut += 1
                    break
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                end.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._up.is_set():
                self.cut += 1
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.s3.port))
            for source, target, upstream in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(source, target, upstream), daemon=True).start()

    def __enter__(self) -> StoreOutage:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._listener.close()


__all__ = ["BUCKET", "LoopbackS3", "StoreOutage"]


if __name__ == "__main__":  # a server to try things against by hand: prints its env, runs until ^C
    with LoopbackS3() as s3:
        print("\n".join(f"export {key}={value}" for key, value in s3.env.items()), flush=True)
        try:
            s3.process.wait()
        except KeyboardInterrupt:
            pass
    os._exit(0)
