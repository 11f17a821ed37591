"""One refresh of a residual engine: push residual mass into ``y`` until certified.

:meth:`ranker.residual.ResidualEngine.refresh` runs a :class:`Refresh`. The engine
keeps ``y``, ``r`` and what it learns across refreshes (the push threshold's scale,
how large a change went global, whether plain sweeps were slow); a ``Refresh``
keeps what one run needs (the work spent, the current thresholds, the sweep count)
and ends in a :class:`ranker.results.RefreshReport`.

Local or global: the refresh starts as a FIFO frontier push (work proportional to
the change). If the push spends more than ``local_work`` link visits per link of
the graph, the change is not local any more, and it switches by itself to
warm-started Gauss-Seidel sweeps over all pages (``mode="global"``), which touch
memory in order and cost one link visit per link per sweep. A change of about the
size of one that went global before goes global at once (``global_from``), so the
push budget is not burnt on every large batch; the bar rises slowly so that the
push is re-tried now and then. PageRank's uncapped sweeps remove their dominant
mode after each sweep wherever the graph has one (:mod:`ranker.dominant_mode`);
WPR's, or PageRank's on a graph without such a mode, are over-relaxed
(``SWEEP_OMEGA``) where plain ones were measured to converge slowly. Either stops as
soon as ``||r||_1`` grows, and plain sweeps never raise it, so they always converge.
WPR sweeps over its residual scaled by each page's factor (:mod:`ranker._scaled_sweep`,
one random read per link instead of two); a large batch's re-weigh, if the absorb owed
it, is paid into that scaled residual before the first sweep
(:mod:`ranker._deferred_reweigh`). Once a sweep is predicted to push only a few pages
(``TAIL_SHARE``), the refresh pushes the rest from a queue instead of sweeping again.
An uncapped refresh of a large graph sweeps on two threads where the calling thread's
kernels may use two (:mod:`ranker._split_sweep`); a capped one, such as the consumer's,
keeps to one.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numba
import numpy as np

from ranker import _kernels as K
from ranker import _scaled_sweep as SK
from ranker import _split_sweep as SS
from ranker._thread_guard import clocks
from ranker.bounds import DRIFT_SHARE, max_abs_bound, rounding_drift
from ranker.dominant_mode import Deflation
from ranker.results import RefreshReport

if TYPE_CHECKING:
    from ranker.residual import ResidualEngine

# Over-relaxation of slow global sweeps where there is no dominant mode to remove
# (1M-page cyclic graph, 1k-link batches: PageRank needed 19 sweeps at 1.15, 30 at
# 1.0, 9-10 removing the mode, no fewer with both; WPR needs more above 1.0). Any
# value is safe: see Refresh.sweep_pass.
SWEEP_OMEGA = {"pagerank": 1.15, "wpr": 1.0}
# Plain sweeps that shrink ||r||_1 by less than this factor each (the geometric mean
# over a refresh) mean slow, eigenvalue-bound convergence through cycles (0.63-0.68
# on the 1M-page cyclic graph): there over-relaxing pays. Where changes die out along
# paths (the DAG model: 0.31-0.47) it only adds overshoot (up to 2.5x slower).
SLOW_SWEEP = 0.55
PROBE_EVERY = 64
# An uncapped refresh whose next sweep would push fewer than this share of the live
# pages (predicted from the last two sweeps' pushes, assuming they shrink at the same
# rate) goes on from a queue of the pages above the threshold (Refresh.tail_pass)
# instead of sweeping every page for them. Session 19: 2% with the prediction spares
# WPR's fourth sweep (pushes 370k, 232k, 57k, then 6k for 5.5 ms) and DAG PageRank one
# of nine (1k batches: 123 -> 105 ms); starting the queue a sweep earlier (20%) made
# WPR slower (129 -> 138 ms). Session 18, 1% of the last sweep's pushes: WPR's last
# 2-3 sweeps had pushed a few hundred pages at 3-4 ms each (scan and statistics), and
# at 10% DAG PageRank took twice as long: its sweeps push ~5% of the pages each, and
# FIFO order costs more per push than id order there.
TAIL_SHARE = 0.02
# A refresh with a work cap (``refresh(max_sweeps=...)``, the consumer's refresh after
# a batch) cannot reach the tolerance on a large graph anyway, so its passes go
# largest residuals first: the first visits only pages holding more than
# PRIORITY_START times the mean |r|, and the threshold drops by PRIORITY_STEP each
# time a pass finds less than PRIORITY_THIN of the links above it. On a growing
# 1.4M-page graph one sweep's worth of such passes left WPR 1,000x closer than one
# plain sweep, PageRank 1.4x (docs/benchmark-history.md, pipeline
# session 6, "prioritized").
PRIORITY_START = 16.0
PRIORITY_STEP = 4.0
PRIORITY_THIN = 0.02


class Refresh:
    """One run of :meth:`ranker.residual.ResidualEngine.refresh` (see there)."""

    def __init__(self, engine: ResidualEngine, mode: str, tolerance: float | None,
                 max_sweeps: float | None) -> None:
        self.started = time.perf_counter()
        self.engine = e = engine
        self.tol = e.tolerance if tolerance is None else float(tolerance)
        self.capped = max_sweeps is not None
        g = e.graph
        # The pages of the last absorb only (ResidualEngine.live): the consumer's main
        # thread may intern or revive pages while this runs on the ranker thread.
        self.n = e.live.size
        e.ensure(g.num_ids)  # so that scores() covers those pages too (with y = 0)
        if e.stale:
            e.recompute()
        d = e.damping
        self.change = e.pending_work  # link visits of the column updates: the change's size
        e.pending_work = 0
        self.work = self.change
        self.pushes = self.sweeps = self.global_work = 0
        self.live_count = max(e.live_count, 1)
        if e.live_count == 0 and not e.y[:self.n].any():
            # Nothing live and y all 0: the exact r is 0 too, so r is off by what ||r||_1
            # shows and no rounding is left unseen (an empty graph is exact, and fresh).
            e.drift = e.residual_error = 0.0
        # b alone gives sum(y) >= (1 - d) * live pages, a safe floor before y settles.
        self.total = max(e.total, (1.0 - d) * self.live_count)
        # y grows where links were added; the threshold is re-derived from the exact
        # maximum after every pass, so an underestimate here only costs a pass.
        self.y_max = e.y_max
        self.deflation = Deflation(None, self.n)  # PageRank's instead of omega
        self.target, self.eps = self.thresholds()
        self.l1, self.peak = e.l1, np.inf
        # The floor keeps small graphs local; local_work = 0: sweeps for every change.
        self.budget = (int(e.local_work * max(g.num_links, 1))
                       + (10_000 if e.local_work else 0))
        # A capped refresh's global passes may visit this many links in all.
        self.global_budget = (2**62 if max_sweeps is None
                              else int(max_sweeps * max(g.num_links, 1)) + 1)
        self.pass_eps = np.inf  # threshold of the next prioritized pass (capped refreshes)
        self.global_start = 0.0  # ||r||_1 before the first sweep
        self.lowered = False  # the push threshold was lowered during this refresh
        self.recomputed = False  # r was computed from scratch during this refresh
        self.mode = mode
        if mode == "local" and self.change >= 0.5 * e.global_from:
            # A change of about this size went global last time: the push would only
            # burn its budget (about one sweep of link visits, at several times the
            # cost per visit) before switching. Raising the bar slowly re-probes the
            # local push every dozen or so such refreshes.
            self.mode = "global"
            K.clear_queue(e.queue, e.qstate, e.inq)
            e.global_from *= 1.06
        # A large WPR batch's re-weigh may be owed to the sweeps; a refresh that does
        # not start with them recomputes r instead (ranker._deferred_reweigh).
        self.settle = e.owed is not None and self.mode == "global" and not self.capped
        if self.settle:
            e.prepare_owed()
        elif e.owed is not None:
            e.recompute()
            self.l1 = e.l1
        if e.rescan and self.mode == "local":  # global sweeps visit every page anyway
            K.enqueue_above(self.n, self.eps, e.r, e.queue, e.qstate, e.inq)
        e.rescan = False
        # Over-relax only slow sweeps (SLOW_SWEEP); every PROBE_EVERY-th one re-measures.
        self.probe = (not self.capped and e.omega != 1.0
                      and e.global_runs % PROBE_EVERY == 0)
        # d * omega > 1 grows r geometrically along swept paths (d = 0.95, 1.15: 1e44).
        self.omega = (max(1.0, min(e.omega, 0.98 / d))
                      if e.relax and not self.probe and not self.capped else 1.0)
        # WPR's sweeps run over r scaled by each page's factor (ranker._scaled_sweep),
        # converted before the first and back in report().
        self.scaled = False
        self.tail = False  # sweeps push only a few pages now: queue them instead
        # Sweeps on two threads, unless the second core was taken lately: then the
        # engine's ThreadGuard has left this thread one kernel thread.
        self.split = not self.capped and SS.wanted(self.n)
        self.last_pushes = 0  # of the previous sweep

    def thresholds(self) -> tuple[float, float]:
        """(allowed ``||r||_1``, push threshold) for the current sum and max of ``y``."""
        return self.engine.thresholds(self.total, self.y_max, self.live_count, self.tol)

    def run(self) -> RefreshReport:
        while True:
            if self.mode == "local":
                sums = self.push_pass()
            else:
                sums = self.tail_pass() if self.tail else self.sweep_pass()
            if self.settled(*sums):
                return self.report()

    def push_pass(self) -> tuple[float, float]:
        """FIFO push within the budget; a queue left over means the change is not local.
        Returns ``(sum(y), max(y))``."""
        e = self.engine
        n = self.n
        p, w, e.l1, y_mass = K.push_queue(
            e.kind, e.damping, self.eps, self.budget - self.work, -1.0, e.l1, e.y, e.r,
            *e.arrays(), e.queue, e.qstate, e.inq, e.touched, e.is_touched)
        self.pushes += p
        self.work += w
        self.l1, self.peak, _, y_sum, y_max = K.stats_along(e.r, n, e.r[:0], e.y)
        e.drift += rounding_drift(e.damping, y_mass)
        if e.qstate[K.Q_SIZE] > 0:  # out of budget
            self.mode = "global"
            K.clear_queue(e.queue, e.qstate, e.inq)
            e.global_from = min(e.global_from, max(self.change, 1))
        return y_sum, y_max

    def sweep_pass(self) -> tuple[float, float]:
        """One sweep over all pages (capped: a prioritized pass). Returns the sweep's
        ``(sum(y), max(y))``, before the deflation's shift along ``v``."""
        e = self.engine
        g = e.graph
        before = e.l1
        if self.sweeps == 0:
            self.global_start = before
            # Always, not after slow sweeps were measured: a batch that hardly
            # excited the mode measured fast, and 63 refreshes took 30 sweeps.
            if not self.capped and e.mode is not None:
                self.deflation = e.mode.deflation(e.y, self.n)
                self.omega = 1.0 if self.deflation.active else self.omega
            if self.capped:
                self.pass_eps = PRIORITY_START * before / self.live_count
        threshold = max(self.eps, self.pass_eps) if self.capped else self.eps
        budget = self.global_budget - self.global_work
        if e.kind == K.KIND_WPR and not self.scaled:
            SK.to_scaled(self.n, e.r, e.r_dangling, e.factor)
            self.scaled = True
        if self.settle:
            self.work += e.settle_owed(self.n)
            self.settle = False
        split, started = self.split, clocks()
        if e.kind == K.KIND_WPR:
            if split:
                p, w, self.l1, self.peak, y_sum, y_max = SS.split_sweep_scaled(
                    e.damping, threshold, self.omega, self.n, e.y, e.r, e.r_dangling,
                    g.out_start, g.out_len, g.out_nbr, e.factor, e.si, e.so, e.touched,
                    e.qstate, e.is_touched, *e.split_buffers())
            else:
                p, w, self.l1, self.peak, y_sum, y_max = SK.sweep_scaled(
                    e.damping, threshold, self.omega, self.n, e.y, e.r, e.r_dangling,
                    g.out_start, g.out_len, g.out_nbr, e.factor, e.si, e.so, e.touched,
                    e.qstate, e.is_touched, budget)
            along = 0.0
        elif split:
            cross, _, scratch = e.split_buffers()
            p, w, self.l1, self.peak, along, y_sum, y_max = SS.split_sweep(
                e.damping, threshold, self.omega, self.n, e.y, e.r, g.out_start, g.out_len,
                g.out_nbr, e.touched, e.qstate, e.is_touched, self.deflation.shift,
                self.deflation.w, cross, scratch)
        else:
            p, w, self.l1, self.peak, along, y_sum, y_max = K.sweep(
                e.kind, e.damping, threshold, self.omega, self.n, e.y, e.r, *e.arrays(),
                e.touched, e.qstate, e.is_touched, budget, self.deflation.shift,
                self.deflation.w)
        if split:
            self.split = e.thread_guard.timed_since(started)
        self.global_work += w
        if self.capped and w < PRIORITY_THIN * g.num_links:
            self.pass_eps = threshold / PRIORITY_STEP
        self.deflation.swept(p, along, self.live_count)  # books the shift this sweep added
        if self.l1 > before:
            # Over-relaxation is only guaranteed to converge for omega below
            # 2 / (1 + d); plain Gauss-Seidel never raises ||r||_1.
            self.omega = 1.0
            self.deflation.stop()
        self.pushes += p
        self.work += w
        self.sweeps += 1
        # A sweep pushes each page at most once, and y[m] changes only then.
        e.drift += rounding_drift(e.damping, self.deflation.abs_mass(y_sum))
        # The next sweep's pushes, if they shrink as they just did. The queue pushes
        # plainly, so it only takes over from plain sweeps: without the mode's removal
        # a cyclic PageRank refresh after a 10-link batch, its sweeps pushing ~2% of
        # the pages each, took 9.5M pushes and 3 s from the queue (287 ms swept).
        coming = p * p / self.last_pushes if self.last_pushes > p else p
        self.last_pushes = p
        plain = self.omega == 1.0 and not self.deflation.active
        self.tail = not self.capped and plain and coming < TAIL_SHARE * self.live_count
        return y_sum, y_max

    def tail_pass(self) -> tuple[float, float]:
        """A global refresh's pass once its sweeps push only a few pages: the pages
        above the threshold are queued and pushed FIFO (counted as a sweep). Returns
        ``(sum(y), max(y))``."""
        e = self.engine
        n = self.n
        self.unscale()
        K.enqueue_above(n, self.eps, e.r, e.queue, e.qstate, e.inq)
        p, w, _, y_mass = K.push_queue(
            e.kind, e.damping, self.eps, self.global_budget - self.global_work, -1.0, self.l1,
            e.y, e.r, *e.arrays(), e.queue, e.qstate, e.inq, e.touched, e.is_touched)
        K.clear_queue(e.queue, e.qstate, e.inq)  # left over only when out of budget
        self.l1, self.peak, _, y_sum, y_max = K.stats_along(e.r, n, e.r[:0], e.y)
        e.drift += rounding_drift(e.damping, y_mass)
        self.global_work += w
        self.pushes += p
        self.work += w
        self.sweeps += 1
        return y_sum, y_max

    def unscale(self) -> None:
        """Back to the plain residual after WPR's scaled sweeps (ranker._scaled_sweep)."""
        if self.scaled:
            e = self.engine
            SK.from_scaled(self.n, e.r, e.r_dangling, e.factor)
            self.scaled = False

    def settled(self, y_sum: float, y_max: float) -> bool:
        """After a pass: whether the refresh is over (certified, out of work, or only
        rounding noise left); lowers the push threshold when it stops paying."""
        e = self.engine
        e.l1 = self.l1
        self.total, self.y_max = self.deflation.bounds(y_sum, y_max)
        self.target, self.eps = self.thresholds()
        drift = self.drift()
        if self.certified(drift):
            return True
        if self.rounding_in_the_way(drift):
            self.recompute_exactly()
            if self.certified(0.0):
                return True
        if self.mode == "global" and (self.sweeps >= e.max_sweeps
                                      or self.global_work >= self.global_budget):
            return True  # reported as not fresh
        if (self.peak <= self.eps
                and self.l1 + self.drift() + e.residual_error > self.target):
            # The dust below the threshold alone exceeds the target: go finer.
            floor = self.target / self.live_count
            finer = min(self.eps / 4.0, self.peak / 2.0)  # below the peak, so something moves
            e.eps_scale = max(finer / floor, 1.0) if floor > 0 else 1.0
            self.lowered = True
            self.target, self.eps = self.thresholds()
        return (self.mode == "local"
                and K.enqueue_above(self.n, self.eps, e.r, e.queue, e.qstate,
                                    e.inq) == 0)  # only rounding noise is left: not fresh

    def rounding_in_the_way(self, drift: float) -> bool:
        """Whether to recompute ``r`` exactly: the rounding it carries, which a
        recompute renews, stands in the way of a certificate.

        Either the pushes' drift outgrew its share (see ranker.bounds.DRIFT_SHARE) of
        a target the kept residual meets, or the unseen rounding alone exceeds the
        target, where no push can help: ``residual_error`` and the drift scale with
        ``sum(y)`` as it was, so after a large page removal, or a start far above the
        solution (the cold start's ``y = 1`` near ``d = 1``), a refresh with
        ``||r||_1 = 0`` swept to ``max_iter`` and reported exact scores as not fresh
        (session 37's review). Once a refresh has recomputed, that rounding is
        current: the second reason holds once per refresh.
        """
        e = self.engine
        if not self.recomputed and not self.within(0.0, 0.0, drift + e.residual_error):
            return True
        return self.certified(0.0) and (drift > DRIFT_SHARE * self.target
                                        or drift / (1.0 - e.damping) > DRIFT_SHARE * e.error_cap)

    def drift(self) -> float:
        """The kept residual's possible rounding drift, the deflation's owed shift's
        included (:func:`ranker.bounds.rounding_drift`)."""
        owed = self.deflation.moved != 0.0
        return self.engine.drift + (rounding_drift(self.engine.damping, abs(self.total))
                                    if owed else 0.0)

    def certified(self, drift: float) -> bool:
        """Both bounds within their targets, with ``drift`` and the residual's own
        rounding (``residual_error``) added to ``||r||_1``."""
        return self.within(self.l1, self.peak, drift + self.engine.residual_error)

    def within(self, l1: float, peak: float, unseen: float) -> bool:
        """Both bounds within their targets for a kept residual of ``l1`` and ``peak``
        and ``unseen`` rounding: no entry of ``(I - d*M)^-1`` exceeds ``1 / (1 - d)``,
        so the rounding adds at most that over ``1 - d`` to any page's error."""
        e = self.engine
        per_page = max_abs_bound(peak, self.y_max, e.damping, unseen)
        return l1 + unseen <= self.target and per_page <= e.error_cap

    def recompute_exactly(self) -> None:
        """``r`` from scratch for ``y`` as it stands (the owed shift paid first)."""
        e = self.engine
        self.unscale()
        if self.deflation.finish(e.y, e.touched, e.qstate, e.is_touched):
            e.drift += rounding_drift(e.damping, abs(self.total))
        e.recompute()
        self.recomputed = True
        self.l1, self.peak, _, y_sum, y_max = K.stats_along(e.r, self.n, e.r[:0], e.y)
        self.total, self.y_max = y_sum, y_max
        self.target, self.eps = self.thresholds()

    def report(self) -> RefreshReport:
        """Settle ``y``, learn for the next refresh, and report what was reached."""
        e = self.engine
        n = self.n
        d = e.damping
        self.unscale()
        if self.deflation.finish(e.y, e.touched, e.qstate, e.is_touched):
            e.drift += rounding_drift(d, abs(self.total))
            self.total, self.y_max = K.sum_max(e.y, n)
        if self.sweeps and self.probe and self.sweeps >= 3 and self.global_start > 0.0:
            e.last_rate = (max(self.l1, 1e-300) / self.global_start) ** (1.0 / self.sweeps)
            e.relax = e.last_rate > SLOW_SWEEP
            e.global_runs += 1
        elif self.sweeps and not self.probe:
            e.global_runs += 1
        if not self.lowered and self.l1 < 0.25 * self.target:
            e.eps_scale *= 2.0  # plenty of room: push less next time
        moved = K.collect_moved(numba.get_num_threads(), e.touched, e.qstate, e.is_touched,
                                e.live, e.y, e.published, e.publish_threshold)
        e.total = self.total
        e.y_max = self.y_max
        # The certificate counts the rounding drift the kept r cannot show, and the
        # rounding of r's last computation from scratch.
        unseen = e.drift + e.residual_error
        e.bound = (self.l1 + unseen) / (1.0 - d)
        max_abs = min(max_abs_bound(self.peak, self.y_max, d, unseen), e.bound)
        # The bound, drift included, not l1: a warm start of 1e20 cancelled to a zero
        # kept residual and a negative total, with everything in the drift, and was
        # called fresh.
        relative = (e.bound / self.total if self.total > 0
                    else (0.0 if e.bound == 0 else np.inf))
        fresh = relative <= self.tol and max_abs <= e.error_cap
        return RefreshReport(
            algorithm=e.algorithm, fresh=bool(fresh), bound=e.bound, total=self.total,
            moved_ids=moved, moved_scores=e.y[moved], mode=self.mode,
            pushes=int(self.pushes), seconds=time.perf_counter() - self.started,
            relative_bound=relative, residual_max=float(self.peak),
            max_abs_bound=float(max_abs), work=int(self.work), sweeps=self.sweeps,
        )
