"""`rankstream consume`: the loop from Kafka to the Redis graph and live scores.

One iteration: poll a batch -> validate (invalid -> dead-letter topic, confirmed)
-> interpret into one net edge batch -> ONE fenced MULTI/EXEC with the graph changes
and the next offsets -> apply to the engines -> publish scores and meta once that EXEC
succeeded (:mod:`consumer.score_publisher`) -> heartbeat. Kafka's group gets the offsets
too once the EXEC settled, for lag tools only (:meth:`.GraphCommits.settle`).

Concurrency: the graph transaction runs on a writer thread
(:mod:`consumer.graph_commits`) while a ranker thread applies the same batch to the
engines (compiled kernels, GIL released) and, while catching up, the main thread
polls and decodes the next one. The ranker thread then refreshes the engines while
the main thread decodes (catching up: up to four batches ahead) and plans the next
one before that transaction and that refresh have finished: planning only reads the
graph and interns, and a refresh keeps to the pages that existed when it started
(:class:`ranker.refresh.Refresh`). The refresh is collected, and a publication
started if due, before the engines take the next batch; publications run on a second
writer thread (:mod:`consumer.publishing`) and are coalesced (batches that finish
while one is being written join the next). A publication only ever covers batches
whose transaction committed. While catching up, batches are only absorbed by the
engines until a publication can start, and one refresh then covers them
(:meth:`consumer.pacing.Pacing.refresh_due`); the refresh after a batch is capped at
``batch_max_sweeps`` sweeps' worth of work, idle and final refreshes are not. Once
caught up, the next poll waits until shortly before the refresh should end
(:meth:`consumer.pacing.Pacing.poll_delay`): each batch then holds what arrived
until the engines can take it. Status heartbeats have a thread.

Failure handling (retries with backoff, lease recovery): :mod:`consumer.recovery`.
Stopping (SIGTERM/SIGINT finish and publish the current batch, then exit 0):
:mod:`consumer.stopping`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from consumer.cpython_tuning import tune_garbage_collector, tune_gil_switching
from consumer.dead_letters import DeadLetterSender
from consumer.graph_commits import GraphCommits
from consumer.jsonlog import safe_address
from consumer.kafka_source import KafkaSource
from consumer.keys import Keys
from consumer.lock import ConsumerLock
from consumer.mirror import Mirror
from consumer.options import ConsumeOptions
from consumer.pacing import Pacing
from consumer.prefetch import Fetched, Prefetcher
from consumer.publishing import Publications
from consumer.recovery import Backoff, MirrorStale, Recovery, run_every, settle_void
from consumer.redis_store import (
    check_layout,
    check_redis_fits,
    connect_redis,
    topic_offsets,
)
from consumer.refreshes import Refreshes
from consumer.score_publisher import ScorePublisher
from consumer.snapshot import leave_snapshot, snapshot_path
from consumer.stats import ConsumerStats, catching_up, lag_by_partition
from consumer.status_writer import StatusWriter
from consumer.stopping import CAUGHT_UP, StopRequests
from ranker import set_kernel_threads
from rankstream.services.stack import ensure_settings_topics
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer")

MAX_IDLE_REFRESHES = 5  # extra refreshes before a --until-caught-up exit


class ConsumerService:
    """One consumer process; :meth:`run` returns the exit code."""

    def __init__(self, settings: Settings, options: ConsumeOptions | None = None) -> None:
        from producer.schema import Limits

        self.settings = settings
        self.options = options or ConsumeOptions()
        self.keys = Keys(settings.key_prefix)
        self.limits = Limits.from_settings(settings)
        self.stats = ConsumerStats()
        self.redis = connect_redis(settings, client_name="rankstream-consumer")
        self.lock = ConsumerLock(self.redis, self.keys.lock, ttl_ms=self.options.lock_ttl_ms)
        backoff = Backoff(self.options.backoff_initial_s, self.options.backoff_max_s)
        self.recovery = Recovery(self.redis, self.lock, self.keys, settings.topic, self.stats,
                                 backoff, stop_grace_s=self.options.stop_grace_s,
                                 set_state=self._set_state)
        self.stops = StopRequests(self.recovery)
        self.publisher = ScorePublisher(self.redis, self.keys, damping=settings.damping,
                                        tolerance=settings.tolerance,
                                        publish_threshold=settings.publish_threshold,
                                        owner=self.lock.holder.token[:12],
                                        scripts=self.options.bulk_writes,
                                        max_updates=settings.publish_max_updates or None)
        # Publications run on a thread of their own and are coalesced (see process).
        self.publications = Publications(
            self.publisher, self.stats, self.recovery.fenced, self.lock,
            min_interval_s=self.options.min_publish_interval_s)
        self.pacing = Pacing(self.publications, self.stats, tolerance=settings.tolerance,
                             batch_max_sweeps=settings.batch_max_sweeps,
                             stop_event=self.stops.event)
        self.mirror: Mirror | None = None
        self.snapshot = snapshot_path(settings)  # left by a clean stop, read at start
        self.source: KafkaSource | None = None
        self.dlq: DeadLetterSender | None = None
        self._holding = False  # status is written only while we hold the lease
        # The thread that runs the loop, the only one that may call the Kafka consumer
        # (kafka-python's is not thread-safe): status written from the writer threads
        # (a retry's "waiting") shows the lag as last measured there.
        self._loop_thread = threading.get_ident()
        self._lock_tried = False
        self.commits = GraphCommits(self.redis, self.keys, self.lock, self.recovery,
                                    self.stats, bulk=self.options.bulk_writes)
        self.status = StatusWriter(self.redis, self.keys.status, self.lock,
                                   interval_s=self.options.status_interval_s)
        # The engines' kernels release the GIL, so a batch is ranked on this thread
        # while the main thread polls and decodes the next one (which touches no
        # shared state); the main thread joins it before anything else.
        self._ranker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ranker",
                                          initializer=set_kernel_threads,
                                          initargs=(settings.ranker_threads,))
        self.batches = Prefetcher(self._source, self.limits,
                                  batch_max_events=settings.batch_max_events,
                                  poll_timeout_ms=settings.poll_timeout_ms, backoff=backoff,
                                  stop_event=self.stops.event)
        # The refresh after the last batch, while it may still run (see process).
        self.refreshes = Refreshes(self._ranker, self.pacing, self.publications,
                                   self._mirror)
        self._lagging = False  # a full batch waited beyond the last one: catching up

    def start(self) -> None:
        """Lease, topics, mirror, Kafka position: everything before the first poll."""
        settings, retry = self.settings, self.recovery.retry
        # --max-seconds bounds the wait for Redis too (it waited 60 s past a 5 s limit).
        wait = min(self.options.startup_wait_s, self.options.max_seconds or math.inf)
        self.recovery.wait_for_redis(wait, self.stops.event)
        retry("checking the Redis server", lambda: check_redis_fits(self.redis))
        # Before the lease, so a refused start writes nothing (Mirror.load checks again,
        # for the rebuilds after a recovery).
        retry("checking the key layout", lambda: check_layout(self.redis, self.keys))
        self._lock_tried = True  # released even if the reply of a SET that took it was lost
        # Retried like the rest: a full Redis refusing the SET (out of memory) was an
        # exit at start where a running consumer waits (LockHeld is not retried).
        retry("taking the lease", self.lock.acquire)
        self._holding = True
        self.lock.start_renewal()
        # P status is ours now: until this, it showed the last holder's last word (a
        # probe took a crashed predecessor's "running" for this process, a review).
        self._set_state("starting", force=True)
        log.info("consumer starting", extra={"fields": {
            "redis": safe_address(settings.redis_url), "kafka": settings.kafka_bootstrap,
            "topic": settings.topic, "prefix": settings.key_prefix, "pid": self.stats.pid}})
        retry("creating topics", lambda: ensure_settings_topics(settings))
        self.mirror = retry("loading the mirror", lambda: Mirror.load(
            self.redis, self.keys, settings, snapshot=self.snapshot))
        tune_garbage_collector()
        tune_gil_switching()
        self.stats.load_seconds = self.mirror.load_seconds
        self.recovery.committed = (self.mirror.counters, self.mirror.offsets_fields())
        published = self.mirror.published
        retry("adopting the published scores", lambda: self.publisher.adopt_live(published))
        self.mirror.published = {}
        self.publications.publish_now(self.mirror, self.mirror.start_reports)
        self.source = retry("connecting to kafka", lambda: KafkaSource(settings))
        self.dlq = retry("connecting the dlq producer", lambda: DeadLetterSender(settings))
        partitions = retry("assigning partitions",
                           lambda: self._source().assign(self._mirror().offsets))
        if self.options.until_caught_up:
            self.pacing.targets = retry("reading end offsets", self._source().end_offsets)
        log.info("consuming", extra={"fields": {"partitions": partitions,
                                                "offsets": self._mirror().offsets,
                                                "targets": self.pacing.targets}})
        self._set_state("running")

    def _mirror(self) -> Mirror:
        assert self.mirror is not None
        return self.mirror

    def _source(self) -> KafkaSource:
        assert self.source is not None
        return self.source

    def run(self) -> int:
        """Start, loop until stopped or caught up, shut down. Returns the exit code."""
        self._loop_thread = threading.get_ident()
        deadline = self.stops.deadline(self.options.max_seconds)
        failed = False
        try:
            self.start()
            while True:
                while not self.stops.event.is_set():
                    self.step()
                    if self.caught_up():
                        self.stops.request(CAUGHT_UP)
                try:
                    self.drain()
                except MirrorStale:  # as in step(): rebuild from Redis, then the last one
                    self._rebuild()
                    if self._resume_catching_up():
                        continue
                    self.drain()
                break
            leave_snapshot(self.redis, self.keys, self.snapshot, self.mirror, self.publisher)
        except BaseException:
            # The worker threads may be retrying through an outage: without a stop
            # request their retries never give up, and shutdown waited for them until
            # Redis came back, holding the lease (a review).
            failed = True
            self.stops.request("error")
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            self.shutdown(quiet=failed)
        log.info("consumer stopped", extra={"fields": {
            "reason": self.stops.reason, "events": self.stats.events,
            "batches": self.stats.batches}})
        return 0

    def shutdown(self, *, quiet: bool = False) -> None:
        """Every step runs, whatever an earlier one raised (a status write that failed
        once skipped the lease's release, the back buffers' and Kafka's close); the
        first error is raised at the end, unless ``quiet`` (one is on its way out
        already)."""
        def close_source() -> None:
            if self.source is not None:
                # For lag tools: only what committed to Redis (the mirror may hold a
                # batch whose transaction never did), and only while the lease is ours
                # (a fenced consumer's offsets are not the group's).
                ours = self.mirror is not None and not self.lock.lost.is_set()
                self.source.close(topic_offsets(self.recovery.committed[1],
                                                self.settings.topic) if ours else None)

        def stopped_state() -> None:
            if self._holding:
                self._set_state("stopped", force=True)

        def release_lock() -> None:
            if self._lock_tried:  # not while Redis was down at start (a misleading warning)
                self.lock.release()

        first = run_every({
            "ranker": lambda: self._ranker.shutdown(wait=True),
            "graph writer": self.commits.close,
            "publications": self.publications.close,
            "status": stopped_state,
            "status writer": self.status.close,
            "kafka": close_source,
            "dead letters": lambda: self.dlq.close() if self.dlq is not None else None,
            "back buffers": self._release_buffers,
            "lease": release_lock,
            "redis": self.redis.close,
        }, "shutdown step failed")
        if first is not None and not quiet:
            raise first

    def _release_buffers(self) -> None:
        # Best effort, quietly: they expire anyway (BACK_TTL_MS), and with Redis down
        # (at start, say) a warning would only add a misleading line.
        with contextlib.suppress(Exception):
            self.publisher.release()

    # -- one batch ------------------------------------------------------------------
    def step(self) -> int:
        """Process one batch (the one fetched during the previous step, or a new one).

        Redis work is overlapped with CPU work on a single writer thread, which
        keeps every write in order: while batch N's graph transaction runs, the
        engines absorb N and batch N+1 is polled and decoded; while a publication
        runs, the next batches are processed. Returns the number of messages handled.
        """
        batch = None
        try:
            polled = not self.batches.ahead  # a fresh poll, not a batch decoded ahead
            if polled and not self._lagging:
                self.pacing.wait_before_polling(self.refreshes.running)
            polled_at = time.perf_counter()
            batch = self.batches.next()
            if batch is None:
                # Idle: publish what is pending now (without waiting for it).
                self.refreshes.collect()
                self._settle_commit()
                if self.lock.lost.is_set():
                    # An idle consumer makes no fenced write that would notice another
                    # one took the lease: continue, rebuild or stop now, as one would.
                    # First: a graph another holder moved on is not a rollback to
                    # rebuild from while it writes, but a reason to stop.
                    self.recovery.regain_lease()
                self.recovery.check_graph_kept()
                self.refreshes.catch_up()
                self._maybe_publish(force=True)
                if self.publications.idle:
                    self.refreshes.idle_refresh(self.stats.fresh, self._publish_now)
                # Retried like every other write: a Redis outage while it was due
                # stopped an idle consumer (exit 2).
                self.recovery.retry("renewing the score back buffers",
                                    self.publications.renew_buffers)
                self._heartbeat()
                return 0
            self.process(batch, polled_at=polled_at if polled else None)
        except MirrorStale:
            self._rebuild()
        return len(batch.records) if batch is not None else 0

    def process(self, batch: Fetched, *, polled_at: float | None = None) -> None:
        """Dead letters, commit, apply and publish one decoded batch.

        ``polled_at``: when its poll began, if it was polled just now (the pacing of
        polls, :meth:`consumer.pacing.Pacing.poll_delay`, learns from it).

        The batch's transaction and the engines' refresh after it are left running
        when this returns: the next batch is planned meanwhile, and the next call
        collects the refresh (:meth:`Refreshes.collect`, publishing if due) and waits
        for the transaction (:meth:`_settle_commit`) before it submits its own, so the
        mirror is at most two batches ahead of Redis. A publication prepared meanwhile
        waits for the transaction before it writes anything
        (:mod:`consumer.publishing`), so it still only covers batches whose
        transaction committed, and it covers only the ids the engines absorbed
        (:attr:`Mirror.absorbed_live`), not those the planned batch interned.
        """
        started = time.perf_counter()
        mirror = self._mirror()
        self.refreshes.new_events()  # an idle refresh that stayed unfresh: try again
        # Planning only reads the graph (and interns new URLs), so it runs while the
        # engines still refresh after the previous batch.
        planned = mirror.plan(batch.events, batch.next_offsets, len(batch.records),
                              len(batch.letters))
        t_plan = time.perf_counter()
        if polled_at is not None:
            self.pacing.planned(t_plan - polled_at)
        if batch.letters:
            dlq = self.dlq
            assert dlq is not None
            letters = batch.letters
            self.recovery.retry("sending dead letters", lambda: dlq.send(letters))
        t_sent = time.perf_counter()
        # The previous batch's refresh: its reports, and a publication if one is due
        # (its scores copied before the engines take this batch). While catching up,
        # the next batches are decoded meanwhile.
        refreshes = self.refreshes
        if refreshes.running is not None and self._lagging:
            self.batches.decode_during(refreshes.running, batch, self.caught_up)
        refreshes.collect()
        publication = self.publications.take(mirror, lagging=self._lagging,
                                             blocked=refreshes.absorbed_since)
        t_refreshed = time.perf_counter()
        # The previous batch's transaction ran while this one was planned.
        self._settle_commit()
        t_commit = time.perf_counter()
        self.commits.submit(planned, next_offsets=batch.next_offsets,
                            messages=len(batch.records))
        # The engines absorb the batch while its transaction is in flight (Redis and
        # this process work in parallel); scores are published only once it committed.
        full = self._catching_up(batch)
        pacing = self.pacing
        refresh = pacing.refresh_due(
            full, last=pacing.drain_comes_first(self._positions_after(batch.next_offsets)))
        absorbing = self._ranker.submit(mirror.absorb_planned, planned)
        self._lagging = full
        refreshes.absorbed()
        refreshing = None
        try:
            if publication is not None:
                # Built while the engines absorb (the transaction it covers committed),
                # and before the refresh is queued: it sets the lag that refresh targets.
                self.publications.start_taken(publication)
            if refresh:
                refreshing = refreshes.start_batch_refresh()
            if full:  # once caught up, the next poll is timed to the engines instead
                self.batches.decode_during(absorbing, batch, self.caught_up)
        finally:
            t_fetch = time.perf_counter()
            absorbing.result()  # never leave the graph changing unjoined
        t_rank = time.perf_counter()
        if refreshing is not None:
            pacing.refresh_started(t_rank)  # the ranker thread went on to it
        self.stats.last_batch_seconds = t_rank - started
        log.info("batch", extra={"fields": {
            "messages": len(batch.records), "dead_letters": len(batch.letters),
            "link_changes": planned.write.link_changes, "version": mirror.counters.version,
            "refreshed": refresh,
            "plan_s": round(t_plan - started, 4), "dlq_s": round(t_sent - t_plan, 4),
            "refresh_wait_s": round(t_refreshed - t_sent, 4),
            "wait_commit_s": round(t_commit - t_refreshed, 4),
            "prefetch_s": round(t_fetch - t_commit, 4), "rank_s": round(t_rank - t_fetch, 4)}})
        self._heartbeat()

    def _catching_up(self, batch: Fetched) -> bool:
        """Does a full batch or more wait after ``batch``? (:func:`consumer.stats.catching_up`)

        Counted from the offsets, not from the batch's size: counting only full batches
        let the short batch of a fetch-buffer boundary (one in fifteen on the 1M-page
        stream) refresh and publish at once, without the catching-up pace: there,
        publications that each rewrote most of a growing ZSET ran back to back, 53 s of
        the first 74 s of Redis time.
        """
        return catching_up(self.settings.batch_max_events, self._source().highwaters(),
                           self._positions_after(batch.next_offsets))

    def _settle_commit(self) -> None:
        """Wait for the graph transaction in flight, if any (raises what it raised);
        only then is the Kafka source needed."""
        self.commits.settle(lambda offsets: self._source().commit_for_monitoring(offsets))

    def _positions_after(self, next_offsets: dict[int, int]) -> dict[int, int]:
        """Next offset per partition once a batch ending at ``next_offsets`` is applied."""
        return {**self._source().positions(self._mirror().offsets), **next_offsets}

    def caught_up(self, next_offsets: dict[int, int] | None = None) -> bool:
        """Have the batches applied so far (and one ending at ``next_offsets``, if
        given) reached the caught-up targets (``--until-caught-up``)?"""
        return self.pacing.caught_up(self._positions_after(next_offsets or {}))

    def drain(self) -> None:
        """Publish everything pending and wait for it (called before a clean exit)."""
        self._settle_commit()
        # The last publication goes out whole and fresh: refreshed to the tolerance
        # without the batch sweep cap (cheap when the engines already are fresh).
        self.refreshes.now()
        self.publications.capped = False
        self._flush_publications()
        if self.stops.reason == CAUGHT_UP:
            for _ in range(MAX_IDLE_REFRESHES):
                if not self.refreshes.refresh_if_stale(self.stats.fresh, self._publish_now):
                    break
                self._flush_publications()

    def _resume_catching_up(self) -> bool:
        """After a rebuild in the final drain: go on consuming if only catching up had
        stopped the loop and the rebuilt mirror is short of the targets again."""
        if not self.stops.withdraw_caught_up(lambda: not self.caught_up()):
            return False
        # The drain uncapped the publications; catching up publishes at its pace again.
        self.publications.capped = True
        return True

    def _maybe_publish(self, *, force: bool = False) -> None:
        """Start a publication if one is due (see :mod:`consumer.publishing`); never
        while the engines hold batches their pending reports do not cover."""
        self.publications.start(self._mirror(), lagging=self._lagging, force=force,
                                blocked=self.refreshes.blocking,
                                after=self.commits.in_flight)

    def _publish_now(self) -> None:
        self._maybe_publish(force=True)  # does not wait: stats.fresh updates when it lands

    def _flush_publications(self) -> None:
        self.publications.flush(self._mirror(), after=self.commits.in_flight)

    def _rebuild(self) -> None:
        settle_void({"refresh": self.refreshes.collect,
                     "graph transaction": self._settle_commit,
                     "publication": self.publications.wait})
        self.publications.reset()  # the rebuilt mirror republishes every page
        self.refreshes.forget_absorbed()
        self.batches.clear()
        old = self._mirror()
        warm = {alg: old.ranks.scores(alg) for alg in old.start_reports}
        self.mirror = self.recovery.retry(
            "rebuilding the mirror",
            lambda: Mirror.load(self.redis, self.keys, self.settings, warm=warm))
        self.recovery.committed = (self.mirror.counters, self.mirror.offsets_fields())
        self.recovery.resume()
        tune_garbage_collector()
        self.publications.publish_now(self.mirror, self.mirror.start_reports)
        self.recovery.retry("seeking", lambda: self._source().seek(self._mirror().offsets))

    def _set_state(self, state: str, *, force: bool = False) -> None:
        changed, self.stats.state = self.stats.state != state, state
        if changed or force:
            self._heartbeat(force=True)

    def _heartbeat(self, *, force: bool = False) -> None:
        """Write ``P status`` if due (see :mod:`consumer.status_writer`); only while
        we hold the lease."""
        if self._holding:
            self.status.heartbeat(self._status_fields, force=force)

    def _status_fields(self) -> dict[str, str]:
        mirror = self.mirror
        if (self.source is not None and mirror is not None
                and threading.get_ident() == self._loop_thread):
            self.stats.lag = lag_by_partition(self.source.highwaters(),
                                              self.source.positions(mirror.offsets))
        return self.stats.status_fields(topic=self.settings.topic,
                                        counters=mirror.counters if mirror else None)


def run_consumer(settings: Settings, options: ConsumeOptions | None = None, *,
                 handle_signals: bool = True) -> int:
    """Build and run a consumer; errors are RankstreamError subclasses."""
    service = ConsumerService(settings, options)
    if handle_signals:
        service.stops.install_signal_handlers()
    return service.run()
