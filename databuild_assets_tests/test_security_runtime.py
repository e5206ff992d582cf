"""What another local user can do to the warm Spark driver and to Spark's JVM (docs/security.md):
plant the driver's registry first, or a `host.json` naming a process to signal; read a secret
setting off a command line (`ps`); reach Spark's ports."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from databuild_assets.runtime.private_folders import UnsafeFolderError, private_folder
from databuild_assets.runtime.processes import process_alive
from databuild_assets.runtime.spark import SparkSettings, spark_config
from databuild_assets.runtime.warm_driver import DRIVERS_DIR_ENV, HOST_MODULE, running_hosts, stop_hosts
from databuild_assets_tests.support import REPO_ROOT, as_other_user, needs_another_user

# What a process of the pipeline does first: ask for its warm session. Run in a child so that
# whatever it attaches to (on code that trusts a planted registry) leaves this process alone.
ATTACH = """
from databuild_assets.runtime.spark import SparkSettings
from databuild_assets.runtime.warm_driver import warm_session
try:
    warm_session(SparkSettings(master="local[1]", driver_memory="1g"))
except Exception as error:
    print(f"{type(error).__name__}: {error}")
else:
    print("attached")
"""


@pytest.fixture
def shared_tmp():
    """A fresh folder like /tmp (sticky, writable by everyone), so `nobody` can make things in it."""
    folder = Path(tempfile.mkdtemp(prefix="databuild-shared-tmp-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=True)


@pytest.fixture
def others_sleep():
    """A process of `nobody`'s that a planted `host.json` names (alive, so a registry is believed)."""
    process = as_other_user("sleep", "120", wait=False)
    yield process.pid
    process.kill()
    process.wait()


def plant_registry(folder: Path, pid: int) -> None:
    """`folder` made by `nobody`, open to all, with a key folder of any name and a host.json in it."""
    host = {"pid": pid, "port": 1, "secret": "planted", "master": "local[1]", "started_at": 0.0, "log": "x"}
    script = (
        f"mkdir -m 0777 -p {folder}/planted-key && printf '%s' '{json.dumps(host)}' > {folder}/planted-key/host.json"
    )
    as_other_user("sh", "-c", script)


def attach(environ: dict[str, str]) -> str:
    run = subprocess.run(
        [sys.executable, "-c", ATTACH], cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1]


@needs_another_user
@pytest.mark.parametrize("where", ["default folder in TMPDIR", "DATABUILD_SPARK_DRIVERS_DIR"])
def test_a_drivers_registry_another_user_made_first_is_refused(shared_tmp, others_sleep, where):
    environ = {key: value for key, value in os.environ.items() if key != DRIVERS_DIR_ENV}
    if where == "DATABUILD_SPARK_DRIVERS_DIR":
        registry = shared_tmp / "drivers"
        environ[DRIVERS_DIR_ENV] = str(registry)
    else:
        registry = shared_tmp / f"databuild-spark-drivers-{os.getuid()}"
        environ["TMPDIR"] = str(shared_tmp)
    plant_registry(registry, others_sleep)

    outcome = attach(environ)

    assert outcome.startswith("UnsafeFolderError: ") and str(registry) in outcome, outcome
    assert "belongs to uid 65534" in outcome
    assert len(outcome.splitlines()) == 1
    stopping = subprocess.run(
        [sys.executable, "-m", "databuild_assets.cli", "spark-driver", "stop"],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stopping.returncode == 2 and str(registry) in stopping.stderr, stopping.stderr
    assert Path(f"/proc/{others_sleep}").exists()  # the pid its host.json names was not signalled


def register(registry: Path, key: str, pid: int) -> Path:
    """A key folder of this user's whose host.json names `pid` (a stale one, say: that pid reused)."""
    folder = private_folder(registry / key)
    host = {"pid": pid, "port": 1, "secret": "x", "master": "local[1]", "started_at": 0.0, "log": "x"}
    (folder / "host.json").write_text(json.dumps(host))
    (folder / "host.json").chmod(0o600)
    return folder


@pytest.fixture
def impostor_code():
    """A module of the host's name that only sleeps, where `nobody` can read it."""
    folder = Path(tempfile.mkdtemp(prefix="databuild-impostor-", dir="/tmp"))
    (folder / "databuild_assets" / "runtime").mkdir(parents=True)
    for package in ("databuild_assets", "databuild_assets/runtime"):
        (folder / package / "__init__.py").write_text("")
    (folder / "databuild_assets" / "runtime" / "warm_driver.py").write_text("import time\ntime.sleep(120)\n")
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=True)


def wait_for_command(pid: int, argv1: str) -> None:
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] != [argv1.encode()]:
        assert time.monotonic() < deadline, "the process did not start"
        time.sleep(0.05)


@needs_another_user
def test_stop_signals_no_process_that_is_not_a_host_this_user_started(tmp_path, impostor_code, capsys):
    registry = private_folder(tmp_path / "drivers")
    # A process of this user's that is no host: what a stale host.json's pid may be now.
    own = subprocess.Popen(["sleep", "120"])
    # A process of another user's that runs what a host runs, for this very folder.
    impostor = as_other_user(
        "/usr/bin/python3", "-m", HOST_MODULE, str(registry / "impostor-key"), wait=False, cwd=impostor_code
    )
    try:
        register(registry, "stale-key", own.pid)
        register(registry, "impostor-key", impostor.pid)
        wait_for_command(impostor.pid, "-m")

        assert stop_hosts(registry, wait_s=1) == []

        assert own.poll() is None and impostor.poll() is None  # both still run
        reasons = capsys.readouterr().err
        assert f"not stopping process {own.pid} named by {registry}/stale-key/host.json" in reasons
        assert "is not the warm Spark driver of" in reasons
        assert f"process {impostor.pid} does not run as this user" in reasons
    finally:
        for process in (own, impostor):
            process.kill()
            process.wait()


def test_a_host_json_that_is_a_link_is_not_followed(tmp_path, capsys):
    registry = private_folder(tmp_path / "drivers")
    folder = private_folder(registry / "some-key")
    own = subprocess.Popen(["sleep", "120"])
    try:
        elsewhere = tmp_path / "elsewhere.json"
        host = {"pid": own.pid, "port": 1, "secret": "x", "master": "local", "started_at": 0.0, "log": "x"}
        elsewhere.write_text(json.dumps(host))
        (folder / "host.json").symlink_to(elsewhere)

        assert stop_hosts(registry) == []

        assert own.poll() is None
        assert f"{folder}/host.json is not a plain file" in capsys.readouterr().err
    finally:
        own.kill()
        own.wait()


@needs_another_user
def test_private_folder_makes_or_accepts_only_a_folder_of_this_users_alone(tmp_path, shared_tmp):
    made = private_folder(tmp_path / "made")
    readable = tmp_path / "readable"
    readable.mkdir(mode=0o755)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(made)
    as_other_user("mkdir", str(shared_tmp / "others"))

    assert made.stat().st_mode & 0o777 == 0o700
    assert private_folder(readable).stat().st_mode & 0o777 == 0o700  # narrowed, not refused
    for path, why in [
        (open_to_all, "writable by other users (mode 0777)"),
        (link, "is a symbolic link"),
        (shared_tmp / "others", "belongs to uid 65534"),
    ]:
        with pytest.raises(UnsafeFolderError) as refused:
            private_folder(path)
        assert str(path) in str(refused.value) and why in str(refused.value)
        assert len(str(refused.value).splitlines()) == 1


# A run's process on the warm driver, its settings from the environment as a deployment's are;
# it prints its host's and JVM's pids, what Spark made of the secret setting, and the UI's address.
ATTACH_AND_REPORT = """
import json, os
from databuild_assets.runtime.spark import SparkSettings
from databuild_assets.runtime.warm_driver import detach, running_hosts, warm_session
spark = warm_session(SparkSettings.from_env())
context = spark.sparkContext
[(_, host, _)] = running_hosts()
print(json.dumps({
    "host": host.pid,
    "jvm": context._jvm.java.lang.ProcessHandle.current().pid(),
    "secret_key": context._jsc.hadoopConfiguration().get("fs.s3a.secret.key"),
    "ui": context.uiWebUrl,
}))
detach()
"""
SECRET = "not-on-any-command-line-5f0c"


def listening_addresses(pid: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} spell them) of the sockets `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(fields[1])
    return found


def is_loopback(address: str) -> bool:
    """Whether a /proc/net/tcp{,6} local address (hex words in host byte order, then the port) is on loopback."""
    words = address.split(":")[0]
    raw = b"".join(bytes.fromhex(words[i : i + 8])[::-1] for i in range(0, len(words), 8))
    ip = ipaddress.ip_address(raw)
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def test_a_local_warm_driver_keeps_secrets_off_command_lines_and_listens_on_loopback_only(tmp_path):
    drivers = tmp_path / "drivers"
    environ = {
        **os.environ,
        DRIVERS_DIR_ENV: str(drivers),
        "PYTHONPATH": str(REPO_ROOT),  # the host imports this checkout's package too
        "DATABUILD_SPARK_MASTER": "local[1]",
        "DATABUILD_SPARK_DRIVER_MEMORY": "1g",
        "DATABUILD_SPARK_CONF": f"spark.hadoop.fs.s3a.secret.key={SECRET},spark.ui.showConsoleProgress=false",
    }
    environ.pop("SPARK_LOCAL_IP", None)
    try:
        run = subprocess.run(
            [sys.executable, "-c", ATTACH_AND_REPORT],
            cwd=REPO_ROOT,
            env=environ,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        reported = json.loads(run.stdout.splitlines()[-1])

        assert reported["secret_key"] == SECRET  # the setting reached Spark
        assert reported["ui"]  # and Spark's UI runs, as operators expect
        showing = [
            pid.name for pid in Path("/proc").iterdir() if pid.name.isdigit() and SECRET.encode() in _cmdline(pid)
        ]
        assert showing == [], f"processes whose command line shows the secret: {showing}"
        addresses = listening_addresses(reported["jvm"])
        assert addresses, "the JVM listens on nothing: the test sees no sockets"
        assert [address for address in addresses if not is_loopback(address)] == []
        [(_, host, _)] = running_hosts(drivers)
        assert stop_hosts(drivers, wait_s=60) == [host.pid]  # what `spark-driver stop` does
        assert not process_alive(host.pid)  # the host is gone when it returns
    finally:
        stop_hosts(drivers, wait_s=60)


def _cmdline(pid: Path) -> bytes:
    try:
        return (pid / "cmdline").read_bytes()
    except OSError:
        return b""


def test_only_a_local_driver_is_put_on_loopback_and_the_operators_setting_wins():
    local = spark_config(SparkSettings(master="local[2]"))
    cluster = spark_config(SparkSettings(master="spark://spark-master:7077"))
    exposed = spark_config(SparkSettings(master="local[2]", extra_config={"spark.driver.bindAddress": "0.0.0.0"}))

    assert (local["spark.driver.bindAddress"], local["spark.driver.host"]) == ("127.0.0.1", "127.0.0.1")
    assert "spark.driver.bindAddress" not in cluster and "spark.driver.host" not in cluster  # executors reach it
    assert exposed["spark.driver.bindAddress"] == "0.0.0.0"
