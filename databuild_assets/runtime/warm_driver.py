"""A Spark driver kept warm across processes: short-lived processes (Dagster's runs, one process
each) attach to one long-lived JVM instead of starting their own.

The first process that asks for a session with given settings starts a *driver host*: a detached
Python process that starts Spark's JVM (the same `build_spark_session` as everywhere else), then
only keeps it alive and watches who is attached. Every process with the same settings and the same
code attaches to that JVM through its Py4J gateway, as Zeppelin and Livy attach Python to a JVM
they started: it gets a classic `SparkSession` of its own (its own SQL settings and temporary
views) on the host's SparkContext, so every PySpark and Delta API works as in a process of its
own, without the JVM's start, its class loading and its first Delta jobs. The host is found by
a key over the Spark settings, the interpreter and this package's source files, so a changed
setting or a changed line of code gets a new host, never a stale one.

    spark = warm_session(SparkSettings())   # attaches, starting the host if there is none
    ...
    detach()                                # done; the host idles out after `idle_minutes`

Crashes keep the semantics of a JVM per process: a process that dies attached (killed, or a run
Dagster terminated) takes the host down with it, so no job or Delta commit of a dead process goes
on behind the commit lock it held. `databuild-assets spark-driver status|stop` lists and stops
hosts. Why this and not Spark Connect: docs/decisions/0021-warm-spark-driver.md.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pyspark
from py4j.java_gateway import GatewayClient, JavaObject
from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from databuild_assets.runtime.file_modes import restrict_umask
from databuild_assets.runtime.lock_files import held_lock
from databuild_assets.runtime.private_folders import UnsafeFolderError, private_folder
from databuild_assets.runtime.processes import process_alive, process_of_this_user
from databuild_assets.runtime.spark import SparkSettings, SparkStartError, build_spark_session, spark_config

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
HOST_MODULE = "databuild_assets.runtime.warm_driver"  # what a host runs: `python -m HOST_MODULE <folder>`
DRIVERS_DIR_ENV = "DATABUILD_SPARK_DRIVERS_DIR"
DEFAULT_IDLE_MINUTES = 30.0
START_TIMEOUT_S = 180.0
WATCH_INTERVAL_S = 0.2

_attached: Path | None = None  # this process's registration file while it is attached
_session: SparkSession | None = None  # this process's session on a host, once it has attached
_session_port = 0  # the gateway port of that host


def drivers_dir() -> Path:
    """Where hosts register: DATABUILD_SPARK_DRIVERS_DIR, else a folder of this user's in the temp
    dir. Either is this user's alone (runtime/private_folders.py): a `host.json` in it names a port
    and a secret this process hands its work to, so a folder someone else made first is refused
    (UnsafeFolderError naming it)."""
    return private_folder(_registry_path())


def _registry_path() -> Path:
    configured = os.environ.get(DRIVERS_DIR_ENV)
    path = Path(configured) if configured else Path(tempfile.gettempdir()) / f"databuild-spark-drivers-{os.getuid()}"
    return path.absolute()


def driver_key(settings: SparkSettings, source_root: Path = PACKAGE_ROOT) -> str:
    """What a host must share with a process to serve it: Spark's settings, the interpreter (its
    Python workers import this package) and this package's source (a changed file, a new host)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(spark_config(settings), sort_keys=True).encode())
    digest.update(f"{sys.executable}\0{pyspark.__version__}".encode())
    for path in sorted(source_root.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(source_root)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class DriverHost:
    """A running host as its `host.json` describes it."""

    pid: int
    port: int
    secret: str
    master: str
    started_at: float
    log: str

    @classmethod
    def read(cls, folder: Path) -> DriverHost | None:
        """The host registered in `folder` (a private folder), if its process is alive and is a host
        of this user's for that folder (a pid of a host long gone may be another process's now).
        Raises UnsafeFolderError when its `host.json` is not a plain file of this user's."""
        host = cls.registered(folder)
        return host if host is not None and why_not_host(host.pid, folder) is None else None

    @classmethod
    def registered(cls, folder: Path) -> DriverHost | None:
        """What `folder`'s `host.json` says, whether or not that process still runs; raises
        UnsafeFolderError when it is a link, or a file someone else owns or may write."""
        try:
            handle = os.open(folder / "host.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as error:  # ELOOP: a symbolic link
            raise UnsafeFolderError(
                f"{folder / 'host.json'} is not a plain file ({error.strerror}); remove it and retry"
            ) from None
        with os.fdopen(handle, "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_mode & 0o022:
                raise UnsafeFolderError(
                    f"{folder / 'host.json'} is not a plain file of this user's writable by no one else "
                    f"(uid {status.st_uid}, mode {stat.S_IMODE(status.st_mode):04o}); remove it and retry"
                )
            text = file.read()
        try:
            return cls(**json.loads(text))
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
            return None  # a host that died writing it; the next start replaces it


def why_not_host(pid: int, folder: Path) -> str | None:
    """None when process `pid` is, running as this user, the host of `folder` (`python -m
    HOST_MODULE <folder>`, as `_start_host` starts it); else why not. A pid is attached to or
    signalled only then: the one in a `host.json` may be stale, reused by another process."""
    if not process_alive(pid):
        return f"process {pid} is not running"
    command = process_of_this_user(pid)
    if command is None:
        return f"process {pid} does not run as this user"
    if command[1:4] != ["-m", HOST_MODULE, str(folder.absolute())]:
        return f"process {pid} is not the warm Spark driver of {folder} (it runs {' '.join(command)[:200]!r})"
    return None


def warm_session(settings: SparkSettings, idle_minutes: float = DEFAULT_IDLE_MINUTES) -> SparkSession:
    """A SparkSession of this process on the warm driver for `settings`, the host started first
    if none is running (that first call pays the JVM's start). Idempotent within a process.

        spark = warm_session(SparkSettings(master="local[*]"))
    """
    global _attached, _session
    folder = private_folder(drivers_dir() / driver_key(settings))
    if _session is None and SparkContext._gateway is not None:
        raise SparkStartError("this process already runs a JVM of its own; it cannot also attach to a warm driver")
    with _start_lock(folder):  # the host cannot idle out between the look-up and the registration
        host = DriverHost.read(folder)
        if _session is not None:  # attached before (a second run in this process): the same host only
            if host is None or host.port != _session_port:
                raise SparkStartError(
                    "the warm Spark driver this process attached to has stopped (idle timeout, or "
                    "`databuild-assets spark-driver stop`); a new process attaches to a new one"
                )
        else:
            host = host or _start_host(folder, settings, idle_minutes)
        clients = folder / "clients"
        clients.mkdir(exist_ok=True)
        _attached = clients / str(os.getpid())
        _attached.write_text(str(os.getpid()))
    if _session is None:
        atexit.register(_at_exit)
        _session = _session_on(host, settings)
    return _session


def detach() -> None:
    """Tell the host this process is done with it (the host then idles out in its own time).
    A process that exits without detaching is taken for crashed: the host stops its JVM."""
    global _attached
    if _attached is not None:
        _attached.unlink(missing_ok=True)
        _attached = None


def _at_exit() -> None:
    """The process ends: it hands back what it holds in the shared JVM, then detaches."""
    release_java_objects()
    detach()


def release_java_objects() -> int:
    """Tell the JVM this process is done with every Java object it still holds; returns how many.

    Py4J's gateway keeps each object it hands to a client until the client's proxy of it is
    collected, and even then the release waits in a queue for a daemon thread. A process that
    exits first (a session in a module global, a run's last DataFrames, releases still queued)
    would leave them bound in the warm JVM for its whole life, and with them their query plans,
    broadcast relations and cached blocks: the driver's heap would grow run after run until it ran
    out. Only at exit: a process that attaches again goes on with its session.
    """
    if SparkContext._gateway is None:
        return 0
    client = SparkContext._gateway._gateway_client
    held = {item._target_id for item in gc.get_objects() if issubclass(type(item), JavaObject)}
    queued = getattr(client, "finalizer_deque", None)  # ClientServer's releases not yet sent
    while queued:
        try:
            task = queued.pop()
        except IndexError:  # the worker thread took the last one meanwhile
            break
        if isinstance(task, tuple):
            held.add(task[1])
        else:  # the worker's stop signal: left for it
            queued.append(task)
            break
    for target_id in held:
        GatewayClient.garbage_collect_object(client, target_id)  # sent now, not queued; errors are py4j's to log
    return len(held)


def _session_on(host: DriverHost, settings: SparkSettings) -> SparkSession:
    global _session_port
    _session_port = host.port
    os.environ["PYSPARK_GATEWAY_PORT"] = str(host.port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = host.secret
    if settings.master.startswith("local"):
        # A Python UDF runs the interpreter its driver process names (pyspark's pythonExec).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    gateway = launch_gateway()
    jvm = gateway.jvm
    jsc = jvm.JavaSparkContext.fromSparkContext(jvm.org.apache.spark.SparkContext.getOrCreate())
    context = SparkContext(gateway=gateway, jsc=jsc, conf=SparkConf(_jconf=jsc.getConf()))
    # A session of its own on the shared context: SQL settings and temporary views are per process.
    shared = getattr(jvm, "org.apache.spark.sql.classic.SparkSession").getDefaultSession().get()
    return SparkSession(context, jsparkSession=shared.newSession())


def _start_lock(folder: Path) -> contextlib.AbstractContextManager[None]:
    """The host's start lock: a lock file like every other (runtime/lock_files.py), bounded wait."""
    return held_lock(folder / "start.lock", "the warm Spark driver's start lock")


def _start_host(folder: Path, settings: SparkSettings, idle_minutes: float) -> DriverHost:
    (folder / "host.json").unlink(missing_ok=True)
    log = folder / "host.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", HOST_MODULE, str(folder.absolute())],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this process and its process group (Dagster's run)
            cwd=folder,
        )
    # The settings on its stdin, not its command line: `ps` shows a command line to every user,
    # and DATABUILD_SPARK_CONF may hold credentials.
    with process.stdin:
        process.stdin.write(json.dumps({"settings": asdict(settings), "idle_minutes": idle_minutes}).encode())
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        host = DriverHost.read(folder)
        if host is not None and host.pid == process.pid:
            return host
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    tail = log.read_text(errors="replace")[-3000:]
    raise SparkStartError(f"the warm Spark driver did not start (its log, {log}, ends with):\n{tail}")


# The host ---------------------------------------------------------------------------------------


def serve(settings: SparkSettings, folder: Path, idle_minutes: float) -> int:
    """The host's life: start Spark, register, watch the attached processes, stop when idle or
    when one of them died attached."""
    # Its runs' logs are in Dagster; a progress bar in a log file nobody watches is noise.
    console = {"spark.ui.showConsoleProgress": "false"}
    spark = build_spark_session(replace(settings, long_lived=True, extra_config={**settings.extra_config, **console}))
    gateway = SparkContext._gateway
    _warm_up(spark, folder)
    clients = folder / "clients"
    clients.mkdir(exist_ok=True)
    for stale in clients.iterdir():  # registrations of a host before this one
        stale.unlink(missing_ok=True)
    host = DriverHost(
        pid=os.getpid(),
        port=gateway.java_parameters.port,
        secret=gateway.java_parameters.auth_token,
        master=settings.master,
        started_at=time.time(),
        log=str(folder / "host.log"),
    )
    staged = folder / "host.json.tmp"
    staged.unlink(missing_ok=True)
    # 0600 whatever the umask: it holds the secret of the JVM's gateway.
    with os.fdopen(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as file:
        file.write(json.dumps(asdict(host)))
    staged.replace(folder / "host.json")
    print(f"warm Spark driver {host.pid} ready on port {host.port} (idle timeout {idle_minutes} min)", flush=True)

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append("stopped (SIGTERM)"))
    idle_since = time.monotonic()
    while not stop:
        time.sleep(WATCH_INTERVAL_S)
        attached = [int(path.name) for path in clients.iterdir() if path.name.isdigit()]
        dead = [pid for pid in attached if not process_alive(pid)]
        if dead:
            # Its jobs and commits would go on without it, behind a commit lock it no longer holds.
            print(f"warm Spark driver {os.getpid()}: process {dead[0]} exited while attached: stopping the JVM with it")
            gateway.proc.kill()
            (folder / "host.json").unlink(missing_ok=True)
            sys.stdout.flush()
            os._exit(1)  # not sys.exit: pyspark's exit hooks would try to talk to the JVM just killed
        if gateway.proc.poll() is not None:  # the JVM is gone (out of memory, killed): so is this host
            stop.append(f"its JVM exited ({gateway.proc.returncode})")
            break
        if attached:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > idle_minutes * 60:
            with _start_lock(folder):
                if not any(clients.iterdir()):
                    stop.append(f"idle for {idle_minutes} min")
                    (folder / "host.json").unlink(missing_ok=True)
    (folder / "host.json").unlink(missing_ok=True)
    print(f"warm Spark driver {host.pid}: {stop[0]}", flush=True)
    if gateway.proc.poll() is not None:
        os._exit(1)  # as above: nothing left to stop
    spark.stop()
    return 0


def _warm_up(spark: SparkSession, folder: Path) -> None:
    """Load and compile what every run uses first (Delta's commit, log replay and MERGE) before
    the host says it is ready, so the first process attached does not pay for it."""
    path = str(folder / "warm-up-table")
    rows = spark.range(10).selectExpr("id", "cast(id as string) as value")
    rows.write.format("delta").mode("overwrite").save(path)
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING (SELECT id, 'x' AS value FROM range(5, 15)) s ON t.id = s.id "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    spark.read.format("delta").load(path).count()


def stop_hosts(root: Path | None = None, wait_s: float = 0) -> list[int]:
    """Stop every running host of this user's (SIGTERM: each stops Spark and exits); their pids.
    A pid that is not such a host (a stale `host.json`, a folder not this user's alone) is left
    alone, with the reason on stderr. With `wait_s`, wait up to that long for them to be gone
    (before removing their folder, say). Raises UnsafeFolderError when `root` is not this user's."""
    stopped = []
    for folder, host in _registered_hosts(root):
        if host.pid in stopped:
            continue
        reason = _signal_host(host.pid, folder, signal.SIGTERM)
        if reason is None:
            stopped.append(host.pid)
        elif process_alive(host.pid):  # a host gone since is no news
            print(f"not stopping process {host.pid} named by {folder / 'host.json'}: {reason}", file=sys.stderr)
    deadline = time.monotonic() + wait_s
    while any(process_alive(pid) for pid in stopped) and time.monotonic() < deadline:
        time.sleep(0.2)
    return stopped


def running_hosts(root: Path | None = None) -> list[tuple[str, DriverHost, list[int]]]:
    """(key, host, attached pids) of every running host of this user's."""
    found = []
    for folder, host in _registered_hosts(root):
        if why_not_host(host.pid, folder) is None:
            clients = folder / "clients"
            pids = sorted(int(p.name) for p in clients.iterdir() if p.name.isdigit()) if clients.is_dir() else []
            found.append((folder.name, host, pids))
    return found


def _registered_hosts(root: Path | None) -> Iterator[tuple[Path, DriverHost]]:
    """(folder, host.json's host) of each key folder of `root` (the registry by default), every
    one checked to be this user's alone; one that is not is skipped with the reason on stderr."""
    root = Path(root).absolute() if root is not None else _registry_path()
    if not os.path.lexists(root):
        return
    root = private_folder(root, create=False)
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.is_symlink():
            continue
        try:
            host = DriverHost.registered(private_folder(folder, create=False))
        except UnsafeFolderError as error:
            print(f"skipping warm Spark driver folder: {error}", file=sys.stderr)
            continue
        if host is not None:
            yield folder, host


def _signal_host(pid: int, folder: Path, signum: int) -> str | None:
    """Send `signum` to `pid` if it is the host of `folder` (why_not_host); else why not. Through a
    pidfd opened before the check, so the pid cannot be another process's by the time it is signalled."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return f"process {pid} is not running"
    try:
        if reason := why_not_host(pid, folder):
            return reason
        signal.pidfd_send_signal(pidfd, signum)
        return None
    except ProcessLookupError:  # it exited after the check
        return f"process {pid} is not running"
    finally:
        os.close(pidfd)


if __name__ == "__main__":
    restrict_umask()  # the host's log and warm-up table are its owner's alone (runtime/file_modes.py)
    # The settings come on stdin (`_start_host`), never on the command line.
    request = json.loads(sys.stdin.read())
    sys.exit(serve(SparkSettings(**request["settings"]), Path(sys.argv[1]), float(request["idle_minutes"])))
