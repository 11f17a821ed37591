"""The dominant mode of PageRank's sweeps, kept so a global refresh can remove it at once.

Why. After a change, a global refresh's Gauss-Seidel sweeps shrink ``||r||_1`` by
the dominant eigenvalue of ``d*M`` per sweep (``M[n, m] = 1 / O[m]``), and on a graph
with cycles that is slow: on the 1M-page cyclic copying-model graph ``M``'s Perron
root is 0.81, so ``d * 0.81 = 0.69`` per sweep, and plain sweeps take 19 full sweeps to
restore a max-abs error of 2.5e-7 after a 1k-link batch. What is left after a few
sweeps is almost all one vector, ``M``'s Perron vector ``v``: ten Jacobi hops after
that batch, removing ``v``'s share cut ``||r||_1`` 17-fold, twenty hops after it
1,000-fold (measured, three batches). The rest decays at ~0.46 per hop.

How. :class:`DominantMode` keeps ``v`` and its image ``w = d*M*v - v`` EXACT for the
current graph: every column update the engine makes to ``r`` it mirrors on ``w``
(:meth:`shift_columns`, about the same cost), the drift guard recomputes both.
Then ``y += a*v`` changes the residual by exactly ``a*w``, for any ``a`` and however
stale ``v`` is as an eigenvector: the residual, and so the certified bound, stays
exact. A stale ``v`` only removes less. After each sweep that pushed at least
``SPREAD_SHARE`` of the pages, :meth:`DominantMode.shift_for` picks the ``a``
minimising ``||r + a*w||_2``; the next sweep adds ``a*w`` to ``r`` as it goes, and
``y`` takes the sum of the shifts when the refresh is over (:class:`Deflation`).
On that graph, sweeps with one deflation each restore the same accuracy in 9-10
full sweeps instead of 19 (plain) or 14 (over-relaxed at 1.15; both together gain
nothing, as over-relaxation changes the slow mode), and the engine's own 1k-batch
refresh takes 600 ms instead of 789 (docs/benchmark-history.md, session 13).

``v`` is computed by power iteration from the current ``y`` (which already leans
towards it) when an uncapped sweep refresh first wants it, and again once the links
changed since then reach ``STALE_SHARE`` of the graph. Only PageRank uses it: WPR's
columns sum to far below 1 (Perron root 0.11 on the cyclic graph), so its sweeps
converge fast anyway, and on a DAG ``M`` is nilpotent: there is no such mode
(``available`` stays false; the iteration gives up once its rate is below
``MIN_RATE``, after 11 pulls on the DAG model).
"""

from __future__ import annotations

import numpy as np

from ranker import _kernels as K
from ranker._kernels import _touch, njit
from ranker.linkgraph import LinkGraph

POWER_STEPS = 40
# Power iteration stops once successive unit-sum iterates differ by less than this
# in L1: v only has to carry most of the slow mode, not be an exact eigenvector.
POWER_TOLERANCE = 1e-3
# d * Perron root below which the mode is not worth keeping (sweeps converge fast).
MIN_RATE = 0.3
STALE_SHARE = 0.1
# Deflate only after a sweep that pushed at least this share of the live pages: the
# residual is then spread over the graph, where the mode dominates. In the tail of
# a refresh (sweeps pushing a few thousand pages) only local dust is left.
SPREAD_SHARE = 0.5
NO_MODE = np.zeros(0)  # the sweep kernel's w when it does not deflate


@njit(cache=True)
def shift_columns(cols, sign, damping, v, w, out_start, out_len, out_nbr):
    """``w += sign * d * M[:, cols] @ v[cols]`` for PageRank's ``M`` (no queue)."""
    for k in range(cols.size):
        m = cols[k]
        deg = out_len[m]
        if deg == 0 or v[m] == 0.0:
            continue
        c = sign * damping * v[m] / deg
        base = out_start[m]
        for i in range(deg):
            w[out_nbr[base + i]] += c


@njit(cache=True)
def _move_into(num_nodes, amount, v, y, touched, qstate, is_touched):
    count = qstate[K.T_COUNT]
    for m in range(num_nodes):
        if v[m] != 0.0:
            y[m] += amount * v[m]
            count = _touch(m, touched, count, is_touched)
    qstate[K.T_COUNT] = count


class DominantMode:
    """``v`` (unit sum when computed) and ``w = d*M*v - v`` for a PageRank engine."""

    def __init__(self, graph: LinkGraph, damping: float) -> None:
        self.graph = graph
        self.damping = damping
        self.v = np.zeros(0)
        self.w = np.zeros(0)
        self.available = False
        self.rate = 0.0  # d * the Perron root estimate when v was computed
        self.changed = 0  # link entries of column updates since v was computed
        self._tried_at = -1  # graph links when a computation found no mode
        self._ww: float | None = None  # sum(w * w), None once w changed

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` page ids (new pages: ``v = w = 0``, exact)."""
        for name in ("v", "w"):
            old = getattr(self, name)
            new = np.zeros(capacity)
            new[: old.size] = old
            setattr(self, name, new)

    def wanted(self, num_links: int) -> bool:
        """Worth (re)computing now: none yet, or too many links changed since."""
        if self.available:
            return self.changed > STALE_SHARE * num_links
        return self._tried_at < 0 or abs(num_links - self._tried_at) > STALE_SHARE * num_links

    # ------------------------------------------------ keeping w exact (like r)
    def shift_columns(self, cols: np.ndarray, sign: float) -> None:
        """Mirror the engine's ``r`` column update on ``w`` (before/after the change)."""
        if not self.available:
            return
        g = self.graph
        shift_columns(cols, sign, self.damping, self.v, self.w, g.out_start, g.out_len,
                      g.out_nbr)
        self._ww = None
        self.changed += int(g.out_len[cols].sum())

    def forget(self, dead: np.ndarray) -> None:
        """Removed pages have no links left: ``v = w = 0`` there keeps ``w`` exact."""
        if self.available:
            self.v[dead] = 0.0
            self.w[dead] = 0.0
            self._ww = None

    def recompute_image(self, num_ids: int) -> None:
        """``w`` from scratch (the drift guard) on pages ``[0, num_ids)``."""
        if self.available:
            self.v[num_ids:] = 0.0
            self._pull(self.v, self.w, num_ids)
            self._ww = None

    def _pull(self, x: np.ndarray, out: np.ndarray, n: int) -> None:
        """``out = d*M*x - x`` on pages ``[0, n)`` (the residual of ``x`` with ``b = 0``)."""
        g = self.graph
        K.full_residual_pull(K.KIND_PAGERANK, self.damping, n, np.zeros(n, dtype=np.bool_), x,
                             out, g.in_start, g.in_len, g.in_nbr, g.out_len, NO_MODE, NO_MODE)

    # ------------------------------------------------ finding v
    def compute(self, start: np.ndarray, n: int) -> bool:
        """Power iteration for ``v`` from ``start`` (the engine's ``y``) on pages ``[0, n)``.

        Returns whether a mode worth keeping was found: the iteration settled within
        ``POWER_STEPS`` at a rate of at least ``MIN_RATE``. ``w`` is exact for the
        ``v`` kept (the last iterate, whose image was pulled).
        """
        v = np.zeros(self.v.size)
        w = np.zeros(self.v.size)
        v[:n] = np.maximum(start[:n], 0.0)
        total = v[:n].sum()
        self.available = False
        self.changed = 0
        self._tried_at = self.graph.num_links
        if not total > 0.0:
            return False
        v[:n] /= total
        rate = 0.0
        for _ in range(POWER_STEPS):
            self._pull(v, w, n)
            image = w[:n] + v[:n]  # d*M*v
            size = image.sum()
            if not size > 0.0:
                return False
            rate = float(size)  # v has unit sum: d times the ratio of sums
            if rate < MIN_RATE:
                # Dying out (a DAG: 0.64, 0.62, 0.59, ... 0.30 after 11 steps on the
                # copying model; a cyclic graph's stays at 0.68): no mode worth the
                # remaining pulls (a full 40 cost ~1.1 s on 1M pages).
                return False
            if np.abs(image / size - v[:n]).sum() < POWER_TOLERANCE:
                break
            v[:n] = image / size
        else:
            # No convergence: no eigenvalue stands out (on a DAG M is nilpotent).
            return False
        if rate < MIN_RATE:
            return False
        self.v, self.w, self.rate, self.available = v, w, rate, True
        self._ww = None
        return True

    def shift_for(self, along: float) -> float:
        """The multiple of ``v`` to move into ``y`` given ``along = sum(r * w)``: the one
        minimising ``||r + a*w||_2``."""
        if not self.available:
            return 0.0
        if self._ww is None:
            # Not np.dot: OpenBLAS's threads spin for ~50 ms after a call and took the
            # second core from the next two-thread sweeps (ranker._split_sweep: 26 ->
            # 50-120 ms each on 1M pages).
            self._ww = K.stats_along(self.w, self.w.size, self.w, NO_MODE)[2]
        return -along / self._ww if self._ww > 0.0 else 0.0

    def deflation(self, y: np.ndarray, n: int) -> Deflation:
        """A refresh's deflation over pages ``[0, n)``, with ``v`` (re)computed from ``y``
        first if due. ``n`` is the refresh's, not the graph's: the consumer may intern
        more pages meanwhile, beyond the engine's arrays."""
        if self.wanted(self.graph.num_links):
            self.compute(y, n)
        return Deflation(self if self.available else None, n)


class Deflation:
    """One refresh's use of the mode (inactive without one).

    Each sweep adds ``shift * w`` to ``r`` (:func:`ranker._kernels.sweep`); ``y`` owes
    the sum of those shifts times ``v`` until :meth:`finish`, which costs one pass
    instead of one per sweep. Until then ``r`` is the residual of ``y + moved * v``.
    """

    def __init__(self, mode: DominantMode | None, num_nodes: int) -> None:
        self.mode = mode
        self.active = mode is not None
        self.num_nodes = num_nodes
        self.w = mode.w if mode is not None else NO_MODE
        self.shift = 0.0  # what the next sweep adds, times w, to r
        self.moved = 0.0  # what the sweeps so far added: y owes moved * v
        sums: tuple[float, float] = (K.sum_max(mode.v, num_nodes) if mode is not None
                                     else (0.0, 0.0))
        self._v_sum, self._v_max = sums

    def swept(self, pushes: int, along: float, live_count: int) -> None:
        """After a sweep that pushed ``pushes`` pages and left ``sum(r*w) = along``."""
        self.moved += self.shift
        spread = pushes >= SPREAD_SHARE * live_count
        self.shift = (self.mode.shift_for(along)
                      if self.active and spread and self.mode is not None else 0.0)

    def stop(self) -> None:
        """No more shifts this refresh (the last sweep did not lower ``||r||_1``).
        Call after :meth:`swept`: a shift a sweep already added to ``r`` stays owed."""
        self.active = False
        self.shift = 0.0

    def bounds(self, total: float, y_max: float) -> tuple[float, float]:
        """``sum`` and an upper bound of ``max`` of ``y + moved * v`` from those of ``y``."""
        return total + self.moved * self._v_sum, y_max + abs(self.moved) * self._v_max

    def abs_mass(self, y_sum: float) -> float:
        """An upper bound of ``sum |y|`` from ``y_sum = sum(y)`` while ``y`` owes
        ``moved * v`` (``y`` itself may dip below 0 then; ``y + moved * v``, near the
        exact scores, is taken to be non-negative)."""
        owed = abs(self.moved) * self._v_sum
        return abs(y_sum + self.moved * self._v_sum) + owed

    def finish(self, y: np.ndarray, touched: np.ndarray, qstate: np.ndarray,
               is_touched: np.ndarray) -> bool:
        """``y += moved * v`` (marking the pages touched); whether ``y`` changed."""
        if self.mode is None or self.moved == 0.0:
            return False
        _move_into(self.num_nodes, self.moved, self.mode.v, y, touched, qstate, is_touched)
        self.moved = 0.0
        return True
