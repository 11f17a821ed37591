"""When the consumer publishes scores: coalesced, paced, on a thread of their own.

:class:`consumer.score_publisher.ScorePublisher` knows *what* a publication writes;
this module decides *when*. A publication carries the engines' current ``y``, so
batches applied while one is being written are covered by the next one
(coalescing). It is written in small transactions that graph transactions
interleave with, so it never stalls the graph; but on a growing graph it rewrites
most of the ZSET, which costs Redis CPU that the graph needs too. So while the
consumer catches up (a full batch or more waiting) the gap after a publication is
at least :data:`LAGGING_PUBLISH_GAP` times as long as the publication took; once
caught up it is ``min_interval_s``, so scores follow events closely. A publication never
writes before the graph transaction of the last batch it covers has committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from consumer.lock import ConsumerLock
from consumer.publication import Publication
from consumer.score_publisher import ScorePublisher
from consumer.score_swap import BACK_TTL_MS
from consumer.stats import ConsumerStats, iso_now

log = logging.getLogger("rankstream.consumer")

# While catching up, publications take a quarter of the time, not half: during an
# initial crawl every publication adds all new pages to both score buffers, and in
# the 100k-event bench that made ZADD Redis' largest cost (2.7 s against 1.9 s for
# the graph transactions). Measured there, alternating: a pause of 3x the last
# publication gave 119k/121k link changes/s (Redis CPU 5.2 s), 1x gave 87k/98k (7.1 s).
# A backlog delays scores anyway; getting through it sooner is what freshens them.
LAGGING_PUBLISH_GAP = 3.0

Fenced = Callable[[str, Callable[[], bool]], bool]


@dataclass(frozen=True)
class ScoresAsOf:
    """The engines' scores as of one refresh, copied (what a publication reads of them)."""

    graph: Any
    y: dict[str, np.ndarray]

    def scores(self, algorithm: str) -> np.ndarray:
        return self.y[algorithm]


@dataclass(frozen=True)
class Taken:
    """A due publication's inputs, taken before the engines go on (:meth:`Publications.take`)."""

    ranks: Any  # the engines (consumer.mirror.Mirror.ranks) or a ScoresAsOf copy
    reports: dict[str, Any]
    version: int
    offsets: dict[str, int]
    live: np.ndarray  # the absorbed ids' live flags (a new array after every absorb)


class Publications:
    """The consumer's score publications: pending reports, the one in flight, pacing.

    Args:
        publisher: builds and writes publications.
        stats: updated when a publication lands (bound, fresh, refresh time).
        fenced: runs a fenced Redis write with the consumer's retries and lease
            recovery (:meth:`consumer.recovery.Recovery.fenced`).
        lock: the consumer's lease, which every swap is fenced with.
        min_interval_s: the gap after a publication once caught up.
    """

    def __init__(self, publisher: ScorePublisher, stats: ConsumerStats, fenced: Fenced,
                 lock: ConsumerLock, *, min_interval_s: float) -> None:
        self.publisher = publisher
        self.stats = stats
        self._fenced = fenced
        self._lock = lock
        self.min_interval_s = min_interval_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="score-writer")
        self._in_flight: Future[bool] | None = None
        # Latest engine report per algorithm not yet published.
        self.pending: dict[str, Any] = {}
        self._last_sent: dict[str, Any] = {}
        self._last_end = float("-inf")  # never: monotonic time may be near 0 after boot
        self._last_seconds = 0.0
        # A consumer on its way out writes its last publication whole: it clears this.
        self.capped = True
        self.lag = 0.0  # relative L1 distance of the last publication from y
        self.count = 0  # publications built so far
        self._buffers_due = time.monotonic() + BACK_TTL_MS / 3000.0

    @property
    def last_seconds(self) -> float:
        """How long the last publication took to write (0 before the first)."""
        return self._last_seconds

    @property
    def idle(self) -> bool:
        """No publication started and not yet waited for."""
        return self._in_flight is None

    def renew_buffers(self) -> None:
        """Renew the back buffers' expiry every third of it while no publication runs
        (an idle consumer writes nothing into them: :meth:`ScorePublisher.renew_back_buffers`)."""
        now = time.monotonic()
        if now >= self._buffers_due and not self._busy():
            self.publisher.renew_back_buffers()
            self._buffers_due = now + BACK_TTL_MS / 3000.0  # still due if that failed

    def _busy(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()

    def gap(self, *, lagging: bool) -> float:
        """The least time between the end of a publication and the next one."""
        if lagging:
            return max(self.min_interval_s, LAGGING_PUBLISH_GAP * self._last_seconds)
        return self.min_interval_s

    def due(self, *, lagging: bool) -> bool:
        """Could a publication start now?"""
        return not self._busy() and time.monotonic() - self._last_end >= self.gap(
            lagging=lagging)

    def wait(self) -> None:
        """Wait for the publication in flight, if any (raises what it raised)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None and not in_flight.result():
            # The swap was refused (score keys not as recorded): the publisher has
            # reset itself; publish again (a full replacement), with newer reports.
            self.pending = {**self._last_sent, **self.pending}

    def start(self, mirror: Any, *, lagging: bool, force: bool = False,
              blocked: bool = False, after: Future[None] | None = None) -> None:
        """Start a publication of ``mirror``'s current scores unless one is in flight,
        nothing is pending, it is ``blocked`` (the engines absorbed batches the
        pending reports do not cover) or, unless ``force``, the gap has not passed.

        ``after``: the graph transaction of the last batch it covers, if it may still
        be running.
        """
        taken = self.take(mirror, lagging=lagging, force=force, blocked=blocked, copy=False)
        if taken is not None:
            self.start_taken(taken, after=after)

    def take(self, mirror: Any, *, lagging: bool, force: bool = False, blocked: bool = False,
             copy: bool = True) -> Taken | None:
        """The first half of :meth:`start`: if a publication is due, take the pending
        reports and what the publication reads of ``mirror`` (``copy``: the scores
        copied), so the engines may take the next batch before :meth:`start_taken`
        builds it. Building one (~65 ms on 1.4M pages) then overlaps the engines'
        absorb instead of holding them idle.
        """
        if self._in_flight is not None:
            if not self._in_flight.done():
                return None
            self.wait()  # surfaces its error, if any
        if not self.pending or blocked:
            return None
        if not force and time.monotonic() - self._last_end < self.gap(lagging=lagging):
            return None
        reports, self.pending = self.pending, {}
        ranks = mirror.ranks
        if copy:
            ranks = ScoresAsOf(ranks.graph, {a: np.array(ranks.scores(a)) for a in reports})
        return Taken(ranks, reports, mirror.counters.version, mirror.offsets_fields(),
                     mirror.absorbed_live)

    def start_taken(self, taken: Taken, *, after: Future[None] | None = None) -> None:
        """Build the publication :meth:`take` took and start writing it."""
        reports = taken.reports
        prepare_started = time.perf_counter()
        publication = self.publisher.prepare(taken.ranks, reports, version=taken.version,
                                             offsets=taken.offsets, capped=self.capped,
                                             live=taken.live)
        self._last_sent = reports
        self.count += 1
        self.lag = max(((item.bound - float(reports[item.algorithm].bound)) / item.total
                        for item in publication.summary if item.total > 0), default=0.0)
        prepare_s = time.perf_counter() - prepare_started
        self._in_flight = self._executor.submit(self._send, publication, after, prepare_s)

    def flush(self, mirror: Any, *, after: Future[None] | None = None) -> None:
        """Wait for the publication in flight, then publish what is pending and wait."""
        self.wait()
        for _ in range(3):  # again only if a swap was refused (keys deleted behind us)
            self.start(mirror, lagging=False, force=True, after=after)
            self.wait()
            if not self.pending:
                return
        # Not silently: the scores in Redis are then older than the graph.
        log.error("publication not completed: its swap was refused three times (score "
                  "keys keep changing behind us)",
                  extra={"fields": {"algorithms": sorted(self.pending)}})

    def publish_now(self, mirror: Any, reports: dict[str, Any]) -> None:
        """Publish ``reports`` (and anything pending) now, synchronously."""
        self.wait()
        self.pending.update(reports)
        self.flush(mirror)

    def reset(self) -> None:
        """Forget what is pending and what the ZSETs hold (the mirror is rebuilt)."""
        self.pending = {}
        self.publisher.reset()

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _send(self, publication: Publication, after: Future[None] | None,
              prepare_s: float) -> bool:
        """Write one publication, fenced; repeated whole after an error (idempotent).

        Nothing is written before ``after`` (a graph transaction) committed.
        ``prepare_s``: how long building it took (logged).
        """
        if after is not None:
            after.result()
        started = time.perf_counter()
        publisher, lock = self.publisher, self._lock
        swapped = self._fenced("publishing scores",
                               lambda: publisher.send(publication, fence=lock))
        elapsed = time.perf_counter() - started
        self._last_seconds = elapsed
        self._last_end = time.monotonic()
        if not swapped:
            log.warning("score keys changed behind our back; publishing a full replacement")
            return False
        self.stats.last_refresh_at = iso_now()
        self.stats.last_refresh_seconds = elapsed
        for item in publication.summary:
            self.stats.bound[item.algorithm] = item.bound
            self.stats.fresh[item.algorithm] = item.fresh
        log.info("published", extra={"fields": {
            "seconds": round(elapsed, 4), "prepare_s": round(prepare_s, 4),
            "chunks": len(publication.chunks),
            "members": publication.members,
            "written": {i.algorithm: i.written for i in publication.summary},
            "unwritten": {i.algorithm: i.unwritten for i in publication.summary},
            "fresh": {i.algorithm: i.fresh for i in publication.summary}}})
        return True
