"""Live PageRank and Weighted PageRank over a changing :class:`LinkGraph`.

:class:`LiveRanks` owns the graph and one :class:`ranker.residual.ResidualEngine` per
algorithm. Each :meth:`LiveRanks.apply` works out, before touching the graph, which
links really change (no-op inserts and deletes are filtered out so they cost
nothing), lets every engine retract the out-weight columns that are about to
change, applies the batch, lets every engine add the new columns, and refreshes.
The refresh cost follows the size of the change; see :mod:`ranker.bounds` for the
tolerance semantics and the certified bounds, :mod:`ranker.refresh` for the
local/global switch.

Every ``recompute_every`` batches the residual is recomputed from scratch, so
floating-point drift of the incremental updates never accumulates. Between those,
each certificate counts the rounding drift the pushes may have left in ``r``
(:func:`ranker.bounds.rounding_drift`), and a refresh recomputes ``r`` when that
drift outgrows its share of the target (near damping 1, after many sweeps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ranker._thread_guard import ThreadGuard
from ranker.bounds import tolerance_floor
from ranker.edge_batches import AppliedBatch, EdgeBatch, sorted_unique
from ranker.linkgraph import LinkGraph
from ranker.pagerank import check_max_iter, check_positive_int, is_real
from ranker.residual import ALGORITHM_KINDS, ResidualEngine
from ranker.results import RefreshReport
from rankstream.errors import InputError

__all__ = ["LiveRanks", "RefreshReport"]


class LiveRanks:
    """The graph plus incrementally maintained scores of each algorithm.

    Args:
        graph: the graph to rank (a new empty one by default); LiveRanks owns it
            from now on: change it only through :meth:`apply` (or :meth:`absorb`).
            Reports certify the graph as of the last batch absorbed
            (:attr:`absorbed_live`): a page interned or revived since (the consumer
            plans the next batch while a refresh runs) joins the scores, the totals
            and the bounds when its batch is absorbed.
        algorithms: any of "pagerank", "wpr".
        damping: ``d``.
        tolerance: RELATIVE certified L1 bound: fresh means
            ``||r||_1 / (1 - d) <= tolerance * sum(y)``.
        publish_threshold: a page is reported moved when its ``y`` differs from
            the value last reported by more than this (absolute, paper scale).
        max_iter: cap on the sweeps of one global refresh (and of a cold solve).
        max_error: optional certified per-page accuracy: fresh also requires the
            report's ``max_abs_bound`` (a bound on ``max |y_exact - y|``, paper scale)
            to be at most this.
        local_work: link visits per graph link a local push may spend before the
            refresh switches to global sweeps. Small, because a FIFO push costs
            about twice as much per link visit as a sweep (random order): on the
            1M-page DAG graph a 1k-link PageRank batch took 485 ms pushing locally
            (0.78 link visits per link) and 270 ms in sweeps (0.72), while 10-link
            batches (0.13-0.15) were 3x faster pushed locally. 0: global sweeps
            for every change.
        recompute_every: batches between exact residual recomputations.
    """

    def __init__(
        self,
        graph: LinkGraph | None = None,
        *,
        algorithms: Sequence[str] = ("pagerank", "wpr"),
        damping: float = 0.85,
        tolerance: float = 1e-6,
        publish_threshold: float = 1e-7,
        max_iter: int = 1000,
        max_error: float | None = None,
        local_work: float = 0.2,
        recompute_every: int = 64,
    ) -> None:
        damping = _real(damping, "damping")
        if not 0.0 < damping < 1.0:
            raise InputError(f"damping must lie strictly between 0 and 1, got {damping!r}")
        check_tolerance(tolerance, damping)
        if not 0.0 <= _real(publish_threshold, "publish_threshold") < np.inf:
            # NaN would publish nothing, ever
            raise InputError(f"publish_threshold must be finite and >= 0, got "
                             f"{publish_threshold!r}")
        if max_error is not None and not _real(max_error, "max_error") > 0.0:
            raise InputError(f"max_error must be positive, got {max_error!r}")
        check_max_iter(max_iter)
        check_positive_int(recompute_every, "recompute_every")  # 2.7 and 0 were taken
        if not 0.0 <= _real(local_work, "local_work") < np.inf:
            raise InputError(f"local_work must be finite and >= 0, got {local_work!r}")
        unknown = [a for a in algorithms if a not in ALGORITHM_KINDS]
        if unknown or not algorithms:
            raise InputError(f"unknown algorithm(s) {unknown}; choose from "
                             f"{sorted(ALGORITHM_KINDS)}")
        self.graph = graph if graph is not None else LinkGraph()
        self.damping = float(damping)
        self.tolerance = float(tolerance)
        self.max_iter = int(max_iter)
        self.recompute_every = int(recompute_every)
        self.batches = 0
        # One for all engines: a taken core is the machine's (ranker._thread_guard).
        self.thread_guard = ThreadGuard()
        self.engines = {
            name: ResidualEngine(self.graph, name, damping=self.damping,
                                 tolerance=self.tolerance, publish_threshold=publish_threshold,
                                 max_error=max_error, local_work=local_work,
                                 max_sweeps=self.max_iter, thread_guard=self.thread_guard)
            for name in dict.fromkeys(algorithms)
        }
        self.last_applied: AppliedBatch | None = None

    # ------------------------------------------------------------------ reads
    def _engine(self, algorithm: str) -> ResidualEngine:
        try:
            return self.engines[algorithm]
        except KeyError:
            raise InputError(f"algorithm {algorithm!r} is not maintained here") from None

    def scores(self, algorithm: str) -> np.ndarray:
        """Paper-scale ``y`` by page id (a view of length ``graph.num_ids``)."""
        return self._engine(algorithm).y[: self.graph.num_ids]

    @property
    def absorbed_live(self) -> np.ndarray:
        """Live flags by id as of the last absorbed batch (or cold start): the pages
        the scores and reports cover. Shared with the engines: do not modify."""
        return next(iter(self.engines.values())).live

    def total(self, algorithm: str) -> float:
        """``sum(y)`` as of the last refresh."""
        return self._engine(algorithm).total

    def bound(self, algorithm: str) -> float:
        """Certified ``||y_exact - y||_1`` (``||r||_1 / (1-d)``, exact as of the last refresh)."""
        return self._engine(algorithm).bound

    # ------------------------------------------------------------------ writes
    def cold_start(self, warm: dict[str, np.ndarray] | None = None) -> dict[str, RefreshReport]:
        """Solve from scratch, or restart from ``warm`` vectors (e.g. read back from Redis).

        Without a warm vector an algorithm starts from ``y = 1`` on live pages
        (``b / (1 - d)``) and the engine's own global sweeps solve it, to a quarter of
        the tolerance: on the 1M-page cyclic graph, at a tolerance of 1e-6, in 1.6 s for
        PageRank and 0.5 s for WPR, against 2.8 and 2.3 s through the static solvers
        (scipy power iteration, CSR built first) and a refresh; the report is that of
        a refresh of the recomputed residual. With one, ``y = warm``
        (dead pages zeroed, missing, non-finite and negative entries 0), the residual
        is recomputed exactly and the refresh repairs whatever is stale. Every live
        page is reported moved; a solve that did not converge within ``max_iter``
        sweeps says so (``fresh`` false).
        """
        if warm is not None and not isinstance(warm, Mapping):
            raise InputError(f"warm must map algorithm names to vectors, got "
                             f"{type(warm).__name__}")
        reports = {}
        graph = self.graph
        n = graph.num_ids
        live = graph.live_mask()
        with self.thread_guard.kernel_threads(n):  # one while the second core is taken
            for name, engine in self.engines.items():
                vector = None if warm is None else warm.get(name)
                if vector is None:
                    engine.load(np.where(live, 1.0, 0.0))
                    # Swept to a quarter of the tolerance: a vector just inside it would
                    # send the first small batches to global sweeps to win back the rest.
                    # Hundreds of sweeps leave rounding in r, which a tolerance near the
                    # floating-point floor would mistake for progress: the report comes
                    # from a refresh of the recomputed residual, against the tolerance.
                    solved = engine.refresh(mode="global", tolerance=max(
                        0.25 * self.tolerance, tolerance_floor(self.damping)))
                    engine.stale = True  # recomputed by the refresh, no drift measured
                    report = engine.refresh()
                    report.mode, report.sweeps = "cold", report.sweeps + solved.sweeps
                    report.moved_ids = np.union1d(solved.moved_ids, report.moved_ids)
                    report.moved_scores = engine.y[report.moved_ids]
                    reports[name] = report
                    continue
                start = np.zeros(n)
                try:
                    given = np.asarray(vector, dtype=np.float64).reshape(-1)[:n]
                except (TypeError, ValueError) as exc:
                    raise InputError(f"warm[{name!r}] must be a vector of numbers: {exc}"
                                     ) from exc
                start[: given.size] = given
                # A warm vector is only a first guess (the refresh certifies the result),
                # but a NaN or inf in it would spread through every sweep and never be
                # repaired, and 1e20 cancelled every other score to rounding noise;
                # such entries, and those no exact score can be (negative, or above
                # the live page count: sum(y) is at most that), start from 0 instead.
                live_count = float(self.graph.num_live)
                start[~(np.isfinite(start) & (start >= 0.0) & (start <= live_count))] = 0.0
                engine.load(start)
                reports[name] = engine.refresh()
        return reports

    def apply(self, batch: EdgeBatch, *, tolerance: float | None = None,
              max_sweeps: float | None = None) -> dict[str, RefreshReport]:
        """Apply ``batch`` to the graph and refresh every algorithm incrementally.

        The same as :meth:`absorb` then :meth:`refresh` (see there for the arguments).
        """
        _check_refresh_args(tolerance, max_sweeps, self.damping)  # before the graph changes
        self.absorb(batch)
        return self.refresh(tolerance=tolerance, max_sweeps=max_sweeps)

    def absorb(self, batch: EdgeBatch) -> AppliedBatch:
        """Apply ``batch`` to the graph and bring every residual up to date, no refresh.

        ``y`` is left as it was, so the engines' bounds grow until the next
        :meth:`refresh`. A caller that cannot use scores after every batch (a consumer
        catching up publishes only now and then) absorbs several batches per refresh:
        a refresh costs about the same after one batch as after a few, and a WPR
        residual that needs recomputing from scratch is recomputed once for them all.
        """
        with self.thread_guard.kernel_threads(self.graph.num_ids):  # (and on small graphs)
            graph = self.graph
            sources, targets = self._changing_links(batch)
            cols = {name: e.columns(sources, targets) for name, e in self.engines.items()}
            for name, engine in self.engines.items():
                engine.retract(cols[name])
            applied = graph.apply(batch)
            self.last_applied = applied
            self.batches += 1
            for name, engine in self.engines.items():
                engine.absorb(cols[name], applied)
                if self.batches % self.recompute_every == 0:
                    # The drift guard: recomputed by the next refresh. WPR's sums are
                    # integers, kept exactly (ResidualEngine.sums_exact); they are re-summed
                    # here too, one pass per recompute_every batches, so that a mistake in
                    # keeping them could not outlast the guard.
                    engine.stale = True
                    engine.sums_exact = False
            return applied

    def refresh(self, *, tolerance: float | None = None, max_sweeps: float | None = None
                ) -> dict[str, RefreshReport]:
        """Refresh every algorithm towards its bounds; returns the reports.

        ``tolerance`` overrides the refresh target of this call only (a caller that
        cannot use more accuracy yet, e.g. a consumer whose published scores lag by
        more, saves the work); the reports' ``fresh`` then refers to it.
        ``max_sweeps`` caps this call's global work at that many sweeps' worth of
        link visits, largest residuals first (a service that must publish
        within a time budget); an unconverged report says so (``fresh`` false, the
        bound as reached), and a later refresh carries on from there.
        """
        _check_refresh_args(tolerance, max_sweeps, self.damping)
        return {name: engine.refresh(tolerance=tolerance, max_sweeps=max_sweeps)
                for name, engine in self.engines.items()}

    def _changing_links(self, batch: EdgeBatch) -> tuple[np.ndarray, np.ndarray]:
        """Distinct sources and targets of the links ``batch`` may change (pre-apply).

        A superset is harmless (an unchanged column is retracted and re-added); what
        matters is filtering the common no-ops, which would otherwise drag the
        in-neighbourhoods of hubs into WPR's column set.
        """
        graph = self.graph
        graph.check_batch(batch)
        removed = sorted_unique(batch.removed_pages)
        removed = removed[graph.live_mask()[removed]] if removed.size else removed
        present = graph.links_exist(batch.delete_src, batch.delete_dst)
        absent = ~graph.links_exist(batch.insert_src, batch.insert_dst)
        absent &= batch.insert_src != batch.insert_dst
        sources = np.concatenate([removed, graph.gather_in(removed),
                                  batch.delete_src[present], batch.insert_src[absent]])
        targets = np.concatenate([removed, graph.gather_out(removed),
                                  batch.delete_dst[present], batch.insert_dst[absent]])
        return (sorted_unique(sources).astype(np.int32), sorted_unique(targets).astype(np.int32))


def _real(value: object, name: str) -> float:
    """``value`` as a float, or InputError naming ``name`` (a string, None or a bool
    raised whatever Python's comparison raised)."""
    if not is_real(value):
        raise InputError(f"{name} must be a number, got {value!r}")
    return float(value)


def check_tolerance(tolerance: float, damping: float) -> None:
    """InputError unless ``tolerance`` is a relative bound certifiable at ``damping``
    (at least :func:`ranker.bounds.tolerance_floor`) and below 1."""
    tolerance = _real(tolerance, "tolerance")
    floor = tolerance_floor(damping)
    if not tolerance >= floor:
        raise InputError(f"tolerance must be at least {floor:.3g} at damping {damping:g} "
                         f"(relative; below it the residual is float64 rounding noise), "
                         f"got {tolerance!r}")
    # Relative to sum(y), an L1 bound of 1 or more certifies nothing about the scores:
    # any probability vector is within 2 of the exact one. Infinity would call every
    # vector fresh.
    if not tolerance < 1.0:
        raise InputError(f"tolerance must be below 1 (a relative L1 bound), got {tolerance!r}")


def _check_refresh_args(tolerance: float | None, max_sweeps: float | None,
                        damping: float) -> None:
    if tolerance is not None:
        check_tolerance(tolerance, damping)
    if max_sweeps is not None and not 0.0 < _real(max_sweeps, "max_sweeps") < np.inf:
        raise InputError(f"max_sweeps must be positive and finite, got {max_sweeps!r}")
