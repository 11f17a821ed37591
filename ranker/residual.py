"""One residual engine per algorithm: keeps ``y`` and ``r = b + d*M*y - y`` exact.

The certified bound is ``||y_exact - y||_1 <= ||r||_1 / (1 - d)`` (docs/algorithms.md,
"Incremental refresh"). A graph change from ``M`` to ``M'`` only alters the columns
of pages whose out-weights change; :meth:`ResidualEngine.retract` subtracts their old
contribution ``d*M[:, m]*y[m]`` before the graph changes and :meth:`absorb` adds the
new one after, so the invariant holds exactly (up to rounding, which the periodic
full recomputation wipes out). :meth:`refresh` then pushes residual mass into ``y``.

Tolerance semantics (decided in :mod:`ranker.bounds`): ``tolerance`` is RELATIVE,
``||r||_1 / (1-d) <= tolerance * sum(y)``; ``max_error`` optionally bounds each page.

The refresh itself, local push or global sweeps, is :class:`ranker.refresh.Refresh`.

WPR batches touch many columns (``{u} + B(u) + B(v)``, and B of a hub is huge), but
only the changed sources get new out-rows: the other columns keep their targets
and only change weight, so they are re-weighed in one pass after the change
(:func:`ranker._column_kernels.wpr_reweigh_columns`) instead of a retract and an
absorb pass plus a re-summation of ``SI``/``SO``. When those columns hold more than
``FULL_RESIDUAL_SHARE`` of all links (a growing graph whose new links go to hubs),
the re-weigh is owed to the next refresh, which pays it over the scaled residual
before its first sweep (:mod:`ranker._deferred_reweigh`), or, where that cannot be,
``r`` is recomputed in one in-order pass, which costs less than re-weighing that
many columns one by one.
"""

from __future__ import annotations

import numba
import numpy as np

from ranker import _column_kernels as CK
from ranker import _deferred_reweigh as DR
from ranker import _graph_kernels as GK
from ranker import _kernels as K
from ranker._thread_guard import ThreadGuard
from ranker.bounds import push_thresholds
from ranker.dominant_mode import DominantMode
from ranker.edge_batches import AppliedBatch, sorted_unique
from ranker.linkgraph import LinkGraph
from ranker.refresh import SWEEP_OMEGA, Refresh
from ranker.results import RefreshReport

ALGORITHM_KINDS = {"pagerank": K.KIND_PAGERANK, "wpr": K.KIND_WPR}
# A WPR batch whose columns to re-weigh hold more than this share of all links is
# absorbed by recomputing r from scratch instead (SI and SO are kept exact by
# shift_sums either way): the column-by-column re-weigh costs ~55 ns per link
# visit (columns in no order, random reads of factors, r and queue marks; sorting
# the columns first: ~42), the full pull ~5 ns per link of the graph. 1M-page cyclic
# graph, 1k-link batches (17-24% re-weighed): 297 ms per batch at 0.25, 213 at 0.10,
# 206 at 0.05 (one kernel thread: 310, 228).
FULL_RESIDUAL_SHARE = 0.08
# Above that, up to this share the re-weigh is owed to the refresh's sweeps instead
# (ranker._deferred_reweigh), whose settle costs ~8 ns per re-weighed link on two
# threads (11 on one) against ~3 ns (5.6) per link of the graph for the full pull.
# Medians per 1M-page batch, owed against pulled (share of the links re-weighed):
# cyclic 1k links (24%) 111 against 150 ms, 3k (37%) 160-161 either way, 10k (58%)
# 210-212 against 205-208; DAG 1k (37%) 81 against 97, 3k (52%) 113 against 108,
# 10k (74%) 158 against 153. The consumer's 50k-link batches (89%) pull: noting what
# is owed only added 10-15% to an absorb whose capped refresh pulls anyway.
OWED_SHARE = 0.45


def _ring_size(count: int) -> int:
    return 1 << max(4, int(count).bit_length())


class ResidualEngine:
    """Incremental PageRank (``kind=0``) or Weighted PageRank (``kind=1``) state."""

    def __init__(self, graph: LinkGraph, algorithm: str, *, damping: float, tolerance: float,
                 publish_threshold: float, max_error: float | None, local_work: float,
                 max_sweeps: int, omega: float | None = None,
                 thread_guard: ThreadGuard | None = None) -> None:
        self.graph = graph
        self.algorithm = algorithm
        self.kind = ALGORITHM_KINDS[algorithm]
        self.damping = damping
        self.tolerance = tolerance
        self.publish_threshold = publish_threshold
        self.max_error = max_error
        self.local_work = local_work
        self.max_sweeps = max_sweeps
        self.omega = SWEEP_OMEGA[algorithm] if omega is None else float(omega)
        self.relax = False  # over-relax sweeps (decided by measuring plain ones)
        self.mode = DominantMode(graph, damping) if self.kind == K.KIND_PAGERANK else None
        self.global_runs = 0
        self.last_rate = 0.0
        self.global_from = np.inf  # column-update work from which refreshes go global
        self._cap = 0
        self.y, self.r, self.published = np.zeros(0), np.zeros(0), np.zeros(0)
        # WPR's SI, SO and signed per-target factors (CK.set_factors).
        self.si, self.so, self.factor = np.zeros(0), np.zeros(0), np.zeros(0)
        self.r_dangling = np.zeros(0)  # WPR's sweeps: see ranker._scaled_sweep
        # WPR columns' old scales, while their re-weigh is owed to the next refresh's
        # sweeps (ranker._deferred_reweigh); 0 where nothing is owed.
        self.pending = np.zeros(0)
        self.owed: tuple[np.ndarray, np.ndarray] | None = None  # (sources, ends)
        # Two-thread sweeps' buffers (ranker._split_sweep), allocated at their first
        # use (20 bytes a page for WPR, 12 for PageRank) and grown with the rest.
        self.cross, self.cross_dangling = np.zeros(0), np.zeros(0)
        self.split_scratch = np.zeros(0, dtype=np.int32)
        # One kernel thread while the second core is taken (ranker._thread_guard).
        self.thread_guard = ThreadGuard() if thread_guard is None else thread_guard
        self.base = np.zeros(0)  # b: 1 - d on live pages, 0 elsewhere
        self.inq = np.zeros(0, dtype=np.bool_)
        self.is_touched = np.zeros(0, dtype=np.bool_)
        self.is_marked = np.zeros(0, dtype=np.bool_)  # scratch of columns()
        # WPR batch scratch from retract to absorb: changed sources, degrees before.
        self.is_source, self.has_prev = np.zeros(0, dtype=np.bool_), np.zeros(0, dtype=np.bool_)
        self.prev_in, self.prev_out = np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
        self._plan: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.touched = np.zeros(0, dtype=np.int32)
        self.queue = np.zeros(16, dtype=np.int32)
        self.qstate = np.zeros(K.QSTATE_SLOTS, dtype=np.int64)
        self.l1 = 0.0  # running ||r||_1, exact after every refresh
        # How far r may have drifted from b + d*M*y - y by rounding since it was last
        # recomputed: the pushes' (ranker.bounds.rounding_drift) and the batches' column
        # updates' (ranker._column_kernels); a refresh recomputes r before calling y
        # fresh if that could matter.
        self.drift = 0.0
        # How far r may be from b + d*M*y - y by the rounding of its last computation
        # from scratch (full_residual_pull's, and pull_pages' since): certificates add
        # it like the drift, but it is no reason to recompute (that is what left it).
        self.residual_error = 0.0
        self.pending_work = 0
        self.rescan = False  # queue every page above the threshold at the next refresh
        # r awaits a recomputation at the next refresh: column updates meanwhile are skipped.
        self.stale = False
        # WPR's SI, SO and factors match the graph: every batch, stale or not, keeps them
        # (the factors of an owed batch's ends once the refresh prepares or drops it).
        self.sums_exact = False
        self.eps_scale = 1.0  # push threshold in units of its floor (adapted per refresh)
        self.total = self.y_max = self.bound = 0.0
        # The graph's live flags as of the last absorb (or load): the pages a refresh
        # certifies. The consumer plans its next batch while a refresh runs, interning
        # and reviving pages; those join at the absorb of their batch.
        self.live = graph.live_mask()
        self.live_count = int(np.count_nonzero(self.live))
        # As many as the graph has room for, so both grow at the same batch.
        self.ensure(graph.id_capacity)

    # ---------------------------------------------------------------- storage
    def ensure(self, num_ids: int) -> None:
        """Grow every per-page array to hold ``num_ids`` (amortised 1.5x)."""
        if num_ids <= self._cap:
            return
        cap = max(num_ids, self._cap + (self._cap >> 1), 16)
        wpr_only = ("factor", "r_dangling", "pending") if self.kind == K.KIND_WPR else ()
        split: tuple[str, ...] = ("cross", "split_scratch") if self.cross.size else ()
        if split and self.kind == K.KIND_WPR:
            split += ("cross_dangling",)
        for name in ("y", "r", "published", "si", "so", "base", "inq", "is_touched", "touched",
                     "is_marked", "is_source", "has_prev", "prev_in", "prev_out", *wpr_only,
                     *split):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: old.size] = old
            if name == "factor":
                new[old.size:] = -1.0  # a page without links (CK.set_factors)
            setattr(self, name, new)
        if self.mode is not None:
            self.mode.grow(cap)
        if self.queue.size <= cap:
            # Re-lay the ring in order into a bigger power-of-two buffer.
            size = int(self.qstate[K.Q_SIZE])
            head = int(self.qstate[K.Q_HEAD])
            order = (head + np.arange(size)) & (self.queue.size - 1)
            queue = np.zeros(_ring_size(cap), dtype=np.int32)
            queue[:size] = self.queue[order]
            self.queue = queue
            self.qstate[K.Q_HEAD] = 0
        self._cap = cap

    def split_buffers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cross, cross_dangling, scratch)`` of the two-thread sweeps, all zero
        (:mod:`ranker._split_sweep`); allocated on the first call."""
        if not self.cross.size:
            self.cross = np.zeros(self._cap)
            wpr = self.kind == K.KIND_WPR
            self.cross_dangling = np.zeros(self._cap if wpr else 0)
            self.split_scratch = np.zeros(self._cap, dtype=np.int32)
        return self.cross, self.cross_dangling, self.split_scratch

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                              np.ndarray]:
        """What the push kernels read per column: out-rows, WPR's factors and sums."""
        g = self.graph
        return (g.out_start, g.out_len, g.out_nbr, self.factor, self.si, self.so)

    # ---------------------------------------------------------------- graph changes
    def columns(self, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Pages whose out-weight column changes when links ``sources -> targets`` change.

        PageRank: the sources. WPR: ``{u} + B(u) + B(v)`` (B before the change; pages
        gaining in-links are themselves changed sources, so this covers B after it).
        Call before the graph changes.
        """
        g = self.graph
        # Pages interned since the last batch may have ids beyond our arrays.
        self.ensure(g.num_ids)
        if self.kind == K.KIND_PAGERANK:
            return sources
        ends = np.concatenate([sources, targets]).astype(np.int32)
        if self.owed is not None:
            # r lacks the previous batch's owed re-weigh: this one cannot build on it.
            self.stale = True
            self._drop_owed()
        if self.stale:
            # r waits for the next refresh's recomputation; only SI and SO are kept.
            self._plan = (sorted_unique(sources).astype(np.int32), sorted_unique(ends), sources)
            return sources
        cols = GK.union_with_rows(sources, ends, g.in_start, g.in_len, g.in_nbr, self.is_marked)
        # Remembered for retract/absorb: only the sources' out-rows change; the
        # other columns are re-weighed in one pass after the change.
        self._plan = (sorted_unique(sources).astype(np.int32), sorted_unique(ends), cols)
        return cols

    def retract(self, cols: np.ndarray) -> None:
        """Subtract the current contribution of ``cols`` (before the graph changes)."""
        g = self.graph
        self.ensure(g.num_ids)
        plan = self._plan
        if plan is None or plan[2] is not cols:
            self._plan = None
            if not self.stale:
                self._add_columns(cols, -1.0)
            return
        sources, changed, _ = plan
        if not self.stale:
            self._add_columns(sources, -1.0)
        self.is_source[sources] = True
        self.prev_in[changed] = g.in_len[changed]
        self.prev_out[changed] = g.out_len[changed]
        self.has_prev[changed] = True

    def absorb(self, cols: np.ndarray, applied: AppliedBatch) -> None:
        """Add the new contribution of ``cols`` and the base changes (after the change)."""
        g = self.graph
        self.ensure(g.num_ids)
        live = self._settle_live(g.live_mask())
        if self.stale:
            plan, self._plan = self._plan, None
            self._keep_sums(plan if plan is not None and plan[2] is cols else None)
            self._forget_removed(applied.removed_pages, live)
            self.pending_work += int(FULL_RESIDUAL_SHARE * g.num_links)
            return
        pages = sorted_unique(np.concatenate([applied.removed_pages, applied.new_pages]))
        if pages.size:
            # Idempotent against our own b, so a page interned before cold_start and
            # reported new by the next apply is not counted twice.
            want = np.where(live[pages], 1.0 - self.damping, 0.0)
            old_r = self.r[pages]
            self.r[pages] = old_r + (want - self.base[pages])
            self.base[pages] = want
            self.l1 += float(np.abs(self.r[pages]).sum() - np.abs(old_r).sum())
            CK.enqueue_pages(pages, self.queue, self.qstate, self.inq)
            # New pages have y = 0: their columns cost nothing now, their first push
            # visits their links (the refresh compares that with earlier changes).
            self.pending_work += int(g.out_len[pages].sum())
        plan, self._plan = self._plan, None
        if self.kind == K.KIND_WPR and plan is not None and plan[2] is cols:
            sources, changed, _ = plan
            reweigh = int(g.out_len[cols].sum())
            if reweigh > FULL_RESIDUAL_SHARE * g.num_links:
                # Growing graphs send many links to hubs, each re-weighing every
                # in-neighbour of the hub (1M pages, 50k new links: 614k columns,
                # 0.55 s). A sweeping refresh pays it before its first sweep (or,
                # failing that, the next refresh recomputes r, once for batches
                # absorbed without one in between, LiveRanks.absorb).
                self.pending_work += reweigh
                if reweigh < OWED_SHARE * g.num_links:
                    self.stale = not self._owe_reweigh(plan)
                else:
                    self.stale = True
                    self._keep_sums(plan)
            else:
                CK.update_sums(sources, g.out_start, g.out_len, g.out_nbr, g.in_len, self.si,
                               self.so)
                CK.set_factors(changed, g.in_len, g.out_len, self.factor)
                self._add_columns(sources, 1.0)
                work, dl1, rounding = CK.wpr_reweigh_columns(
                    cols, self.is_source, changed, self.prev_in, self.prev_out,
                    self.has_prev, self.damping, self.y, self.r, g.out_start, g.out_len,
                    g.out_nbr, g.in_start, g.in_len, g.in_nbr, self.factor, self.si, self.so,
                    self.queue, self.qstate, self.inq)
                self.pending_work += work
                self.l1 += dl1
                self.drift += rounding
                self.is_source[sources] = False
                self.has_prev[changed] = False
        else:
            if self.kind == K.KIND_WPR:  # without a plan: whose degrees changed is unknown
                CK.update_sums(cols, g.out_start, g.out_len, g.out_nbr, g.in_len, self.si,
                               self.so)
                CK.set_factors(np.arange(g.num_ids), g.in_len, g.out_len, self.factor)
            self._add_columns(cols, 1.0)
        self._forget_removed(applied.removed_pages, live)

    def _settle_live(self, live: np.ndarray) -> np.ndarray:
        self.live, self.live_count = live, int(np.count_nonzero(live))
        return live

    def _owe_reweigh(self, plan: tuple[np.ndarray, np.ndarray, np.ndarray]) -> bool:
        """Keep the sums after the graph changed and owe the re-weigh of the plan's
        columns to the next refresh (:mod:`ranker._deferred_reweigh`): the batch's
        ends keep their old factors until :meth:`prepare_owed` or :meth:`_drop_owed`.
        False if a column may change mode: then ``r`` needs a recompute."""
        sources, changed, _ = plan
        self.owed = (sources, changed)
        if self._keep_sums(plan, self.pending):
            self._drop_owed()
            return False
        return True

    def prepare_owed(self) -> None:
        """For a refresh about to sweep: the batch's ends get their new factors and
        residual, the sources their new columns; what stays owed is ``pending``,
        paid by :meth:`settle_owed` over the scaled residual."""
        assert self.owed is not None
        g = self.graph
        sources, changed = self.owed
        flipped = DR.rescale_ends(changed, g.in_len, g.out_len, self.factor, self.base,
                                  self.y, self.r)
        self._add_columns(sources, 1.0)
        self.residual_error += DR.pull_pages(
            flipped, self.damping, self.y, self.r, self.base, g.in_start, g.in_len, g.in_nbr,
            g.out_len, self.si, self.so, self.pending)

    def settle_owed(self, num_ids: int) -> int:
        """Pay the owed re-weigh into the scaled residual (:mod:`ranker._scaled_sweep`,
        after :meth:`prepare_owed`); returns the link visits."""
        g = self.graph
        self.owed = None
        return DR.settle_scaled(numba.get_num_threads(), num_ids, self.damping, self.y,
                                self.r, self.r_dangling, g.out_start, g.out_len, g.out_nbr,
                                self.si, self.so, self.pending)

    def _drop_owed(self) -> None:
        """Forget an owed re-weigh (``r`` is about to be recomputed in full); the
        batch's ends get their new factors (again, if prepared: the same ones)."""
        if self.owed is not None:
            g = self.graph
            CK.set_factors(self.owed[1], g.in_len, g.out_len, self.factor)
            self.pending[:] = 0.0
            self.owed = None

    def _keep_sums(self, plan: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                   pending: np.ndarray | None = None) -> bool:
        """Bring WPR's SI, SO and factors up to date after a batch whose r is left stale.

        The changed sources are re-summed; every other page only shifts by the degree
        changes of the pages it links to (:func:`ranker._column_kernels.shift_sums`):
        on 1M pages, 40k + 1.1M link visits per batch of 40k new links instead of all 8M.
        Without the batch's plan the sums are re-summed at the next recomputation.
        With ``pending`` the shifted columns' old scales are noted there and the
        factors left to the caller; returns whether a column may have changed mode.
        """
        if self.kind != K.KIND_WPR:
            return False
        if plan is None:
            self.sums_exact = False
            return False
        g = self.graph
        sources, changed, _ = plan
        CK.update_sums(sources, g.out_start, g.out_len, g.out_nbr, g.in_len, self.si, self.so)
        crossed = CK.shift_sums_split(numba.get_num_threads(), changed, self.is_source,
                                      self.prev_in, self.prev_out, g.in_start, g.in_len,
                                      g.in_nbr, g.out_len, self.si, self.so,
                                      self.si[:0] if pending is None else pending)
        if pending is None:
            CK.set_factors(changed, g.in_len, g.out_len, self.factor)
        self.is_source[sources] = False
        self.has_prev[changed] = False
        return bool(crossed)

    def _forget_removed(self, removed: np.ndarray, live: np.ndarray) -> None:
        dead = removed[~live[removed]]
        # A removed page has no links and b = 0, so its exact y and residual are 0;
        # zeroing y moves no other residual because its column is empty.
        self.l1 -= float(np.abs(self.r[dead]).sum())
        self.y[dead] = 0.0
        self.r[dead] = 0.0
        if self.mode is not None:
            self.mode.forget(dead)
        self.published[removed] = 0.0
        # Removed and revived by the same batch: readers dropped its score, so it
        # must be published again even if y did not move.
        K.touch_pages(removed[live[removed]], self.touched, self.qstate, self.is_touched)

    def _add_columns(self, cols: np.ndarray, sign: float) -> None:
        work, dl1, rounding = CK.add_columns(self.kind, cols, sign, self.damping, self.y,
                                             self.r, *self.arrays(), self.queue, self.qstate,
                                             self.inq)
        self.pending_work += work
        self.l1 += dl1
        self.drift += rounding  # the certificates add it (ranker._column_kernels)
        if self.mode is not None:
            self.mode.shift_columns(cols, sign)

    # ---------------------------------------------------------------- exact state
    def recompute_residual(self) -> float:
        """``r = b + d*M*y - y`` from scratch (drift guard); returns the largest change."""
        n = self.live.size
        self.ensure(n)
        before = self.r[:n].copy()
        self.recompute()
        return float(np.abs(self.r[:n] - before).max()) if n else 0.0

    def recompute(self) -> None:
        """:meth:`recompute_residual` without measuring the change (1M pages: 4 ms less)."""
        g, live = self.graph, self.live
        n = live.size
        self.ensure(n)
        self._drop_owed()
        self.base[:n] = np.where(live, 1.0 - self.damping, 0.0)
        if self.kind == K.KIND_WPR and not self.sums_exact:
            CK.all_sums(n, g.out_start, g.out_len, g.out_nbr, g.in_len, self.si, self.so)
            CK.set_factors(np.arange(n), g.in_len, g.out_len, self.factor)
            self.sums_exact = True
        self.l1, _, self.residual_error = K.full_residual_pull(
            self.kind, self.damping, n, live, self.y, self.r, g.in_start, g.in_len, g.in_nbr,
            g.out_len, self.si, self.so)
        if self.mode is not None:
            self.mode.recompute_image(n)
        K.clear_queue(self.queue, self.qstate, self.inq)
        self.rescan = True
        self.stale = False
        self.drift = 0.0

    def load(self, y: np.ndarray) -> None:
        """Take ``y`` as the current estimate (dead pages zeroed), residual recomputed."""
        live = self._settle_live(self.graph.live_mask())
        n = live.size
        self.ensure(n)
        self.y[:] = 0.0
        self.y[:n] = y[:n]
        self.y[:n][~live] = 0.0
        self.published[:] = 0.0
        self.sums_exact = False
        self.recompute()
        self.is_touched[:n] = True
        self.touched[:n] = np.arange(n, dtype=np.int32)
        self.qstate[K.T_COUNT] = n

    # ---------------------------------------------------------------- refresh
    @property
    def error_cap(self) -> float:
        """The certified per-page error a fresh refresh needs (``max_error`` or none)."""
        return np.inf if self.max_error is None else self.max_error

    def thresholds(self, total: float, y_max: float, live_count: int, tolerance: float
                   ) -> tuple[float, float]:
        return push_thresholds(tolerance=tolerance, damping=self.damping, total=total,
                               y_max=y_max, live_count=live_count, eps_scale=self.eps_scale,
                               max_error=self.max_error, unseen=self.residual_error)

    def refresh(self, *, mode: str = "local", tolerance: float | None = None,
                max_sweeps: float | None = None) -> RefreshReport:
        """Push until the certified bounds hold; switch to global sweeps if not local.

        ``tolerance`` overrides :attr:`tolerance` for this refresh (and the report's
        ``fresh`` refers to it). ``max_sweeps`` caps its global work at that many
        sweeps' worth of link visits (a float: 0.25 is a quarter of a sweep), spent
        on prioritized passes, largest residuals first (see
        :data:`ranker.refresh.PRIORITY_START`); the report is then honest about what
        was reached, and counts passes as sweeps.
        """
        with self.thread_guard.kernel_threads(self.graph.num_ids):
            return Refresh(self, mode, tolerance, max_sweeps).run()
