"""The consumer's Redis side against the real redis-server: graph transaction and lock."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
import redis as redis_py

from consumer.graph_write import GraphCounters, GraphWrite, commit_graph, plan_links
from consumer.keys import Keys, offset_field
from consumer.lock import ConsumerLock, LockLost
from consumer.recovery import Backoff, MirrorStale, Recovery
from consumer.redis_store import connect_redis, load_stored
from consumer.stats import ConsumerStats
from producer.schema import DEFAULT_LIMITS, decode_event
from ranker.linkgraph import LinkGraph
from rankstream.graph_updates import EventApplier
from rankstream.services.testing import Isolated

URLS = [f"https://e{i % 7}.example.org/p/{i}" for i in range(40)]


@pytest.fixture
def client(isolated: Isolated) -> redis_py.Redis:
    return connect_redis(isolated.settings)


def _random_event(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.5:
        data = {"type": "page", "url": rng.choice(URLS),
                "links": rng.sample(URLS, rng.randrange(0, 6))}
    elif kind < 0.7:
        data = {"type": "link_added", "src": rng.choice(URLS), "dst": rng.choice(URLS)}
    elif kind < 0.9:
        data = {"type": "link_removed", "src": rng.choice(URLS), "dst": rng.choice(URLS)}
    else:
        data = {"type": "page_removed", "url": rng.choice(URLS)}
    return json.dumps(data).encode()


@pytest.mark.parametrize("bulk", [True, False], ids=["script", "plain"])
def test_graph_transactions_keep_redis_equal_to_the_mirror(isolated, client, bulk):
    keys = Keys(isolated.key_prefix)
    rng = random.Random(7)
    graph = LinkGraph()
    applier = EventApplier(graph)
    removed: set[int] = set()
    for batch_no in range(30):
        events = [decode_event(_random_event(rng), DEFAULT_LIMITS)
                  for _ in range(rng.randrange(1, 25))]
        applied = applier.apply(events)
        planned = plan_links(graph, applied.batch)
        live = graph.live_mask()
        revived = sorted(p for p in removed if live[p])
        write = GraphWrite(
            new_pages=applied.new_pages, removed_ids=planned.removed_ids.tolist(),
            revived_ids=revived, delete_src=planned.delete_src, delete_dst=planned.delete_dst,
            insert_src=planned.insert_src, insert_dst=planned.insert_dst,
            ts_updates=applied.ts_updates, crawled_changes=applied.crawled_changes,
            counters=GraphCounters(version=batch_no, links=planned.links_after),
            offsets={offset_field("t", 0): batch_no + 1})
        commit_graph(client, keys, write, bulk=bulk)
        graph.apply(applied.batch)
        removed = (removed - set(revived)) | set(planned.removed_ids.tolist())

        stored = load_stored(client, keys, "t")
        src, dst = graph.edges()
        assert set(zip(stored.edge_src.tolist(), stored.edge_dst.tolist(), strict=True)) == \
            set(zip(src.tolist(), dst.tolist(), strict=True))
        assert set(stored.removed.tolist()) == {p for p in range(graph.num_ids)
                                                if not graph.is_live(p)}
        assert stored.urls == [graph.key_of(p) for p in range(graph.num_ids)]
        assert stored.offsets == {0: batch_no + 1}
        assert stored.counters.links == graph.num_links
        assert stored.crawled is not None
        assert np.array_equal(stored.crawled, applier.crawled)
    assert applier.crawled.any() and not applier.crawled.all()
    for page in range(graph.num_ids):
        in_ids = {int(x) for x in client.smembers(keys.in_links(page))}
        assert in_ids == set(graph.in_links(page).tolist())


def test_a_graph_transaction_refuses_a_redis_that_went_back(isolated, client):
    """The fence: P graph must hold the counters committed last (their progress:
    applied + stale + dead-lettered messages), or this write's own (a re-send whose
    first attempt committed); a valid lease alone let a consumer commit over a Redis
    that lost acknowledged writes, and the version alone missed a lost batch of
    dead letters."""
    from consumer.graph_write import GraphMoved

    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=5000)
    lock.acquire()

    def counters(version: int, dlq: int = 0) -> GraphCounters:
        return GraphCounters(version=version, dlq=dlq)

    def write(version: int, dlq: int = 0) -> GraphWrite:
        return GraphWrite(counters=counters(version, dlq),
                          offsets={offset_field("t", 0): version + dlq})

    commit_graph(client, keys, write(3), fence=lock, after=counters(0))
    commit_graph(client, keys, write(3), fence=lock, after=counters(0))  # a re-send
    commit_graph(client, keys, write(5), fence=lock, after=counters(3))
    client.hset(keys.graph, "version", 3)  # Redis lost the last transaction
    with pytest.raises(GraphMoved, match="a graph of 3 messages where 5 were committed: it "
                                         "lost acknowledged writes"):
        commit_graph(client, keys, write(7), fence=lock, after=counters(5))
    client.hset(keys.graph, "version", 9)
    with pytest.raises(GraphMoved, match="another writer"):
        commit_graph(client, keys, write(7), fence=lock, after=counters(5))
    client.hset(keys.graph, "version", 5)
    commit_graph(client, keys, write(5, dlq=2), fence=lock, after=counters(5))  # letters
    client.hset(keys.graph, "dlq", 0)  # ... which Redis lost: same version, not the same
    with pytest.raises(GraphMoved, match="5 messages where 7"):
        commit_graph(client, keys, write(6, dlq=2), fence=lock, after=counters(5, dlq=2))
    assert client.hget(keys.offsets, offset_field("t", 0)) == b"7"
    lock.release()


def test_a_redis_that_may_evict_keys_is_refused(client):
    """With a maxmemory, allkeys-* silently deletes graph keys, and volatile-* the
    lease and back buffers, again at every write (a review: 9,476 lease re-takes and
    no progress); only noeviction refuses writes instead, which are retried."""
    from consumer.redis_store import check_redis_fits
    from rankstream.errors import ConfigError

    before = client.config_get("maxmemory*")
    try:
        for policy in ("noeviction", "allkeys-lru", "volatile-ttl"):  # no maxmemory: fine
            client.config_set("maxmemory-policy", policy)
            check_redis_fits(client)
        client.config_set("maxmemory", "4gb")
        client.config_set("maxmemory-policy", "noeviction")
        check_redis_fits(client)
        for policy in ("allkeys-lru", "volatile-lru", "volatile-ttl"):
            client.config_set("maxmemory-policy", policy)
            with pytest.raises(ConfigError, match=f"maxmemory-policy {policy}"):
                check_redis_fits(client)
    finally:
        client.config_set("maxmemory-policy", before["maxmemory-policy"])
        client.config_set("maxmemory", before["maxmemory"])


def test_a_redis_in_cluster_mode_is_refused(tmp_path):
    """A cluster refuses the batch's MULTI/EXEC over many slots (CROSSSLOT) deep in
    the first batch; a real redis-server in cluster mode is refused at once."""
    import subprocess

    from consumer.redis_store import check_redis_fits
    from rankstream.errors import ConfigError
    from rankstream.services.redis import redis_binary
    from tests.faults.stack import free_port

    port = free_port()
    server = subprocess.Popen(
        [redis_binary(install=False), "--port", str(port), "--bind", "127.0.0.1",
         "--cluster-enabled", "yes", "--cluster-config-file", str(tmp_path / "nodes.conf"),
         # Its bus port, by default the port + 10000, past 65535 for a high free port.
         "--cluster-port", str(free_port()),
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    node = redis_py.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                node.ping()
                break
            except redis_py.ConnectionError:
                if server.poll() is not None:
                    pytest.fail(f"the cluster node exited: {server.communicate()[0][-500:]!r}")
                assert time.monotonic() < deadline, "the cluster node did not start"
                time.sleep(0.05)
        with pytest.raises(ConfigError, match="cluster mode"):
            check_redis_fits(node)
    finally:
        node.close()
        server.terminate()
        server.wait(timeout=10)


def test_fenced_transaction_aborts_when_the_lease_changes(isolated, client):
    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=5000)
    lock.acquire()
    write = GraphWrite(counters=GraphCounters(version=1), offsets={"t:0": 1})
    commit_graph(client, keys, write, fence=lock)
    assert client.hget(keys.offsets, "t:0") == b"1"
    client.set(keys.lock, b"someone else")
    with pytest.raises(LockLost):
        commit_graph(client, keys, GraphWrite(offsets={"t:0": 2}), fence=lock)
    assert client.hget(keys.offsets, "t:0") == b"1"
    assert not lock.renew() and lock.lost.is_set()


def _committed_once(client, keys: Keys) -> tuple[ConsumerLock, Recovery]:
    """A consumer's lease and recovery after its first graph transaction (version 1,
    offset 10 on partition 0 of topic t)."""
    lock = ConsumerLock(client, keys.lock, ttl_ms=5000)
    lock.acquire()
    recovery = Recovery(client, lock, keys, "t", ConsumerStats(), Backoff(0.001, 0.001),
                        stop_grace_s=1.0, set_state=lambda _state: None)
    commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=1),
                                          offsets={"t:0": 10}), fence=lock)
    recovery.committed = (GraphCounters(version=1), {"t:0": 10})
    return lock, recovery


def test_after_a_foreign_write_no_writer_thread_commits_until_the_rebuild(isolated, client):
    """Both writer threads recover after one freeze. The first re-took the lease and
    found another consumer's write; the second found the lease "ours" again and
    committed its batch, planned on the stale mirror, over the other's writes (a
    review's repro)."""
    keys = Keys(isolated.key_prefix)
    lock, recovery = _committed_once(client, keys)
    client.delete(keys.lock)  # frozen past the TTL; another consumer writes and stops
    other = ConsumerLock(client, keys.lock, ttl_ms=5000, pid=1)
    other.acquire()
    commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=7),
                                          offsets={"t:0": 70}), fence=other)
    other.release()

    def refused() -> None:
        raise LockLost("the publication's EXEC aborted during the freeze")

    stale = GraphWrite(counters=GraphCounters(version=2), offsets={"t:0": 20})
    with pytest.raises(MirrorStale):  # the score writer, first
        recovery.fenced("publishing", refused)
    with pytest.raises(MirrorStale):  # then the graph writer
        recovery.fenced("committing the graph", lambda: commit_graph(
            client, keys, stale, fence=lock))
    with pytest.raises(LockLost):  # any fenced write, until the rebuild
        commit_graph(client, keys, stale, fence=lock)
    assert client.hget(keys.graph, "version") == b"7"
    assert client.hget(keys.offsets, "t:0") == b"70"
    assert lock.still_ours()
    recovery.committed = (GraphCounters(version=7), {"t:0": 70})  # the rebuild's
    recovery.resume()
    commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=8),
                                          offsets={"t:0": 80}), fence=lock)
    assert client.hget(keys.graph, "version") == b"8"
    lock.release()


def test_a_foreign_write_that_moved_only_offsets_is_not_taken_for_none(isolated, client):
    """Another consumer committed a batch of dead letters only while our lease had
    lapsed: the version stands still, the offsets moved. The regain must not carry on
    (a mutation review: no test told the two apart)."""
    keys = Keys(isolated.key_prefix)
    _, recovery = _committed_once(client, keys)
    client.delete(keys.lock)
    other = ConsumerLock(client, keys.lock, ttl_ms=5000, pid=1)
    other.acquire()
    commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=1, dlq=5),
                                          offsets={"t:0": 15}), fence=other)
    other.release()
    attempts = []

    def refused_once() -> None:  # the write that found the lease gone; a retry would pass
        attempts.append(1)
        if len(attempts) == 1:
            raise LockLost("EXEC aborted during the freeze")

    with pytest.raises(MirrorStale):
        recovery.fenced("publishing", refused_once)
    assert attempts == [1]


def test_an_idle_check_finds_a_graph_that_moved_on(isolated, client):
    """The idle check finds a graph another writer moved on, not only one that went back."""
    keys = Keys(isolated.key_prefix)
    lock, recovery = _committed_once(client, keys)
    recovery.check_graph_kept()  # as committed: nothing to do
    client.hset(keys.graph, "version", 4)  # another writer's batches
    with pytest.raises(MirrorStale, match="another writer"):
        recovery.check_graph_kept()
    lock.release()


def test_a_lease_retaken_with_no_foreign_write_carries_on(isolated, client):
    keys = Keys(isolated.key_prefix)
    lock, recovery = _committed_once(client, keys)
    client.delete(keys.lock)
    attempts = []

    def commit() -> int:
        attempts.append(1)
        return commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=2),
                                                     offsets={"t:0": 20}), fence=lock)

    recovery.fenced("committing the graph", commit)
    assert len(attempts) == 2 and not lock.suspended.is_set()
    assert client.hget(keys.graph, "version") == b"2"
    lock.release()


def test_load_of_an_empty_prefix_is_empty(isolated, client):
    stored = load_stored(client, Keys(isolated.key_prefix), isolated.topic)
    assert stored.urls == [] and stored.edge_src.size == 0 and stored.offsets == {}
    assert stored.counters == GraphCounters()
    assert np.array_equal(stored.removed, np.zeros(0, np.int32))


@pytest.mark.parametrize("damage", [
    ("out:1", "sadd", "4294967297"),  # wrapped to id 1 by int32
    ("out:1", "sadd", "x"),           # a ValueError traceback
    ("page:removed", "sadd", "2147483648"),
    ("page:ts", "hset", "-1"),        # set the last page's ts
    ("page:url", "hset", "01"),       # beside "1": an id without its URL
])
def test_stored_data_rankstream_did_not_write_is_a_clear_error(isolated, client, damage):
    from rankstream.errors import ServiceError

    keys = Keys(isolated.key_prefix)
    client.hset(keys.page_url, mapping={"0": "https://a.example/", "1": "https://b.example/",
                                        "2": "https://c.example/"})
    client.sadd(keys.out_links(0), 1, 2)
    load_stored(client, keys, "t")  # intact: loads
    name, kind, value = damage
    key = f"{isolated.key_prefix}{name}"
    if kind == "sadd":
        client.sadd(key, value)
    elif name == "page:url":
        client.hdel(keys.page_url, "2")
        client.hset(key, value, "https://d.example/")
    else:
        client.hset(key, value, 17)
    with pytest.raises(ServiceError):
        load_stored(client, keys, "t")


def test_status_heartbeats_are_fenced_and_a_state_change_lands_last(isolated, client):
    from consumer.status_writer import StatusWriter

    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=5000)
    lock.acquire()
    writer = StatusWriter(client, keys.status, lock, interval_s=3600.0)
    calls = []

    def fields(state: str):
        def make() -> dict[str, str]:
            calls.append(state)
            return {"state": state}
        return make

    writer.heartbeat(fields("running"))  # due (never written): on the status thread
    writer.heartbeat(fields("skipped"))  # not due for an hour: fields never built
    writer.heartbeat(fields("stopped"), force=True)  # synchronous, after the first
    assert calls == ["running", "stopped"]
    assert client.hget(keys.status, "state") == b"stopped"
    client.set(keys.lock, b"someone else")  # the lease is gone: nothing is written
    writer.heartbeat(fields("zombie"), force=True)
    writer.close()
    assert client.hget(keys.status, "state") == b"stopped"


def test_top_breaks_ties_by_url_ascending_like_rank_and_hits(isolated: Isolated) -> None:
    """ZREVRANGE gave tied pages in descending URL order, so where k cut a group of
    exact ties `top` chose other pages than `rankstream rank` and HITS."""
    from consumer import readers

    client = connect_redis(isolated.settings)
    keys = Keys(isolated.key_prefix)
    client.zadd(keys.scores("pagerank"), {"https://hub.org/": 2.0, "https://z.org/": 1.5,
                                          "https://y.org/": 1.5, **{
                                              f"https://{c}.org/": 0.5 for c in "dcba"}})
    client.hset(keys.meta("pagerank"), mapping={"total": "7.0", "bound": "0.0",
                                                "publication": "p1"})
    ranked = [url for url, _ in readers.top(client, isolated.key_prefix, "pagerank", 5)]
    assert ranked == ["https://hub.org/", "https://y.org/", "https://z.org/",
                      "https://a.org/", "https://b.org/"]
    everything = readers.top(client, isolated.key_prefix, "pagerank", 100)
    assert [url for url, _ in everything][3:] == [f"https://{c}.org/" for c in "abcd"]
    assert readers.top(client, isolated.key_prefix, "pagerank", 2) == [
        ("https://hub.org/", 2.0), ("https://y.org/", 1.5)]


def test_a_graph_that_changes_while_it_is_read_is_not_loaded(isolated, client, monkeypatch):
    """A Redis restarted from an older copy in the middle of a load (redis-py
    reconnects by itself) gave a mirror with the newer ids and the older counters;
    the fence accepted it and page:url was never dense again (a review)."""
    import consumer.redis_store as store
    from rankstream.errors import ServiceUnavailable

    keys = Keys(isolated.key_prefix)
    commit_graph(client, keys, GraphWrite(new_pages=[(0, "https://a.example/")],
                                          counters=GraphCounters(version=2, ids=1),
                                          offsets={"t:0": 2}))
    scan = store._hscan_all
    went_back = []

    def racing(c, key):
        found = scan(c, key)
        if key == keys.page_url and not went_back:
            went_back.append(True)
            client.hset(keys.graph, "version", 1)  # the older copy's counters
        return found

    monkeypatch.setattr(store, "_hscan_all", racing)
    with pytest.raises(ServiceUnavailable, match="changed while the graph was read"):
        load_stored(client, keys, "t")
    assert load_stored(client, keys, "t").counters.version == 1  # read again: consistent


def test_the_key_layout_check(isolated, client):
    """No ``layout`` field (a new database, or data written before the field) is layout
    1; another number is a ConfigError naming both; anything else is not ours."""
    from consumer.redis_store import check_layout
    from rankstream.errors import ConfigError, ServiceError

    keys = Keys(isolated.key_prefix)
    check_layout(client, keys)
    client.hset(keys.graph, mapping={"version": 3, "links": 1})
    check_layout(client, keys)
    client.hset(keys.graph, "layout", 1)
    check_layout(client, keys)
    for value in ("0", "2", "17"):
        client.hset(keys.graph, "layout", value)
        with pytest.raises(ConfigError, match=f"key layout {int(value)} under prefix"):
            check_layout(client, keys)
    for value in ("x", "-1", "1.0", "", "99999999999999999999", "\u0661"):
        client.hset(keys.graph, "layout", value)
        with pytest.raises(ServiceError, match="not written by rankstream"):
            check_layout(client, keys)
    # A library reader's client that decodes replies gets the same answers.
    text_client = redis_py.Redis.from_url(isolated.settings.redis_url, decode_responses=True)
    client.hset(keys.graph, "layout", 1)
    check_layout(text_client, keys)
    client.hset(keys.graph, "layout", 2)
    with pytest.raises(ConfigError, match="key layout 2"):
        check_layout(text_client, keys)
    text_client.close()


def test_a_graph_transaction_and_a_rebuild_refuse_data_of_another_layout(isolated, client):
    """A running consumer checked the layout only at start: after its lease lapsed
    and another release wrote layout 2, its rebuild loaded that data and its next
    transaction stamped it layout 1 (a review). Both refuse it now, writing nothing."""
    from consumer.mirror import Mirror
    from rankstream.errors import ConfigError

    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=5000)
    lock.acquire()
    first = GraphWrite(counters=GraphCounters(version=3), offsets={offset_field("t", 0): 3})
    commit_graph(client, keys, first, fence=lock, after=GraphCounters())
    assert client.hget(keys.graph, "layout") == b"1"
    client.hset(keys.graph, "layout", 2)
    later = GraphWrite(counters=GraphCounters(version=4), offsets={offset_field("t", 0): 4})
    with pytest.raises(ConfigError, match="key layout 2"):
        commit_graph(client, keys, later, fence=lock, after=GraphCounters(version=3))
    assert client.hget(keys.graph, "layout") == b"2"
    assert client.hget(keys.offsets, offset_field("t", 0)) == b"3"
    with pytest.raises(ConfigError, match="key layout 2"):
        Mirror.load(client, keys, isolated.settings)
    lock.release()



def test_an_empty_member_in_an_adjacency_set_is_a_clear_error(isolated, client):
    """numpy 2.4 itself refuses "x" (the existing damage case), so the count check in
    consumer.resp._parse_ids is reached only by members that parse as nothing."""
    from consumer.redis_store import load_stored
    from rankstream.errors import ServiceError

    keys = Keys(isolated.key_prefix)
    client.hset(keys.page_url, mapping={"0": "https://a.example/", "1": "https://b.example/",
                                        "2": "https://c.example/"})
    client.sadd(keys.out_links(0), 1, 2)
    client.sadd(keys.out_links(1), "")
    with pytest.raises(ServiceError):
        load_stored(client, keys, "t")
