"""Double-buffered score publications against the real redis-server."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import redis as redis_py

from consumer.keys import Keys
from consumer.redis_store import connect_redis
from consumer.score_publisher import ScorePublisher
from rankstream.errors import ServiceError
from rankstream.services.testing import Isolated
from tests.publisher_fakes import FakeGraph, FakeRanks, Report

ALGORITHMS = ("pagerank", "wpr")


@pytest.fixture
def client(isolated: Isolated) -> redis_py.Redis:
    return connect_redis(isolated.settings)


def zset(client: redis_py.Redis, key: str) -> dict[str, float]:
    rows: Any = client.zrange(key, 0, -1, withscores=True)
    return {m.decode(): s for m, s in rows}


def evolve(rng: np.random.Generator, ranks: FakeRanks, step: int) -> None:
    """New pages, some deaths and revivals, moves big and tiny."""
    graph = ranks.graph
    grow = int(rng.integers(0, 40))
    graph.urls.extend(f"https://h{i % 5}.example.org/p{i}" for i in
                      range(graph.num_ids, graph.num_ids + grow))
    live = np.concatenate([graph.live, np.ones(grow, dtype=bool)])
    flip = rng.random(live.size) < 0.05
    live[flip] = ~live[flip]
    graph.live = live
    for algorithm in ALGORITHMS:
        y = np.concatenate([ranks.y.get(algorithm, np.zeros(0)), 0.15 + rng.random(grow)])
        y = y + np.where(rng.random(y.size) < 0.5, rng.random(y.size) * 1e-3,
                         rng.random(y.size) * 1e-9)
        y[~live] = 0.0
        ranks.y[algorithm] = y


def published_once(client: redis_py.Redis, keys: Keys, *, seed: int, zeroed: int = 0
                   ) -> tuple[FakeRanks, np.random.Generator]:
    """One publication by a first consumer, of a random graph (its first ``zeroed``
    live pages published at 0). Returns the ranks and the generator, for more steps."""
    rng = np.random.default_rng(seed)
    ranks = FakeRanks(FakeGraph(), {})
    first = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6, publish_threshold=0.0,
                           owner="a")
    evolve(rng, ranks, 0)
    for algorithm in ALGORITHMS:
        ranks.y[algorithm][np.flatnonzero(ranks.graph.live)[:zeroed]] = 0.0
    assert first.send(first.prepare(ranks, exact_reports(ranks), version=0, offsets={}))
    return ranks, rng


def publishing(client: redis_py.Redis, keys: Keys, *, seed: int, steps: int,
               scripts: bool = True, owner: str = "0", fence: Any = None
               ) -> tuple[ScorePublisher, FakeRanks, np.random.Generator]:
    """A publisher that has sent ``steps`` publications of a random, evolving graph
    (each swap ``fence``d if given); returns it with the ranks and the generator, for
    more steps."""
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, owner=owner, scripts=scripts)
    rng = np.random.default_rng(seed)
    ranks = FakeRanks(FakeGraph(), {})
    publisher.reset()
    for step in range(steps):
        evolve(rng, ranks, step)
        assert publisher.send(publisher.prepare(ranks, exact_reports(ranks), version=step,
                                                offsets={}), fence=fence)
    return publisher, ranks, rng


def restarted_publisher(client: redis_py.Redis, keys: Keys, graph: FakeGraph
                        ) -> tuple[ScorePublisher, dict[str, np.ndarray]]:
    """A publisher as a restarted consumer has it: the live ZSETs read back, adopted
    and seeded into its back buffers. Returns it and the vectors it read."""
    from consumer.redis_store import load_published

    ids = {url: i for i, url in enumerate(graph.urls)}
    loaded = load_published(client, keys, ids.get, graph.num_ids)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, owner="b")
    for algorithm, values in loaded.items():
        publisher.adopt(algorithm, values,
                        client.hget(keys.meta(algorithm), "publication").decode())
        publisher.seed_back_buffer(algorithm)
    return publisher, loaded


def exact_reports(ranks: FakeRanks) -> dict[str, Report]:
    """Engine reports of an exact ``y`` (engine bound 0) for every algorithm."""
    return {a: Report(bound=0.0, total=float(ranks.y[a].sum())) for a in ALGORITHMS}


def check(client: redis_py.Redis, keys: Keys, ranks: FakeRanks, reports: dict[str, Report]
          ) -> None:
    graph = ranks.graph
    live_urls = {graph.urls[i] for i in np.flatnonzero(graph.live)}
    for algorithm in ALGORITHMS:
        shown = zset(client, keys.scores(algorithm))
        assert set(shown) == live_urls  # membership is always exact
        y = {graph.urls[i]: float(ranks.y[algorithm][i]) for i in np.flatnonzero(graph.live)}
        drift = sum(abs(shown[u] - y[u]) for u in y)
        meta = client.hgetall(keys.meta(algorithm))
        bound = float(meta[b"bound"])
        # What bound certifies, with the engine's own bound as the exactness gap.
        assert drift <= bound - reports[algorithm].bound + 1e-12
        assert float(meta[b"engine_bound"]) == reports[algorithm].bound


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "plain"])
def test_publications_show_y_within_the_bound_through_swaps(isolated, client, scripts):
    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-4,
                               publish_threshold=1e-10, owner="a", scripts=scripts,
                               chunk_members=7)
    rng = np.random.default_rng(3)
    ranks = FakeRanks(FakeGraph(), {})
    # Leftovers of an earlier run: a stale member and a stale back buffer.
    client.zadd(keys.scores("pagerank"), {"https://gone.example.org/": 1.0})
    client.zadd(publisher.back_key("wpr"), {"https://junk.example.org/": 2.0})
    publisher.reset()
    for step in range(25):
        evolve(rng, ranks, step)
        total = {a: float(ranks.y[a].sum()) for a in ALGORITHMS}
        reports = {a: Report(bound=1e-5 * total[a], total=total[a]) for a in ALGORITHMS}
        publication = publisher.prepare(ranks, reports, version=step, offsets={"t:0": step})
        assert publisher.send(publication)
        published = publication.summary
        assert [p.algorithm for p in published] == list(ALGORITHMS)
        check(client, keys, ranks, reports)
        for algorithm in ALGORITHMS:
            assert client.pttl(keys.scores(algorithm)) == -1  # the live ZSET never expires
            if client.exists(publisher.back_key(algorithm)):
                assert client.pttl(publisher.back_key(algorithm)) > 0
        if step > 2:
            # The tolerance leaves room: some tiny moves wait, and that is accounted.
            assert all(p.fresh for p in published)
    assert any(p.unwritten for p in published)


def test_an_idle_publisher_keeps_its_back_buffers_from_expiring(isolated, client):
    """Only publications wrote the back buffers: after 15 idle minutes they expired,
    and the next publication's member check refused the swap (a full rewrite)."""
    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-4,
                               publish_threshold=1e-10, owner="idle")
    rng = np.random.default_rng(4)
    ranks = FakeRanks(FakeGraph(), {})
    publisher.reset()
    for step in range(2):  # the second swap leaves the first ZSET as the back buffer
        evolve(rng, ranks, step)
        reports = exact_reports(ranks)
        assert publisher.send(publisher.prepare(ranks, reports, version=step, offsets={}))
    for algorithm in ALGORITHMS:
        client.pexpire(publisher.back_key(algorithm), 1000)  # nearly expired
    publisher.renew_back_buffers()
    for algorithm in ALGORITHMS:
        assert client.pttl(publisher.back_key(algorithm)) > 60_000


def test_the_swap_runs_at_most_once(isolated, client):
    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0)
    rng = np.random.default_rng(5)
    ranks = FakeRanks(FakeGraph(), {})
    publisher.reset()
    for step in range(4):
        evolve(rng, ranks, step)
        reports = exact_reports(ranks)
        publication = publisher.prepare(ranks, reports, version=step, offsets={})
        publisher.send_chunks(publication)
        assert publisher.send_swap(publication)
        # The reply of that swap was lost: the retry must neither write chunks into
        # the buffer that is now the back one nor swap back.
        publication.attempts = 1
        assert publisher.send(publication)
        check(client, keys, ranks, reports)


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "plain"])
@pytest.mark.parametrize("attempts", [0, 1], ids=["first", "retry"])
def test_a_redis_error_in_a_publication_is_a_service_error(isolated, client, scripts, attempts):
    """WRONGTYPE from a key someone overwrote: one of ours, never a raw redis-py error."""
    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, scripts=scripts)
    ranks = FakeRanks(FakeGraph(), {})
    publisher.reset()
    evolve(np.random.default_rng(8), ranks, 0)
    publication = publisher.prepare(ranks, exact_reports(ranks), version=1, offsets={})
    client.set(keys.meta("pagerank"), "not a hash")
    publication.attempts = attempts  # a retry first asks meta whether the swap ran
    with pytest.raises(ServiceError, match="WRONGTYPE"):
        publisher.send(publication)


@pytest.mark.parametrize("scripts", [True, False], ids=["script", "plain"])
def test_a_swap_without_its_chunks_is_refused_not_published(isolated, client, scripts):
    """A Redis restored from a copy taken after the graph transaction but before the
    publication's chunks (a failover: the chunks are the biggest writes) held a back
    buffer with the right member count and older values: the swap made it live
    under the new bound and fresh flag (a review: L1 85 against a total of 300)."""
    keys = Keys(isolated.key_prefix)
    publisher, ranks, _ = publishing(client, keys, seed=12, steps=3, scripts=scripts)
    for step in (3, 4):  # values move, membership does not: back and live agree on it
        for algorithm in ALGORITHMS:
            ranks.y[algorithm] = ranks.y[algorithm] * 1.01
        if step == 3:
            assert publisher.send(publisher.prepare(ranks, exact_reports(ranks),
                                                    version=step, offsets={}))
    lost = publisher.prepare(ranks, exact_reports(ranks), version=4, offsets={})
    assert any(chunk.op == "ZADD" for chunk in lost.chunks)
    assert not publisher.send_swap(lost)  # its chunks never reached this Redis
    publisher.reset()  # as send() does on a refused swap: publish again, whole
    assert publisher.send(publisher.prepare(ranks, exact_reports(ranks), version=4,
                                            offsets={}))
    check(client, keys, ranks, exact_reports(ranks))


def test_a_full_redis_refusing_the_chunks_is_retried_not_fatal(isolated, client):
    """Out of memory under noeviction (the only policy with a maxmemory the consumer
    accepts): the chunks' ZADDs are refused first, and that was a ServiceError, which
    stopped the consumer, where the swap's and the graph's refusals are retried."""
    from rankstream.errors import ServiceUnavailable

    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0)
    ranks = FakeRanks(FakeGraph(), {})
    publisher.reset()
    evolve(np.random.default_rng(9), ranks, 0)
    publication = publisher.prepare(ranks, exact_reports(ranks), version=1, offsets={})
    before = client.config_get("maxmemory*")
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        with pytest.raises(ServiceUnavailable, match="refused by Redis for now"):
            publisher.send(publication)
    finally:
        client.config_set("maxmemory", before["maxmemory"])
        client.config_set("maxmemory-policy", before["maxmemory-policy"])
    assert publisher.send(publication)  # the same publication, once Redis has room
    check(client, keys, ranks, exact_reports(ranks))


def test_a_restarted_publisher_adopts_the_live_zset_and_then_writes_only_moves(
        isolated, client):
    """After a restart no full write: the back buffer is a server-side copy."""
    keys = Keys(isolated.key_prefix)
    rng = np.random.default_rng(5)
    ranks = FakeRanks(FakeGraph(), {})
    first = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6, publish_threshold=0.0,
                           owner="a")
    for step in range(3):
        evolve(rng, ranks, step)
        reports = exact_reports(ranks)
        assert first.send(first.prepare(ranks, reports, version=step, offsets={}))
    graph = ranks.graph
    second, _ = restarted_publisher(client, keys, graph)
    sizes = []
    for step in range(3, 6):
        changed = rng.random(graph.num_ids) < 0.1
        for algorithm in ALGORITHMS:
            ranks.y[algorithm] = np.where(changed & graph.live, ranks.y[algorithm] + 0.5,
                                          ranks.y[algorithm])
        reports = exact_reports(ranks)
        publication = second.prepare(ranks, reports, version=step, offsets={})
        assert second.send(publication)
        sizes.append(publication.members)
        check(client, keys, ranks, reports)
    live = int(graph.live.sum())
    assert all(size < live for size in sizes), sizes  # only what moved, from the start


def test_a_live_page_published_at_zero_is_adopted_as_present(isolated, client):
    """A capped refresh can leave a live page at y = 0, published as 0. Adoption read
    0 as "absent": the record missed members, the first swap was refused as "changed
    behind our back", and both ZSETs were rewritten whole."""
    keys = Keys(isolated.key_prefix)
    ranks, _ = published_once(client, keys, seed=6, zeroed=3)
    graph = ranks.graph
    zeroed = np.flatnonzero(graph.live)[:3]
    second, loaded = restarted_publisher(client, keys, graph)
    assert all((values[zeroed] == 0.0).all() for values in loaded.values())
    for algorithm in ALGORITHMS:
        ranks.y[algorithm][zeroed] = 0.5
    reports = exact_reports(ranks)
    publication = second.prepare(ranks, reports, version=1, offsets={})
    assert second.send(publication)
    assert publication.members < int(graph.live.sum())  # the moves only, not a rewrite
    check(client, keys, ranks, reports)


def test_a_seeded_back_buffer_with_a_member_we_cannot_name_is_refused_then_replaced(
        isolated, client):
    """A live ZSET member without a page id (left by someone else) makes the adopted
    record wrong: the swap's ZCARD check refuses it, and a full replacement follows."""
    keys = Keys(isolated.key_prefix)
    ranks, rng = published_once(client, keys, seed=6)
    client.zadd(keys.scores("pagerank"), {"https://nobody.example/": 0.5})
    graph = ranks.graph
    second, _ = restarted_publisher(client, keys, graph)
    evolve(rng, ranks, 1)
    reports = exact_reports(ranks)
    assert not second.send(second.prepare(ranks, reports, version=1, offsets={}))
    assert second.send(second.prepare(ranks, reports, version=1, offsets={}))
    check(client, keys, ranks, reports)
    assert client.zscore(keys.scores("pagerank"), "https://nobody.example/") is None


def test_large_rewrites_drop_and_refill_the_back_buffer(isolated, client):
    """Publications that move most of a large ZSET rebuild it (UNLINK, then every live
    member in ascending score order); readers still see exactly y after each swap."""
    from consumer.score_plan import REBUILD_MIN_MEMBERS

    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-6,
                               publish_threshold=0.0, owner="a")
    rng = np.random.default_rng(9)
    n = REBUILD_MIN_MEMBERS + 2_000
    graph = FakeGraph([f"https://h{i % 7}.example.org/r{i}" for i in range(n)],
                      np.ones(n, dtype=bool))
    ranks = FakeRanks(graph, {a: 0.15 + rng.random(n) for a in ALGORITHMS})
    rebuilt = []
    share = [0.0, 0.8, 0.05, 0.05, 0.8]
    for step in range(5):
        if step:
            graph.live = graph.live & (rng.random(n) < 0.99)  # some pages die
            moved = rng.random(n) < share[step]
            for a in ALGORITHMS:
                ranks.y[a] = np.where(moved, 0.15 + rng.random(n), ranks.y[a]) * graph.live
        reports = exact_reports(ranks)
        publication = publisher.prepare(ranks, reports, version=step, offsets={})
        rebuilt.append(sum(c.op == "UNLINK" for c in publication.chunks))
        assert publisher.send(publication)
        check(client, keys, ranks, reports)
    # A back buffer lags the live ZSET by one publication: step 0 fills empty buffers,
    # steps 1 and 4 move 80%, step 2 moves 5% but its buffer misses step 1's moves
    # too; only step 3 writes updates.
    assert rebuilt[3] == 0 and all(rebuilt[i] >= 2 for i in (0, 1, 2, 4)), rebuilt


def test_ids_interned_after_the_absorb_are_not_published(isolated, client):
    # The consumer plans the next batch (interning its new URLs) while the engines
    # refresh; a publication then covers only the ids the engines had absorbed.
    keys = Keys(isolated.key_prefix)
    publisher = ScorePublisher(client, keys, damping=0.85, tolerance=1e-4,
                               publish_threshold=1e-10, owner="a")
    urls = [f"https://site.example.org/{i}" for i in range(6)]
    graph = FakeGraph(urls, np.ones(6, dtype=bool))
    y = np.array([0.5, 1.0, 1.5, 2.0, 0.0, 0.0])  # ids 4 and 5: interned, not absorbed
    ranks = FakeRanks(graph, {"pagerank": y})
    reports = {"pagerank": Report(bound=0.0, total=5.0)}
    absorbed = np.ones(4, dtype=bool)
    absorbed[2] = False  # removed as of the absorb, revived by the planned batch
    publication = publisher.prepare(ranks, reports, version=1, offsets={}, live=absorbed)
    assert publisher.send(publication)
    members = {m.decode(): s for m, s in client.zrange(keys.scores("pagerank"), 0, -1,
                                                        withscores=True)}
    assert members == {urls[0]: 0.5, urls[1]: 1.0, urls[3]: 2.0}
