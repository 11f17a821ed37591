"""The consumer end to end, in-process, against the real Kafka broker and redis-server."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis as redis_py

from consumer import readers
from consumer.keys import ALGORITHMS, Keys
from consumer.options import ConsumeOptions
from consumer.redis_store import connect_redis, load_stored
from consumer.service import ConsumerService
from producer.client import LinkPublisher
from producer.schema import Limits, decode_event
from producer.synthetic import synthetic_event_dicts
from ranker.linkgraph import LinkGraph
from rankstream.graph_updates import EventApplier
from rankstream.services.kafka import delete_topics, ensure_topics
from rankstream.services.stack import kafka_client_options, topic_specs
from rankstream.settings import Settings
from tests.faults.harness import exact_scores

# -- helpers ---------------------------------------------------------------------------

def publish(settings: Settings, messages: Sequence[bytes | dict[str, Any] | None]) -> None:
    """Publish dicts (validated, keyed by source URL) and raw bytes (None: a tombstone),
    in order."""
    with LinkPublisher.from_settings(settings) as publisher:
        for message in messages:
            if message is None or isinstance(message, bytes):
                publisher.publish_raw(message, b"raw")
            else:
                publisher.publish_event(decode_event(json.dumps(message).encode(),
                                                     Limits.from_settings(settings)))


def consume(settings: Settings, **options: Any) -> ConsumerService:
    service = ConsumerService(settings, ConsumeOptions(until_caught_up=True, **options))
    assert service.run() == 0
    return service


def delete_records_before(settings: Settings, offset: int) -> None:
    """Partition 0 of the topic loses its records below ``offset``, as retention does."""
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap,
                             **kafka_client_options(settings))
    try:
        admin.delete_records({TopicPartition(settings.topic, 0): offset})
    finally:
        admin.close()


def url_edges(client: redis_py.Redis, settings: Settings) -> tuple[set[tuple[str, str]], set[str]]:
    """(links as URL pairs, live page URLs) as stored in Redis."""
    stored = load_stored(client, Keys(settings.key_prefix), settings.topic)
    urls = stored.urls
    edges = {(urls[s], urls[d])
             for s, d in zip(stored.edge_src.tolist(), stored.edge_dst.tolist(), strict=True)}
    dead = set(stored.removed.tolist())
    return edges, {u for i, u in enumerate(urls) if i not in dead}


def offline_graph(messages: Sequence[dict[str, Any]]) -> LinkGraph:
    graph = LinkGraph()
    applier = EventApplier(graph)
    events = [decode_event(json.dumps(m).encode()) for m in messages]
    graph.apply(applier.apply(events).batch)
    return graph


def graph_as_urls(graph: LinkGraph) -> tuple[set[tuple[str, str]], set[str]]:
    src, dst = graph.edges()
    edges = {(graph.key_of(s), graph.key_of(d))
             for s, d in zip(src.tolist(), dst.tolist(), strict=True)}
    return edges, {graph.key_of(p) for p in range(graph.num_ids) if graph.is_live(p)}


def published(client: redis_py.Redis, prefix: str, algorithm: str) -> dict[str, float]:
    rows = client.zrange(Keys(prefix).scores(algorithm), 0, -1, withscores=True)
    return {url.decode(): float(score) for url, score in rows}


def l1(a: dict[str, float], b: dict[str, float]) -> float:
    return sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


# -- tests -----------------------------------------------------------------------------

@pytest.mark.parametrize("max_updates", [20_000, 25], ids=["default-cap", "tiny-cap"])
def test_replay_equals_offline_graph_and_scores_within_the_bound(one_partition, tmp_path,
                                                                 max_updates):
    # With a tiny cap every publication during the run is partial (and says so in its
    # bound); the final one, on the way out, is whole and fresh.
    settings = one_partition.model_copy(update={"batch_max_events": 400,
                                                "publish_max_updates": max_updates})
    log = list(synthetic_event_dicts(3000, seed=11, edit_fraction=0.3))
    assert any(m["type"] == "page_removed" for m in log)
    publish(settings, log)
    service = consume(settings)
    assert service.stats.batches >= 5  # several transactions, not one
    client = connect_redis(settings)

    graph = offline_graph(log)
    assert url_edges(client, settings) == graph_as_urls(graph)
    counters = readers.status(client, settings.key_prefix)["graph"]
    assert counters["version"] == len(log) and counters["links"] == graph.num_links
    assert counters["pages"] == graph.num_live

    log_file = tmp_path / "log.jsonl"
    log_file.write_text("".join(json.dumps(m) + "\n" for m in log))
    for algorithm in ALGORITHMS:
        meta = readers.meta(client, settings.key_prefix, algorithm)
        # The tolerance is relative (ranker.residual): fresh means bound <= tol * sum(y).
        assert meta.fresh and meta.bound <= settings.tolerance * meta.total
        assert meta.version == len(log)
        assert meta.offsets == {f"{settings.topic}:0": len(log)}
        scores = published(client, settings.key_prefix, algorithm)
        exact = exact_scores(graph, algorithm, settings.damping)
        assert set(scores) == set(exact)
        assert l1(scores, exact) <= meta.bound + 1e-9
        assert meta.total == pytest.approx(sum(exact.values()), abs=meta.bound + 1e-9)
        # ... and `rankstream rank --events` on the same log agrees within the bound
        # (its own relative tolerance is 1e-12; it prints 12 significant digits).
        offline = rank_command_scores(log_file, algorithm, settings)
        assert set(offline) == set(scores)
        assert l1(scores, offline) <= meta.bound + 3e-12 * meta.total


def rank_command_scores(log_file: Path, algorithm: str, settings: Settings) -> dict[str, float]:
    import contextlib
    import io

    from rankstream import rank_command

    # Through the command's own parser: a hand-built Namespace missed every option
    # added later (--teleport).
    parser = argparse.ArgumentParser()
    rank_command.add_arguments(parser)
    args = parser.parse_args(["--events", str(log_file), "--algorithm", algorithm,
                              "--tolerance", "1e-12"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert rank_command.run(args, settings) == 0
    rows = (line.split("\t") for line in out.getvalue().splitlines())
    return {url: float(value) for url, value in rows}


def test_invalid_messages_go_to_the_dlq_and_good_ones_are_applied(isolated):
    settings = isolated.settings.model_copy(update={"max_message_bytes": 2048})
    good = [{"type": "page", "url": f"https://good.example.org/{i}",
             "links": [f"https://good.example.org/{i + 1}"]} for i in range(7)]
    bad: dict[str, bytes | None] = {
        "malformed JSON": b'{"type": "page", "url": ',
        "wrong type": json.dumps({"type": "page", "url": "https://x.org/", "links": 5}).encode(),
        "missing field": json.dumps({"type": "page", "links": []}).encode(),
        "oversized": json.dumps({"type": "page", "url": "https://x.org/",
                                 "links": [f"https://x.org/{'a' * 100}{i}"
                                           for i in range(40)]}).encode(),
        "non-UTF-8": b'{"type": "page", "url": "https://x.org/\xff\xfe", "links": []}',
        "tombstone": None,
    }
    assert len(bad["oversized"] or b"") > settings.max_message_bytes
    stream: list[bytes | dict[str, Any] | None] = []
    for i, raw in enumerate(bad.values()):
        stream.extend([good[i], raw])
    stream.append(good[6])
    publish(settings, stream)
    consume(settings)

    client = connect_redis(settings)
    edges, _ = url_edges(client, settings)
    assert edges == {(g["url"], g["links"][0]) for g in good}
    assert readers.status(client, settings.key_prefix)["graph"]["dlq"] == len(bad)

    letters = read_topic(settings, settings.dlq_topic, len(bad))
    # A tombstone's dead letter carries an empty value and says so in a header.
    assert [value for value, _ in letters] == [v if v is not None else b"" for v in bad.values()]
    assert letters[-1][1]["tombstone"] == b"1"
    expected_words = ["json", "wrong type", "missing", "too large", "utf-8", "tombstone"]
    for (_, headers), word in zip(letters, expected_words, strict=True):
        assert headers["source_topic"] == settings.topic.encode()
        assert int(headers["source_offset"]) >= 0 and int(headers["source_partition"]) >= 0
        assert word in headers["error"].decode().lower()


def read_topic(settings: Settings, topic: str,
               count: int) -> list[tuple[bytes | None, dict[str, bytes]]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=settings.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=10_000,
                             group_id=None, **kafka_client_options(settings))
    out: list[tuple[bytes | None, dict[str, bytes]]] = []
    try:
        for message in consumer:
            out.append((message.value, dict(message.headers)))
            if len(out) >= count:
                break
    finally:
        consumer.close()
    return out


def test_stale_page_events_are_ignored_and_counted(isolated):
    settings = isolated.settings
    url = "https://stale.example.org/"
    publish(settings, [
        {"type": "page", "url": url, "links": ["https://new.example.org/"], "ts": 2000},
        {"type": "page", "url": url, "links": ["https://old.example.org/"], "ts": 1000},
    ])
    consume(settings)
    # An older event arriving after a restart is judged against page:ts from Redis.
    publish(settings, [
        {"type": "page", "url": url, "links": ["https://older.example.org/"], "ts": 1500},
        {"type": "page", "url": url, "links": ["https://newest.example.org/"], "ts": 3000},
    ])
    consume(settings)
    client = connect_redis(settings)
    edges, _ = url_edges(client, settings)
    assert edges == {(url, "https://newest.example.org/")}
    graph = readers.status(client, settings.key_prefix)["graph"]
    assert graph["stale_ignored"] == 2 and graph["version"] == 2


@pytest.mark.parametrize("codec", ["gzip", "lz4", "snappy", "zstd"])
def test_batches_compressed_with_any_kafka_codec_are_read(isolated, codec):
    # Without the codec's library kafka-python raised UnsupportedCodecError at poll,
    # and the consumer stopped at that batch on every start.
    settings = isolated.settings
    links = {(f"https://{codec}.example.org/{i}", f"https://{codec}.example.org/{i + 1}")
             for i in range(50)}
    with LinkPublisher.from_settings(settings, compression_type=codec) as publisher:
        for src, dst in sorted(links):
            publisher.publish_raw(json.dumps(
                {"type": "link_added", "src": src, "dst": dst}).encode(), src.encode())
    consume(settings)
    edges, _ = url_edges(connect_redis(settings), settings)
    assert edges == links


def test_readers_and_cli_commands(isolated, capsys):
    from consumer.commands import score as score_cmd
    from consumer.commands import status as status_cmd
    from consumer.commands import top as top_cmd

    settings = isolated.settings
    hub = "https://hub.example.org/"
    pages = [{"type": "page", "url": f"https://leaf.example.org/{i}", "links": [hub]}
             for i in range(5)]
    publish(settings, [*pages, {"type": "page", "url": hub, "links": []}])
    consume(settings)
    client = connect_redis(settings)
    best = readers.top(client, settings.key_prefix, "pagerank", 3)
    assert best[0][0] == hub and len(best) == 3
    probability = readers.top(client, settings.key_prefix, "pagerank", 6, "probability")
    assert sum(value for _, value in probability) == pytest.approx(1.0, abs=1e-6)
    # The rows and the meta shown beside them are read in one MULTI.
    rows, info = readers.top_with_meta(client, settings.key_prefix, "pagerank", 3)
    assert rows == best and info == readers.meta(client, settings.key_prefix, "pagerank")
    # The reader canonicalises: upper-case host and a default port are the same page.
    assert readers.score(client, settings.key_prefix, "HTTPS://Hub.Example.org:443/") == \
        pytest.approx(best[0][1])
    assert readers.score(client, settings.key_prefix, "https://unknown.example.org/") is None

    assert top_cmd.run(argparse.Namespace(k=2, algorithm="wpr", scale="paper", json=True),
                       settings) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["top"][0]["url"] == hub and payload["meta"]["fresh"] is True
    meta = payload["meta"]
    assert meta["relative_bound"] == pytest.approx(meta["bound"] / meta["total"])
    # The bound is shown beside the tolerance on the same (relative) footing.
    assert top_cmd.run(argparse.Namespace(k=2, algorithm="pagerank", scale="probability",
                                          json=False), settings) == 0
    info = readers.meta(client, settings.key_prefix, "pagerank")
    # Probability-scale scores get the bound on their own scale (at most 2x relative).
    assert (f"fresh, certified L1 bound {2 * info.bound / info.total:.1e} on the probability "
            f"scale (tolerance {settings.tolerance:.1e} of sum(y))") in capsys.readouterr().out
    assert top_cmd.run(argparse.Namespace(k=2, algorithm="pagerank", scale="paper",
                                          json=False), settings) == 0
    assert (f"fresh, certified L1 bound {info.bound:.2e} = {info.bound / info.total:.1e} of "
            f"sum(y) (tolerance {settings.tolerance:.1e} of sum(y))") in capsys.readouterr().out
    assert score_cmd.run(argparse.Namespace(url=hub, algorithm=None, scale="paper", json=False),
                         settings) == 0
    assert "pagerank" in capsys.readouterr().out
    assert score_cmd.run(argparse.Namespace(url=hub, algorithm="wpr", scale="paper", json=True),
                         settings) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["meta"]["wpr"]["fresh"] is True and answer["scores"]["wpr"] > 0
    assert status_cmd.run(_status_args(json=True), settings) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["graph"]["pages"] == 6 and status["consumer"]["state"] == "stopped"
    assert status["running"] is False and np.isfinite(status["algorithms"]["wpr"]["bound"])
    assert status_cmd.run(_status_args(json=False), settings) == 0
    assert f"of sum(y) (tolerance {settings.tolerance:.1e} of sum(y))" in capsys.readouterr().out
    assert status_cmd.run(_status_args(prometheus=True), settings) == 0
    exposition = capsys.readouterr().out
    assert "\nrankstream_graph_pages 6.0\n" in exposition
    assert 'rankstream_consumer_info{host="' in exposition
    # A consumer killed while running leaves its last state: said as such, once its
    # lease is gone.
    client.hset(Keys(settings.key_prefix).status, "state", "running")
    assert status_cmd.run(_status_args(json=False), settings) == 0
    assert ("not running; state running when it last wrote (killed or crashed?)"
            in capsys.readouterr().out)


@pytest.mark.parametrize("dlq_limit", [None, 4096], ids=["our-topic", "small-dlq-topic"])
def test_a_dead_letter_always_fits_so_the_partition_never_stalls(isolated, dlq_limit):
    """A key far beyond the topic's limit (the broker bounds only the compressed
    size) is cut to KEY_LIMIT; a dead-letter topic created elsewhere with a smaller
    limit gets a stub (headers, the key's first bytes, no value). Either way the
    batch commits and the good events around the bad one are applied."""
    from kafka import KafkaProducer

    from consumer.dead_letters import KEY_LIMIT, STUB_KEY_BYTES
    from rankstream.services.kafka import TopicSpec

    settings = isolated.settings.model_copy(update={
        "topic": f"{isolated.topic}.big", "dlq_topic": f"{isolated.topic}.big.dlq",
        "topic_partitions": 1, "max_message_bytes": 2048})
    options = kafka_client_options(settings)
    event_topic, dlq_topic = topic_specs(settings)
    if dlq_limit is not None:
        dlq_topic = TopicSpec(dlq_topic.name, 1, {"max.message.bytes": str(dlq_limit)})
    ensure_topics(settings.kafka_bootstrap, (event_topic, dlq_topic), **options)
    try:
        good = [{"type": "page", "url": f"https://good.example.org/{i}",
                 "links": [f"https://good.example.org/{i + 1}"]} for i in range(2)]
        publish(settings, [good[0]])
        key = b"k" * 300_000
        producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap,
                                 compression_type="gzip", max_request_size=4_000_000,
                                 **options)
        producer.send(settings.topic, key=key, value=b"not json").get(timeout=30)
        producer.close()
        publish(settings, [good[1]])
        consume(settings)

        client = connect_redis(settings)
        edges, _ = url_edges(client, settings)
        assert edges == {(g["url"], g["links"][0]) for g in good}
        (value, headers), = read_topic(settings, settings.dlq_topic, 1)
        assert headers["key_truncated"] == b"300000"
        assert headers["source_offset"] == b"1" and b"JSON" in headers["error"]
        if dlq_limit is None:
            assert value == b"not json" and "truncated" not in headers
        else:
            assert value == b"" and headers["truncated"] == b"8"
        assert KEY_LIMIT > STUB_KEY_BYTES
    finally:
        delete_topics(settings.kafka_bootstrap, [settings.topic, settings.dlq_topic], **options)


def test_no_score_back_buffer_outlives_its_consumer(isolated):
    """Each back buffer is a full copy of a ZSET: a clean stop drops its own, and a
    start drops those a crashed predecessor left (instead of 15 minutes of TTL)."""
    from consumer.redis_store import load_published
    from consumer.score_publisher import ScorePublisher

    settings = isolated.settings
    keys = Keys(settings.key_prefix)
    client = connect_redis(settings)
    pattern = f"{settings.key_prefix}scores:*:next:*"
    publish(settings, [{"type": "page", "url": f"https://buf.example.org/{i}",
                        "links": ["https://buf.example.org/"]} for i in range(30)])
    consume(settings)
    assert list(client.scan_iter(match=pattern)) == []
    stored = load_stored(client, keys, settings.topic)
    ids = {url: i for i, url in enumerate(stored.urls)}
    crashed = ScorePublisher(client, keys, damping=settings.damping,
                             tolerance=settings.tolerance, publish_threshold=0.0,
                             owner="crashed")
    crashed.adopt_live(load_published(client, keys, ids.get, len(stored.urls)))
    assert len(list(client.scan_iter(match=pattern))) == len(ALGORITHMS)
    consume(settings)
    assert list(client.scan_iter(match=pattern)) == []
    assert client.scard(keys.score_buffers) == 0


def _status_args(**given: Any) -> argparse.Namespace:
    """``rankstream status``'s parsed arguments: its defaults, then ``given``."""
    from consumer.commands import status as status_cmd

    parser = argparse.ArgumentParser()
    status_cmd.add_arguments(parser)
    return argparse.Namespace(**{**vars(parser.parse_args([])), **given})

