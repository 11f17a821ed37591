"""The single-consumer lease against the real redis-server: refusal naming the holder,
takeover of a dead holder's lease, hand-edited and foreign values, renewal."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis as redis_py

from consumer.graph_write import GraphCounters, GraphWrite, commit_graph
from consumer.keys import Keys
from consumer.lock import ConsumerLock, Holder, LockHeld, LockNotString
from consumer.redis_store import connect_redis
from rankstream.services.testing import Isolated


@pytest.fixture
def client(isolated: Isolated) -> redis_py.Redis:
    return connect_redis(isolated.settings)


def test_second_lock_refuses_and_names_the_holder(isolated, client):
    key = Keys(isolated.key_prefix).lock
    # Another live process: this one's parent (a lease of this very process under
    # another token is taken back, see the next test).
    first = ConsumerLock(client, key, ttl_ms=5000, pid=os.getppid())
    first.acquire()
    second = ConsumerLock(client, key, ttl_ms=5000)
    with pytest.raises(LockHeld, match=f"pid {first.holder.pid}"):
        second.acquire()
    first.release()
    second.acquire()
    assert second.still_ours() and not first.still_ours()
    second.release()
    assert client.get(key) is None


def test_our_own_lease_under_an_older_token_is_taken_back(isolated, client):
    """A Redis restored from a copy taken before a lease regain holds this process's
    lease under its old token: a live pid, so it stopped the consumer as if another
    had taken over (a review); the graph fence then decides what follows."""
    key = Keys(isolated.key_prefix).lock
    lock = ConsumerLock(client, key, ttl_ms=60_000)
    lock.acquire()
    old = client.get(key)
    client.delete(key)
    assert lock.reacquire()  # the regain: a new token
    assert client.get(key) != old
    client.set(key, old)  # the restore
    assert lock.reacquire() and lock.still_ours()
    lock.release()


def test_lease_of_a_dead_process_is_taken_over(isolated, client):
    key = Keys(isolated.key_prefix).lock
    # A pid far above pid_max: certainly no such process on this host.
    dead = ConsumerLock(client, key, ttl_ms=60_000, pid=2**22 + 12345)
    dead.acquire()
    successor = ConsumerLock(client, key, ttl_ms=60_000)
    successor.acquire()
    holder = Holder.decode(client.get(key))
    assert holder is not None and holder.pid == successor.holder.pid
    successor.release()


def test_hand_edited_leases_are_refused_in_one_line_never_taken_nor_raised(isolated, client):
    """A review (session 29): ``"pid": 1e999`` and a pid past the C long range crashed
    the start with an OverflowError traceback; a lease without ``since`` or ``token``
    lost its holder's name."""
    key = Keys(isolated.key_prefix).lock
    me = ConsumerLock(client, key, ttl_ms=60_000)
    own = json.loads(me.value)
    for pid in ("1e999", str(2**63), "1e20"):
        client.set(key, me.value.replace(f'"pid":{own["pid"]}'.encode(), f'"pid":{pid}'.encode()))
        with pytest.raises(LockHeld, match="refusing to start"):
            ConsumerLock(client, key, ttl_ms=60_000).acquire()
    client.set(key, json.dumps({"host": "elsewhere", "pid": 41}))
    with pytest.raises(LockHeld, match="pid 41 on host elsewhere"):
        me.acquire()
    client.delete(key)


def test_a_lease_key_of_another_type_stops_writes_with_a_service_error(isolated, client):
    """WRONGTYPE on the lease's GET: a fenced write raised redis' ResponseError (a
    traceback), the renewal logged "failed" forever without setting ``lost``, and
    a start called it an outage (retried). Now every path says LockNotString."""
    key = Keys(isolated.key_prefix).lock
    lock = ConsumerLock(client, key, ttl_ms=5000)
    lock.acquire()
    client.delete(key)
    client.sadd(key, "not a lease")
    assert not lock.lost.is_set()
    with pytest.raises(LockNotString, match="not a consumer lease"):
        lock.renew()
    assert lock.lost.is_set()
    keys = Keys(isolated.key_prefix)
    with pytest.raises(LockNotString):
        commit_graph(client, keys, GraphWrite(counters=GraphCounters(version=1)), fence=lock)
    with pytest.raises(LockNotString):
        ConsumerLock(client, key, ttl_ms=5000).acquire()
    assert not client.exists(keys.graph)
    from consumer.publication import Publication
    from consumer.score_swap import send_swap

    swap = Publication(publication_id="p1", chunks=[], swap=[], checks=[], meta_checks=[],
                       summary=[], urls=None, swapped={}, meta_key=keys.meta("pagerank"),
                       reports={})
    for scripts in (True, False):  # the scripted swap's WRONGTYPE said "failed in Redis"
        lock.lost.clear()
        with pytest.raises(LockNotString):
            send_swap(client, swap, scripts=scripts, fence=lock)
        assert lock.lost.is_set()
    client.delete(key)


def test_the_loser_of_a_takeover_race_names_the_winner_not_the_dead(isolated, client):
    key = Keys(isolated.key_prefix).lock
    dead = ConsumerLock(client, key, ttl_ms=60_000, pid=2**22 + 12345)
    dead.acquire()
    winner = ConsumerLock(client, key, ttl_ms=60_000, pid=2**22 + 777)
    loser = ConsumerLock(client, key, ttl_ms=60_000)

    def beaten(expected: bytes) -> bool:  # the winner's takeover lands first
        client.set(key, winner.value)
        return False

    loser._compare_and_set = beaten  # type: ignore[method-assign]
    with pytest.raises(LockHeld, match=f"pid {2**22 + 777} "):
        loser.acquire()

    def gone(expected: bytes) -> bool:  # the winner took it over and already left
        client.delete(key)
        return False

    client.set(key, dead.value)
    loser._compare_and_set = gone  # type: ignore[method-assign]
    loser.acquire()  # a free lease is taken, not called held
    assert client.get(key) == loser.value
    loser.release()


def test_a_fenced_transaction_first_extends_a_lease_due_for_renewal(isolated, client):
    """Renewal waits while a fenced transaction holds the mutex, and since Redis 6.0.9
    a watched key that expires aborts EXEC: a transaction begun on the lease's last
    third could abort with no rival, and again on every retry."""

    keys = Keys(isolated.key_prefix)
    lock = ConsumerLock(client, keys.lock, ttl_ms=6000)
    lock.acquire()
    client.pexpire(keys.lock, 300)  # the renewal thread missed its turn
    lock._renewed_at = time.monotonic() - 2.5
    commit_graph(client, keys, GraphWrite(offsets={"t:0": 7}), fence=lock)
    assert client.hget(keys.offsets, "t:0") == b"7"
    assert client.pttl(keys.lock) > 5000  # extended before the WATCH
    lock.release()


def test_a_holder_in_another_pid_namespace_is_not_taken_for_dead(isolated, client):
    """Same host name, pid not found here: in another container on the host network it
    may well be alive. Taking over evicted a live consumer; now it waits for the TTL."""
    import dataclasses

    key = Keys(isolated.key_prefix).lock
    elsewhere = ConsumerLock(client, key, ttl_ms=60_000, pid=2**22 + 12345)
    elsewhere.holder = dataclasses.replace(elsewhere.holder, pidns="pid:[4026531999]")
    elsewhere.value = elsewhere.holder.encode()
    elsewhere.acquire()
    with pytest.raises(LockHeld):
        ConsumerLock(client, key, ttl_ms=60_000).acquire()
    elsewhere.release()


def test_renewal_extends_the_lease(isolated, client):
    key = Keys(isolated.key_prefix).lock
    lock = ConsumerLock(client, key, ttl_ms=3000)
    lock.acquire()
    client.pexpire(key, 1000)
    assert lock.renew()
    assert client.pttl(key) > 2000
    lock.release()


def test_a_takeover_that_loses_the_race_leaves_the_winners_lease(isolated, client, monkeypatch):
    """Taking over a dead holder's lease is a compare-and-set: a rival that took it
    meanwhile keeps it, and is named."""
    import consumer.lock as lock_module
    from consumer.lock import LockHeld

    key = Keys(isolated.key_prefix).lock
    dead = ConsumerLock(client, key, ttl_ms=60_000, pid=2**22 + 12345)
    dead.acquire()
    winner = ConsumerLock(client, key, ttl_ms=60_000, pid=os.getppid())

    def racing(pid: int) -> bool:  # while we look the dead holder up, a rival takes over
        client.set(key, winner.value, px=60_000)
        return False

    monkeypatch.setattr(lock_module, "_pid_alive", racing)
    with pytest.raises(LockHeld, match=f"pid {os.getppid()} "):
        ConsumerLock(client, key, ttl_ms=60_000).acquire()
    assert client.get(key) == winner.value
