"""What a score publication guards against, against the real redis-server: score keys
changed behind its back, a stale consumer (the fenced swap), another consumer's
publication meanwhile, foreign bytes in the scores or their meta."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis as redis_py

from consumer.keys import Keys
from consumer.lock import ConsumerLock, LockLost
from consumer.redis_store import connect_redis
from consumer.score_publisher import ScorePublisher
from rankstream.services.testing import Isolated
from tests.integration.test_consumer_publisher import (
    ALGORITHMS,
    check,
    evolve,
    exact_reports,
    published_once,
    publishing,
    zset,
)
from tests.publisher_fakes import FakeGraph, FakeRanks


@pytest.fixture
def client(isolated: Isolated) -> redis_py.Redis:
    return connect_redis(isolated.settings)


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "plain"])
@pytest.mark.parametrize("victim", ["live", "back"])
def test_score_keys_changed_behind_our_back_lead_to_a_full_replacement(isolated, client,
                                                                       scripts, victim):
    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, scripts=scripts)
    rng = np.random.default_rng(9)
    ranks = FakeRanks(FakeGraph(), {})
    publisher.reset()
    for step in range(6):
        evolve(rng, ranks, step)
        reports = exact_reports(ranks)
        if step == 3:
            # A key deleted, or a back buffer that expired and was recreated by a chunk.
            if victim == "live":
                client.delete(keys.scores("wpr"))
            else:
                client.delete(publisher.back_key("wpr"))
            before = client.hgetall(keys.meta("wpr"))
            refused = publisher.prepare(ranks, reports, version=step, offsets={})
            assert not publisher.send(refused)  # nothing made visible ...
            assert client.hgetall(keys.meta("wpr")) == before  # ... not even meta
        publication = publisher.prepare(ranks, reports, version=step, offsets={})
        assert publisher.send(publication)
        check(client, keys, ranks, reports)
        if step == 3:
            # The replacement also seeded the next back buffer (COPY in Redis), so the
            # next publication writes only what moves instead of every member again.
            for algorithm in ALGORITHMS:
                assert (zset(client, publisher.back_key(algorithm))
                        == zset(client, keys.scores(algorithm)))


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "plain"])
def test_the_swap_is_fenced_and_a_stale_consumer_cannot_publish(isolated, client, scripts):
    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=5000)
    lock.acquire()
    stale, ranks, rng = publishing(client, keys, seed=11, steps=2, scripts=scripts,
                                   owner="stale", fence=lock)
    before = {a: zset(client, keys.scores(a)) for a in ALGORITHMS}
    evolve(rng, ranks, 2)
    reports = exact_reports(ranks)
    publication = stale.prepare(ranks, reports, version=2, offsets={})
    client.set(keys.lock, b"someone else")
    with pytest.raises(LockLost):
        stale.send(publication, fence=lock)
    # Its chunks went into its own back buffer only; readers still see the last
    # publication with its meta.
    assert {a: zset(client, keys.scores(a)) for a in ALGORITHMS} == before
    assert client.hget(keys.meta("pagerank"), "version") == b"1"


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "plain"])
def test_no_swap_while_fenced_writes_are_suspended_nor_with_a_token_read_before(
        isolated, client, scripts):
    """A regain that found another consumer's write suspends fenced writes until the
    rebuild. The scripted swap compared only the token, which the regain had made
    ours again, and published scores of the stale mirror."""
    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=5000)
    lock.acquire()
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, owner="a", scripts=scripts)
    rng = np.random.default_rng(12)
    ranks = FakeRanks(FakeGraph(), {})
    publisher.reset()
    evolve(rng, ranks, 0)
    assert publisher.send(publisher.prepare(ranks, exact_reports(ranks), version=0,
                                            offsets={}), fence=lock)
    before = {a: zset(client, keys.scores(a)) for a in ALGORITHMS}
    evolve(rng, ranks, 1)
    publication = publisher.prepare(ranks, exact_reports(ranks), version=1, offsets={})
    lock.suspended.set()
    with pytest.raises(LockLost):
        publisher.send_swap(publication, fence=lock)
    lock.suspended.clear()
    # A swap that read the token before the lease lapsed and was re-taken (the
    # regain's suspension came after its check) meets a new token.
    stale_token = lock.value
    client.delete(keys.lock)
    assert lock.reacquire() and lock.value != stale_token
    if scripts:
        class ReadBefore:
            key, value = keys.lock, stale_token
            lost = threading.Event()

            def check_not_suspended(self) -> None:
                pass

        with pytest.raises(LockLost):
            publisher.send_swap(publication, fence=ReadBefore())
    assert {a: zset(client, keys.scores(a)) for a in ALGORITHMS} == before
    lock.release()


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "plain"])
def test_a_publication_by_another_consumer_meanwhile_makes_the_swap_start_over(
        isolated, client, scripts):
    """A consumer stalled past its lease, whose successor published and stopped, takes
    the lease back: the ZSETs hold as many members as its record says, but other
    values. The swap checks that meta still names the publication its record comes
    from, refuses, and a full replacement follows."""
    keys = Keys(isolated.key_prefix)
    rng = np.random.default_rng(8)
    ranks = FakeRanks(FakeGraph(), {})
    first = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6, publish_threshold=0.0,
                           owner="a", scripts=scripts)
    evolve(rng, ranks, 0)
    assert first.send(first.prepare(ranks, exact_reports(ranks), version=0, offsets={}))
    graph = ranks.graph
    successor = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, owner="b")
    other = FakeRanks(graph, {a: np.where(graph.live, ranks.y[a] * 3.0, 0.0)
                              for a in ALGORITHMS})
    assert successor.send(successor.prepare(other, exact_reports(other), version=0, offsets={}))
    for algorithm in ALGORITHMS:
        assert client.zcard(keys.scores(algorithm)) == int(graph.live.sum())
    ranks.y = {a: np.where(graph.live, v + 0.25, 0.0) for a, v in ranks.y.items()}
    reports = exact_reports(ranks)
    assert not first.send(first.prepare(ranks, reports, version=1, offsets={}))
    assert first.send(first.prepare(ranks, reports, version=1, offsets={}))
    check(client, keys, ranks, reports)


def test_foreign_bytes_in_the_scores_or_their_meta_are_replaced_not_a_crash(isolated, client):
    """A ZSET member or a meta `publication` that is not UTF-8 stopped the consumer's
    start with a UnicodeDecodeError; such a member names no page, so the swap refuses
    and the ZSET is replaced whole, as for any foreign member."""
    from consumer.redis_store import load_published

    keys = Keys(isolated.key_prefix)
    ranks, rng = published_once(client, keys, seed=11)
    for algorithm in ALGORITHMS:
        client.zadd(keys.scores(algorithm), {b"\xff\xfe": 1.0})
    client.hset(keys.meta("pagerank"), "publication", b"\xff")
    ids = {url: i for i, url in enumerate(ranks.graph.urls)}
    loaded = load_published(client, keys, ids.get, ranks.graph.num_ids)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, owner="b")
    publisher.adopt_live(loaded)
    evolve(rng, ranks, 1)
    reports = exact_reports(ranks)
    assert not publisher.send(publisher.prepare(ranks, reports, version=1, offsets={}))
    assert publisher.send(publisher.prepare(ranks, reports, version=1, offsets={}))
    check(client, keys, ranks, reports)


def test_plain_writes_refuse_a_seeded_back_buffer_with_a_member_we_cannot_name(isolated, client):
    """test_a_seeded_back_buffer_with_a_member_we_cannot_name_is_refused_then_replaced,
    under --plain-writes (the WATCH/ZCARD path): it runs only with the script today."""
    from tests.integration.test_consumer_publisher import (
        check,
        evolve,
        exact_reports,
        published_once,
        restarted_publisher,
    )

    keys = Keys(isolated.key_prefix)
    ranks, rng = published_once(client, keys, seed=6)
    client.zadd(keys.scores("pagerank"), {"https://nobody.example/": 0.5})
    second, _ = restarted_publisher(client, keys, ranks.graph)
    second.scripts = False
    evolve(rng, ranks, 1)
    reports = exact_reports(ranks)
    assert not second.send(second.prepare(ranks, reports, version=1, offsets={}))
    assert second.send(second.prepare(ranks, reports, version=1, offsets={}))
    check(client, keys, ranks, reports)
    assert client.zscore(keys.scores("pagerank"), "https://nobody.example/") is None
