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
vector ``x = y / sum(y)`` is at most about ``tolerance`` (at most ``2 * tolerance``,
see :func:`probability_bound`).
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
# a page's residual sums its in-links' terms, each rounded, so a plain sum carries an
# error of the order of k * 2.2e-16 * y for k in-links. The engines' sums are now
# compensated and their rounding certified (ranker._kernels.full_residual_pull,
# ResidualEngine.residual_error: about 7e-15 of sum(y)), but the floor stays: below
# ~1e-13 of sum(y) the residual of a converged vector is that noise, and a bound
# derived from a plain sum's was not a bound (on the
# Python docs graph, a refresh to 1e-16 claimed an L1 error 100x smaller than the true
# one, measured in long double). The static solvers stop on a plain mat-vec's
# residual, which understated the true error 3-5x at d >= 0.99 (session 24) and up to
# 218x beside a hub of 1,646 in-links (session 27); they now certify the returned
# vector with a compensated residual and its rounding (ranker._csr_residual), refuse a
# tol below what that can certify, and default to static_tolerance on large graphs.
MIN_TOLERANCE = 1e-12
# float64's unit of rounding.
EPS = float(np.finfo(np.float64).eps)
# The damping MIN_TOLERANCE was chosen for (the default).
_FLOOR_DAMPING = 0.85


def tolerance_floor(damping: float) -> float:
    """The smallest relative tolerance certifiable at ``damping``.

    :data:`MIN_TOLERANCE` up to d = 0.85; above, it grows as ``1 / (1 - d)``, as the
    bound divides the residual's rounding noise by ``1 - d``: at d = 0.9999 even an
    exactly recomputed residual of a 40-page graph certified only 1.9e-10 for a vector
    whose true relative error (long double) was 1.1e-12.
    """
    return MIN_TOLERANCE * max(1.0, (1.0 - _FLOOR_DAMPING) / (1.0 - damping))


def static_tolerance(num_pages: int, damping: float) -> float:
    """The tightest absolute ``tol`` the static solvers certify with room to spare on
    ``num_pages`` live pages: a tenth of :func:`tolerance_floor` per page (``sum(y)``
    is at most the page count). Their residual's rounding alone bounds the error by
    about ``3e-15 * sum(y) / (1 - d)`` (:mod:`ranker._csr_residual`), 5x below it."""
    return 0.1 * tolerance_floor(damping) * max(num_pages, 1)


# The share of each target the push threshold leaves for rounding drift; a refresh
# whose drift outgrows it recomputes r exactly (one pass over the links, about a
# sweep). At d = 0.85 that takes millions of sweeps at the default relative tolerance
# and tens of 1k-link batches at a per-page max_error of 1e-5 on 1M pages; near d = 1,
# hundreds of sweeps. Aiming 1/16 lower cost 0.5% more pushes on the 1M-page graph's
# PageRank refresh after a 1k-link batch (session 22).
DRIFT_SHARE = 1.0 / 16.0


def rounding_drift(damping: float, y_mass: float) -> float:
    """How far (L1) the kept residual may drift from ``b + d*M*y - y`` by pushes.

    A push ``y[m] += r[m]`` rounds ``y[m]`` by up to ``EPS * |y[m]|``, which changes
    the true residual by up to ``(1 + d)`` times that, while the kept ``r`` assumes the
    exact sum; ``y_mass`` is the sum of ``|y[m]|`` over the pushes. The pushes'
    additions to the kept residual round relative to ``|r|``, which shrinks as a
    refresh converges: not counted (a batch's column updates, which need not shrink,
    are: :data:`ranker._column_kernels.ROUNDED_PRODUCTS`). Certificates divide this by
    ``1 - d`` too: near d = 1, with many sweeps, it outgrows the tolerance (d = 0.9999,
    794 sweeps: a relative bound of 9.9e-13 called fresh where the exactly recomputed
    one was 1.9e-10).
    """
    return (1.0 + damping) * EPS * y_mass


def probability_bound(paper_bound: float, total: float) -> float:
    """Certified ``||x_exact - x||_1`` for ``x = y / sum(y)`` from the paper-scale bound.

    With ``S = sum(y)`` and ``S_exact = sum(y_exact)``, split ``x_exact - x`` as
    ``(y_exact - y) / S + y_exact * (1/S_exact - 1/S)``: the first part is at most
    ``B / S`` in L1, the second ``|S - S_exact| / S <= B / S``, so the bound is
    ``2*B / S`` (the same figure readers print: twice the relative bound). It was
    ``2*B / (S - B)`` until session 31, from dividing by ``S_exact >= S - B`` instead:
    valid, looser, and undefined once ``B >= S``. Two probability vectors never
    differ by more than 2 in L1.
    """
    if total <= 0.0:
        return 2.0
    return min(2.0, 2.0 * paper_bound / total)


def max_abs_bound(peak: float, y_max: float, damping: float, unseen: float = 0.0) -> float:
    """Certified ``max |y_exact - y|`` from ``max |r| = peak``.

    ``|e| <= G |r| <= peak * G 1`` with ``G 1 = y_exact / (1 - d)`` on live pages (1
    on dead ones), and ``max y_exact <= y_max + E``. ``unseen`` is the L1 rounding
    the kept ``r`` may hide: no entry of ``G = (I - d*M)^-1`` exceeds ``1 / (1 - d)``,
    so it adds at most ``unseen / (1 - d)`` to any page. Solving
    ``E <= rho * (y_max + E) + unseen / (1 - d)`` for E (the unseen term is divided by
    ``1 - rho`` too: adding it after the division, as before, came out short).
    """
    rho = peak / (1.0 - damping)
    if rho >= 1.0:
        return float(np.inf)
    return (rho * max(y_max, 1.0 - damping) + unseen / (1.0 - damping)) / (1.0 - rho)


def push_thresholds(*, tolerance: float, damping: float, total: float, y_max: float,
                    live_count: int, eps_scale: float, max_error: float | None,
                    unseen: float = 0.0) -> tuple[float, float]:
    """(allowed ``||r||_1``, push threshold on ``|r[m]|``) for the current sum and max of y.

    ``tolerance`` is relative to ``sum(y) = total`` (see :mod:`ranker.residual`). The
    threshold is ``eps_scale`` times its floor, ``target / live pages``, which always
    reaches the target: an engine raises the scale to keep refreshes local and lowers
    it when the dust below the threshold alone exceeds the target. With
    ``max_error`` it is also capped so that :func:`max_abs_bound` is at most
    ``max_error``. The threshold aims :data:`DRIFT_SHARE` below both targets: that
    share is left for the residual's rounding drift (:func:`rounding_drift`), which
    the certificates add. ``unseen``, the L1 rounding ``r`` was computed with (which
    the certificates add too), comes off both targets first; never below the drift's
    share, where a target out of reach is left for the certificate to refuse.
    """
    d = damping
    target = tolerance * (1.0 - d) * total
    free = max((1.0 - DRIFT_SHARE) * target - unseen, DRIFT_SHARE * target)
    floor = free / live_count
    eps = min(max(floor * eps_scale, floor), free)
    if max_error is not None:
        seen = unseen / (1.0 - d)
        cap = max((1.0 - DRIFT_SHARE) * max_error - seen, DRIFT_SHARE * max_error)
        # max_abs_bound(eps, y_max, d, unseen) <= cap + seen where cap is not floored.
        eps = min(eps, cap * (1.0 - d) / (max(y_max, 1.0 - d) + cap + seen))
    return target, eps
