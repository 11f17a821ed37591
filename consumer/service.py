"""`rankstream consume`: the loop from Kafka to the Redis graph and live scores.

One iteration: poll a batch -> validate (invalid -> dead-letter topic, confirmed)
-> interpret into one net edge batch -> ONE fenced MULTI/EXEC with the graph
changes and the next offsets -> apply to the in-memory engines -> publish the
scores and meta once that EXEC succeeded (see :mod:`consumer.score_publisher`)
-> commit offsets to Kafka (for lag tools only) -> status heartbeat.

Concurrency: the graph transaction runs on a writer thread while a ranker thread
applies the same batch to the engines (compiled kernels, GIL released) and the main
thread polls and decodes the next one. The ranker thread then refreshes the engines
while the main thread decodes up to four batches ahead and plans the next one
(before that transaction has finished, and before the refresh has: planning only
reads the graph and interns; see :meth:`ConsumerService.process`). The refresh is
collected, and a publication started if due, before the engines take the next
batch; publications run on a second writer thread (:mod:`consumer.publishing`) and are
coalesced (batches that finish while one is being written join the next). A
publication only ever covers batches whose transaction committed. While catching
up, batches are only absorbed by the engines until a publication can start, and one
refresh then covers them (:meth:`ConsumerService._refresh_due`); the refresh after
a batch is capped at ``batch_max_sweeps`` sweeps' worth of work, idle and final
refreshes are not. The status heartbeat is written from a thread of its own.

Failure handling (the decisions, see docs/redis-keys.md):

* Redis errors around a transaction: the identical write is retried with bounded
  exponential backoff (0.1 s doubling to 5 s, with jitter; never a hot loop).
  The write is idempotent, so a retry after an EXEC that did commit is harmless.
  Nothing is published meanwhile, and the batch in flight is the only one the
  mirror holds beyond Redis.
* Lease lost (frozen past its TTL): if the lease is free we take it again; if
  Redis shows that nobody wrote in between (same graph version and offsets) we
  carry on, otherwise the batch is dropped, the mirror (which may already hold
  that batch) is rebuilt from Redis and Kafka is re-positioned at the Redis
  offsets. If another consumer holds the lease we stop with an error.
* Kafka errors while polling or sending dead letters: retried with the same
  backoff (dead letters may be sent twice; never lost).
* SIGTERM/SIGINT: the current batch is finished and published, then a clean exit
  (0). While Redis is down a stop request waits at most ``stop_grace_s`` more.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import logging
import random
import signal
import sys
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
from consumer.publishing import Publications
from consumer.redis_store import connect_redis, redis_errors
from consumer.score_publisher import ScorePublisher
from consumer.stats import ConsumerStats, catching_up, lag_by_partition, seconds_to_catch_up
from consumer.status_writer import StatusWriter
from ranker import set_kernel_threads
from rankstream.errors import InputError, ServiceUnavailable
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer")

T = TypeVar("T")

RETRYABLE = (redis.ConnectionError, redis.TimeoutError, ServiceUnavailable)
MAX_IDLE_REFRESHES = 5  # extra refreshes before a --until-caught-up exit
# While a capped publication leaves the published scores lagging y by a relative L1
# distance L (see consumer.score_publisher), refining y per batch far below L is work
# nobody can see yet: the engines then refresh to CATCHUP_SHARE * L (never looser
# than CATCHUP_MAX_TOLERANCE, never tighter than the tolerance). Idle refreshes and
# the final publication always go back to the tolerance, so `fresh` means the same.
CATCHUP_SHARE = 0.1
CATCHUP_MAX_TOLERANCE = 1e-2
# Decoding one 5,000-event batch allocates ~100k container objects that all die with
# the batch (reference counting frees them; they form no cycles). With CPython's
# default young-generation threshold (700) that meant ~1,350 collections, 11 of them
# full ones over the whole mirror, per 100k events: 1.7 s of GIL-holding collector
# in a 10 s run (measured with gc.callbacks). See tune_garbage_collector().
GC_YOUNG_THRESHOLD = 100_000
# Batches decoded ahead while the engines refresh (bounded: 4 x batch_max_events
# decoded events in memory at most).
MAX_PREFETCH_BATCHES = 4
EXTRA_POLL_MS = 20
# A refresh on the ranker thread is a chain of GIL-free kernels joined by short Python
# steps, and each step must win the GIL back from the main thread, which decodes and
# plans in pure Python meanwhile. CPython hands the GIL over only after the switch
# interval (5 ms by default), so a refresh of a few dozen steps waited ~0.4 s per
# batch: measured on 1M pages, a quarter-sweep refresh of both engines beside a busy
# Python thread took 0.82-0.86 s instead of 0.41 s alone, and 0.47-0.61 s at 0.5 ms.
# In the 1M-page pipeline bench, two runs back to back: p99 event -> visible score
# 5.3 s at 5 ms, 4.6 s at 0.5 ms; throughput the same (81.6k, 80.6k link changes/s).
GIL_SWITCH_INTERVAL_S = 0.0005


def tune_garbage_collector() -> None:
    """Keep CPython's cycle collector off the hot path of a consumer process.

    ``gc.freeze()`` moves everything alive now (the freshly loaded mirror: URL
    lists, id maps) out of the collector's sight, so full collections no longer
    walk it; the raised young threshold lets a batch's short-lived objects be freed
    by reference counting before a collection ever starts. Measured on the 100k-event
    pipeline bench: collector time 1.72 s -> 0.03 s. Cyclic garbage is still
    collected, just after 100k net allocations instead of 700.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def tune_gil_switching() -> None:
    """Let the ranker thread win the GIL back quickly (see GIL_SWITCH_INTERVAL_S).

    Process-wide, like :func:`tune_garbage_collector`; never loosens a tighter
    interval someone else set.
    """
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))


@dataclass(frozen=True)
class ConsumeOptions:
    """Run-time options of one consumer process (the CLI flags)."""

    until_caught_up: bool = False
    max_seconds: float | None = None
    lock_ttl_ms: int = DEFAULT_TTL_MS
    bulk_writes: bool = True
    status_interval_s: float = 1.0
    # Between the end of a publication and the start of the next (once caught up):
    # a capped publication takes a few hundred ms of Redis, and any pause here adds
    # directly to the event-to-score latency (while catching up the pause is as long
    # as the last publication, which leaves Redis to the graph half the time).
    min_publish_interval_s: float = 0.05
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
                                        owner=self.lock.holder.token[:12],
                                        scripts=self.options.bulk_writes,
                                        max_updates=settings.publish_max_updates or None)
        # Publications run on a thread of their own and are coalesced (see process).
        self.publications = Publications(self.publisher, self.stats, self._fenced, self.lock,
                                         min_interval_s=self.options.min_publish_interval_s)
        self.mirror: Mirror | None = None
        self.source: KafkaSource | None = None
        self.dlq: DeadLetterSender | None = None
        self._targets: dict[int, int] | None = None
        self._holding = False  # status is written only while we hold the lease
        # Graph transactions run on one writer thread (in order) while the main thread
        # decodes the next batch.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graph-writer")
        self.status = StatusWriter(self.redis, self.keys.status, self.lock,
                                   interval_s=self.options.status_interval_s)
        # The engines' kernels release the GIL, so a batch is ranked on this thread
        # while the main thread polls and decodes the next one (which touches no
        # shared state); the main thread joins it before anything else.
        self._ranker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ranker",
                                          initializer=set_kernel_threads,
                                          initargs=(settings.ranker_threads,))
        # Batches polled and decoded ahead, oldest first (see _prefetch_during).
        self._prefetched: collections.deque[Fetched] = collections.deque()
        # The transaction of the last batch the engines absorbed, while it may still run.
        self._uncommitted: Future[None] | None = None
        # The refresh after the last batch, while it may still run (see process).
        self._refreshing: Future[dict[str, Any]] | None = None
        self._lagging = False  # after the last batch a full one was waiting: catching up
        # The engines absorbed batches since their last refresh: the pending reports
        # do not cover them, so nothing may be published before the next refresh.
        self._unrefreshed = False
        # (graph version, P offsets fields) as of the last transaction that committed
        self._committed: tuple[int, dict[str, int]] = (0, {})
        self._regain_mutex = threading.Lock()

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
        tune_garbage_collector()
        tune_gil_switching()
        self.stats.load_seconds = self.mirror.load_seconds
        self._committed = (self.mirror.counters.version, self.mirror.offsets_fields())
        self.publisher.reset()
        for algorithm, values in self.mirror.published.items():
            self.publisher.adopt(algorithm, values)
            seed = functools.partial(self.publisher.seed_back_buffer, algorithm)
            with redis_errors("copying the scores into the back buffer"):
                self._retry("seeding the back buffer", seed)
        self.mirror.published = {}
        self.publications.publish_now(self.mirror, self.mirror.start_reports)
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
        return self._would_be_caught_up({})

    def shutdown(self) -> None:
        self._ranker.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        self.publications.close()
        if self._holding:
            self._set_state("stopped", force=True)
        self.status.close()
        if self.source is not None:
            self.source.close(self.mirror.offsets if self.mirror is not None else None)
        if self.dlq is not None:
            self.dlq.close()
        self.lock.release()
        self.redis.close()

    # -- one batch ------------------------------------------------------------------
    def fetch(self, timeout_ms: int | None = None) -> Fetched | None:
        """Poll one batch and decode it (no shared state: runs while Redis writes).

        ``timeout_ms``: how long the poll may wait for records (default: the
        ``poll_timeout_ms`` setting).
        """
        from producer.schema import decode_event

        wait_ms = self.settings.poll_timeout_ms if timeout_ms is None else timeout_ms
        try:
            records = self._source().poll(self.settings.batch_max_events, wait_ms)
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
        keeps every write in order: while batch N's graph transaction runs, the
        engines absorb N and batch N+1 is polled and decoded; while a publication
        runs, the next batches are processed. Returns the number of messages handled.
        """
        batch = self._prefetched.popleft() if self._prefetched else None
        try:
            if batch is None:
                batch = self.fetch()
            if batch is None:
                # Idle: publish what is pending now (without waiting for it).
                self._collect_refresh()
                self._settle_commit()
                self._refresh_absorbed()
                self._maybe_publish(force=True)
                if self.publications.idle:
                    self.refresh_if_stale()
                self._heartbeat()
                return 0
            self.process(batch)
        except MirrorStale:
            self._rebuild()
        return len(batch.records) if batch is not None else 0

    def process(self, batch: Fetched) -> None:
        """Dead letters, commit, apply and publish one decoded batch.

        The batch's transaction and the engines' refresh after it are left running
        when this returns: the next batch is planned meanwhile, and the next call
        collects the refresh (:meth:`_collect_refresh`, publishing if due) and waits
        for the transaction (:meth:`_settle_commit`) before it submits its own, so the
        mirror is at most two batches ahead of Redis. A publication prepared meanwhile
        waits for the transaction before it writes anything
        (:mod:`consumer.publishing`), so it still only covers batches whose
        transaction committed, and it covers only the ids the engines absorbed
        (:attr:`Mirror.absorbed_live`), not those the planned batch interned.
        """
        started = time.perf_counter()
        mirror = self._mirror()
        # Planning only reads the graph (and interns new URLs), so it runs while the
        # engines still refresh after the previous batch.
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
        # The previous batch's refresh: its reports, and a publication if one is due,
        # before the engines take this batch (decoding ahead while it runs).
        if self._refreshing is not None:
            self._prefetch_during(self._refreshing, batch)
        self._collect_refresh()
        self._maybe_publish()
        t_refreshed = time.perf_counter()
        # The previous batch's transaction ran while this one was planned.
        self._settle_commit()
        t_commit = time.perf_counter()
        commit = self._writer.submit(self._commit, planned)
        # The engines absorb the batch while its transaction is in flight (Redis and
        # this process work in parallel); scores are published only once it committed.
        full = self._catching_up(batch)
        refresh = self._refresh_due(full, last=self._drain_comes_first(batch.next_offsets))
        absorbing = self._ranker.submit(mirror.absorb_planned, planned)
        refreshing = (self._ranker.submit(mirror.ranks.refresh,
                                          tolerance=self._batch_tolerance(),
                                          max_sweeps=self._batch_sweeps())
                      if refresh else None)
        self._uncommitted = commit
        self._refreshing = refreshing
        self._unrefreshed = not refresh
        self._lagging = full
        try:
            self._prefetch_during(absorbing, batch)
        finally:
            t_fetch = time.perf_counter()
            absorbing.result()  # never leave the graph changing unjoined
        t_rank = time.perf_counter()
        self._source().commit_for_monitoring(batch.next_offsets)
        done = time.perf_counter()
        self.stats.record_batch(len(batch.records), planned.write.link_changes, done - started)
        log.info("batch", extra={"fields": {
            "messages": len(batch.records), "dead_letters": len(batch.letters),
            "link_changes": planned.write.link_changes, "version": mirror.counters.version,
            "refreshed": refresh,
            "plan_s": round(t_plan - started, 4), "dlq_s": round(t_sent - t_plan, 4),
            "refresh_wait_s": round(t_refreshed - t_sent, 4),
            "wait_commit_s": round(t_commit - t_refreshed, 4),
            "prefetch_s": round(t_fetch - t_commit, 4), "rank_s": round(t_rank - t_fetch, 4),
            "publish_s": round(done - t_rank, 4)}})
        self._heartbeat()

    def _collect_refresh(self) -> None:
        """Wait for the refresh still running after the last batch; its reports become
        pending (published by the next :meth:`_maybe_publish` that is due).

        Anything that reads the engines or changes the graph calls this first: the
        refresh runs on the ranker thread while the main thread plans the next batch.
        """
        refreshing, self._refreshing = self._refreshing, None
        if refreshing is None:
            return
        reports = refreshing.result()
        self.publications.pending.update(reports)
        log.info("refreshed", extra={"fields": {
            "version": self._mirror().counters.version,
            "moved": {a: int(r.moved_ids.size) for a, r in reports.items()},
            "modes": {a: str(r.mode) for a, r in reports.items()},
            "refresh_s": {a: round(float(r.seconds), 4) for a, r in reports.items()},
            "relative_bound": {a: float(f"{r.relative_bound:.3g}") for a, r in reports.items()}}})

    def _catching_up(self, batch: Fetched) -> bool:
        """Is a full batch still waiting after ``batch``? (:func:`consumer.stats.catching_up`)

        Counting only full batches as catching up let the short batch of a fetch-buffer
        boundary (one in fifteen on the 1M-page stream) refresh and publish at once,
        without the catching-up pace: there, publications that each rewrote most of a
        growing ZSET ran back to back, 53 s of the first 74 s of Redis time.
        """
        return catching_up(len(batch.records), self.settings.batch_max_events,
                           self._source().highwaters(), self._positions_after(batch.next_offsets))

    def _prefetch_during(self, ranking: Future[Any], current: Fetched) -> None:
        """Poll and decode the next batch, and more while the engines still work.

        Decoding is the main thread's largest cost and needs no shared state, so a
        long refresh (about a second on a 1.4M-page graph) is used to decode up to
        :data:`MAX_PREFETCH_BATCHES` batches ahead. With no batch in hand the poll
        waits up to ``poll_timeout_ms`` as usual; the extra polls wait at most
        :data:`EXTRA_POLL_MS` each and stop as soon as the engines are done. No poll
        follows a batch that reaches the caught-up targets or a stop request, and
        none follows one that was not full, ``current`` included: once caught up, a
        batch polled now would hold only what arrived so far and then wait for this
        whole refresh before the engines take it. Polled by the next step instead,
        right after the engines took this batch, it holds everything that arrived
        meanwhile and is still planned while the engines refresh (1M-page stream,
        latency phase: p50/p99 2.00/2.72 s -> 1.67/2.29 s).
        """
        latest = self._prefetched[-1] if self._prefetched else current
        while (len(self._prefetched) < MAX_PREFETCH_BATCHES
               and not self._would_be_caught_up(latest.next_offsets)
               and not self.stop_event.is_set()):
            in_hand = bool(self._prefetched)
            if (len(latest.records) < self.settings.batch_max_events
                    or (in_hand and ranking.done())):
                return
            fetched = self.fetch(timeout_ms=EXTRA_POLL_MS if in_hand else None)
            if fetched is None:
                if in_hand:
                    continue  # the client had nothing buffered yet; the engines still work
                return
            self._prefetched.append(fetched)
            latest = fetched

    def _settle_commit(self) -> None:
        """Wait for the graph transaction in flight, if any (raises what it raised)."""
        commit, self._uncommitted = self._uncommitted, None
        if commit is not None:
            commit.result()

    def _refresh_due(self, full: bool, *, last: bool = False) -> bool:
        """Refresh the engines after this batch, or only absorb it?

        While catching up (``full``: a full batch is waiting, see
        :meth:`_catching_up`) scores are published only
        every few batches (see :meth:`_maybe_publish`), and a refresh nobody publishes
        is wasted: one refresh after several batches costs about as much as one after
        a single batch (on 1.4M pages, 12 batches of 50k links: 0.68 s per batch
        refreshing each, 0.28 s refreshing every fourth). So such a batch is only
        absorbed unless a publication could start after it; anything else (caught
        up, stopping) is refreshed, and an idle consumer refreshes what is left.

        ``last``: :meth:`drain` follows before a publication started now could end
        (:meth:`_drain_comes_first`). The batch is only absorbed: a publication of it
        would rewrite a buffer that the drain's rewrites again, and delay the drain's
        by its whole length.
        """
        if last:
            return False
        if not full or self.stop_event.is_set():
            return True
        return self.publications.due(lagging=True)

    def _refresh(self, *, tolerance: float | None = None, max_sweeps: float | None = None
                 ) -> None:
        """Refresh the engines here and now; their reports become pending."""
        self._collect_refresh()
        self.publications.pending.update(self._mirror().ranks.refresh(tolerance=tolerance,
                                                                      max_sweeps=max_sweeps))
        self._unrefreshed = False

    def _refresh_absorbed(self) -> None:
        """Refresh the engines if batches were absorbed since their last refresh."""
        if self._unrefreshed:
            self._refresh(tolerance=self._batch_tolerance(), max_sweeps=self._batch_sweeps())

    def _batch_sweeps(self) -> float | None:
        """The work cap of the refresh after a batch (see Settings.batch_max_sweeps)."""
        return self.settings.batch_max_sweeps or None

    def _batch_tolerance(self) -> float | None:
        """The engines' refresh target for the next batch (None: the tolerance)."""
        lag = self.publications.lag
        if lag <= 0.0 or not self.publications.capped:
            return None
        target = min(CATCHUP_SHARE * lag, CATCHUP_MAX_TOLERANCE)
        return target if target > self.settings.tolerance else None

    def _positions_after(self, next_offsets: dict[int, int]) -> dict[int, int]:
        """Next offset per partition once a batch ending at ``next_offsets`` is applied."""
        return {**self._mirror().offsets, **next_offsets}

    def _would_be_caught_up(self, next_offsets: dict[int, int]) -> bool:
        if self._targets is None:
            return False
        positions = self._positions_after(next_offsets)
        return all(positions.get(p, 0) >= end for p, end in self._targets.items() if end > 0)

    def _drain_comes_first(self, next_offsets: dict[int, int]) -> bool:
        """``--until-caught-up``: after a batch ending at ``next_offsets``, is the rest of
        the backlog consumed, and :meth:`drain` reached, before a publication as long
        as the last one could end?

        Counted at the recent pace of this consumer. On the 1M-page stream a full
        publication that started two batches before the end (11.4 s, 2.8M members)
        was still running when the drain began, and the drain's own full rewrite
        (8.4 s) waited for it: 20 s of a 119 s run.
        """
        if self._targets is None:
            return False
        if self._would_be_caught_up(next_offsets):
            return True
        left_s = seconds_to_catch_up(self._targets, self._positions_after(next_offsets),
                                     self.stats.events_meter.rate())
        return left_s < self.publications.last_seconds

    def drain(self) -> None:
        """Publish everything pending and wait for it (called before a clean exit)."""
        self._settle_commit()
        # The last publication goes out whole and fresh: refreshed to the tolerance
        # without the batch sweep cap (cheap when the engines already are fresh).
        self._refresh()
        self.publications.capped = False
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
        self._refresh()
        self._maybe_publish(force=True)  # does not wait; stats.fresh updates when it lands
        return True

    def _maybe_publish(self, *, force: bool = False) -> None:
        """Start a publication if one is due (see :mod:`consumer.publishing`); never
        while the engines hold batches their pending reports do not cover."""
        self.publications.start(self._mirror(), lagging=self._lagging, force=force,
                                blocked=self._unrefreshed or self._refreshing is not None,
                                after=self._uncommitted)

    def _flush_publications(self) -> None:
        self.publications.flush(self._mirror(), after=self._uncommitted)

    def _commit(self, planned: PlannedBatch) -> None:
        bulk = self.options.bulk_writes
        self._fenced("committing the graph", lambda: commit_graph(
            self.redis, self.keys, planned.write, fence=self.lock, bulk=bulk))
        # Runs on the single writer thread, in batch order.
        self._committed = (planned.write.counters.version,
                           {**self._committed[1], **planned.write.offsets})

    def _fenced(self, what: str, action: Callable[[], T]) -> T:
        """Run a fenced Redis write with retries; on a lease change continue or rebuild."""
        while True:
            try:
                return self._retry(what, action)
            except (LockLost, redis.WatchError):
                self._regain_lease()

    def _regain_lease(self) -> None:
        """The lease changed under a transaction: continue, rebuild or stop.

        The graph writer and the publisher may both get here after one freeze; they
        go one at a time, so the second finds the lease ours again and both compare
        Redis with the same committed state.
        """
        with self._regain_mutex:
            self._regain_lease_locked()

    def _regain_lease_locked(self) -> None:
        if self._retry("checking the lease", self.lock.still_ours):
            return  # the WATCH tripped for another reason (e.g. our key expired and came back)
        if not self._retry("taking the lease again", self.lock.reacquire):
            raise LockHeld(f"another consumer took {self.keys.lock} while this one was "
                           "stalled; stopping")
        with redis_errors("checking for foreign writes"):
            stored_version = self.redis.hget(self.keys.graph, "version")
            stored_offsets = self.redis.hgetall(self.keys.offsets)
        # Compared with the last transaction that committed (the mirror may already
        # hold the batch whose transaction was refused).
        version, offsets = self._committed
        ours = {k: str(v) for k, v in offsets.items()}
        raw: dict[bytes, bytes] = dict(stored_offsets)  # type: ignore[arg-type]
        stored = {k.decode(): v.decode() for k, v in raw.items()
                  if k.decode().rpartition(":")[0] == self.settings.topic}
        if int(stored_version or 0) == version and stored == ours:
            log.warning("lease re-taken; nobody wrote meanwhile, continuing")
            return
        log.warning("lease re-taken after a foreign write; rebuilding the mirror")
        raise MirrorStale()

    def _rebuild(self) -> None:
        with contextlib.suppress(Exception):  # whatever was in flight is void now
            self._collect_refresh()
        with contextlib.suppress(Exception):
            self._settle_commit()
        with contextlib.suppress(Exception):
            self.publications.wait()
        self.publications.reset()  # the rebuilt mirror republishes every page
        self._unrefreshed = False
        self._prefetched.clear()
        old = self._mirror()
        warm = {alg: old.ranks.scores(alg) for alg in old.start_reports}
        self.mirror = self._retry("rebuilding the mirror",
                                  lambda: Mirror.load(self.redis, self.keys, self.settings,
                                                      warm=warm))
        self._committed = (self.mirror.counters.version, self.mirror.offsets_fields())
        tune_garbage_collector()
        self.publications.publish_now(self.mirror, self.mirror.start_reports)
        self._retry("seeking", lambda: self._source().seek(self._mirror().offsets))

    # -- status ---------------------------------------------------------------------
    def _set_state(self, state: str, *, force: bool = False) -> None:
        if self.stats.state != state:
            self.stats.state = state
            self._heartbeat(force=True)
        elif force:
            self._heartbeat(force=True)

    def _heartbeat(self, *, force: bool = False) -> None:
        """Write ``P status`` if due (see :mod:`consumer.status_writer`); only while
        we hold the lease."""
        if self._holding:
            self.status.heartbeat(self._status_fields, force=force)

    def _status_fields(self) -> dict[str, str]:
        mirror = self.mirror
        if self.source is not None and mirror is not None:
            self.stats.lag = lag_by_partition(self.source.highwaters(), mirror.offsets)
        counters = mirror.counters if mirror is not None else None
        return self.stats.status_fields(
            topic=self.settings.topic,
            version=counters.version if counters else 0,
            stale_ignored=counters.stale_ignored if counters else 0,
            dlq_total=counters.dlq if counters else 0)


def run_consumer(settings: Settings, options: ConsumeOptions | None = None, *,
                 handle_signals: bool = True) -> int:
    """Build and run a consumer; errors are RankstreamError subclasses."""
    service = ConsumerService(settings, options)
    if handle_signals:
        service.install_signal_handlers()
    return service.run()
