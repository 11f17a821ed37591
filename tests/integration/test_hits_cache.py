"""HITS answers cached in Redis: hits, invalidation by graph changes and new PageRank
publications, the cache key, and answers that cannot be cached."""

from __future__ import annotations

import json
import uuid

import redis as redis_py
from pydantic import SecretStr

from consumer.hits_query import HitsQuery, run_hits, url_host
from rankstream.services.testing import redis_client
from rankstream.settings import Settings
from tests.integration.conftest import HandGraph
from tests.integration.test_hits_query import mutual_reinforcement


def test_cache_hit_then_invalidated_by_a_graph_change(graph: HandGraph) -> None:
    seeds = tuple(mutual_reinforcement(graph))
    query = HitsQuery(seeds=seeds, k=3)
    first = run_hits(graph.client, graph.prefix, query)
    again = run_hits(graph.client, graph.prefix, query)
    assert not first.cached and again.cached
    assert again.authorities == first.authorities and again.graph_version == first.graph_version
    assert graph.client.ttl(next(graph.client.scan_iter(f"{graph.prefix}hits:cache:*"))) > 0

    # Same query in another spelling hits the same entry.
    reordered = HitsQuery(seeds=(*reversed(seeds), seeds[0] + "#frag"), k=3)
    assert run_hits(graph.client, graph.prefix, reordered).cached

    # A graph change (version bump): the old answer must not come back.
    for spammer in seeds[6:11]:
        graph.unlink(spammer, "https://target.com/t1")
    fresh = run_hits(graph.client, graph.prefix, query)
    assert not fresh.cached and fresh.graph_version == first.graph_version + 5
    # The spam block shrank to 5x1 (singular value sqrt 5 < 3): the good pages win now.
    assert url_host(first.authorities[0].url) == "target.com"
    assert fresh.authorities[0].url == "https://good1.org/"
    assert fresh.links == first.links - 5
    assert run_hits(graph.client, graph.prefix, query).cached


def test_a_cached_answer_of_the_wrong_shape_is_recomputed(graph: HandGraph) -> None:
    seeds = tuple(mutual_reinforcement(graph))
    query = HitsQuery(seeds=seeds, k=3)
    first = run_hits(graph.client, graph.prefix, query)
    key = next(graph.client.scan_iter(f"{graph.prefix}hits:cache:*"))
    entry = json.loads(graph.client.get(key))
    entry["authorities"][0]["score"] = "high"  # well-formed JSON, a field of the wrong type
    graph.client.set(key, json.dumps(entry))
    again = run_hits(graph.client, graph.prefix, query)
    assert not again.cached and again.authorities == first.authorities


def test_an_answer_that_cannot_be_cached_is_still_answered(
        graph: HandGraph, services: Settings) -> None:
    """A reader allowed to read only (a replica, an ACL): the cache write fails."""
    seeds = tuple(mutual_reinforcement(graph))
    user, password = f"reader-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    graph.client.acl_setuser(user, enabled=True, passwords=[f"+{password}"],
                             keys=[f"{graph.prefix}*"],
                             commands=["+@read", "+@connection", "+@transaction"])
    reader = redis_client(services.model_copy(update={
        "redis_username": user, "redis_password": SecretStr(password)}))
    try:
        answer = run_hits(reader, graph.prefix, HitsQuery(seeds=seeds, k=3))
        assert answer.authorities and not answer.cached
        assert not list(graph.client.scan_iter(f"{graph.prefix}hits:cache:*"))
    finally:
        reader.close()
        graph.client.acl_deluser(user)


def test_seed_order_is_part_of_the_cache_key_when_it_decides_the_root_set(
        graph: HandGraph) -> None:
    """More seeds than root_size: the first known ones form the root set."""
    graph.write([("https://hub0.org/", "https://a0.org/"), ("https://hub1.org/", "https://a1.org/")])
    first, second = "https://hub0.org/", "https://hub1.org/"
    ab = run_hits(graph.client, graph.prefix, HitsQuery(seeds=(first, second), root_size=1))
    ba = run_hits(graph.client, graph.prefix, HitsQuery(seeds=(second, first), root_size=1))
    assert not ba.cached
    assert [h.url for h in ab.hubs] == [first] and [h.url for h in ba.hubs] == [second]
    both = run_hits(graph.client, graph.prefix, HitsQuery(seeds=(second, first), root_size=2))
    assert run_hits(graph.client, graph.prefix, HitsQuery(seeds=(first, second),
                                                            root_size=2)).cached
    assert both.root_size == 2


def test_a_new_pagerank_publication_invalidates_the_cache(graph: HandGraph) -> None:
    """PageRank picks the in-linkers (max_in) and ranks text matches; a publication
    without new events keeps the meta's version, so the key uses its id."""
    seeds = tuple(mutual_reinforcement(graph))
    meta = f"{graph.prefix}meta:pagerank"
    graph.client.hset(meta, mapping={"version": 7, "publication": "p1"})
    assert not run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds)).cached
    assert run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds)).cached
    graph.client.hset(meta, mapping={"version": 7, "publication": "p2"})
    assert not run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds)).cached


def test_options_are_part_of_the_cache_key(graph: HandGraph) -> None:
    seeds = tuple(mutual_reinforcement(graph))
    run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds))
    other = run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds, host_weighting=True))
    assert not other.cached
    assert not run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds, k=4)).cached


def test_a_client_that_decodes_responses_gets_the_same_answer(
    graph: HandGraph, services: Settings
) -> None:
    """run_hits is a library call: a redis-py client made with decode_responses=True
    (str replies, not bytes) crashed on the publication id with an AttributeError."""
    seeds = tuple(mutual_reinforcement(graph))
    graph.client.hset(f"{graph.prefix}meta:pagerank", "publication", "abc123")
    query = HitsQuery(seeds=seeds, k=3)
    expected = run_hits(graph.client, graph.prefix, query, use_cache=False)
    password = services.redis_password.get_secret_value() if services.redis_password else None
    client = redis_py.Redis.from_url(services.redis_url, username=services.redis_username,
                                     password=password, decode_responses=True)
    try:
        for use_cache in (False, True, True):
            answer = run_hits(client, graph.prefix, query, use_cache=use_cache)
            assert answer.authorities == expected.authorities
            assert answer.hubs == expected.hubs
    finally:
        client.close()


def test_an_answer_computed_across_a_graph_change_is_not_cached(graph, monkeypatch):
    """A graph transaction landing while HITS runs: the answer is given, not cached."""
    import consumer.hits_query as hq
    from consumer.hits_query import HitsQuery, run_hits
    from tests.integration.test_hits_query import mutual_reinforcement

    seeds = tuple(mutual_reinforcement(graph))
    real = hq.hits

    def racing(*args, **kwargs):  # a graph transaction lands while HITS runs
        graph.client.hincrby(f"{graph.prefix}graph", "version", 1)
        return real(*args, **kwargs)

    monkeypatch.setattr(hq, "hits", racing)
    query = HitsQuery(seeds=seeds, k=3)
    assert not run_hits(graph.client, graph.prefix, query).cached
    assert list(graph.client.scan_iter(f"{graph.prefix}hits:cache:*")) == []
