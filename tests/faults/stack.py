"""Dedicated services for the fault scenarios, and the consumer as a killable process.

The scenarios restart, kill and freeze Redis and Kafka. Doing that to the shared
services would break every other test (and every other developer) using them, so
the suite starts its OWN redis-server and Kafka broker on free loopback ports,
through the same :mod:`rankstream.services` API as ``./run services``, once per
session (the broker costs ~15 s to start), and stops them at the end. Each
scenario then gets its own topics and key prefix on that stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis as redis_py
from pydantic import SecretStr

from rankstream.services import (
    KafkaBroker,
    RedisServer,
    ensure_settings_topics,
    start_kafka,
    start_redis,
    stop_kafka,
    stop_redis,
)
from rankstream.services.kafka_jars import fetch_kafka, java_binary, libs_dir_for
from rankstream.services.redis import redis_binary
from rankstream.settings import Settings

PYTHON = sys.executable
# The stack's home directory is named after this (``tmp_path_factory.mktemp`` adds a
# number), and holds OWNER_FILE: how a later session tells an orphaned stack.
STACK_DIR_NAME = "rankstream-fault-stack"
OWNER_FILE = "owner"


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout: float, what: str, *,
              interval: float = 0.02) -> float:
    """Poll ``check`` until true; return the seconds waited or fail the test.

    Redis connection errors count as "not yet": the probes run through the faults.
    """
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except (redis_py.ConnectionError, redis_py.TimeoutError):
            pass  # the fault under test: keep polling
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True)
class FaultStack:
    """A redis-server and a Kafka broker that only the fault scenarios use."""

    redis: RedisServer
    kafka: KafkaBroker
    base: Settings  # the session settings pointed at this stack
    home: Path

    def scenario(self, name: str, *, partitions: int = 1, **updates: Any) -> Settings:
        """Settings with a fresh topic (created now), DLQ topic and key prefix."""
        token = uuid.uuid4().hex[:8]
        topic = f"faults.{name}.{token}"
        settings = self.base.model_copy(update={
            "topic": topic, "dlq_topic": f"{topic}.dlq", "key_prefix": f"faults:{token}:",
            "topic_partitions": partitions, "group_id": f"faults-{token}", **updates})
        ensure_settings_topics(settings)
        return settings

    def client(self) -> redis_py.Redis:
        """A plain client of the stack's Redis; callers close it."""
        return redis_py.Redis(host=self.redis.host, port=self.redis.port,
                              socket_timeout=60.0)


def start_stack(base: Settings, home: Path) -> FaultStack:
    """Start a redis-server (AOF on) and a KRaft broker on free ports under ``home``.

    The session's services may be the user's (Docker's, say), so the jars and the
    redis-server binary are fetched and installed here when missing, as ``up`` does.
    """
    reap_orphaned_stacks()
    home.mkdir(parents=True, exist_ok=True)
    (home / OWNER_FILE).write_text(f"{os.getpid()} {start_ticks(os.getpid())}\n")
    cache_dir = base.cache_dir.expanduser()
    fetch_kafka(cache_dir)
    server = RedisServer(home=home / "redis", port=free_port())
    start_redis(server, binary=redis_binary(install=True))
    broker = KafkaBroker(home=home / "kafka", libs_dir=libs_dir_for(cache_dir),
                         port=free_port(), controller_port=free_port(), heap_mb=384)
    try:
        start_kafka(broker, java=java_binary(install=True), timeout=180.0)
    except BaseException:
        stop_redis(server)
        raise
    settings = base.model_copy(update={
        "kafka_bootstrap": broker.bootstrap, "redis_url": server.url,
        "redis_username": None, "redis_password": None,
        "snapshot_dir": home / "snapshots"})  # restart snapshots go with the stack
    return FaultStack(server, broker, settings, home)


def _stack_home(proc: psutil.Process) -> Path | None:
    """The fault-stack home a stack's process names: the broker (java) in an argument,
    a consumer in a ``RANKSTREAM_*`` variable (its settings come that way), a
    redis-server by its working directory (its title names no path). Nothing else
    counts: a developer's shell in such a directory, or a viewer of its logs, is not
    the stack's."""
    try:
        name = proc.name()
        places = [value for key, value in proc.environ().items()
                  if key.startswith("RANKSTREAM_")]
        if name == "java":
            places.extend(proc.cmdline())
        elif name == "redis-server":
            places.append(proc.cwd())
    except (psutil.Error, OSError):
        return None  # gone, or another user's
    for place in places:
        parts = Path(place.removesuffix(" (deleted)")).parts
        for i, part in enumerate(parts):
            if part.startswith(STACK_DIR_NAME) and part[len(STACK_DIR_NAME):].isdigit():
                return Path(*parts[: i + 1])
    return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``
    field 22): with the pid, it names one process. Not psutil's create_time, which
    adds the boot time as the wall clock now places it: a clock step changed it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # fields from 3 on follow the name


def _owner_alive(home: Path) -> bool:
    try:
        pid, ticks = (home / OWNER_FILE).read_text().split()
        return start_ticks(int(pid)) == int(ticks)
    except (OSError, ValueError):
        return False  # no owner file (pytest pruned the directory), or its owner is gone


def reap_orphaned_stacks() -> list[int]:
    """Stop what fault stacks of ended sessions left running; returns their pids.

    A session that is killed (SIGKILL, a CI job cancelled) runs no teardown, and
    its broker (a JVM of ~0.5 GB) and redis-server run on, detached, until someone
    stops them: the next session that starts a stack does. A stack whose owner
    (the pytest process named in its home's OWNER_FILE) still runs is left alone.
    """
    stopped = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        home = _stack_home(proc)
        if home is None or _owner_alive(home):
            continue
        with contextlib.suppress(psutil.Error, OSError):
            os.kill(proc.pid, signal.SIGCONT)  # a frozen one cannot die of SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=20.0)
            except psutil.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10.0)
            stopped.append(proc.pid)
    return stopped


def stop_stack(stack: FaultStack) -> None:
    """Stop both services and delete their data."""
    with contextlib.suppress(Exception):
        stop_kafka(stack.kafka, timeout=30.0)
    with contextlib.suppress(Exception):
        stop_redis(stack.redis, timeout=30.0)
    shutil.rmtree(stack.home, ignore_errors=True)


# -- the consumer as a process ------------------------------------------------------

def settings_env(settings: Settings) -> dict[str, str]:
    """``RANKSTREAM_*`` variables that make a child process read exactly ``settings``."""
    env: dict[str, str] = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if value is None:
            if Settings.model_fields[name].get_default(call_default_factory=True) is not None:
                env[f"RANKSTREAM_{name.upper()}"] = ""  # switched off (snapshot_dir)
            continue
        if isinstance(value, SecretStr):
            text = value.get_secret_value()
        elif isinstance(value, tuple | list):
            text = json.dumps(list(value))
        else:
            text = str(value)
        env[f"RANKSTREAM_{name.upper()}"] = text
    return env


class ConsumerProcess:
    """``python -m consumer consume`` with its stderr in a file (a pipe could fill up)."""

    def __init__(self, settings: Settings, log_dir: Path, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.args = args
        self.log_path = log_dir / f"consumer-{uuid.uuid4().hex[:8]}.log"
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def start(self) -> ConsumerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSTREAM_")}
        env.update(settings_env(self.settings))
        env.update(self.extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", "consumer", "consume", *self.args], env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> float:
        """SIGKILL; returns the wall-clock time of the signal (for MONITOR timelines)."""
        assert self.proc is not None
        at = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        return at

    def stop(self, timeout: float = 120.0) -> int:
        """SIGTERM (finish the batch, publish, release the lease) and wait; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 120.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            raise AssertionError(f"consumer did not exit within {timeout:.0f}s\n"
                                 f"{self.output()[-3000:]}") from None

    def ensure_dead(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)

    def output(self) -> str:
        """Everything the process wrote (JSON log lines on stderr, stdout)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far (all its threads)."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def rss_bytes(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)


@contextlib.contextmanager
def consumers(settings: Settings, log_dir: Path) -> Iterator[Callable[..., ConsumerProcess]]:
    """``with consumers(s, dir) as spawn: spawn(*args)``; every process dies on the way out."""
    started: list[ConsumerProcess] = []

    def spawn(*args: str, env: dict[str, str] | None = None) -> ConsumerProcess:
        proc = ConsumerProcess(settings, log_dir, *args, env=env).start()
        started.append(proc)
        return proc

    try:
        yield spawn
    finally:
        for proc in started:
            proc.ensure_dead()
