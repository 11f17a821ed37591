"""HITS (Kleinberg 1999) by power iteration on a (small, query-time) subgraph.

From all-ones hub and authority vectors, repeat ``a = A^T h``, ``h = A a``,
normalising each (unit L2 norm or unit sum) until the L1 change of both vectors
in one step is below ``tol``. ``A``'s values are link weights, so host-level
weighting (k links from one host to a page count 1/k each) is applied by the
caller through the matrix values.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import scipy.sparse as sp

from ranker.pagerank import check_iteration_args, clean_links, validate_adjacency
from ranker.results import HitsResult
from rankstream.errors import ConvergenceError, InputError

Normalization = Literal["l2", "sum"]


def _normalise(vector: np.ndarray, how: Normalization) -> None:
    """Scale ``vector`` in place to unit L2 norm or unit sum (it is non-zero, >= 0)."""
    size = float(np.linalg.norm(vector)) if how == "l2" else float(vector.sum())
    vector /= size


def hits(
    A: object,
    *,
    tol: float = 1e-10,
    max_iter: int = 1000,
    normalize: Normalization = "l2",
) -> HitsResult:
    """Hub and authority scores of the graph with weighted adjacency ``A`` (row = source).

    Args:
        A: square scipy sparse matrix/array; ``A[m, n] > 0`` is the weight of link
            ``m -> n``. Self links and explicit zeros are dropped (algorithms.md);
            duplicate entries add up.
        tol: stop when ``||a_k - a_{k-1}||_1 + ||h_k - h_{k-1}||_1 < tol``.
        max_iter: step cap; :class:`ConvergenceError` after it.
        normalize: ``"l2"`` (Kleinberg) or ``"sum"`` (networkx's convention).

    A graph without links returns all-zero hubs and authorities (``iterations=1``,
    ``error=0``): the first step gives ``a = A^T h = 0`` exactly, so zero is what the
    iteration produces and it says truthfully that no page has any hub or authority
    evidence; a uniform vector would invent equal evidence and could not be told
    apart from a genuinely symmetric graph. Once any link exists, ``a`` and ``h``
    stay non-zero (a page with an out-link always points at a page with authority).
    """
    matrix = validate_adjacency(A)
    check_iteration_args(tol, max_iter)
    if normalize not in ("l2", "sum"):
        raise InputError(f"normalize must be 'l2' or 'sum', got {normalize!r}", where="normalize")
    n = matrix.shape[0]
    if n == 0:
        return HitsResult(np.zeros(0), np.zeros(0), 0, 0.0)
    links = clean_links(matrix)
    if links.nnz == 0:
        return HitsResult(np.zeros(n), np.zeros(n), 1, 0.0)
    links_t = sp.csr_array(links.T.tocsr())

    hubs = np.ones(n)
    _normalise(hubs, normalize)
    authorities = hubs.copy()
    change = np.empty(n)
    error = float("inf")
    for step in range(1, max_iter + 1):
        new_authorities = links_t @ hubs
        _normalise(new_authorities, normalize)
        new_hubs = links @ new_authorities
        _normalise(new_hubs, normalize)
        np.subtract(new_authorities, authorities, out=change)
        error = float(np.abs(change, out=change).sum())
        np.subtract(new_hubs, hubs, out=change)
        error += float(np.abs(change, out=change).sum())
        hubs, authorities = new_hubs, new_authorities
        if error < tol:
            return HitsResult(hubs, authorities, step, error)
    raise ConvergenceError(
        f"hits did not reach tol={tol:g} in {max_iter} steps (last L1 change {error:.3g})",
        iterations=max_iter,
        error=error,
    )
