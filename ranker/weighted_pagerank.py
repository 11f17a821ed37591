"""Cold Weighted PageRank (Xing & Ghorbani 2004) on the paper scale.

Definitions follow docs/algorithms.md:

    Win(m,n)  = I[n] / sum_{p in R(m)} I[p]
    Wout(m,n) = O[n] / sum_{p in R(m)} O[p]     (1 / |R(m)| when that sum is 0)
    y[n] = (1 - d) + d * sum_{m in B(n)} y[m] * Win(m,n) * Wout(m,n)

Every row of ``W = Win * Wout`` sums to at most 1 (a sum of products of
non-negative shares is at most the product of their sums), so the iteration is a
``d``-contraction in L1 and the same certified bound ``||r||_1 / (1 - d)`` as for
PageRank applies.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ranker.pagerank import (
    DEFAULT_TOL,
    check_alive,
    check_damping,
    check_iteration_args,
    check_start,
    damped_transpose,
    link_structure,
    resolved_tol,
    solve_fixed_point,
    teleport_base,
    validate_adjacency,
)
from ranker.results import RankResult


def wpr_weights(structure: sp.csr_array) -> sp.csr_array:
    """WPR weights on an already cleaned 0/1 link structure (row = source).

    Split out of :func:`wpr_matrix` so callers that have cleaned the graph
    (e.g. with an alive mask) do not validate it twice.
    """
    n = structure.shape[0]
    indptr, targets = structure.indptr, structure.indices
    out_count = np.diff(indptr)
    out_degree = out_count.astype(np.float64)
    in_degree = np.bincount(targets, minlength=n).astype(np.float64)
    # sum_{p in R(m)} I[p] and sum_{p in R(m)} O[p] for every source m at once.
    in_total = structure @ in_degree
    out_total = structure @ out_degree

    # sum I over R(m) >= 1 for every page with links (m's own link counts), so only
    # pages without links give 0 here, and they own no entries.
    row_in_scale = np.zeros(n)
    has_links = out_count > 0
    row_in_scale[has_links] = 1.0 / in_total[has_links]
    regular = out_total > 0
    row_out_scale = np.zeros(n)
    row_out_scale[regular] = 1.0 / out_total[regular]

    sources = np.repeat(np.arange(n, dtype=np.int64), out_count)
    win = in_degree[targets] * row_in_scale[sources]
    wout = out_degree[targets] * row_out_scale[sources]
    frontier = has_links & ~regular
    if frontier.any():
        # Every page in R(m) has no out-links: share equally, Wout = 1 / |R(m)|.
        equal_share = frontier[sources]
        wout[equal_share] = 1.0 / out_degree[sources[equal_share]]
    return sp.csr_array((win * wout, targets, indptr), shape=(n, n))


def wpr_matrix(A: object) -> sp.csr_array:
    """``W[m, n] = Win(m,n) * Wout(m,n)`` (row = source), so ``y = (1-d) + d * W^T y``.

    ``A`` is treated as 0/1 link structure: explicit zeros and self links are
    dropped, duplicates count once. Rows sum to at most 1. ``W`` stores exactly one
    entry per link, in ``A``'s canonical order; a link to a page without out-links
    stores an explicit 0 (``Wout = 0``) unless every target of its source is such a
    page, so the structure of ``W`` always equals the link structure.
    """
    return wpr_weights(link_structure(validate_adjacency(A)))


def weighted_pagerank(
    A: object,
    *,
    damping: float = 0.85,
    tol: float | None = None,
    max_iter: int = 1000,
    start: object = None,
    alive: object = None,
) -> RankResult:
    """Weighted PageRank on the paper scale (row = source; values ignored).

    Args:
        A: square scipy sparse matrix/array, a stored non-zero ``A[m, n]`` is ``m -> n``.
        damping: ``d`` in (0, 1).
        tol: certified L1 bound ``||y_exact - y||_1`` to reach (absolute, paper scale);
            default as :func:`ranker.pagerank.pagerank`'s.
        max_iter: sweep cap; :class:`ConvergenceError` after it or on a stall.
        start: warm start (previous ``y``), length n; default 1 on live pages.
        alive: optional bool mask; dead ids lose every link (so in- and out-degrees
            and therefore the weights are those of the live graph), ``b = 0``, score 0.

    Returns:
        :class:`RankResult` with ``scores = y``.
    """
    matrix = validate_adjacency(A)
    n = matrix.shape[0]
    d = check_damping(damping)
    check_iteration_args(DEFAULT_TOL if tol is None else tol, max_iter)
    live = check_alive(alive, n)
    target = resolved_tol(tol, d, live, n)
    base = teleport_base(None, n, d, live)
    warm = check_start(start, n, live)
    if n == 0:
        return RankResult(np.zeros(0), 0, 0.0, 0.0, 0.0)
    damped = damped_transpose(wpr_weights(link_structure(matrix, live)), d)
    y, residual, sweeps = solve_fixed_point(
        damped, base, damping=d, tol=target, max_iter=max_iter, start=warm,
        algorithm="weighted_pagerank",
    )
    return RankResult(y, sweeps, residual, residual / (1.0 - d), float(y.sum()))
