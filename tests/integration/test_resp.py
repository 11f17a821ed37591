"""Raw RESP transactions (consumer.resp) against the real redis-server."""

from __future__ import annotations

import numpy as np
import pytest
import redis as redis_py

from consumer.redis_store import connect_redis, redis_errors
from consumer.resp import (
    TransactionFailed,
    command,
    pooled_connection,
    send_commands,
    set_commands,
    transaction,
)
from rankstream.services.testing import Isolated


@pytest.fixture
def client(isolated: Isolated) -> redis_py.Redis:
    return connect_redis(isolated.settings)


def test_a_large_transaction_runs_whole_and_leaves_the_connection_usable(isolated, client):
    prefix = isolated.key_prefix
    owners = np.arange(100_000, dtype=np.int32)  # one command each: many reads of replies
    body = [set_commands("SADD", f"{prefix}s:", owners, np.ones_like(owners), owners * 3)]
    with pooled_connection(client) as conn:
        replies = transaction(conn, [*body, command("SET", f"{prefix}done", "1")],
                              owners.size + 1)
    assert replies[:-1] == [1] * owners.size and replies[-1] in (b"OK", "OK")
    assert client.smembers(f"{prefix}s:99999") == {b"299997"}
    assert client.get(f"{prefix}done") == b"1"  # the pooled connection is still in step


def test_pipelined_payloads_of_many_commands_are_all_answered(isolated, client):
    """A payload holding a command per owner, counted: every reply is read, so the pooled
    connection stays in step (rekey's link sets; a reply left unread once answered the
    next SCAN)."""
    prefix = isolated.key_prefix
    owners = np.arange(3_000, dtype=np.int32)
    payloads = [set_commands("SADD", f"{prefix}p:", owners[:1_000], np.ones(1_000), owners[:1_000]),
                command("SADD", f"{prefix}p:0", "0"),  # already there: 0, not 1
                set_commands("SADD", f"{prefix}p:", owners[1_000:], np.ones(2_000),
                             owners[1_000:])]
    replies = send_commands(client, payloads, [1_000, 1, 2_000])
    assert replies == [1] * 1_000 + [0] + [1] * 2_000
    assert client.ping() is True and client.smembers(f"{prefix}p:2999") == {b"2999"}


def test_a_changed_watched_key_refuses_the_whole_transaction(isolated, client):
    key, other = f"{isolated.key_prefix}watched", f"{isolated.key_prefix}x"
    with pooled_connection(client) as conn:
        conn.send_command("WATCH", key)
        conn.read_response()
        client.set(key, "changed")  # another connection writes in between
        with pytest.raises(redis_py.WatchError):
            transaction(conn, [command("SET", other, "1")], 1)
    assert client.get(other) is None


def test_a_command_refused_while_queued_discards_the_transaction(isolated, client):
    key = f"{isolated.key_prefix}x"
    with pooled_connection(client) as conn, pytest.raises(TransactionFailed, match=r"(?i)sadd"):
        transaction(conn, [command("SET", key, "1"), command("SADD", key)], 2)
    assert client.get(key) is None


def test_a_command_failing_inside_exec_is_reported(isolated, client):
    key = f"{isolated.key_prefix}str"
    client.set(key, "a string")
    with pooled_connection(client) as conn, pytest.raises(TransactionFailed, match="WRONGTYPE"):
        transaction(conn, [command("SADD", key, "1")], 1)


def test_an_exec_running_past_the_socket_timeout_is_waited_for_not_retried(
        isolated, client, monkeypatch):
    """A batch removing pages with millions of in-links kept Redis busy past the
    connection's socket timeout; the consumer then retried it, and Redis ran it again."""
    from consumer import resp

    slow = redis_py.Redis(connection_pool=redis_py.ConnectionPool(
        **{**client.connection_pool.connection_kwargs, "socket_timeout": 0.3}))
    key = f"{isolated.key_prefix}ran"
    busy = command("EVAL", "local t = redis.call('TIME') local s = t[1] + t[2] / 1e6 "
                   "repeat t = redis.call('TIME') until t[1] + t[2] / 1e6 > s + 1 "
                   "return redis.call('INCR', KEYS[1])", 1, key)
    monkeypatch.setattr(resp, "EXEC_BYTES_PER_S", 10.0)  # patience: many seconds
    with pooled_connection(slow) as conn:
        assert transaction(conn, [busy], 1) == [1]
    monkeypatch.setattr(resp, "EXEC_BYTES_PER_S", 1e12)  # no patience: the old behaviour
    with pooled_connection(slow) as conn, pytest.raises(redis_py.TimeoutError):
        transaction(conn, [busy], 1)
    slow.close()


def test_a_transient_refusal_is_retryable_and_runs_nothing(isolated, client):
    """Out of memory (or a read-only replica after a failover) stopped the consumer as
    if the transaction were a bug; nothing of it ran, so it is retried like an outage."""
    from rankstream.errors import ServiceUnavailable

    key = f"{isolated.key_prefix}x"
    saved = client.config_get("maxmemory*")
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        with pooled_connection(client) as conn, pytest.raises(ServiceUnavailable,
                                                              match="OOM"):
            transaction(conn, [command("SET", key, "1")], 1)
        # The same refusal through redis-py, which moves the code out of the message
        # and, in a pipeline, puts the command before it.
        with pytest.raises(ServiceUnavailable), redis_errors("writing"):
            client.set(key, "1")
        with (pytest.raises(ServiceUnavailable), redis_errors("writing"),
              client.pipeline(transaction=True) as pipe):
            pipe.set(key, "1").execute()
    finally:
        client.config_set("maxmemory", saved["maxmemory"])
        client.config_set("maxmemory-policy", saved["maxmemory-policy"])
    assert client.get(key) is None
    with pooled_connection(client) as conn:  # the same transaction once Redis takes it
        transaction(conn, [command("SET", key, "1")], 1)
    assert client.get(key) == b"1"
