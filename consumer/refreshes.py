"""The engines' refreshes, run on the consumer's ranker thread.

:class:`consumer.service.ConsumerService` absorbs each batch into the engines on its
ranker thread and, when :class:`consumer.pacing.Pacing` says one is due, refreshes
them there too, while the main thread plans the next batch. This module keeps the
two facts every publication depends on: whether a refresh is still running (its
reports are not pending yet), and whether the engines absorbed batches since their
last refresh (the pending reports do not cover those, so nothing may be published
before the next refresh: :attr:`Refreshes.blocking`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from consumer.mirror import Mirror
from consumer.pacing import Pacing
from consumer.publishing import Publications

log = logging.getLogger("rankstream.consumer")

# While idle, a refresh that ends unfresh is tried again after a delay doubling from
# 1 s to this: a graph the engine cannot converge within RANKSTREAM_MAX_ITER (a
# damping near 1) repeated max_iter sweeps at every empty poll.
MAX_IDLE_REFRESH_DELAY_S = 300.0


class Refreshes:
    """Refreshes of one consumer's engines; reports go to ``publications.pending``."""

    def __init__(self, ranker: ThreadPoolExecutor, pacing: Pacing,
                 publications: Publications, mirror: Callable[[], Mirror]) -> None:
        self._ranker = ranker
        self._pacing = pacing
        self._publications = publications
        self._mirror = mirror
        self.running: Future[dict[str, Any]] | None = None
        self.absorbed_since = False  # batches absorbed since the last refresh
        self.idle_delay = 0.0  # seconds; 0 while the last idle refresh was fresh
        self.idle_due = 0.0  # monotonic time of the next idle refresh allowed

    @property
    def blocking(self) -> bool:
        """Would a publication now miss batches the engines hold? (One is running,
        or batches were absorbed since the last refresh.)"""
        return self.absorbed_since or self.running is not None

    def absorbed(self) -> None:
        """The engines took a batch (until the next refresh, nothing is publishable)."""
        self.absorbed_since = True

    def forget_absorbed(self) -> None:
        """A rebuild replaced the engines: nothing is absorbed and unrefreshed."""
        self.absorbed_since = False

    def start_batch_refresh(self) -> Future[dict[str, Any]]:
        """Queue the refresh after a batch (capped by the pacing), not waiting for it."""
        pacing = self._pacing
        self.running = self._ranker.submit(self._mirror().ranks.refresh,
                                           tolerance=pacing.batch_tolerance(),
                                           max_sweeps=pacing.batch_sweeps())
        self.absorbed_since = False
        return self.running

    def collect(self) -> None:
        """Wait for the refresh still running, if any; its reports become pending
        (published once a publication is due).

        Anything that reads the engines or changes the graph calls this first: the
        refresh runs on the ranker thread while the main thread plans the next batch.
        """
        refreshing, self.running = self.running, None
        if refreshing is None:
            return
        reports = refreshing.result()
        self._pacing.refresh_took(sum(float(r.seconds) for r in reports.values()))
        self._publications.pending.update(reports)
        log.info("refreshed", extra={"fields": {
            "version": self._mirror().counters.version,
            "moved": {a: int(r.moved_ids.size) for a, r in reports.items()},
            "modes": {a: str(r.mode) for a, r in reports.items()},
            "refresh_s": {a: round(float(r.seconds), 4) for a, r in reports.items()},
            "relative_bound": {a: float(f"{r.relative_bound:.3g}") for a, r in reports.items()}}})

    def now(self, *, tolerance: float | None = None, max_sweeps: float | None = None
            ) -> dict[str, Any]:
        """Refresh the engines now and wait (on the ranker thread: its
        RANKSTREAM_RANKER_THREADS kernel threads would take every core here); returns
        the reports (also pending for publication)."""
        self.collect()
        refresh = self._ranker.submit(self._mirror().ranks.refresh, tolerance=tolerance,
                                      max_sweeps=max_sweeps)
        reports: dict[str, Any] = refresh.result()
        self._publications.pending.update(reports)
        self.absorbed_since = False
        return reports

    def catch_up(self) -> None:
        """Refresh (capped as after a batch) if batches were absorbed since the last."""
        if self.absorbed_since:
            self.now(tolerance=self._pacing.batch_tolerance(),
                     max_sweeps=self._pacing.batch_sweeps())

    # -- while idle -------------------------------------------------------------------
    def new_events(self) -> None:
        """A batch came: an idle refresh that stayed unfresh may be tried at once again."""
        self.idle_delay = self.idle_due = 0.0

    def refresh_if_stale(self, fresh: Mapping[str, bool], publish: Callable[[], None]
                         ) -> bool:
        """While idle: if a published vector is not ``fresh`` (by algorithm), refine
        it and ``publish`` again.

        A refresh can end unfresh (the global mode's sweep cap); with no new events
        nothing else would tighten it. Returns True if a refresh was done.
        """
        mirror = self._mirror()
        if all(fresh.get(a, True) for a in mirror.start_reports):
            return False
        reports = self.now()
        publish()
        if all(report.fresh for report in reports.values()):
            self.idle_delay = 0.0
        else:
            self.idle_delay = min(max(1.0, 2.0 * self.idle_delay), MAX_IDLE_REFRESH_DELAY_S)
            log.warning("refreshed while idle and still not fresh; trying again later",
                        extra={"fields": {
                            "retry_in_s": self.idle_delay,
                            "relative_bound": {a: float(f"{r.relative_bound:.3g}")
                                               for a, r in reports.items()}}})
        return True

    def idle_refresh(self, fresh: Mapping[str, bool], publish: Callable[[], None]) -> None:
        """:meth:`refresh_if_stale`, at most once per current delay."""
        if time.monotonic() < self.idle_due:
            return
        if self.refresh_if_stale(fresh, publish) and self.idle_delay:
            self.idle_due = time.monotonic() + self.idle_delay
