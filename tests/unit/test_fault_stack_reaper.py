"""The fault stack's reaper: services an ended session left behind are stopped, and
a running session's are not (no services needed: stand-in processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.stack import OWNER_FILE, STACK_DIR_NAME, reap_orphaned_stacks, start_ticks

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _stand_in(home: Path, spawned: list[subprocess.Popen[bytes]], *, by_cwd: bool
              ) -> subprocess.Popen[bytes]:
    """A process that looks like a stack's service: a redis-server runs in its data
    dir, the broker names its properties file."""
    data = home / "redis" / "data"
    data.mkdir(parents=True)
    if by_cwd:  # a python named redis-server (the process name is what counts)
        redis_server = home / "redis-server"
        redis_server.symlink_to(sys.executable)
        args = [str(redis_server), *SLEEPER[1:]]
    else:  # a python named java, naming the broker's properties
        java = home / "java"
        java.symlink_to(sys.executable)
        args = [str(java), *SLEEPER[1:], str(home / "kafka" / "server.properties")]
    proc = subprocess.Popen(args, cwd=data if by_cwd else home.parent)
    spawned.append(proc)
    return proc


def test_an_orphaned_stack_is_stopped_and_a_live_one_is_not(tmp_path, spawned):
    orphan_redis = _stand_in(tmp_path / f"{STACK_DIR_NAME}0", spawned, by_cwd=True)
    orphan_kafka = _stand_in(tmp_path / f"{STACK_DIR_NAME}1", spawned, by_cwd=False)
    (tmp_path / f"{STACK_DIR_NAME}1" / OWNER_FILE).write_text("999999999 1.0\n")  # gone
    live_home = tmp_path / f"{STACK_DIR_NAME}2"
    live = _stand_in(live_home, spawned, by_cwd=True)
    (live_home / OWNER_FILE).write_text(f"{os.getpid()} {start_ticks(os.getpid())}\n")
    other = _stand_in(tmp_path / "fault-stackish3", spawned, by_cwd=True)
    # A scenario's consumer: its settings, the snapshot directory among them, come
    # through the environment.
    consumer = subprocess.Popen(SLEEPER, cwd=tmp_path, env={
        **os.environ, "RANKSTREAM_SNAPSHOT_DIR": str(tmp_path / f"{STACK_DIR_NAME}0" / "s")})
    spawned.append(consumer)

    # A developer's shell in an orphaned stack's directory, or a viewer of its logs,
    # is not the stack's.
    shell = subprocess.Popen(SLEEPER, cwd=tmp_path / f"{STACK_DIR_NAME}0" / "redis",
                             env={**os.environ, "PWD": str(tmp_path / f"{STACK_DIR_NAME}0")})
    viewer = subprocess.Popen([*SLEEPER, str(tmp_path / f"{STACK_DIR_NAME}1" / "server.log")])
    spawned.extend([shell, viewer])

    stopped = reap_orphaned_stacks()

    orphans = (orphan_redis, orphan_kafka, consumer)
    assert {proc.pid for proc in orphans} <= set(stopped)
    assert all(proc.wait(5) is not None for proc in orphans)
    kept = (live, other, shell, viewer)
    assert all(proc.poll() is None for proc in kept)
    assert not {proc.pid for proc in kept} & set(stopped)
