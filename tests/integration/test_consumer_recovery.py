"""The consumer when the world moves under it: another consumer takes its lease, a
foreign write, a Redis that went back (the recovery paths of docs/reliability.md)."""

from __future__ import annotations

import time
from typing import Any

from consumer.keys import ALGORITHMS, Keys
from consumer.options import ConsumeOptions
from consumer.redis_store import connect_redis
from consumer.service import ConsumerService
from producer.synthetic import synthetic_event_dicts
from tests.faults.harness import exact_scores
from tests.integration.test_consumer_pipeline import (
    consume,
    l1,
    offline_graph,
    publish,
    published,
    url_edges,
)


def test_an_idle_consumer_stops_when_another_takes_its_lease(isolated):
    """An idle consumer makes no fenced write that would notice: its renewal thread
    sees the lease go, and the idle loop then stops it (LockHeld) instead of letting
    it run on beside the new holder."""
    import threading

    from consumer.lock import Holder, LockHeld

    settings = isolated.settings
    keys = Keys(settings.key_prefix)
    client = connect_redis(settings)
    publish(settings, [{"type": "page", "url": "https://idle.example.org/", "links": []}])
    service = ConsumerService(settings, ConsumeOptions(lock_ttl_ms=1500))
    failures: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as exc:  # handed to the test thread
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60

    def idle() -> bool:  # the batch committed and both rankings published fresh
        return client.hget(keys.graph, "version") == b"1" and all(
            client.hget(keys.meta(a), "fresh") == b"1" for a in ALGORITHMS)

    while not idle() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert idle(), "the consumer never settled, so this would not test the idle loop"
    time.sleep(1.0)  # a publication's last writes
    other = Holder(host="elsewhere.example", pid=4242, since="2026-11-27T00:00:00+00:00",
                   token="f" * 32)
    client.set(keys.lock, other.encode(), px=60_000)
    thread.join(timeout=30)
    assert not thread.is_alive(), "the idle consumer kept running beside the new holder"
    assert len(failures) == 1 and isinstance(failures[0], LockHeld)
    assert client.get(keys.lock) == other.encode()  # and it left the new lease alone


def test_a_foreign_write_found_while_draining_rebuilds_then_publishes(isolated, monkeypatch):
    """MirrorStale in the final drain (our lease lapsed and another consumer wrote):
    the consumer rebuilds from Redis and publishes that, instead of crashing."""
    from consumer.recovery import MirrorStale

    settings = isolated.settings
    keys = Keys(settings.key_prefix)
    client = connect_redis(settings)
    pages = [{"type": "page", "url": f"https://drain.example.org/{i}",
              "links": [f"https://drain.example.org/{(i + 1) % 7}"]} for i in range(7)]
    publish(settings, pages)
    real_drain = ConsumerService.drain
    mirrors: list[Any] = []

    def drain(service: ConsumerService) -> None:
        mirrors.append(service.mirror)
        if len(mirrors) == 1:
            # After our last transaction landed: when the foreign write came first, it
            # voided that batch, which a consumer past its loop never polls again
            # (version 7, not 8: a race seen once in session 27).
            service._settle_commit()
            client.hincrby(keys.graph, "version", 1)  # the other consumer's write
            raise MirrorStale("simulated: a foreign write under the prefix")
        real_drain(service)

    monkeypatch.setattr(ConsumerService, "drain", drain)
    consume(settings)
    assert len(mirrors) == 2 and mirrors[1] is not mirrors[0]  # rebuilt in between
    assert mirrors[1].counters.version == 8  # 7 events of ours + the foreign write
    graph = offline_graph(pages)
    for algorithm in ALGORITHMS:
        meta = client.hgetall(keys.meta(algorithm))
        assert meta[b"fresh"] == b"1" and meta[b"version"] == b"8"
        exact = exact_scores(graph, algorithm, settings.damping)
        assert l1(published(client, settings.key_prefix, algorithm), exact) <= float(
            meta[b"bound"]) + 1e-9


def test_the_term_index_holds_a_pages_last_title_only(isolated):
    """Two crawls of a page in one batch: the index holds what one-event batches
    leave, the last title's terms (before the index was exact, session 32, it held
    both; before session 29, only the last by accident of the batch's cut)."""
    settings = isolated.settings
    url = "https://titles.example.org/"
    publish(settings, [{"type": "page", "url": url, "links": [], "title": "alpha", "ts": 1},
                       {"type": "page", "url": url, "links": [], "title": "beta", "ts": 2}])
    consume(settings)
    client = connect_redis(settings)
    keys = Keys(settings.key_prefix)
    assert client.hget(keys.graph, "version") == b"2"
    page = client.hget(keys.page_id, url)
    assert client.hget(keys.page_title, page) == b"beta"  # the last title is stored
    assert client.smembers(f"{settings.key_prefix}term:beta") == {page}
    assert not client.exists(f"{settings.key_prefix}term:alpha")
    assert client.hget(keys.page_terms, page) == b"t beta"  # its contributions


def test_an_idle_consumer_finds_a_redis_that_went_back_and_reads_kafka_again(isolated,
                                                                            caplog):
    """Nothing new arrives, so no transaction would notice: the idle poll's check of
    P graph does, and the consumer rebuilds and re-applies what Redis lost."""
    import logging
    import threading

    settings = isolated.settings.model_copy(update={"poll_timeout_ms": 50})
    keys = Keys(settings.key_prefix)
    client = connect_redis(settings)
    events = list(synthetic_event_dicts(300, seed=4))
    publish(settings, events)
    service = ConsumerService(settings, ConsumeOptions(max_seconds=60.0))
    thread = threading.Thread(target=service.run, daemon=True)
    with caplog.at_level(logging.INFO, logger="rankstream.consumer"):
        thread.start()
        deadline = time.monotonic() + 60

        def version() -> int:
            return int(client.hget(keys.graph, "version") or 0)

        while version() < len(events) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert version() == len(events)
        want = url_edges(client, settings)
        # As a restore of a backup taken before any event (the lease kept, as a
        # backup taken within its TTL holds it): the graph, its counters and offsets
        # all gone.
        names = [name for name in client.scan_iter(match=f"{settings.key_prefix}*")
                 if name != keys.lock.encode()]
        client.delete(*names)  # at once, as a restart from a backup would
        while version() < len(events) and time.monotonic() < deadline:
            time.sleep(0.05)
        service.stops.request("test")
        thread.join(timeout=30)
    assert url_edges(client, settings) == want
    assert version() == len(events)
    assert any(r.getMessage().startswith("redis went back") for r in caplog.records)
