"""`rankstream consume`: the loop from Kafka to the Redis graph and live scores.

One iteration: poll a batch -> validate (invalid -> dead-letter topic, confirmed)
-> interpret into one net edge batch -> ONE fenced MULTI/EXEC with the graph
changes and the next offsets -> apply to the in-memory engines -> publish the
moved scores and meta (one more MULTI/EXEC) -> commit offsets to Kafka (for lag
tools only) -> status heartbeat.

Concurrency: the graph transaction runs on a writer thread while the main thread
polls and decodes the next batch; publications run on a second writer thread and
are coalesced (batches that finish while one is being written join the next).

Failure handling (the decisions, see docs/redis-keys.md):

* Redis errors around a transaction: the identical write is retried with bounded
  exponential backoff (0.1 s doubling to 5 s, with jitter; never a hot loop).
  The write is idempotent, so a retry after an EXEC that did commit is harmless,
  and the mirror stays valid: it is only updated after EXEC succeeds.
* Lease lost (frozen past its TTL): if the lease is free we take it again; if
  Redis shows that nobody wrote in between (same graph version and offsets) we
  carry on, otherwise the batch is dropped, the mirror is rebuilt from Redis and
  Kafka is re-positioned at the Redis offsets. If another consumer holds the
  lease we stop with an error.
* Kafka errors while polling or sending dead letters: retried with the same
  backoff (dead letters may be sent twice; never lost).
* SIGTERM/SIGINT: the current batch is finished and published, then a clean exit
  (0). While Redis is down a stop request waits at most ``stop_grace_s`` more.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

import redis

from consumer.dead_letters import DeadLetter, DeadLetterSender
from consumer.graph_write import commit_graph
from consumer.jsonlog import safe_address
from consumer.kafka_source import KafkaSource, Record, ensure_topics
from consumer.keys import Keys
from consumer.lock import DEFAULT_TTL_MS, ConsumerLock, LockHeld, LockLost
from consumer.mirror import Mirror, PlannedBatch
from consumer.redis_store import connect_redis, redis_errors
from consumer.score_publisher import PendingScores, Publication, ScorePublisher
from consumer.stats import ConsumerStats, iso_now, lag_by_partition
from rankstream.errors import InputError, ServiceUnavailable
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer")

T = TypeVar("T")

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ServiceUnavailable)
MAX_IDLE_REFRESHES = 5  # extra refreshes before a --until-caught-up exit


@dataclass(frozen=True)
class ConsumeOptions:
    """Run-time options of one consumer process (the CLI flags)."""

    until_caught_up: bool = False
    max_seconds: float | None = None
    lock_ttl_ms: int = DEFAULT_TTL_MS
    bulk_writes: bool = True
    status_interval_s: float = 1.0
    min_publish_interval_s: float = 0.5
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    stop_grace_s: float = 30.0
    startup_wait_s: float = 60.0


@dataclass
class Fetched:
    """One polled and decoded batch."""

    records: list[Record]
    events: list[Any]
    letters: list[DeadLetter]
    next_offsets: dict[int, int]


class MirrorStale(Exception):
    """Someone else wrote the prefix while we did not hold the lease: rebuild."""


class ConsumerService:
    """One consumer process; :meth:`run` returns the exit code."""

    def __init__(self, settings: Settings, options: ConsumeOptions | None = None) -> None:
        from producer.schema import Limits

        self.settings = settings
        self.options = options or ConsumeOptions()
        self.keys = Keys(settings.key_prefix)
        self.limits = Limits.from_settings(settings)
        self.stats = ConsumerStats()
        self.stop_event = threading.Event()
        self.stop_reason = ""
        self._stop_requested_at: float | None = None
        self.redis = connect_redis(settings, client_name="rankstream-consumer")
        self.lock = ConsumerLock(self.redis, self.keys.lock, ttl_ms=self.options.lock_ttl_ms)
        self.publisher = ScorePublisher(self.redis, self.keys, damping=settings.damping,
                                        tolerance=settings.tolerance,
                                        publish_threshold=settings.publish_threshold,
                                        bulk=self.options.bulk_writes)
        self.mirror: Mirror | None = None
        self.source: KafkaSource | None = None
        self.dlq: DeadLetterSender | None = None
        self._last_status = 0.0
        self._targets: dict[int, int] | None = None
        self._holding = False  # status is written only while we hold the lease
        # Graph transactions run on one writer thread (in order) while the main thread
        # decodes the next batch; publications run on another, coalesced (see process).
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graph-writer")
        self._pub_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-writer")
        self._prefetched: Fetched | None = None
        self._publishing: Future[None] | None = None
        self._pending = PendingScores()
        self._last_publication_end = 0.0
        self._last_publication_s = 0.0

    # -- signals --------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        if not self.stop_event.is_set():
            self.stop_reason = reason
            self._stop_requested_at = time.monotonic()
            self.stop_event.set()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            self.request_stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # -- retry ----------------------------------------------------------------------
    def _sleep_backoff(self, attempt: int) -> None:
        base = min(self.options.backoff_max_s,
                   self.options.backoff_initial_s * (2 ** min(attempt, 16)))
        # Full jitter in [base/2, base]: no thundering herd, never a hot loop.
        time.sleep(base * (0.5 + random.random() / 2))

    def _retry(self, what: str, action: Callable[[], T]) -> T:
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
                if (self._stop_requested_at is not None
                        and time.monotonic() - self._stop_requested_at > self.options.stop_grace_s):
                    raise ServiceUnavailable(f"gave up {what} after the stop request: {exc}"
                                             ) from exc
                log.warning("retrying", extra={"fields": {"what": what, "attempt": attempt,
                                                          "error": str(exc)[:300]}})
                self._set_state("waiting")
                self._sleep_backoff(attempt - 1)

    # -- lifecycle ------------------------------------------------------------------
    def _wait_for_redis(self) -> None:
        deadline = time.monotonic() + self.options.startup_wait_s
        attempt = 0
        while True:
            try:
                with redis_errors("connecting"):
                    self.redis.ping()
                return
            except ServiceUnavailable:
                if time.monotonic() > deadline or self.stop_event.is_set():
                    raise
                self._sleep_backoff(attempt)
                attempt += 1

    def start(self) -> None:
        """Lease, topics, mirror, Kafka position: everything before the first poll."""
        settings = self.settings
        self._wait_for_redis()
        self.lock.acquire()
        self._holding = True
        self.lock.start_renewal()
        log.info("consumer starting", extra={"fields": {
            "redis": safe_address(settings.redis_url), "kafka": settings.kafka_bootstrap,
            "topic": settings.topic, "prefix": settings.key_prefix, "pid": self.stats.pid}})
        self._retry("creating topics", lambda: ensure_topics(settings))
        self.mirror = self._retry("loading the mirror",
                                  lambda: Mirror.load(self.redis, self.keys, settings))
        self.stats.load_seconds = self.mirror.load_seconds
        self._publish(self.mirror.start_reports, ())
        self.source = self._retry("connecting to kafka", lambda: KafkaSource(settings))
        self.dlq = self._retry("connecting the dlq producer", lambda: DeadLetterSender(settings))
        partitions = self._retry("assigning partitions",
                                 lambda: self._source().assign(self._mirror().offsets))
        if self.options.until_caught_up:
            self._targets = self._retry("reading end offsets", self._source().end_offsets)
        log.info("consuming", extra={"fields": {"partitions": partitions,
                                                "offsets": self._mirror().offsets,
                                                "targets": self._targets}})
        self._set_state("running")

    def _mirror(self) -> Mirror:
        assert self.mirror is not None
        return self.mirror

    def _source(self) -> KafkaSource:
        assert self.source is not None
        return self.source

    def run(self) -> int:
        """Start, loop until stopped or caught up, shut down. Returns the exit code."""
        started = time.monotonic()
        try:
            self.start()
            while not self.stop_event.is_set():
                if (self.options.max_seconds is not None
                        and time.monotonic() - started >= self.options.max_seconds):
                    self.request_stop("max-seconds")
                    break
                self.step()
                if self._caught_up():
                    self.request_stop("caught-up")
            self.drain()
        finally:
            self.shutdown()
        log.info("consumer stopped", extra={"fields": {
            "reason": self.stop_reason, "events": self.stats.events,
            "batches": self.stats.batches}})
        return 0

    def _caught_up(self) -> bool:
        if self._targets is None:
            return False
        positions = self._mirror().offsets
        return all(positions.get(p, 0) >= end for p, end in self._targets.items() if end > 0)

    def shutdown(self) -> None:
        self._writer.shutdown(wait=True)
        self._pub_writer.shutdown(wait=True)
        if self._holding:
            self._set_state("stopped", force=True)
        if self.source is not None:
            self.source.close(self.mirror.offsets if self.mirror is not None else None)
        if self.dlq is not None:
            self.dlq.close()
        self.lock.release()
        self.redis.close()

    # -- one batch ------------------------------------------------------------------
    def fetch(self) -> Fetched | None:
        """Poll one batch and decode it (no shared state: runs while Redis writes)."""
        from producer.schema import decode_event

        try:
            records = self._source().poll(self.settings.batch_max_events,
                                          self.settings.poll_timeout_ms)
        except ServiceUnavailable as exc:
            log.warning("poll failed", extra={"fields": {"error": str(exc)[:300]}})
            self._sleep_backoff(0)
            return None
        if not records:
            return None
        events: list[Any] = []
        letters: list[DeadLetter] = []
        next_offsets: dict[int, int] = {}
        for record in records:
            try:
                events.append(decode_event(record.value, self.limits))
            except InputError as exc:
                letters.append(DeadLetter(record, str(exc)))
            if record.offset + 1 > next_offsets.get(record.partition, -1):
                next_offsets[record.partition] = record.offset + 1
        return Fetched(records, events, letters, next_offsets)

    def step(self) -> int:
        """Process one batch (the one fetched during the previous step, or a new one).

        Redis work is overlapped with CPU work on a single writer thread, which
        keeps every write in order: while batch N's graph transaction runs, batch
        N+1 is polled and decoded; while N's publication runs, N+1 is planned.
        The mirror is still updated only after N's EXEC succeeded.
        Returns the number of messages handled.
        """
        batch, self._prefetched = self._prefetched, None
        try:
            if batch is None:
                batch = self.fetch()
            if batch is None:
                # Idle: publish what is pending now (without waiting for it).
                self._maybe_publish(force=True)
                if self._publishing is None:
                    self.refresh_if_stale()
                self._heartbeat()
                return 0
            self.process(batch)
        except MirrorStale:
            self._rebuild()
        return len(batch.records) if batch is not None else 0

    def process(self, batch: Fetched) -> None:
        """Dead letters, commit, apply and publish one decoded batch."""
        started = time.perf_counter()
        mirror = self._mirror()
        planned = mirror.plan(batch.events, batch.next_offsets, len(batch.records),
                              len(batch.letters))
        t_plan = time.perf_counter()
        if batch.letters:
            dlq = self.dlq
            assert dlq is not None
            letters = batch.letters
            self._retry("sending dead letters", lambda: dlq.send(letters))
            self.stats.dlq_sent += len(letters)
        t_sent = time.perf_counter()
        commit = self._writer.submit(self._commit, planned)
        if not self.stop_event.is_set() and not self._would_be_caught_up(batch.next_offsets):
            self._prefetched = self.fetch()
        t_fetch = time.perf_counter()
        commit.result()
        t_commit = time.perf_counter()
        reports = mirror.apply_committed(planned)
        t_rank = time.perf_counter()
        self._pending.add(reports, planned.removed_ids)
        self._maybe_publish()
        self._source().commit_for_monitoring(batch.next_offsets)
        done = time.perf_counter()
        self.stats.record_batch(len(batch.records), planned.write.link_changes, done - started)
        log.info("batch", extra={"fields": {
            "messages": len(batch.records), "dead_letters": len(batch.letters),
            "link_changes": planned.write.link_changes, "version": mirror.counters.version,
            "moved": {a: int(r.moved_ids.size) for a, r in reports.items()},
            "modes": {a: str(r.mode) for a, r in reports.items()},
            "plan_s": round(t_plan - started, 4), "dlq_s": round(t_sent - t_plan, 4),
            "prefetch_s": round(t_fetch - t_sent, 4), "wait_commit_s": round(t_commit - t_fetch, 4),
            "rank_s": round(t_rank - t_commit, 4), "prepare_s": round(done - t_rank, 4)}})
        self._heartbeat()

    def _would_be_caught_up(self, next_offsets: dict[int, int]) -> bool:
        if self._targets is None:
            return False
        merged = {**self._mirror().offsets, **next_offsets}
        return all(merged.get(p, 0) >= end for p, end in self._targets.items() if end > 0)

    def drain(self) -> None:
        """Publish everything pending and wait for it (called before a clean exit)."""
        self._flush_publications()
        if self.stop_reason == "caught-up":
            for _ in range(MAX_IDLE_REFRESHES):
                if not self.refresh_if_stale():
                    break
                self._flush_publications()

    def refresh_if_stale(self) -> bool:
        """While idle: if a published vector is not fresh, refine and publish it again.

        A refresh can end unfresh (the global mode's sweep cap); with no new events
        nothing else would tighten it. Returns True if a refresh was done.
        """
        mirror = self.mirror
        if mirror is None or all(self.stats.fresh.get(a, True) for a in mirror.start_reports):
            return False
        from ranker.linkgraph import EdgeBatch

        reports = mirror.ranks.apply(EdgeBatch())
        self._pending.add(reports, ())
        self._maybe_publish(force=True)  # does not wait; stats.fresh updates when it lands
        return True

    def _await_publication(self) -> None:
        in_flight, self._publishing = self._publishing, None
        if in_flight is not None:
            in_flight.result()

    def _maybe_publish(self, *, force: bool = False) -> None:
        """Start a publication of the pending scores unless one is still being written.

        Coalescing: a publication rewrites every page that moved since the last one,
        which on a fast-changing graph is most pages; batches arriving meanwhile
        only add to the pending set, so publication cost never throttles the graph.
        """
        if self._publishing is not None:
            if not self._publishing.done():
                return
            self._await_publication()  # surfaces its error, if any
        if not self._pending:
            return
        # A publication is one atomic EXEC that holds Redis for its whole length, and
        # graph transactions queue behind it: after one ends, leave Redis to the graph
        # for at least as long as it took (and at least min_publish_interval_s).
        gap = max(self.options.min_publish_interval_s, self._last_publication_s)
        if not force and time.monotonic() - self._last_publication_end < gap:
            return
        mirror = self._mirror()
        publication = self.publisher.prepare(mirror.ranks, self._pending,
                                             version=mirror.counters.version,
                                             offsets=mirror.offsets_fields())
        self._publishing = self._pub_writer.submit(self._send_publication, publication)

    def _flush_publications(self) -> None:
        """Wait for the publication in flight, then publish what is pending and wait."""
        self._await_publication()
        self._maybe_publish(force=True)
        self._await_publication()

    def _commit(self, planned: PlannedBatch) -> None:
        mirror = self._mirror()
        bulk = self.options.bulk_writes

        def attempt() -> int:
            return commit_graph(self.redis, self.keys, planned.write, fence=self.lock, bulk=bulk)

        while True:
            try:
                self._retry("committing the graph", attempt)
                return
            except (LockLost, redis.WatchError):
                self._regain_lease(mirror)

    def _regain_lease(self, mirror: Mirror) -> None:
        """The lease changed under a transaction: continue, rebuild or stop."""
        if self._retry("checking the lease", self.lock.still_ours):
            return  # the WATCH tripped for another reason (e.g. our key expired and came back)
        if not self._retry("taking the lease again", self.lock.reacquire):
            raise LockHeld(f"another consumer took {self.keys.lock} while this one was "
                           "stalled; stopping")
        with redis_errors("checking for foreign writes"):
            stored_version = self.redis.hget(self.keys.graph, "version")
            stored_offsets = self.redis.hgetall(self.keys.offsets)
        ours = {k.encode(): str(v).encode() for k, v in mirror.offsets_fields().items()}
        same_version = int(stored_version or 0) == mirror.counters.version
        if same_version and dict(stored_offsets) == ours:
            log.warning("lease re-taken; nobody wrote meanwhile, continuing")
            return
        log.warning("lease re-taken after a foreign write; rebuilding the mirror")
        raise MirrorStale()

    def _rebuild(self) -> None:
        with contextlib.suppress(Exception):  # whatever was in flight is void now
            self._await_publication()
        self._pending = PendingScores()  # the rebuilt mirror republishes every page
        self._prefetched = None
        old = self._mirror()
        warm = {alg: old.ranks.scores(alg) for alg in old.start_reports}
        self.mirror = self._retry("rebuilding the mirror",
                                  lambda: Mirror.load(self.redis, self.keys, self.settings,
                                                      warm=warm))
        self._publish(self.mirror.start_reports, ())
        self._retry("seeking", lambda: self._source().seek(self._mirror().offsets))

    def _publish(self, reports: dict[str, Any], removed_ids: Any) -> None:
        """Publish ``reports`` (and anything pending) now, synchronously."""
        self._await_publication()
        self._pending.add(reports, removed_ids)
        self._flush_publications()

    def _send_publication(self, publication: Publication) -> None:
        mirror = self._mirror()
        started = time.perf_counter()

        def attempt() -> Any:
            return self.publisher.send(publication, fence=self.lock)

        while True:
            try:
                published = self._retry("publishing scores", attempt)
                break
            except (LockLost, redis.WatchError):
                self._regain_lease(mirror)
        self.stats.last_refresh_at = iso_now()
        self.stats.last_refresh_seconds = time.perf_counter() - started
        self._last_publication_s = self.stats.last_refresh_seconds
        self._last_publication_end = time.monotonic()
        for item in published:
            self.stats.bound[item.algorithm] = item.bound
            self.stats.fresh[item.algorithm] = item.fresh

    # -- status ---------------------------------------------------------------------
    def _set_state(self, state: str, *, force: bool = False) -> None:
        if self.stats.state != state:
            self.stats.state = state
            self._heartbeat(force=True)
        elif force:
            self._heartbeat(force=True)

    def _heartbeat(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self._holding:
            return
        if not force and now - self._last_status < self.options.status_interval_s:
            return
        self._last_status = now
        mirror = self.mirror
        if self.source is not None and mirror is not None:
            self.stats.lag = lag_by_partition(self.source.highwaters(), mirror.offsets)
        counters = mirror.counters if mirror is not None else None
        fields = self.stats.status_fields(
            topic=self.settings.topic,
            version=counters.version if counters else 0,
            stale_ignored=counters.stale_ignored if counters else 0,
            dlq_total=counters.dlq if counters else 0)
        try:
            self.redis.hset(self.keys.status, mapping=fields)  # type: ignore[arg-type]
        except redis.RedisError as exc:
            log.warning("status write failed", extra={"fields": {"error": str(exc)[:300]}})


def run_consumer(settings: Settings, options: ConsumeOptions | None = None, *,
                 handle_signals: bool = True) -> int:
    """Build and run a consumer; errors are RankstreamError subclasses."""
    service = ConsumerService(settings, options)
    if handle_signals:
        service.install_signal_handlers()
    return service.run()
