"""Raw RESP transactions (consumer.resp) against the real redis-server."""

from __future__ import annotations

import numpy as np
import pytest
import redis as redis_py

from consumer.redis_store import connect_redis
from consumer.resp import TransactionFailed, command, pooled_connection, set_commands, transaction
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
