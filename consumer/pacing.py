"""When the consumer refreshes its engines after a batch, and how far.

A refresh only pays when its scores can be published soon, and refining them far
beyond what the published scores show is work nobody sees yet. :class:`Pacing`
makes those calls for :class:`consumer.service.ConsumerService` from the state of
its publications (:mod:`consumer.publishing`), its pace and, with
``--until-caught-up``, the end offsets it has to reach.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from concurrent import futures
from concurrent.futures import Future
from typing import Any

from consumer.publishing import Publications
from consumer.stats import ConsumerStats, seconds_to_catch_up

__all__ = ["CATCHUP_MAX_TOLERANCE", "CATCHUP_SHARE", "POLL_MARGIN_S", "WARMUP_PUBLICATIONS",
           "WARMUP_TOLERANCE", "Pacing"]

# While a capped publication leaves the published scores lagging y by a relative L1
# distance L (see consumer.score_publisher), refining y per batch far below L is work
# nobody can see yet: the engines then refresh to CATCHUP_SHARE * L (never looser
# than CATCHUP_MAX_TOLERANCE, never tighter than the tolerance). Idle refreshes and
# the final publication always go back to the tolerance, so `fresh` means the same.
CATCHUP_SHARE = 0.1
CATCHUP_MAX_TOLERANCE = 1e-2
# Right after a start that lag is zero (the last consumer's final publication was
# whole) and it builds up only over several capped publications (to 1e-2 within 8-9
# of them, ~4 s, on the 1M-page stream). Meanwhile the engines refined to the
# tolerance, WPR spending its whole work cap (0.27-0.52 s per refresh against ~0.18 s
# later), and a fast stream's events piled up behind them: the first 5 s after a
# restart were the tail of the latency phase. So a consumer starts warming up: the
# target is WARMUP_TOLERANCE until the lag's own target reaches it, and for at most
# WARMUP_PUBLICATIONS publications after the first batch (a stream whose lag never
# builds up, whose publications stay whole, then gets the tolerance again; an idle
# consumer refreshes to the tolerance anyway). Alternating latency phases on one
# loaded 1M-page graph: p99 of the first 5 s 3.36 and 3.84 s without, 1.82 and
# 1.78 s with (docs/benchmark-history.md, pipeline session 10). Not ended by the
# first whole publication: the loose target itself makes the first refresh move few
# pages (8k in one run), so that publication was whole on the 1M-page stream too.
WARMUP_TOLERANCE = 1e-3
WARMUP_PUBLICATIONS = 16
# Once caught up, a batch polled while the engines still refresh the last one waits
# for that refresh, and so does every event in it. So the next poll is put off until
# the refresh is expected to end, less what polling, decoding and planning took last
# time and POLL_MARGIN_S to spare: the batch then also holds what arrived meanwhile,
# and the engines take it about as soon as they are free (see Pacing.poll_delay).
POLL_MARGIN_S = 0.03
# Weight of the newest measurement in the running estimates of both durations.
SMOOTHING = 0.3


class Pacing:
    """Refresh decisions of one consumer.

    Args:
        publications: the consumer's publications (due, lag, capped, last length).
        stats: its counters (the recent pace, events per second).
        tolerance: the engines' relative tolerance (settings).
        batch_max_sweeps: the work cap of a refresh after a batch (settings; 0 = none).
        stop_event: set when the consumer should stop.
    """

    def __init__(self, publications: Publications, stats: ConsumerStats, *, tolerance: float,
                 batch_max_sweeps: float, stop_event: threading.Event) -> None:
        self.publications = publications
        self.stats = stats
        self.tolerance = tolerance
        self.batch_max_sweeps = batch_max_sweeps
        self.stop_event = stop_event
        # --until-caught-up: the end offsets read at start, per partition.
        self.targets: dict[int, int] | None = None
        # For poll_delay: when the refresh in flight began, and running estimates of
        # how long a refresh takes and of poll + decode + plan (the lead).
        self.refresh_began: float | None = None
        self.refresh_s = 0.0
        self.lead_s = 0.0
        # See WARMUP_TOLERANCE: warming up since the start, and the publication count
        # when the first batch was refreshed.
        self.warming = True
        self._warm_from: int | None = None

    def caught_up(self, positions: Mapping[int, int]) -> bool:
        """Do ``positions`` (next offset per partition) reach the targets?"""
        if self.targets is None:
            return False
        return all(positions.get(p, 0) >= end for p, end in self.targets.items() if end > 0)

    def drain_comes_first(self, positions: Mapping[int, int]) -> bool:
        """``--until-caught-up``: from ``positions``, is the rest of the backlog consumed,
        and the drain reached, before a publication as long as the last one could end?

        Counted at the recent pace of this consumer. On the 1M-page stream a full
        publication that started two batches before the end (11.4 s, 2.8M members)
        was still running when the drain began, and the drain's own full rewrite
        (8.4 s) waited for it: 20 s of a 119 s run.
        """
        if self.targets is None:
            return False
        if self.caught_up(positions):
            return True
        left_s = seconds_to_catch_up(self.targets, positions, self.stats.events_meter.rate())
        return left_s < self.publications.last_seconds

    def refresh_due(self, full: bool, *, last: bool = False) -> bool:
        """Refresh the engines after this batch, or only absorb it?

        While catching up (``full``: a full batch or more waits beyond this one, see
        ``ConsumerService._catching_up``) scores are published only every few
        batches (see :mod:`consumer.publishing`), and a refresh nobody
        publishes is wasted: one refresh after several batches costs about as much as
        one after a single batch (on 1.4M pages, 12 batches of 50k links: 0.68 s per
        batch refreshing each, 0.28 s refreshing every fourth). So such a batch is
        only absorbed unless a publication could start after it; anything else
        (caught up, stopping) is refreshed, and an idle consumer refreshes what is left.

        ``last``: the drain follows before a publication started now could end
        (:meth:`drain_comes_first`). The batch is only absorbed: a publication of it
        would rewrite a buffer that the drain's rewrites again, and delay the drain's
        by its whole length.
        """
        if last:
            return False
        if not full or self.stop_event.is_set():
            return True
        return self.publications.due(lagging=True)

    def refresh_started(self, now: float) -> None:
        """The engines began a refresh after a batch (``now``: time.perf_counter())."""
        self.refresh_began = now

    def refresh_took(self, seconds: float) -> None:
        """The refresh that began last took ``seconds`` (its reports' sum)."""
        self.refresh_began = None
        self.refresh_s = _smoothed(self.refresh_s, seconds)

    def planned(self, seconds: float) -> None:
        """A batch took ``seconds`` from its poll to the end of its planning."""
        self.lead_s = _smoothed(self.lead_s, seconds)

    def poll_delay(self, now: float) -> float:
        """Caught up, with the engines refreshing the last batch: seconds to wait before
        polling the next one (0: poll now). See POLL_MARGIN_S.

        Polling late costs the engines at most the lead's misestimate in idle time,
        and only once caught up, where the events of a batch polled early would wait
        out the refresh anyway (the latency phase of the 1M-page stream: 0.17-0.33 s
        per batch, planned and waiting).
        """
        if self.refresh_began is None or self.stop_event.is_set():
            return 0.0
        expected_end = self.refresh_began + self.refresh_s
        return max(0.0, expected_end - self.lead_s - POLL_MARGIN_S - now)

    def wait_before_polling(self, refreshing: Future[Any] | None) -> None:
        """Caught up: wait up to :meth:`poll_delay` for ``refreshing`` (the engines'
        refresh after the last batch, if any) before the next poll."""
        if refreshing is None:
            return
        delay = self.poll_delay(time.perf_counter())
        if delay > 0.0:
            futures.wait([refreshing], timeout=delay)

    def batch_sweeps(self) -> float | None:
        """The work cap of the refresh after a batch (see Settings.batch_max_sweeps)."""
        return self.batch_max_sweeps or None

    def batch_tolerance(self) -> float | None:
        """The engines' refresh target for the next batch (None: the tolerance)."""
        if not self.publications.capped:
            return None
        target = min(CATCHUP_SHARE * self.publications.lag, CATCHUP_MAX_TOLERANCE)
        if self.warming:
            target = self._warm_up(target)
        return target if target > self.tolerance else None

    def _warm_up(self, target: float) -> float:
        """The target while warming up (see WARMUP_TOLERANCE), given the lag's own."""
        count = self.publications.count
        if self._warm_from is None:
            self._warm_from = count
        if target >= WARMUP_TOLERANCE or count - self._warm_from >= WARMUP_PUBLICATIONS:
            self.warming = False
            return target
        return WARMUP_TOLERANCE


def _smoothed(estimate: float, sample: float) -> float:
    """An exponentially weighted running estimate (the first sample taken as is)."""
    return sample if estimate == 0.0 else (1.0 - SMOOTHING) * estimate + SMOOTHING * sample
