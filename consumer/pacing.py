"""When the consumer refreshes its engines after a batch, and how far.

A refresh only pays when its scores can be published soon, and refining them far
beyond what the published scores show is work nobody sees yet. :class:`Pacing`
makes those calls for :class:`consumer.service.ConsumerService` from the state of
its publications (:mod:`consumer.publishing`), its pace and, with
``--until-caught-up``, the end offsets it has to reach.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from consumer.publishing import Publications
from consumer.stats import ConsumerStats, seconds_to_catch_up

__all__ = ["CATCHUP_MAX_TOLERANCE", "CATCHUP_SHARE", "Pacing"]

# While a capped publication leaves the published scores lagging y by a relative L1
# distance L (see consumer.score_publisher), refining y per batch far below L is work
# nobody can see yet: the engines then refresh to CATCHUP_SHARE * L (never looser
# than CATCHUP_MAX_TOLERANCE, never tighter than the tolerance). Idle refreshes and
# the final publication always go back to the tolerance, so `fresh` means the same.
CATCHUP_SHARE = 0.1
CATCHUP_MAX_TOLERANCE = 1e-2


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

        While catching up (``full``: a full batch is waiting, see
        ``ConsumerService._catching_up``) scores are published only every few
        batches (see ``ConsumerService._maybe_publish``), and a refresh nobody
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

    def batch_sweeps(self) -> float | None:
        """The work cap of the refresh after a batch (see Settings.batch_max_sweeps)."""
        return self.batch_max_sweeps or None

    def batch_tolerance(self) -> float | None:
        """The engines' refresh target for the next batch (None: the tolerance)."""
        lag = self.publications.lag
        if lag <= 0.0 or not self.publications.capped:
            return None
        target = min(CATCHUP_SHARE * lag, CATCHUP_MAX_TOLERANCE)
        return target if target > self.tolerance else None
