"""The local services are real, answer, persist, and `up` can be called again and again."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord

from rankstream.services import (
    AclUser,
    RedisServer,
    auth_redis,
    env_lines,
    frozen_redis,
    kafka_client_options,
    local_services,
    redis_answers,
    redis_pid,
    restart_redis,
    start_redis,
    status,
    stop_redis,
    topic_partitions,
    up,
)
from rankstream.services.testing import Isolated, redis_client
from rankstream.settings import Settings

# Upper bound for a message to travel producer -> broker -> consumer; a hang guard,
# not a performance assertion.
DELIVERY_BOUND_S = 30.0


def test_message_round_trip_through_the_real_broker(isolated: Isolated) -> None:
    settings = isolated.settings
    options = kafka_client_options(settings)
    key, value = b"https://example.org/", f"hello {uuid.uuid4()}".encode()
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", **options)
    try:
        metadata = producer.send(isolated.topic, key=key, value=value).get(timeout=DELIVERY_BOUND_S)
    finally:
        producer.close()

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                             **options)
    try:
        partition = TopicPartition(isolated.topic, metadata.partition)
        consumer.assign([partition])
        consumer.seek(partition, metadata.offset)
        received: list[ConsumerRecord] = []
        deadline = time.monotonic() + DELIVERY_BOUND_S
        while not received and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received.extend(records)
    finally:
        consumer.close()
    assert [(r.key, r.value) for r in received[:1]] == [(key, value)]


def test_project_topics_exist_with_the_configured_partitions(services: Settings) -> None:
    found = topic_partitions(services.kafka_bootstrap, [services.topic, services.dlq_topic],
                             **kafka_client_options(services))
    assert found[services.topic] == services.topic_partitions
    assert found[services.dlq_topic] >= 1


def test_redis_set_get_with_append_only_file(services: Settings, isolated: Isolated) -> None:
    client = redis_client(services)
    try:
        client.set(f"{isolated.key_prefix}greeting", "hello")
        assert client.get(f"{isolated.key_prefix}greeting") == b"hello"
        if redis_pid(local_services(services).redis) is None:
            pytest.skip("Redis is the user's own instance: its persistence is theirs to choose")
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        # Raised AOF rewrite triggers (rankstream/services/redis.py says why).
        assert client.config_get("auto-aof-rewrite-percentage") == {
            "auto-aof-rewrite-percentage": "400"}
        assert client.config_get("auto-aof-rewrite-min-size") == {
            "auto-aof-rewrite-min-size": str(1 << 30)}
    finally:
        client.close()


def test_up_is_idempotent(services: Settings) -> None:
    first = status(services)
    again = up(services)
    assert all(state.up for state in again)
    pids = {s.name: s.pid for s in first}
    assert {s.name: s.pid for s in again} == pids


def test_status_and_env_describe_the_services(services: Settings) -> None:
    assert [(s.name, s.up) for s in status(services)] == [("redis", True), ("kafka", True)]
    lines = env_lines(services)
    assert f"export RANKSTREAM_KAFKA_BOOTSTRAP={services.kafka_bootstrap}" in lines
    assert all(line.startswith("export RANKSTREAM_") for line in lines)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def second_redis(services: Settings, tmp_path: Path) -> Iterator[RedisServer]:
    """A password-protected instance with one ACL user, on a free port; stopped after."""
    server = auth_redis(tmp_path, _free_port(), "s3cret-pass",
                        [AclUser("reader", "reader-pass", "~* &* +@read +ping")])
    start_redis(server)
    try:
        yield server
    finally:
        stop_redis(server)


def test_second_redis_requires_its_password_and_acl(second_redis: RedisServer) -> None:
    host, port = second_redis.host, second_redis.port
    assert not redis_answers(host, port)
    assert redis_answers(host, port, password="s3cret-pass")
    assert redis_answers(host, port, username="reader", password="reader-pass")
    reader = redis.Redis(host=host, port=port, username="reader", password="reader-pass")
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.set("k", "v")
    finally:
        reader.close()


def test_second_redis_freezes_thaws_and_keeps_data_across_restart(
    second_redis: RedisServer,
) -> None:
    client = redis.Redis(host=second_redis.host, port=second_redis.port, password="s3cret-pass",
                         socket_timeout=0.5)
    try:
        client.set("survives", "restart")
        with frozen_redis(second_redis):
            assert not redis_answers(second_redis.host, second_redis.port,
                                     password="s3cret-pass", timeout=0.3)
        assert client.ping()
        old_pid = redis_pid(second_redis)
        assert restart_redis(second_redis) != old_pid
        assert client.get("survives") == b"restart"
    finally:
        client.close()
