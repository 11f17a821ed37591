"""Result records returned by the static solvers.

They are frozen so a result handed to another component (the publisher, a test,
the dynamic engine as a warm start) cannot be changed behind the solver's back;
the arrays inside are still ordinary numpy arrays owned by the caller.
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
        residual_l1: ``||r||_1`` of the returned paper-scale vector, where
            ``r = b + d*M*y - y``; computed for exactly the vector returned.
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
    """

    hubs: np.ndarray
    authorities: np.ndarray
    iterations: int
    error: float
