"""The certified error bounds, in one place: what a residual ``r`` proves about ``y``.

With ``r = b + d*M*y - y`` (paper scale, PageRank or WPR) the error ``e = y_exact - y``
solves ``(I - d*M) e = r``, and ``G = (I - d*M)^-1`` is non-negative with columns
summing to at most ``1 / (1 - d)``. Hence the L1 bound ``||e||_1 <= ||r||_1 / (1 - d)``
that every published vector carries (``docs/algorithms.md``, "Incremental refresh"),
and the per-page and probability-scale bounds below, which follow from it.
Pure functions of a few floats: the engines call them, tests check them on their own.

Tolerance semantics of the incremental engines (:mod:`ranker.residual`), decided
here. ``tolerance`` is RELATIVE: a refresh is fresh when ``||r||_1 / (1-d) <=
tolerance * sum(y)``, i.e. when the certified L1 error of the probability-scale
vector ``x = y / sum(y)`` is at most about ``tolerance`` (at most
``2 * tolerance / (1 - tolerance)``, see :func:`probability_bound`).
An absolute L1 tolerance would have to grow with the graph: ``sum(y)`` is of the
order of the page count, so a fixed absolute figure means a near-exact global solve
per batch on a large graph and a sloppy one on a small graph. The relative figure
costs the same per changed link whatever the graph size, which is what makes
incremental refresh pay. Reports carry both the absolute and the relative bound.

An L1 bound says little about one page: ``max |y_exact - y|`` is only bounded by
``max|r| * max(y_exact) / (1 - d)`` (the rows of ``(I - d*M)^-1`` sum to
``y_exact / (1 - d)`` for both PageRank and WPR), which the report carries as
``max_abs_bound``. Callers that need a per-page accuracy set ``max_error``: the
refresh then also pushes until that certified per-page bound is at most it.
"""

from __future__ import annotations

import numpy as np

# The smallest relative tolerance the engines accept. r itself is computed in float64:
# a page's residual sums its in-links' terms, each rounded, so r carries an error of
# the order of k * 2.2e-16 * y for k in-links. Below ~1e-13 of sum(y) the residual of
# a converged vector is that noise, and a bound derived from it is not a bound (on the
# Python docs graph, a refresh to 1e-16 claimed an L1 error 100x smaller than the true
# one, measured in long double). The static solvers detect the same floor as a stall.
MIN_TOLERANCE = 1e-12


def probability_bound(paper_bound: float, total: float) -> float:
    """Certified ``||x_exact - x||_1`` for ``x = y / sum(y)`` from the paper-scale bound.

    With ``e = y_exact - y``: ``x_exact - x = (S*e - y*sum(e)) / (S * S_exact)``, so
    ``||x_exact - x||_1 <= 2*||e||_1 / S_exact <= 2*B / (S - B)``; two probability
    vectors never differ by more than 2 in L1.
    """
    if total <= paper_bound:
        return 2.0
    return min(2.0, 2.0 * paper_bound / (total - paper_bound))


def max_abs_bound(peak: float, y_max: float, damping: float) -> float:
    """Certified ``max |y_exact - y|`` from ``max |r| = peak``.

    ``|e| <= G |r| <= peak * G 1`` with ``G 1 = y_exact / (1 - d)`` on live pages (1
    on dead ones), and ``max y_exact <= y_max + E``; solving ``E <= rho * (y_max + E)``
    for E.
    """
    rho = peak / (1.0 - damping)
    if rho >= 1.0:
        return float(np.inf)
    return rho * max(y_max, 1.0 - damping) / (1.0 - rho)


def push_thresholds(*, tolerance: float, damping: float, total: float, y_max: float,
                    live_count: int, eps_scale: float, max_error: float | None
                    ) -> tuple[float, float]:
    """(allowed ``||r||_1``, push threshold on ``|r[m]|``) for the current sum and max of y.

    ``tolerance`` is relative to ``sum(y) = total`` (see :mod:`ranker.residual`). The
    threshold is ``eps_scale`` times its floor, ``target / live pages``, which always
    reaches the target: an engine raises the scale to keep refreshes local and lowers
    it when the dust below the threshold alone exceeds the target. With
    ``max_error`` it is also capped so that :func:`max_abs_bound` is at most
    ``max_error``.
    """
    d = damping
    target = tolerance * (1.0 - d) * total
    floor = target / live_count
    eps = min(max(floor * eps_scale, floor), target)
    if max_error is not None:
        eps = min(eps, max_error * (1.0 - d) / (max(y_max, 1.0 - d) + max_error))
    return target, eps
