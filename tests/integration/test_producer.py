"""LinkPublisher and `rankstream produce` against the real broker, read back with a consumer."""

from __future__ import annotations

import argparse
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from producer import cli
from producer.client import LinkPublisher
from producer.schema import PageEvent, decode_event, event_key
from rankstream.errors import InputError, ServiceError, ServiceUnavailable
from rankstream.services import kafka_client_options
from rankstream.services.kafka import TopicSpec, delete_topics, ensure_topics
from rankstream.services.testing import Isolated
from rankstream.settings import Settings

# Hang guards, not performance assertions.
DELIVERY_BOUND_S = 30.0
FAILURE_BOUND_S = 20.0
DEMO = Path(__file__).resolve().parents[2] / "data" / "python-docs-pages.jsonl.gz"


def read_back(settings: Settings, topic: str, expected: int) -> list[tuple[int, int, bytes, bytes]]:
    """``(partition, offset, key, value)`` of every message, until ``expected`` arrived."""
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                             **kafka_client_options(settings))
    try:
        found = sorted(consumer.partitions_for_topic(topic))
        partitions = [TopicPartition(topic, p) for p in found]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: list[tuple[int, int, bytes, bytes]] = []
        deadline = time.monotonic() + DELIVERY_BOUND_S
        while len(records) < expected and time.monotonic() < deadline:
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records.extend((tp.partition, r.offset, r.key, r.value) for r in batch)
        return records
    finally:
        consumer.close()


def message_count(settings: Settings, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap,
                             **kafka_client_options(settings))
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


def test_events_are_keyed_by_source_and_ordered_within_a_partition(isolated: Isolated) -> None:
    settings = isolated.settings
    pages = [f"https://site{i % 7}.example/p{i}" for i in range(40)]
    published = []
    with LinkPublisher.from_settings(settings) as publisher:
        for round_no in range(5):
            for i, url in enumerate(pages):
                ts = round_no * 1000 + i
                if i % 3 == 0:
                    publisher.publish_link_added(url, pages[(i + 1) % 40], ts=ts)
                else:
                    publisher.publish_page(url, [pages[(i + round_no) % 40]], title=f"r{round_no}",
                                           ts=ts)
                published.append((url, ts))
        publisher.flush()
        assert publisher.sent == publisher.delivered == len(published)

    records = read_back(settings, isolated.topic, len(published))
    assert len(records) == len(published)
    partitions_of_key: dict[bytes, set[int]] = defaultdict(set)
    stamps_of_key: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for partition, offset, key, value in records:
        event = decode_event(value)
        assert key == event_key(event)
        partitions_of_key[key].add(partition)
        stamps_of_key[key].append((offset, event.ts or 0))
    assert all(len(found) == 1 for found in partitions_of_key.values())
    assert len({p for found in partitions_of_key.values() for p in found}) > 1  # spread out
    for url, _ in published:
        in_offset_order = [ts for _, ts in sorted(stamps_of_key[url.encode()])]
        assert in_offset_order == [ts for u, ts in published if u == url]


def test_invalid_input_is_refused_before_sending(isolated: Isolated) -> None:
    with LinkPublisher.from_settings(isolated.settings) as publisher:
        with pytest.raises(InputError, match="bad url: links\\[0\\]"):
            publisher.publish_page("https://example.org/", ["not a url"])
        # Valid, but over the consumer's message limit: it would only be dead-lettered.
        with pytest.raises(InputError, match="message too large"):
            publisher.publish_page("https://example.org/", [], title="x" * 1_100_000)
        # Wrong types are InputErrors, not kafka-python's AssertionError or a TypeError.
        for links in (None, 5, "https://example.org/a"):
            with pytest.raises(InputError, match="links"):
                publisher.publish_page("https://example.org/", links)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="needs a key"):
            publisher.publish_raw(None)
        with pytest.raises(InputError, match="bytes"):
            publisher.publish_raw("text", b"k")  # type: ignore[arg-type]
        publisher.publish_raw(b"\xff not json", b"raw")  # raw bytes are the caller's business
        assert publisher.sent == 1
    records = read_back(isolated.settings, isolated.topic, 1)
    assert [(key, value) for _, _, key, value in records] == [(b"raw", b"\xff not json")]


def test_a_misspelt_security_option_is_a_service_error(services: Settings) -> None:
    with pytest.raises(ServiceError, match="sasl_mechanizm"):
        LinkPublisher(services.kafka_bootstrap, "t", security={"sasl_mechanizm": "PLAIN"})


def test_missing_topic_is_reported_in_bounded_time(services: Settings) -> None:
    missing = f"no.such.topic.{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    publisher = LinkPublisher.from_settings(services, topic=missing, max_block_ms=2000)
    with pytest.raises(ServiceError, match=missing):
        publisher.publish_link_added("https://a.example/", "https://b.example/")
    publisher.close()
    assert time.monotonic() - started < FAILURE_BOUND_S


def test_broker_rejection_is_raised_by_flush_not_swallowed(services: Settings) -> None:
    # The client accepts the message (it is within its own limits); the broker refuses
    # it (the topic allows 1000 bytes), so only the delivery report can tell.
    topic = f"test.producer.small.{uuid.uuid4().hex[:8]}"
    options = kafka_client_options(services)
    ensure_topics(services.kafka_bootstrap, [TopicSpec(topic, 1, {"max.message.bytes": "1000"})],
                  **options)
    try:
        publisher = LinkPublisher.from_settings(services, topic=topic)
        publisher.publish_raw(b"x" * 5000, b"big")
        started = time.monotonic()
        with pytest.raises(ServiceError, match="1 event\\(s\\) not delivered"):
            publisher.flush()
        assert time.monotonic() - started < FAILURE_BOUND_S
        assert publisher.delivered == 0 and publisher.failed == 1
        publisher.publish_raw(b"x" * 5000, b"big")
        deadline = time.monotonic() + FAILURE_BOUND_S
        while publisher.failed < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Reported by the next call, which says its own event was not sent either.
        with pytest.raises(ServiceError, match=r"1 earlier event.*not sent either"):
            publisher.publish_raw(b"small", b"ok")
        assert publisher.sent == 2 and publisher.failed == 2
        publisher.publish_raw(b"small", b"ok")  # the failure was reported once, not forever
        publisher.close()
        assert publisher.delivered == 1
    finally:
        delete_topics(services.kafka_bootstrap, [topic], **options)


def test_unreachable_broker_is_reported_in_bounded_time(services: Settings) -> None:
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        LinkPublisher("127.0.0.1:1", services.topic, max_block_ms=2000)
    assert time.monotonic() - started < FAILURE_BOUND_S


def test_a_flush_without_timeout_is_bounded_by_the_delivery_timeout(
        isolated: Isolated, monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python 2.3's idempotent producer can ignore its delivery timeout while
    the broker is away (it waits for a producer id): an unbounded flush hung for the
    whole outage (session 37's review). Ours asks kafka-python for a bounded one."""
    asked: list[float | None] = []
    with LinkPublisher.from_settings(isolated.settings, delivery_timeout_ms=4000,
                                     request_timeout_ms=3000) as publisher:
        real = publisher._producer.flush

        def spy(timeout: float | None = None) -> None:
            asked.append(timeout)
            real(timeout=timeout)

        monkeypatch.setattr(publisher._producer, "flush", spy)
        publisher.flush()
        publisher.flush(timeout=1.5)
    assert asked[:2] == [4.0 + 3.0 + 5.0, 1.5]


def produce_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_produce_replays_the_demo_log(isolated: Isolated, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    assert cli.run(produce_args(str(DEMO)), isolated.settings) == 0
    assert "sent 530 events (16014 page links)" in capsys.readouterr().out
    records = read_back(isolated.settings, isolated.topic, 530)
    events = [decode_event(value) for _, _, _, value in records]
    assert len(events) == 530 and all(isinstance(e, PageEvent) for e in events)


def test_produce_stops_at_the_first_bad_line(isolated: Isolated, tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    good = b'{"type":"link_added","src":"https://a.example/","dst":"https://b.example/"}'
    log.write_bytes(b"\n".join([good, good, b'{"type":"page","url":"https://a.example/"}', good]))
    with pytest.raises(InputError) as info:
        cli.run(produce_args(str(log)), isolated.settings)
    assert str(info.value) == (f"{log}:3: missing field: links; stopped there, 2 event(s) "
                               "before it were sent")
    assert message_count(isolated.settings, isolated.topic) == 2


def test_produce_synthetic(isolated: Isolated, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(produce_args("--synthetic", "300", "--seed", "3"), isolated.settings) == 0
    assert capsys.readouterr().out.startswith("sent 300 events")
    assert len(read_back(isolated.settings, isolated.topic, 300)) == 300


def test_a_line_too_large_once_encoded_is_named_by_file_and_line(isolated: Isolated,
                                                                  tmp_path: Path) -> None:
    """The line decodes within the limit; the publisher's encoding adds ``"v":1`` and
    the URL's canonical ``/``, and it is the publisher that refuses it."""
    log = tmp_path / "events.jsonl"
    good = b'{"type":"link_added","src":"https://a.example/","dst":"https://b.example/"}'
    head = b'{"type":"page","url":"https://a.example","links":[],"title":"'
    big = head + b"x" * (1024 - len(head) - 2) + b'"}'
    assert len(big) == 1024
    log.write_bytes(b"\n".join([good, big, good]))
    settings = isolated.settings.model_copy(update={"max_message_bytes": 1024})
    with pytest.raises(InputError) as info:
        cli.run(produce_args(str(log)), settings)
    assert str(info.value).startswith(f"{log}:2: message too large: ")
    assert str(info.value).endswith("; stopped there, 1 event(s) before it were sent")


def test_a_delivery_failure_during_produce_says_how_far_it_got(services: Settings,
                                                               tmp_path: Path) -> None:
    topic = f"test.producer.small.{uuid.uuid4().hex[:8]}"
    options = kafka_client_options(services)
    ensure_topics(services.kafka_bootstrap, [TopicSpec(topic, 1, {"max.message.bytes": "1000"})],
                  **options)
    try:
        small = b'{"type":"link_added","src":"https://a.example/","dst":"https://b.example/"}'
        big = ('{"type":"page","url":"https://a.example/","links":['
               + ",".join(f'"https://a.example/{i:04d}"' for i in range(100)) + "]}").encode()
        log = tmp_path / "events.jsonl"
        log.write_bytes(b"\n".join([small, small, big]))
        # (The small events may share the big one's batch, and its refusal.)
        with pytest.raises(ServiceError, match=r"not delivered.*\(after 3 event\(s\) sent at "
                                               r".*events\.jsonl:3, \d acknowledged\)"):
            cli.run(produce_args(str(log), "--topic", topic, "--no-create-topics"), services)
    finally:
        delete_topics(services.kafka_bootstrap, [topic], **options)
