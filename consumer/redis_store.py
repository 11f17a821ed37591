"""Redis connection, error translation, and reading the stored graph back.

The write side (one MULTI/EXEC per batch) is :mod:`consumer.graph_write`. This
module builds the client from settings and loads what a restart resumes from:
the graph (pipelined, chunked reads), the last ts per page, the offsets and the
counters, and the last published score vectors (warm start).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from consumer.graph_write import GraphCounters
from consumer.keys import (
    ALGORITHMS,
    LAYOUT_FIELD,
    UNFINISHED_FIELD,
    Keys,
    check_layout_value,
)
from consumer.resp import read_sets, transient_refusal
from rankstream.errors import ConfigError, ServiceError, ServiceUnavailable
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer.store")

REDIS_SOCKET_TIMEOUT_S = 30.0  # a 50k-command EXEC may take a while on a busy box
# Readers (CLI and HTTP) send small reads: on a stalled Redis the consumer's 30 s and
# three retries held each request for two minutes, and ~40 such requests froze the
# HTTP server's thread pool.
READER_SOCKET_TIMEOUT_S = 5.0
READER_RETRIES = 1


def connect_redis(settings: Settings, *, client_name: str = "rankstream",
                  reader: bool = False) -> redis.Redis:
    """A redis-py client (hiredis parser when installed) built from settings.

    Connection errors and timeouts are retried by redis-py itself with exponential
    backoff (a few attempts, capped at 2 s); longer outages surface as
    ``redis.ConnectionError`` for the caller's own bounded-backoff loop.
    ``reader``: a short socket timeout and one retry, for readers answering a person
    or a request. The password is taken from its SecretStr only here and never logged.
    """
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    kwargs: dict[str, Any] = {
        "username": settings.redis_username,
        "password": password,
        "socket_timeout": READER_SOCKET_TIMEOUT_S if reader else REDIS_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": 5.0,
        # No health checks: redis-py PINGs before a command on a connection idle for
        # the interval and, if the reply is not PONG, reconnects by itself. Between
        # the groups of a raw-RESP transaction the next reply is MULTI's +OK, and on
        # the new connection the rest of the batch ran without WATCH or MULTI (a
        # review's repro, a fenced batch resumed after a 15 s pause). Dead
        # connections still fail: keepalive, the socket timeout, then a retry.
        "health_check_interval": 0,
        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.05),
                       retries=READER_RETRIES if reader else 3),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        "client_name": client_name,
    }
    if not settings.redis_url.startswith("unix:"):  # a unix socket's class refuses it
        kwargs["socket_keepalive"] = True
    if settings.redis_ssl_ca_certs is not None:  # rediss:// only (the settings check)
        kwargs["ssl_ca_certs"] = str(settings.redis_ssl_ca_certs)
    try:
        return redis.Redis.from_url(settings.redis_url, **kwargs)
    except (ValueError, TypeError, redis.RedisError) as exc:
        raise ServiceError(f"bad redis settings: {exc}") from exc


@contextlib.contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Translate redis-py errors: unreachable, or refusing for now (out of memory, a
    read-only replica: :data:`consumer.resp.TRANSIENT_REFUSALS`) -> ServiceUnavailable,
    others -> ServiceError.

    A refused password is a ServiceError, not "unavailable": redis-py raises it as a
    ConnectionError subclass, and retrying it only delayed the error by a minute.
    ``redis.WatchError`` passes through untranslated.
    """
    try:
        yield
    except redis.WatchError:
        raise  # not a failure: a fenced write's signal, for Recovery.fenced
    except redis.AuthenticationError as exc:
        raise ServiceError(f"redis refused our credentials while {what}: {exc}") from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ServiceUnavailable(f"redis unavailable while {what}: {exc}") from exc
    except redis.RedisError as exc:
        if transient_refusal(exc):  # out of memory, read-only replica...: retried
            raise ServiceUnavailable(f"redis refused for now while {what}: {exc}") from exc
        raise ServiceError(f"redis error while {what}: {exc}") from exc


def check_redis_fits(client: redis.Redis) -> None:
    """Refuse a Redis the consumer cannot keep its promises on, with one clear line.

    * A policy other than ``noeviction`` with a ``maxmemory``: under ``allkeys-*`` a
      full Redis would silently delete links, id maps or offsets, and nothing could
      tell; under ``volatile-*`` it evicts the keys with a TTL, the lease and score
      back buffers first, which the consumer's own writes then evicted again and
      again (a review: 9,476 lease re-takes, no progress). Out of memory under
      ``noeviction`` is a refusal, retried. Without a maxmemory nothing is evicted:
      a warning then.
    * Cluster mode: each batch is one MULTI/EXEC over keys of every slot, which a
      cluster refuses (CROSSSLOT) deep inside the first batch.

    ``INFO`` is read, not ``CONFIG GET``, which managed services often disable; a
    Redis that refuses ``INFO`` too is not checked.
    """
    try:
        with redis_errors("checking the Redis server"):
            info: Any = client.info()
    except ServiceUnavailable:
        raise
    except ServiceError as exc:
        log.info("redis server not checked", extra={"fields": {"error": str(exc)}})
        return
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        if int(info.get("maxmemory", 0) or 0) > 0:
            raise ConfigError(
                f"Redis evicts keys when full (maxmemory-policy {policy}): the graph's "
                "keys (allkeys-*), or the lease and score buffers (volatile-*), would "
                "vanish; use maxmemory-policy noeviction for this database")
        log.warning("redis may evict keys once a maxmemory is set", extra={"fields": {
            "maxmemory_policy": policy}})
    if str(info.get("cluster_enabled", "0")) == "1":
        raise ConfigError("Redis runs in cluster mode, which refuses the consumer's "
                          "transactions over keys of many slots; use a standalone Redis "
                          "(or a primary with replicas)")


def check_layout(client: redis.Redis, keys: Keys) -> None:
    """Refuse data written in another version of the key layout (docs/redis-keys.md),
    with one line saying what to do: a consumer would otherwise write a mix of two
    layouts under one prefix, and a reader misread it. No ``layout`` field (a new
    database, or data written before the field existed) is this layout. Works with
    any client (``decode_responses`` or not): readers of the library may pass theirs."""
    with redis_errors("reading the key layout version"):
        raw, unfinished = client.hmget(keys.graph, [LAYOUT_FIELD, UNFINISHED_FIELD])
    check_layout_value(keys, raw)
    if unfinished is not None:
        raise ConfigError(f"the graph under {keys.prefix!r} is an unfinished `rankstream "
                          "rekey` (cut short): delete its keys and run rekey again")


@contextlib.contextmanager
def stored_data(what: str) -> Iterator[None]:
    """A value in Redis that is not what rankstream writes (a hand edit, another
    program under the prefix) is a ServiceError naming it, never a crash."""
    try:
        yield
    # RecursionError: json.loads of a value nested a few thousand deep.
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ServiceError(f"unexpected data in Redis while {what}: {exc}") from exc


def decoded(value: Any, errors: str = "strict") -> str:
    """A reply of a client without ``decode_responses``, as text (``errors`` as for
    ``bytes.decode``)."""
    return value.decode("utf-8", errors) if isinstance(value, bytes) else str(value)


def decoded_hash(raw: Mapping[Any, Any], errors: str = "strict") -> dict[str, str]:
    """An HGETALL reply of such a client, as text."""
    return {decoded(k, errors): decoded(v, errors) for k, v in raw.items()}


@dataclass
class StoredState:
    """The graph and bookkeeping as Redis holds them (what a restart resumes from)."""

    urls: list[str]  # by page id
    removed: np.ndarray  # ids of removed pages
    edge_src: np.ndarray
    edge_dst: np.ndarray
    last_ts: dict[int, int]
    offsets: dict[int, int]  # partition of the consumed topic -> next offset
    counters: GraphCounters
    seconds: float = 0.0
    crawled: np.ndarray | None = None
    """Crawled flag by page id (bool, length ``len(urls)``); None when Redis holds no
    ``page:crawled`` bitmap although it holds pages: data an older version wrote."""


def _hscan_all(client: redis.Redis, key: str) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    cursor = 0
    while True:
        reply: Any = client.hscan(key, cursor, count=10_000)
        cursor, chunk = reply
        out.update(chunk)
        if cursor == 0:
            return out


def topic_offsets(fields: Mapping[str, bytes | str | int], topic: str) -> dict[int, int]:
    """``P offsets`` fields (``topic:partition`` -> next offset) of one topic, by partition."""
    offsets: dict[int, int] = {}
    for name, value in fields.items():
        owner, _, partition = name.rpartition(":")  # another's field: not ours to parse
        if owner == topic:
            offsets[int(partition)] = int(value)
    return offsets


def load_stored(client: redis.Redis, keys: Keys, topic: str) -> StoredState:
    """Read the whole stored graph back (out-link sets: :func:`consumer.resp.read_sets`)."""
    started = time.perf_counter()
    with redis_errors("loading the graph"), stored_data("loading the graph"):
        # Read again at the end: the keys are read one after another, and a Redis that
        # went back meanwhile (restarted from an older copy; redis-py reconnects by
        # itself) gave a mirror with the newer ids and the older counters, which the
        # fence then accepted, and page:url was never dense again (a review).
        before = (client.hgetall(keys.graph), client.hgetall(keys.offsets))
        raw_urls = _hscan_all(client, keys.page_url)
        num_ids = len(raw_urls)
        urls: list[str] = [""] * num_ids
        for raw_id, raw_url in raw_urls.items():
            pid = int(raw_id)
            # "01" next to "1" would leave an id without its URL: written ids are canonical.
            if not 0 <= pid < num_ids or raw_id != str(pid).encode():
                raise ServiceError(f"{keys.page_url} is not dense: id {raw_id!r} of {num_ids}")
            urls[pid] = raw_url.decode("utf-8")
        del raw_urls
        # Raw pipelined SMEMBERS (consumer.resp.read_sets): through redis-py's pipeline
        # object every page cost ~10 us of Python, ~15 s of a 1.4M-page restart.
        lengths, members = read_sets(client, [keys.out_links(pid) for pid in range(num_ids)])
        edge_src = np.repeat(np.arange(num_ids, dtype=np.int32), lengths)
        _check_ids(members, num_ids, f"{keys.prefix}out:*")  # before int32 wraps them
        edge_dst = members.astype(np.int32)
        removed_raw = client.smembers(keys.page_removed)
        removed_ids = np.array(sorted(int(x) for x in removed_raw), dtype=np.int64)
        _check_ids(removed_ids, num_ids, keys.page_removed)
        removed = removed_ids.astype(np.int32)
        last_ts = {int(k): int(v) for k, v in _hscan_all(client, keys.page_ts).items()}
        _check_ids(np.fromiter(last_ts, dtype=np.int64, count=len(last_ts)), num_ids,
                   keys.page_ts)
        crawled = crawled_flags(client.get(keys.page_crawled), num_ids, keys.page_crawled)
        stored_offsets: Any = client.hgetall(keys.offsets)
        graph_hash: Any = client.hgetall(keys.graph)
        if (graph_hash, stored_offsets) != before:
            raise ServiceUnavailable(f"{keys.graph} changed while the graph was read (Redis "
                                     "went back, or another writer): reading it again")
        offsets = topic_offsets({k.decode(): v for k, v in stored_offsets.items()}, topic)
        counters = GraphCounters.from_redis(graph_hash)
    return StoredState(
        urls=urls,
        removed=removed,
        edge_src=edge_src,
        edge_dst=edge_dst,
        last_ts=last_ts,
        offsets=offsets,
        counters=counters,
        seconds=time.perf_counter() - started,
        crawled=crawled,
    )


def crawled_flags(bitmap: Any, num_ids: int, key: str) -> np.ndarray | None:
    """The ``page:crawled`` bitmap as flags by id (Redis numbers a string's bits from
    the most significant bit of its first byte); None if absent while there are ids."""
    if bitmap is None:
        return None if num_ids else np.zeros(0, dtype=bool)
    if not isinstance(bitmap, bytes):
        raise ServiceError(f"{key} is not a bitmap: not written by rankstream")
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="big")
    if bits.size > num_ids and bits[num_ids:].any():
        raise ServiceError(f"{key} flags a page id outside 0..{num_ids - 1}: "
                           "not written by rankstream")
    flags = np.zeros(num_ids, dtype=bool)
    flags[: min(bits.size, num_ids)] = bits[:num_ids].astype(bool)
    return flags


def crawled_bitmap(flags: np.ndarray) -> bytes:
    """:func:`crawled_flags` reversed."""
    return np.packbits(np.asarray(flags, dtype=bool), bitorder="big").tobytes()


def _check_ids(ids: np.ndarray, num_ids: int, key: str) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_ids):
        raise ServiceError(f"{key} holds a page id outside 0..{num_ids - 1}: not written "
                           "by rankstream")


def load_published(client: redis.Redis, keys: Keys, url_to_id: Any, num_ids: int,
                   algorithms: Sequence[str] = ALGORITHMS) -> dict[str, np.ndarray]:
    """The last published score vectors, by page id (warm start after a restart).

    ``url_to_id`` maps a URL to its id or None. Pages missing from a ZSET get NaN,
    not 0: an engine can leave a live page at exactly 0 after a capped refresh, and
    its member is present all the same (a warm start reads NaN as 0,
    :meth:`consumer.score_publisher.ScorePublisher.adopt` as absent). An algorithm
    with an empty ZSET is left out (the engine starts it cold).
    """
    warm: dict[str, np.ndarray] = {}
    with redis_errors("loading the published scores"):
        for algorithm in algorithms:
            vector = np.full(num_ids, np.nan)
            seen = 0
            cursor = 0
            while True:
                reply: Any = client.zscan(keys.scores(algorithm), cursor, count=10_000)
                cursor, chunk = reply
                for member, score in chunk:
                    # A member that is not UTF-8 (not ours) names no page: it stays
                    # unrecorded, so the swap refuses and the ZSET is replaced whole.
                    pid = url_to_id(member.decode("utf-8", "replace"))
                    if pid is not None and pid < num_ids:
                        vector[pid] = score
                        seen += 1
                if cursor == 0:
                    break
            if seen:
                warm[algorithm] = vector
    return warm
