"""Writes by others landing between a fence's check and its EXEC, against the real
redis-server: the fence must abort (or read again), never act on what it checked a
moment before. Found missing by a mutation review: every other test changed the state
before the check. (Foreign writes while our lease had lapsed: test_consumer_store.)"""

from __future__ import annotations

import pytest
import redis as redis_py

import consumer.graph_write as gw
from consumer.graph_write import GraphCounters, GraphWrite, commit_graph
from consumer.keys import Keys
from consumer.lock import ConsumerLock
from consumer.redis_store import connect_redis


@pytest.fixture
def client(isolated):
    return connect_redis(isolated.settings)


def _race_before_exec(monkeypatch, action):
    """Run ``action`` from another connection after the fence's checks, before EXEC."""
    real = gw.transaction

    def racing(conn, payload, count):
        action()
        return real(conn, payload, count)

    monkeypatch.setattr(gw, "transaction", racing)


def test_a_graph_changed_after_the_progress_check_aborts_the_transaction(
        isolated, client, monkeypatch):
    """P graph is WATCHed: a rollback (or another writer) landing between the progress
    check and EXEC aborts the batch instead of committing over it."""
    keys = Keys(isolated.key_prefix)
    commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=1), offsets={"t:0": 1}),
                 after=GraphCounters())
    other = connect_redis(isolated.settings)
    _race_before_exec(monkeypatch, lambda: other.hset(keys.graph, "version", 0))  # went back
    with pytest.raises(redis_py.WatchError):
        commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=2),
                                              offsets={"t:0": 2}), after=GraphCounters(version=1))
    assert client.hget(keys.offsets, "t:0") == b"1"


def test_a_lease_changed_after_the_token_check_aborts_the_transaction(
        isolated, client, monkeypatch):
    """The lease is WATCHed, not only read: one taken between the check and EXEC
    aborts the fenced write."""
    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=60_000)
    lock.acquire()
    other = connect_redis(isolated.settings)
    _race_before_exec(monkeypatch, lambda: other.set(keys.lock, b"someone else"))
    with pytest.raises(redis_py.WatchError):
        commit_graph(client, keys, GraphWrite(offsets={"t:0": 2}), fence=lock)
    assert client.hget(keys.offsets, "t:0") is None


def test_a_back_buffer_expiring_between_the_checks_and_exec_aborts_a_plain_swap(
        isolated, client, monkeypatch):
    """Under --plain-writes the swap WATCHes the back buffers it checked: one that
    expires before EXEC aborts it (RENAME of the live ZSET, then a failure, lost it)."""
    from redis.client import Pipeline

    from tests.integration.test_consumer_publisher import (
        ALGORITHMS,
        evolve,
        exact_reports,
        publishing,
        zset,
    )

    keys = Keys(isolated.key_prefix)
    publisher, ranks, rng = publishing(client, keys, seed=11, steps=2, scripts=False)
    evolve(rng, ranks, 2)
    publication = publisher.prepare(ranks, exact_reports(ranks), version=2, offsets={})
    publisher.send_chunks(publication)
    live_before = {a: zset(client, keys.scores(a)) for a in ALGORITHMS}
    other = connect_redis(isolated.settings)
    real_multi = Pipeline.multi
    fired = []

    def multi(self):
        if not fired:  # the back buffer's TTL runs out after the ZCARD check
            fired.append(other.delete(publisher.back_key("wpr")))
        return real_multi(self)

    monkeypatch.setattr(Pipeline, "multi", multi)
    with pytest.raises(redis_py.WatchError):
        publisher.send_swap(publication)
    assert fired == [1]
    for algorithm in ALGORITHMS:  # nothing of the swap ran: the live ZSETs are intact
        assert zset(client, keys.scores(algorithm)) == live_before[algorithm]


def test_a_publication_between_the_two_top_reads_is_read_again(isolated, client, monkeypatch):
    """Where k cuts a tie, `top` reads twice; a swap landing in between is read again,
    never mixed (docs/redis-keys.md)."""
    from consumer.readers import top

    keys = Keys(isolated.key_prefix)
    scores = keys.scores("pagerank")
    client.zadd(scores, {"https://a.example/": 2.0, "https://b.example/": 1.0,
                         "https://c.example/": 1.0, "https://d.example/": 1.0})
    client.hset(keys.meta("pagerank"), mapping={"publication": "p1", "total": 5.0})
    real = client.pipeline
    calls = []

    def pipeline(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # a swap lands between the rows and the read at the tie
            client.delete(scores)
            client.zadd(scores, {"https://a.example/": 2.0, "https://x.example/": 1.0,
                                 "https://y.example/": 3.0})
            client.hset(keys.meta("pagerank"), mapping={"publication": "p2", "total": 6.0})
        return real(*args, **kwargs)

    monkeypatch.setattr(client, "pipeline", pipeline)
    assert top(client, isolated.key_prefix, k=2) == [("https://y.example/", 3.0),
                                                     ("https://a.example/", 2.0)]
