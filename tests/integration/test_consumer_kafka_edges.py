"""The consumer against what a Kafka log can do under it: records deleted before or
while they are read, aborted transactions, partitions added, a topic recreated."""

from __future__ import annotations

import json
import time

from consumer.keys import Keys
from consumer.redis_store import connect_redis
from rankstream.services.kafka import delete_topics
from rankstream.services.stack import ensure_settings_topics, kafka_client_options
from tests.integration.test_consumer_pipeline import (
    consume,
    delete_records_before,
    publish,
    url_edges,
)


def test_events_deleted_before_they_were_read_are_counted_and_do_not_block_catching_up(
        one_partition, caplog):
    """Retention (here DeleteRecords) moves the log start past the stored offset, or up
    to the end of a partition: the consumer says how many events it lost and still
    counts as caught up, though no record arrives to move its committed offset."""
    settings = one_partition
    pages = [{"type": "page", "url": f"https://gone.example.org/{i}",
              "links": ["https://gone.example.org/"]} for i in range(20)]
    publish(settings, pages[:5])
    consume(settings)
    publish(settings, pages[5:])
    delete_records_before(settings, 20)
    with caplog.at_level("WARNING", logger="rankstream.consumer.kafka"):
        service = consume(settings, max_seconds=60.0)
    assert service.stops.reason == "caught-up"
    lost = [r for r in caplog.records
            if r.getMessage() == "events deleted before they were consumed"]
    assert [r.fields["lost"] for r in lost] == [15]  # type: ignore[attr-defined]
    edges, _ = url_edges(connect_redis(settings), settings)
    assert len(edges) == 5


def test_events_deleted_while_the_consumer_runs_are_counted(one_partition, caplog):
    """kafka-python moves a position that retention deleted under a running consumer
    to the log start by itself, logging it only at INFO: the gap must be a warning."""
    from consumer.kafka_source import KafkaSource

    settings = one_partition
    pages = [{"type": "page", "url": f"https://gap.example.org/{i}",
              "links": ["https://gap.example.org/"]} for i in range(20)]
    publish(settings, pages[:5])
    source = KafkaSource(settings)
    try:
        source.assign({0: 0})
        read: list[int] = []
        deadline = time.monotonic() + 30
        while len(read) < 5 and time.monotonic() < deadline:
            read += [r.offset for r in source.poll(100, 200)]
        assert read == list(range(5))
        time.sleep(0.5)  # the fetch kafka-python sent after that poll comes back empty
        publish(settings, pages[5:])
        delete_records_before(settings, 15)
        with caplog.at_level("WARNING", logger="rankstream.consumer.kafka"):
            while len(read) < 10 and time.monotonic() < deadline:
                read += [r.offset for r in source.poll(100, 200)]
    finally:
        source.close()
    assert read == [*range(5), *range(15, 20)]
    lost = [r for r in caplog.records
            if r.getMessage() == "events deleted before they were consumed"]
    assert [(r.fields["expected_offset"], r.fields["lost"]) for r in lost] == [(5, 10)]  # type: ignore[attr-defined]


def test_a_transactional_producers_aborted_events_are_not_applied(one_partition, caplog):
    """Kafka Connect, Flink and Kafka Streams write transactionally. Aborted events
    were applied (read_uncommitted); every commit marker was warned about as deleted
    events; and the marker ending the log was never "read", so --until-caught-up
    never ended."""
    from kafka import KafkaProducer

    settings = one_partition
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap,
                             transactional_id=f"crawler-{settings.topic}",
                             **kafka_client_options(settings))
    groups = [{(f"https://tx.example.org/{g}/{i}", f"https://tx.example.org/{g}/{i + 1}")
               for i in range(20)} for g in range(3)]
    try:
        producer.init_transactions()
        for number, links in enumerate(groups):
            producer.begin_transaction()
            for src, dst in sorted(links):
                producer.send(settings.topic, json.dumps(
                    {"type": "link_added", "src": src, "dst": dst}).encode(), src.encode())
            producer.flush()
            if number == 1:
                producer.abort_transaction()
            else:
                producer.commit_transaction()
    finally:
        producer.close()
    with caplog.at_level("WARNING", logger="rankstream.consumer.kafka"):
        service = consume(settings, max_seconds=60.0)
    assert service.stops.reason == "caught-up"
    edges, _ = url_edges(connect_redis(settings), settings)
    assert edges == groups[0] | groups[2]
    assert not [r for r in caplog.records
                if r.getMessage() == "events deleted before they were consumed"]
    client = connect_redis(settings)
    status = json.loads(client.hget(Keys(settings.key_prefix).status, "lag") or b"{}")
    assert status == {"0": 0}


def test_partitions_added_while_running_are_read_from_their_start(one_partition, monkeypatch):
    """Manual assignment gets no rebalance when a topic grows: the keys hashed to a new
    partition were never read until a restart."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewPartitions

    from consumer import kafka_source

    monkeypatch.setattr(kafka_source, "PARTITION_CHECK_S", 0.5)
    settings = one_partition
    options = kafka_client_options(settings)
    publish(settings, [{"type": "page", "url": "https://p0.example.org/", "links": []}])
    source = kafka_source.KafkaSource(settings)
    try:
        source.assign({})
        seen: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            seen |= {(r.partition, r.offset) for r in source.poll(100, 200)}
        assert seen == {(0, 0)}
        admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **options)
        try:
            admin.create_partitions({settings.topic: NewPartitions(total_count=2)})
        finally:
            admin.close()
        producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, **options)
        try:
            producer.send(settings.topic, b"{}", partition=1).get(timeout=30)
            producer.send(settings.topic, b"{}", partition=0).get(timeout=30)
        finally:
            producer.close()
        while len(seen) < 3 and time.monotonic() < deadline:
            seen |= {(r.partition, r.offset) for r in source.poll(100, 200)}
        assert seen == {(0, 0), (0, 1), (1, 0)}
        assert source.partitions == [0, 1]
    finally:
        source.close()


def test_a_recreated_topic_is_read_from_its_start(one_partition, caplog):
    """The offsets kept in Redis are past the end of a topic deleted and created again:
    its events are all unread. Seeking to the stale offset skipped them, and counted
    the consumer caught up before it had read any."""
    settings = one_partition
    options = kafka_client_options(settings)
    publish(settings, [{"type": "page", "url": f"https://old.example.org/{i}",
                        "links": ["https://old.example.org/"]} for i in range(10)])
    consume(settings)
    delete_topics(settings.kafka_bootstrap, [settings.topic], **options)
    deadline = time.monotonic() + 60
    while True:  # deletion is asynchronous: create it again once it is gone
        try:
            if ensure_settings_topics(settings):
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "the topic was not deleted"
        time.sleep(0.5)
    new = [{"type": "page", "url": f"https://new.example.org/{i}",
            "links": ["https://new.example.org/"]} for i in range(3)]
    publish(settings, new)
    with caplog.at_level("ERROR", logger="rankstream.consumer.kafka"):
        service = consume(settings, max_seconds=60.0)
    assert service.stops.reason == "caught-up"
    assert any(r.getMessage().startswith("stored offset past the log end") for r in caplog.records)
    edges, _ = url_edges(connect_redis(settings), settings)
    assert {(p["url"], p["links"][0]) for p in new} <= edges


def test_the_lag_counts_partitions_not_fetched_yet(isolated):
    """kafka-python knows a partition's highwater only once it parsed a fetch of it: a
    consumer started with 150k events waiting reported a lag of 0, then a third of
    it, to `status --check --max-lag` and /metrics (session 37's review)."""
    from consumer import kafka_source
    from consumer.stats import lag_by_partition

    settings = isolated.settings
    urls = [f"https://lag{i}.example.org/" for i in range(40)]
    publish(settings, [{"type": "page", "url": url, "links": []} for url in urls])
    source = kafka_source.KafkaSource(settings)
    try:
        source.assign({})
        ends = source.highwaters()  # nothing polled yet
        assert sorted(ends) == list(range(settings.topic_partitions))
        assert sum(lag_by_partition(ends, source.positions({})).values()) == len(urls)
    finally:
        source.close()
