"""How the consumer rides out failures: retries with backoff, and lease recovery.

The decisions (see also docs/redis-keys.md):

* Redis errors around a transaction: the identical write is retried with bounded
  exponential backoff (0.1 s doubling to 5 s, with jitter; never a hot loop).
  The write is idempotent, so a retry after an EXEC that did commit is harmless.
  Nothing is published meanwhile, and the mirror holds at most two batches beyond
  Redis: the one in flight and the one planned beside it.
* Lease lost (frozen past its TTL): if the lease is free we take it again; if
  Redis shows that nobody wrote in between (same graph version and offsets) we
  carry on, otherwise the batch is dropped, the mirror (which may already hold
  that batch) is rebuilt from Redis and Kafka is re-positioned at the Redis
  offsets (:class:`MirrorStale`, handled by the service). If another consumer
  holds the lease we stop with an error.
* Redis went back (it lost acknowledged writes: a failover to a replica that
  lagged, a restore from a backup) while our lease stayed valid: each graph
  transaction checks that ``P graph`` still holds the counters last committed
  (:class:`consumer.graph_write.GraphMoved`), and so does every idle poll; if not,
  the mirror is rebuilt from Redis and Kafka re-read from the offsets stored there
  (:class:`MirrorStale`), so the lost batches are applied again.
* Kafka errors while polling or sending dead letters: retried with the same
  backoff (dead letters may be sent twice; never lost).
* After a stop request, a failing write is retried for at most ``stop_grace_s``
  more, then given up (``ServiceUnavailable``).

One :class:`Recovery` serves all threads of a consumer process: the main thread,
the graph writer and the score writer. Lease recovery runs one thread at a time.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from consumer.graph_write import PROGRESS_FIELDS, GraphCounters, GraphMoved, stored_progress
from consumer.keys import Keys
from consumer.lock import ConsumerLock, LockHeld, LockLost
from consumer.redis_store import redis_errors
from consumer.stats import ConsumerStats
from rankstream.errors import ServiceError, ServiceUnavailable

log = logging.getLogger("rankstream.consumer")

T = TypeVar("T")

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ServiceUnavailable)


class MirrorStale(ServiceError):
    """Someone else wrote the prefix while we did not hold the lease: rebuild.

    The consumer rebuilds where it can (a batch, the final drain); anywhere else it
    stops with this as its one-line error, and a restart reads Redis afresh.
    """


def run_every(steps: Mapping[str, Callable[[], object]], failed: str) -> Exception | None:
    """Run every step whatever an earlier one raised (each failure logged as
    ``failed``, naming the step); return the first error, if any."""
    first: Exception | None = None
    for what, step in steps.items():
        try:
            step()
        except Exception as exc:
            log.warning(failed, extra={"fields": {
                "step": what, "error": f"{type(exc).__name__}: {exc}"[:300]}})
            first = first or exc
    return first


def settle_void(in_flight: Mapping[str, Callable[[], object]]) -> None:
    """Wait for work made void by a rebuild: its errors are logged, never raised."""
    run_every(in_flight, "dropped before the rebuild")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: ``initial_s`` doubling up to ``max_s``."""

    initial_s: float = 0.1
    max_s: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt + 1``."""
        base = min(self.max_s, self.initial_s * (2 ** min(attempt, 16)))
        # Jitter in [base/2, base]: no thundering herd, never a hot loop.
        return base * (0.5 + random.random() / 2)

    def sleep(self, attempt: int) -> None:
        time.sleep(self.delay(attempt))


class Recovery:
    """Retries and lease recovery for one consumer process.

    Args:
        client: the consumer's Redis client.
        lock: its lease.
        keys: its key layout (the graph and offsets keys are compared after a
            lease change).
        topic: its topic (only this topic's offsets are compared).
        stats: ``retries`` and ``state`` are updated here.
        backoff: the delays between attempts.
        stop_grace_s: how long a failing write is retried after a stop request.
        set_state: reports ``"waiting"`` while retrying and ``"running"`` once an
            attempt succeeded again (the service's status heartbeat).
    """

    def __init__(self, client: redis.Redis, lock: ConsumerLock, keys: Keys, topic: str,
                 stats: ConsumerStats, backoff: Backoff, *, stop_grace_s: float,
                 set_state: Callable[[str], None]) -> None:
        self.client = client
        self.lock = lock
        self.keys = keys
        self.topic = topic
        self.stats = stats
        self.backoff = backoff
        self.stop_grace_s = stop_grace_s
        self._set_state = set_state
        self.stop_requested_at: float | None = None  # monotonic time of a stop request
        # (graph counters, P offsets fields) as of the last transaction that committed:
        # what Redis must still hold for a re-taken lease to carry on, and for the
        # next transaction (GraphCounters.progress).
        self.committed: tuple[GraphCounters, dict[str, int]] = (GraphCounters(), {})
        self._mutex = threading.Lock()
        self._held_by_another = False  # a regain found the lease taken: stop, all threads

    def retry(self, what: str, action: Callable[[], T]) -> T:
        """``action()``, retried with backoff while it fails with a RETRYABLE error."""
        attempt = 0
        while True:
            try:
                result = action()
                if attempt and self.stats.state == "waiting":
                    log.info("recovered", extra={"fields": {"what": what, "attempts": attempt}})
                    self._set_state("running")
                return result
            except RETRYABLE as exc:
                attempt += 1
                self.stats.retries += 1
                self._give_up_if_stopping(what, exc)
                log.warning("retrying", extra={"fields": {"what": what, "attempt": attempt,
                                                          "error": str(exc)[:300]}})
                self._set_state("waiting")
                self.backoff.sleep(attempt - 1)

    def wait_for_redis(self, within_s: float, stop_event: threading.Event) -> None:
        """Ping Redis until it answers; give up after ``within_s`` or a stop request."""
        deadline = time.monotonic() + within_s
        attempt = 0
        while True:
            try:
                with redis_errors("connecting"):
                    self.client.ping()
                return
            except ServiceUnavailable:
                if time.monotonic() > deadline or stop_event.is_set():
                    raise
                self.backoff.sleep(attempt)
                attempt += 1

    def fenced(self, what: str, action: Callable[[], T]) -> T:
        """Run a fenced Redis write with retries; on a lease change continue, or raise
        :class:`MirrorStale` (rebuild) or ``LockHeld`` (stop)."""
        regained = 0
        while True:
            try:
                return self.retry(what, action)
            except (LockLost, redis.WatchError) as exc:
                if regained:
                    # The lease keeps going (a Redis that evicts keys with a TTL under
                    # memory pressure evicted it again at every write): back off, and
                    # heed a stop request, instead of a hot loop that ignored both.
                    self._give_up_if_stopping(what, exc)
                    self.backoff.sleep(regained - 1)
                self.regain_lease()
                regained += 1
            except GraphMoved as exc:
                raise self._graph_moved(exc.stored) from exc

    def _give_up_if_stopping(self, what: str, exc: BaseException) -> None:
        if (self.stop_requested_at is not None
                and time.monotonic() - self.stop_requested_at > self.stop_grace_s):
            raise ServiceUnavailable(f"gave up {what} after the stop request: {exc}") from exc

    def check_graph_kept(self) -> None:
        """Raise :class:`MirrorStale` unless ``P graph`` holds the counters last
        committed (called while idle, with no transaction in flight: a rollback of
        Redis is otherwise found only by the next batch's transaction)."""
        def stored() -> Any:
            with redis_errors("checking the stored graph"):
                return self.client.hmget(self.keys.graph, list(PROGRESS_FIELDS))

        progress = stored_progress(self.keys, self.retry("checking the stored graph", stored))
        if progress != self.committed[0].progress:
            if not self.retry("checking the lease", self.lock.still_ours):
                # Another holder moved it on (the renewal thread may not have said so
                # yet): continue, rebuild or stop as for any lapsed lease.
                self.regain_lease()
            raise self._graph_moved(progress)

    def _graph_moved(self, stored: int) -> MirrorStale:
        expected = self.committed[0].progress
        went_back = stored < expected
        log.warning("redis went back; rebuilding the mirror" if went_back
                    else "the stored graph moved on; rebuilding the mirror",
                    extra={"fields": {"stored_progress": stored,
                                      "committed_progress": expected}})
        return MirrorStale(str(GraphMoved(stored, expected)))

    def regain_lease(self) -> None:
        """The lease changed under a transaction: continue, rebuild or stop.

        The graph writer and the publisher may both get here after one freeze; they
        go one at a time. The first suspends every fenced write (``lock.suspended``)
        before it re-takes the lease, and lifts that only if nobody wrote meanwhile;
        otherwise it stays until :meth:`resume` after the rebuild, and the second
        thread, like any fenced write meanwhile, gets :class:`MirrorStale` too.
        """
        with self._mutex:
            self._regain_lease_locked()

    def resume(self) -> None:
        """The mirror was rebuilt from Redis (and ``committed`` set), under the lease the
        regain took: fenced writes may go ahead again (each still checks the lease)."""
        self.lock.suspended.clear()
        self.lock.lost.clear()  # set by the writes refused meanwhile

    def _taken_by_another(self) -> LockHeld:
        return LockHeld(f"another consumer took {self.keys.lock} while this one was "
                        "stalled; stopping")

    def _regain_lease_locked(self) -> None:
        suspended = self.lock.suspended
        if suspended.is_set():
            # Left by an earlier regain: another consumer holds the lease, or wrote, or
            # the check failed before it could tell (only a rebuild is safe then).
            if self._held_by_another:
                raise self._taken_by_another()
            raise MirrorStale("the lease lapsed and Redis may hold another consumer's "
                              "writes; the in-memory graph must be rebuilt")
        suspended.set()
        if self.retry("checking the lease", self.lock.still_ours):
            # The WATCH tripped for another reason (e.g. our key expired and came back).
            self.lock.lost.clear()
            suspended.clear()
            return
        if not self.retry("taking the lease again", self.lock.reacquire):
            self._held_by_another = True
            raise self._taken_by_another()
        def stored_state() -> tuple[Any, Any]:
            with redis_errors("checking for foreign writes"):
                return (self.client.hget(self.keys.graph, "version"),
                        self.client.hgetall(self.keys.offsets))

        # Retried like the two calls before it: one dropped connection here stopped
        # the consumer (the suspension stays set if this never answers).
        stored_version, stored_offsets = self.retry("checking for foreign writes",
                                                    stored_state)
        # Compared with the last transaction that committed (the mirror may already
        # hold the batch whose transaction was refused).
        version, offsets = self.committed[0].version, self.committed[1]
        ours = {k: str(v) for k, v in offsets.items()}
        raw: dict[bytes, bytes] = dict(stored_offsets)
        fields = ((k.decode("utf-8", "replace"), v.decode("utf-8", "replace"))
                  for k, v in raw.items())
        stored = {k: v for k, v in fields if k.rpartition(":")[0] == self.topic}
        if int(stored_version or 0) == version and stored == ours:
            log.warning("lease re-taken; nobody wrote meanwhile, continuing")
            suspended.clear()
            return
        log.warning("lease re-taken after a foreign write; rebuilding the mirror")
        raise MirrorStale("another consumer wrote under this prefix while our lease had "
                          "lapsed; the in-memory graph is stale")
