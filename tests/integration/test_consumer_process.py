"""The consumer as a process: SIGKILL and restart, SIGTERM, and the single-consumer guard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from consumer import readers
from consumer.keys import ALGORITHMS, Keys
from consumer.redis_store import connect_redis
from producer.synthetic import synthetic_event_dicts
from rankstream.services.testing import Isolated
from rankstream.settings import Settings
from tests.integration.test_consumer_pipeline import consume, l1, publish, published, url_edges


def consumer_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "RANKSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "RANKSTREAM_REDIS_URL": settings.redis_url,
        "RANKSTREAM_TOPIC": settings.topic,
        "RANKSTREAM_DLQ_TOPIC": settings.dlq_topic,
        "RANKSTREAM_KEY_PREFIX": settings.key_prefix,
        "RANKSTREAM_SNAPSHOT_DIR": str(settings.snapshot_dir or ""),
    })
    env.update(extra)
    return env


def start_consumer(settings: Settings, *args: str, read_output: bool = True,
                   **env: str) -> subprocess.Popen[str]:
    """``read_output``: pipes the test reads with ``communicate``. Otherwise the output
    goes nowhere: an undrained pipe fills after 64 KiB of JSON log lines and blocks
    the consumer, which would then look stalled."""
    out = subprocess.PIPE if read_output else subprocess.DEVNULL
    return subprocess.Popen(
        [sys.executable, "-m", "consumer", "consume", *args],
        env=consumer_env(settings, **env), stdout=out, stderr=out, text=True)


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:  # never leave a consumer running
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_sigkill_mid_stream_then_restart_equals_an_uninterrupted_run(isolated: Isolated, procs):
    settings = isolated.settings
    # No page_removed: with 4 partitions the result must not depend on how batches
    # interleave the partitions, and only removals make it order-dependent across keys.
    log = [m for m in synthetic_event_dicts(6000, seed=5, edit_fraction=0.3)
           if m["type"] != "page_removed"]
    publish(settings, log)
    client = connect_redis(settings)
    keys = Keys(settings.key_prefix)

    def consumed() -> int:
        return sum(int(v) for v in client.hvals(keys.offsets))

    for fraction in (0.2, 0.5):
        proc = start_consumer(settings, read_output=False, RANKSTREAM_BATCH_MAX_EVENTS="50")
        procs.append(proc)
        wait_for(lambda f=fraction: consumed() >= f * len(log), 120, "progress")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert consumed() < len(log), "the consumer finished before it could be killed"
    restart = start_consumer(settings, "--until-caught-up")
    procs.append(restart)
    _, err = restart.communicate(timeout=180)
    assert restart.returncode == 0, err
    assert consumed() == len(log)

    reference = settings.model_copy(update={"key_prefix": f"{settings.key_prefix}ref:"})
    consume(reference)
    assert url_edges(client, settings) == url_edges(client, reference)
    killed_graph = readers.status(client, settings.key_prefix)["graph"]
    reference_graph = readers.status(client, reference.key_prefix)["graph"]
    for name in ("version", "links", "pages", "stale_ignored", "dlq"):
        assert killed_graph[name] == reference_graph[name], name
    assert killed_graph["version"] == len(log)
    for algorithm in ALGORITHMS:
        a = readers.meta(client, settings.key_prefix, algorithm)
        b = readers.meta(client, reference.key_prefix, algorithm)
        assert a.fresh and b.fresh and a.version == b.version == len(log)
        scores_a = published(client, settings.key_prefix, algorithm)
        scores_b = published(client, reference.key_prefix, algorithm)
        assert set(scores_a) == set(scores_b)
        # Each published vector is within its own bound of the same exact vector.
        assert l1(scores_a, scores_b) <= a.bound + b.bound


def test_second_consumer_refuses_and_sigterm_stops_cleanly(isolated: Isolated, procs):
    settings = isolated.settings
    publish(settings, [{"type": "page", "url": "https://a.example.org/",
                        "links": ["https://b.example.org/"]}])
    client = connect_redis(settings)
    keys = Keys(settings.key_prefix)
    first = start_consumer(settings)
    procs.append(first)
    wait_for(lambda: client.hget(keys.status, "state") == b"running"
             and client.hget(keys.graph, "version") == b"1", 120, "the first consumer")

    second = start_consumer(settings, "--until-caught-up")
    procs.append(second)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "refusing to start" in lines[0], err
    assert f"pid {first.pid}" in lines[0]
    assert client.hget(keys.status, "state") == b"running"  # untouched by the refused one
    probe = _status_check(settings, "--max-lag", "0")
    assert probe.returncode == 0 and probe.stderr == "", probe.stderr

    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert first.returncode == 0
    probe = _status_check(settings, "--json")
    assert probe.returncode == 1
    assert probe.stderr == "rankstream status: unhealthy: no consumer holds the lease\n"
    answer = json.loads(probe.stdout)
    assert answer["healthy"] is False and answer["problems"] == ["no consumer holds the lease"]

    assert client.get(keys.lock) is None
    assert client.hget(keys.status, "state") == b"stopped"


def test_data_of_another_key_layout_is_refused_by_consumer_and_readers(isolated: Isolated,
                                                                      procs):
    """``P graph`` names the key layout its data follows; the consumer and every reader
    refuse another version with one line and exit 2 before reading or writing a key
    (a consumer would otherwise write a mix of two layouts under one prefix)."""
    settings = isolated.settings
    client = connect_redis(settings)
    keys = Keys(settings.key_prefix)
    publish(settings, [{"type": "page", "url": "https://a.example.org/",
                        "links": ["https://b.example.org/"]}])
    first = start_consumer(settings, "--until-caught-up")
    procs.append(first)
    first.communicate(timeout=120)
    assert first.returncode == 0
    assert client.hget(keys.graph, "layout") == b"1"  # written by the graph transaction
    before = {k: client.dump(k) for k in client.scan_iter(f"{keys.prefix}*")
              if k != keys.status.encode()}

    client.hset(keys.graph, "layout", 2)
    refused = start_consumer(settings, "--until-caught-up")
    procs.append(refused)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "key layout 2" in lines[0], err
    for command in (["top"], ["score", "https://a.example.org/"], ["hits", "--seed",
                                                                    "https://a.example.org/"]):
        done = subprocess.run([sys.executable, "-m", "consumer", *command],
                              env=consumer_env(settings), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "key layout 2" in done.stderr and "layout 1" in done.stderr
    client.hset(keys.graph, "layout", 1)
    after = {k: client.dump(k) for k in client.scan_iter(f"{keys.prefix}*")
             if k != keys.status.encode()}
    assert after.keys() == before.keys()  # nothing written, nothing dropped
    assert all(after[k] == before[k] for k in before if k != keys.graph.encode())


def _status_check(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "consumer", "status", "--check", *args],
                          env=consumer_env(settings), capture_output=True, text=True,
                          timeout=60)
