"""Redis commands as raw RESP bytes: encoding, pipelined sending, one raw MULTI/EXEC.

The consumer's two bulk writes, the graph transaction and the score publications,
send tens of thousands of small commands per batch. Through redis-py's pipeline
object every argument costs ~1 us of Python (packing) and every reply ~1 us more,
time taken from the threads that decode events and run the engines. So the bulk
commands are encoded here (numpy, or the compiled :func:`set_commands`) and sent
through the public ``Connection.send_packed_command``; replies are read back with
the connection's own (hiredis) parser through ``Connection.read_response``, except
a transaction's one ``+QUEUED`` per command, which a hiredis reader of our own
takes straight from the socket (:func:`_replies`).

Why plain commands and not a server-side script that unpacks packed ids: measured
on this 2-core box (AOF on), Redis spends 4.9-5.2 us per link running a Lua script
that unpacks int32 arrays and calls ``SADD`` per key, against 1.8-2.8 us for the
same ``SADD`` commands sent plainly inside ``MULTI``. Redis' CPU is shared with
the broker and the consumer, so that difference is end-to-end throughput.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import hiredis
import numba
import numpy as np
import redis

from rankstream.errors import ServiceError, ServiceUnavailable

SEND_GROUP_BYTES = 8 * 1024 * 1024  # one sendall() each: the GIL is released meanwhile
READ_SETS_CHUNK = 10_000  # SMEMBERS per round trip of read_sets()

_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"


class TransactionFailed(ServiceError):
    """EXEC ran, or was refused, and a command inside it failed.

    A bug or foreign keys of the wrong type: never retried.
    """


# Refusals a Redis server takes back by itself or by an operator's fix that needs no
# change of ours (memory freed, a disk that takes the snapshot again, a failover over,
# a long script done): the consumer retries them with backoff like an outage instead
# of stopping. A queued command refused so makes Redis discard the whole transaction,
# so nothing of it ran and the identical transaction can be sent again.
TRANSIENT_REFUSALS = frozenset({"OOM", "MISCONF", "READONLY", "LOADING", "BUSY",
                                "MASTERDOWN", "NOREPLICAS", "TRYAGAIN", "CLUSTERDOWN"})


def reply_code(error: BaseException) -> str | None:
    """The code of a Redis error reply (``OOM``, ``WRONGTYPE``...), or None.

    Where the code is: redis-py moves the codes it knows (OOM, READONLY...) out of the
    message into ``status_code``; its pipelines put ``Command # N (...) of pipeline
    caused error:`` before the reply; and an EXEC refused as a whole names the
    refusal after ``EXECABORT Transaction discarded because of:``.
    """
    if not isinstance(error, redis.ResponseError):
        return None
    reply = str(error).rpartition("caused error: ")[2]
    if "discarded because of: " in reply:  # the refusal, not EXECABORT (status_code)
        return reply.rpartition("discarded because of: ")[2].split(" ", 1)[0]
    code = getattr(error, "status_code", None)
    return str(code) if code else reply.split(" ", 1)[0]


def transient_refusal(error: BaseException) -> bool:
    """Whether ``error`` is a Redis error reply of :data:`TRANSIENT_REFUSALS`."""
    return reply_code(error) in TRANSIENT_REFUSALS


def bulk(value: bytes | str) -> bytes:
    """One RESP bulk string."""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return b"$%d\r\n%s\r\n" % (len(raw), raw)


def command(*args: bytes | str | int) -> bytes:
    """One RESP command (for the few small ones)."""
    parts = [bulk(str(a) if isinstance(a, int) else a) for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(parts)


# -- grouped set commands (compiled) ------------------------------------------------

@numba.njit(cache=True, nogil=True, inline="always")
def _digits(value: int) -> int:
    count = 1
    while value >= 10:
        value //= 10
        count += 1
    return count


@numba.njit(cache=True, nogil=True, inline="always")
def _put_decimal(out: np.ndarray, at: int, value: int) -> int:
    end = at + _digits(value)
    pos = end
    while True:
        pos -= 1
        out[pos] = 48 + value % 10
        value //= 10
        if value == 0:
            break
    return end


@numba.njit(cache=True, nogil=True, inline="always")
def _put_bytes(out: np.ndarray, at: int, raw: np.ndarray) -> int:
    out[at:at + raw.size] = raw
    return at + raw.size


@numba.njit(cache=True, nogil=True, inline="always")
def _put_line_end(out: np.ndarray, at: int) -> int:
    out[at] = 13
    out[at + 1] = 10
    return at + 2


@numba.njit(cache=True, nogil=True)
def _encode_set_commands(verb: np.ndarray, key_head: np.ndarray, owners: np.ndarray,
                         counts: np.ndarray, members: np.ndarray) -> np.ndarray:
    # Pass 1: the exact size. Per group "*<2+c>\r\n" verb "$<k>\r\n<key_head><owner>\r\n",
    # then per member "$<d>\r\n<member>\r\n".
    size = 0
    pos = 0
    for g in range(owners.size):
        key_len = key_head.size + _digits(owners[g])
        size += 3 + _digits(counts[g] + 2) + verb.size + 5 + _digits(key_len) + key_len
        for j in range(pos, pos + counts[g]):
            d = _digits(members[j])
            size += 5 + _digits(d) + d
        pos += counts[g]
    out = np.empty(size, dtype=np.uint8)
    at = 0
    pos = 0
    for g in range(owners.size):
        out[at] = 42  # '*'
        at = _put_line_end(out, _put_decimal(out, at + 1, counts[g] + 2))
        at = _put_bytes(out, at, verb)
        out[at] = 36  # '$'
        at = _put_line_end(out, _put_decimal(out, at + 1, key_head.size + _digits(owners[g])))
        at = _put_line_end(out, _put_decimal(out, _put_bytes(out, at, key_head), owners[g]))
        for j in range(pos, pos + counts[g]):
            out[at] = 36
            at = _put_line_end(out, _put_decimal(out, at + 1, _digits(members[j])))
            at = _put_line_end(out, _put_decimal(out, at, members[j]))
        pos += counts[g]
    return out


def set_commands(verb: str, key_head: str, owners: np.ndarray, counts: np.ndarray,
                 members: np.ndarray) -> bytes:
    """``verb key_head+owner member ...`` per group (SADD/SREM), as RESP bytes.

    ``owners``/``counts``/``members`` as from :func:`consumer.graph_write.group_members`:
    group ``g`` owns the next ``counts[g]`` members. Ids are non-negative and written
    in decimal, exactly as ``redis-py`` would send ``str(id)``.
    """
    if owners.size == 0:
        return b""
    if (owners.size and owners.min() < 0) or (members.size and members.min() < 0):
        raise ValueError("page ids are non-negative")
    encoded = _encode_set_commands(np.frombuffer(bulk(verb), dtype=np.uint8),
                                   np.frombuffer(key_head.encode("utf-8"), dtype=np.uint8),
                                   owners.astype(np.int64), counts.astype(np.int64),
                                   members.astype(np.int64))
    return encoded.tobytes()


# -- sending ------------------------------------------------------------------------

def _groups(payloads: Sequence[bytes]) -> Iterator[list[bytes]]:
    """``payloads`` in consecutive groups of about :data:`SEND_GROUP_BYTES`."""
    group: list[bytes] = []
    size = 0
    for payload in payloads:
        group.append(payload)
        size += len(payload)
        if size >= SEND_GROUP_BYTES:
            yield group
            group, size = [], 0
    if group:
        yield group


@contextlib.contextmanager
def pooled_connection(client: redis.Redis) -> Iterator[Any]:
    """A connection of ``client``'s pool; dropped (not reused) after any error."""
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        yield conn
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def send_commands(client: redis.Redis, payloads: Sequence[bytes],
                  counts: Sequence[int] | None = None) -> list[Any]:
    """Send RESP commands on one pooled connection, pipelined; return every reply.

    Each payload is one command, or ``counts[i]`` of them (as :func:`set_commands`
    encodes a command per owner): a reply left unread would be taken as the answer to
    the connection's next command.

    The replies of one ~8 MB group are read before the group after next is sent, so
    a huge publication (2.8M members, ~200 MB, after a restart on a 1.4M-page graph)
    is never more than two groups ahead of Redis, and no single read waits for more
    than about two groups' worth of Redis work.

    Error replies come back as exceptions in the list. Connection errors propagate
    (the connection is dropped) for the caller's retry loop.
    """
    with pooled_connection(client) as conn:
        replies: list[Any] = []
        in_flight: list[int] = []  # commands per group sent and not yet read

        def read(count: int) -> None:
            for _ in range(count):
                try:
                    replies.append(conn.read_response())
                except redis.ResponseError as exc:
                    replies.append(exc)

        sizes = iter([1] * len(payloads) if counts is None else counts)
        for group in _groups(payloads):
            conn.send_packed_command(group)
            in_flight.append(sum(next(sizes) for _ in group))
            if len(in_flight) > 2:
                read(in_flight.pop(0))
        for count in in_flight:
            read(count)
        return replies


def read_sets(redis: Any, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``SMEMBERS`` of every key (integer members): ``(lengths, all members concatenated)``.

    One raw pipelined write and read per :data:`READ_SETS_CHUNK` keys. On any error the
    connection is closed before it goes back to the pool, so no half-read reply
    can reach the next user.
    """
    lengths = np.zeros(len(keys), dtype=np.int64)
    if not keys:
        return lengths, np.zeros(0, dtype=np.int64)
    members: list[bytes] = []
    with pooled_connection(redis) as connection:
        for lo in range(0, len(keys), READ_SETS_CHUNK):
            batch = keys[lo : lo + READ_SETS_CHUNK]
            connection.send_packed_command([_smembers_request(batch)])
            for i in range(lo, lo + len(batch)):
                reply = connection.read_response(disable_decoding=True)
                lengths[i] = len(reply)
                members.extend(reply)
    return lengths, _parse_ids(members, int(lengths.sum()))


def _smembers_request(keys: Sequence[str]) -> bytes:
    parts = []
    for key in keys:
        raw = key.encode()
        parts.append(b"*2\r\n$8\r\nSMEMBERS\r\n$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


def _parse_ids(members: list[bytes], expected: int) -> np.ndarray:
    if not members:
        return np.zeros(0, dtype=np.int64)
    # One C-level parse of "12 7 301 ..." is ~4x faster than int() per member.
    ids = np.fromstring(b" ".join(members), dtype=np.int64, sep=" ")
    if ids.size != expected:
        raise ValueError(f"non-integer member in an adjacency set ({ids.size} != {expected})")
    return ids


# EXEC answers only once every queued command ran. A batch that removes pages with
# millions of in-links keeps Redis busy past the connection's socket timeout (30 s),
# and a retry would only run the whole transaction again, and again: so once the
# transaction is sent, its replies are awaited for as long as its size could take at
# this pessimistic rate (measured here: 4-7 MB/s of adjacency commands).
EXEC_BYTES_PER_S = 1_000_000


def _replies(conn: Any, count: int, patience_s: float = 0.0) -> Iterator[Any]:
    """The next ``count`` replies on ``conn``, parsed by a hiredis reader of our own.

    ``Connection.read_response`` costs ~1 us of Python per reply (measured: 1.4 s of
    the writer thread's GIL time per million links), and a graph transaction has one
    ``+QUEUED`` reply per command. Reading the socket directly is only correct when
    redis-py's own parser holds no unread bytes, which is the case here: every
    earlier reply on the connection was read before these commands were sent. The
    socket (``Connection._sock``) is redis-py's one private attribute we rely on;
    the integration tests exercise this path on every graph write.
    """
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("connection closed before the replies were read")
    reader = hiredis.Reader(replyError=redis.ResponseError)
    left = count
    deadline = time.monotonic() + patience_s
    while left:
        reply = reader.gets()
        if reply is False:
            try:
                received = sock.recv(1 << 20)
            except TimeoutError as exc:
                if time.monotonic() < deadline:
                    # Everything is sent: Redis is queueing or running it (replies go out
                    # when it has processed what it read, EXEC's included).
                    continue
                raise redis.TimeoutError("timeout reading transaction replies") from exc
            except OSError as exc:
                raise redis.ConnectionError(f"error reading transaction replies: {exc}"
                                            ) from exc
            if not received:
                raise redis.ConnectionError("Redis closed the connection mid-transaction")
            reader.feed(received)
            continue
        left -= 1
        yield reply


def transaction(conn: Any, body: Sequence[bytes], commands: int) -> list[Any]:
    """``MULTI``, the ``commands`` RESP commands in ``body``, ``EXEC``, on ``conn``.

    Returns EXEC's replies. Raises ``redis.WatchError`` when EXEC was refused because
    a key the connection WATCHes changed, and :class:`TransactionFailed` when a
    command was refused while queued (Redis then discards the whole transaction) or
    failed inside EXEC (the others did run; Redis has no rollback).
    """
    for group in _groups([_MULTI, *body, _EXEC]):
        conn.send_packed_command(group)
    refused: Exception | None = None
    replies: Any = None
    patience_s = sum(map(len, body)) / EXEC_BYTES_PER_S
    # +OK of MULTI, +QUEUED per command, then EXEC's reply
    for index, reply in enumerate(_replies(conn, commands + 2, patience_s)):
        if index <= commands:
            if refused is None and isinstance(reply, Exception):
                refused = reply
        else:
            replies = reply
    if isinstance(replies, Exception):  # EXECABORT, or EXEC itself refused
        cause = refused or replies
        if transient_refusal(cause):
            raise ServiceUnavailable(f"Redis refused the transaction for now (nothing "
                                     f"of it ran): {cause}") from cause
        raise TransactionFailed(f"transaction refused by Redis: {cause}") from cause
    if replies is None:
        raise redis.WatchError("a watched key changed; the transaction was not run")
    failures = [r for r in replies if isinstance(r, Exception)]
    if failures:
        # Redis ran the other commands, the batch's offsets (the last one) included.
        raise TransactionFailed(f"transaction partly failed in Redis ({len(failures)} of "
                                f"{len(replies)} commands; the others, the offsets "
                                f"included, were applied): {failures[0]}")
    return list(replies)
