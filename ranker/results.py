"""Result records returned by the static solvers and the incremental engines.

The static solvers' results are frozen so a result handed to another component (the
publisher, a test, the dynamic engine as a warm start) cannot be changed behind the
solver's back; the arrays inside are still ordinary numpy arrays owned by the caller.
A :class:`RefreshReport` is not frozen: :class:`ranker.LiveRanks` relabels the
report of a refresh it ran as part of a cold start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankResult:
    """Scores of PageRank or Weighted PageRank plus the certificate that comes with them.

    Attributes:
        scores: paper-scale ``y`` (or probability ``x = y / sum(y)`` when the caller
            asked for ``scale="probability"``), float64, indexed by page id; dead
            ids are 0.
        iterations: mat-vec sweeps performed (each sweep also yields the residual).
        residual_l1: a certified upper bound on ``||r||_1`` of the returned
            paper-scale vector, where ``r = b + d*M*y - y``: computed for exactly the
            vector returned, with compensated sums, plus the bound on their rounding
            (:mod:`ranker._csr_residual`); never 0 for a non-empty graph.
        bound: certified ``||y_exact - y||_1 <= residual_l1 / (1 - d)`` on the paper
            scale; on the probability scale the certified bound of
            ``||x_exact - x||_1`` (see :func:`ranker.pagerank.pagerank`).
        total: ``sum(y)`` on the paper scale, published beside ``y`` so readers can
            form the probability vector without a global rewrite.
    """

    scores: np.ndarray
    iterations: int
    residual_l1: float
    bound: float
    total: float


@dataclass(frozen=True)
class HitsResult:
    """Hub and authority scores of HITS.

    Attributes:
        hubs: hub score per page id (float64).
        authorities: authority score per page id (float64).
        iterations: power-iteration steps, plus the applications of A^T A made by
            the Lanczos/eigh fallback when power iteration was too slow (a dense
            eigh counts n).
        error: L1 change of hubs plus authorities in the last power step (what was
            compared against ``tol``) or, after the fallback, the relative
            eigen-residual of hubs plus authorities.
        distance: how far (L1, hubs plus authorities) the scores may still be from
            the iteration's limit: ``error * r / (1 - r)`` for the observed rate ``r``
            of the last step, or the fallback's residual. A score at or below it
            cannot be told from 0 (a page whose limit is 0 keeps some of it).
    """

    hubs: np.ndarray
    authorities: np.ndarray
    iterations: int
    error: float
    distance: float = 0.0


@dataclass
class RefreshReport:
    """Outcome of one refresh of one algorithm.

    Attributes:
        algorithm: "pagerank" or "wpr".
        fresh: the certified relative bound is within the tolerance (and every
            ``max_abs_bound <= max_error`` when that is set). Never true otherwise.
        bound: certified ``||y_exact - y||_1 <= (||r||_1 + drift) / (1 - d)``, paper
            scale: ``||r||_1`` of the kept residual, summed exactly at the end of the
            refresh, and ``drift`` the rounding that the pushes since ``r`` was last
            recomputed may have left in it (:func:`ranker.bounds.rounding_drift`).
        total: ``sum(y)``.
        moved_ids: live pages whose ``y`` moved by more than the publish threshold
            since they were last published; ``moved_scores`` their new ``y``.
        mode: "local" (frontier push), "global" (sweeps) or "cold" (solved from
            scratch, by sweeps from ``y = 1``).
        pushes: single-page pushes done (sweeps included).
        seconds: wall time of the refresh.
        relative_bound: ``bound / total`` (what ``tolerance`` is compared with).
        residual_max: ``max |r|``.
        max_abs_bound: certified ``max |y_exact - y|`` (inf if not certifiable).
        work: link entries visited (column updates, pushes, sweeps).
        sweeps: global sweeps done.
    """

    algorithm: str
    fresh: bool
    bound: float
    total: float
    moved_ids: np.ndarray
    moved_scores: np.ndarray
    mode: str
    pushes: int
    seconds: float
    relative_bound: float = 0.0
    residual_max: float = 0.0
    max_abs_bound: float = 0.0
    work: int = 0
    sweeps: int = 0
