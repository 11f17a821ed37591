"""HITS (Kleinberg 1999) on a (small, query-time) subgraph.

From all-ones hub and authority vectors, repeat ``a = A^T h``, ``h = A a``,
normalising each (unit L2 norm or unit sum) until the L1 change of both vectors
in one step is below ``tol``. ``A``'s values are link weights, so host-level
weighting (k links from one host to a page count 1/k each) is applied by the
caller through the matrix values.

What the iteration converges to: ``a_k`` is proportional to ``(A^T A)^(k-1) A^T 1``,
so its limit is the projection of the first authority vector ``A^T 1`` onto the top
eigenspace of ``A^T A`` (equivalently, the hubs converge to the projection of the
all-ones start onto the top eigenspace of ``A A^T``, and ``h = A a``). When the top
eigenvalue is simple that is the principal eigenvector; when it is degenerate (two
disjoint identical stars, an in-star and an out-star of equal size) it is the one
mix of the eigenspace that the all-ones start selects, not an arbitrary eigenvector.

Each step shrinks the error by ``lambda_2 / lambda_1`` of ``A^T A``. Query-time base
sets often hold near-equal stars (many root pages with exactly ``t`` in-linkers) with
``lambda_2 / lambda_1`` around 0.999, where the iteration would need ~10^5 steps. So
after ``_POWER_STEPS`` steps (or earlier, once the observed contraction rate predicts
it cannot finish within them) the same limit is computed by Lanczos on
``x -> A^T (A x)`` started from ``A^T 1``, never restarted and fully reorthogonalised:
eigenvalues within ``tol`` (relative) of the largest form the top eigenspace,
``A^T 1`` is projected onto it, one HITS step polishes the result, and an explicit
residual check certifies it.

Why not a restarted eigensolver (ARPACK's ``eigsh``, used before): a Krylov space
grown from one start vector holds one direction per DISTINCT eigenvalue, which is
exactly the start's projection, so a base set of many identical stars (eigenvalue
50 a hundred times over, 49 as often) is done in three steps, with a breakdown that
means the answer is exact. ``eigsh`` instead hunted for a whole basis of the
degenerate eigenspace from random restarts: 200 such stars took 3 s, 300 failed
within ``max_iter`` (review of session 23).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Literal

import numpy as np
import scipy.sparse as sp
from scipy.linalg import eigh_tridiagonal, eigvalsh_tridiagonal
from threadpoolctl import ThreadpoolController

from ranker.pagerank import check_iteration_args, clean_links, validate_adjacency
from ranker.results import HitsResult
from rankstream.errors import ConvergenceError, InputError

Normalization = Literal["l2", "sum"]

# Power steps before the Lanczos fallback: well-separated base sets converge in
# 20-100 steps, and beyond that Lanczos reaches machine precision in fewer mat-vecs.
_POWER_STEPS = 100
# Steps before the contraction rate (ratio of successive changes) is trusted.
_WARMUP = 10
# Up to this many pages the fallback uses a dense eigh (ARPACK needs k < n anyway).
_DENSE_LIMIT = 64
# The Lanczos basis is kept whole, for the reorthogonalisation and the projection,
# which cost about 8 * n * j^2 flops over j steps on n pages. Both are capped: at
# most this many bytes of basis, and about a second of reorthogonalisation (a spectrum
# with dozens of eigenvalues within 1e-7 of the top took 937 steps, 14.6 s, on 6,000
# pages; the restarted solver used before gave up on it).
_BASIS_BYTES = 256 * 1024 * 1024
_REORTH_FLOPS = 2e9
# Mat-vecs spent after the eigensolver: one polishing HITS step, two for the check.
_CHECK_APPLICATIONS = 3
# Lanczos runs until its top Ritz pairs' residuals are this small (relative to the
# largest Ritz value), whatever ``tol``: near working precision with full
# reorthogonalisation, and a few steps more than a tenth of tol took.
_RITZ_PRECISION = 1e-12


class _BudgetExhausted(Exception):
    """The Lanczos fallback would exceed what is left of ``max_iter``."""


class _StepsCapped(Exception):
    """The Lanczos fallback would exceed its memory and time caps (not ``max_iter``)."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps)
        self.steps = steps


@cache
def _blas_threads() -> ThreadpoolController:
    """The BLAS thread-pool controller, built once on first use (it scans loaded libraries)."""
    return ThreadpoolController()


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
        tol: the power iteration stops when the distance to its limit, estimated as
            ``e * r / (1 - r)`` from the last L1 change ``e = ||a_k - a_{k-1}||_1 +
            ||h_k - h_{k-1}||_1`` and its ratio ``r`` to the one before (from step 3
            on), is below ``tol``; a Lanczos result (run to working precision) is
            accepted when its relative residual
            ``||A^T A a - lam a|| / lam + ||A A^T h - lam h|| / lam`` (unit-L2 ``a``,
            ``h``) is ``<= tol``. Eigenvalues within ``tol`` (relative) of the largest
            are treated as one degenerate eigenvalue.
        max_iter: cap on ``iterations``; :class:`ConvergenceError` when it is hit.
        normalize: ``"l2"`` (Kleinberg) or ``"sum"`` (networkx's convention).

    Returns:
        ``HitsResult`` whose ``iterations`` counts power steps plus applications of
        ``x -> A^T (A x)`` by the fallback (each costs what one power step costs; the
        dense fallback for <= 64 pages counts ``n``), and whose ``error`` is the last
        L1 change, or the relative residual above when the fallback answered.

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
    # HITS does not depend on the weights' scale, but floating point does: weights of
    # 1e-170 or 1e160 underflowed or overflowed A^T A into NaN. Largest weight 1.
    links = sp.csr_array((links.data / links.data.max(), links.indices, links.indptr),
                         shape=links.shape)
    links_t = sp.csr_array(links.T.tocsr())

    hubs, authorities, steps, error, distance = _power_iteration(
        links, links_t, tol, min(max_iter, _POWER_STEPS), normalize
    )
    if distance < tol:
        return HitsResult(hubs, authorities, steps, error, max(distance, error))
    failure = f"hits did not reach tol={tol:g} in {max_iter} iterations"
    if steps >= max_iter:
        raise ConvergenceError(f"{failure} (last L1 change {error:.3g})",
                               iterations=steps, error=error)
    try:
        hubs, authorities, applications, residual = _eigen_hits(
            links, links_t, tol, max_iter - steps
        )
    except _BudgetExhausted:
        raise ConvergenceError(
            f"{failure}: {steps} power steps (last L1 change {error:.3g}), then the "
            "Lanczos fallback ran out of iterations",
            iterations=max_iter, error=error,
        ) from None
    except _StepsCapped as capped:
        raise ConvergenceError(
            f"hits did not reach tol={tol:g}: {steps} power steps (last L1 change "
            f"{error:.3g}), then the Lanczos fallback reached its cap of {capped.steps} "
            f"steps on {n} pages (top eigenvalues too close together)",
            iterations=steps + capped.steps, error=error,
        ) from None
    iterations = steps + applications
    if not residual <= tol:  # also catches NaN
        raise ConvergenceError(
            f"hits: Lanczos fallback residual {residual:.3g} above tol={tol:g}",
            iterations=iterations, error=residual,
        )
    if normalize == "sum":
        _normalise(hubs, "sum")
        _normalise(authorities, "sum")
    return HitsResult(hubs, authorities, iterations, residual, residual)


def _power_iteration(
    links: sp.csr_array, links_t: sp.csr_array, tol: float, limit: int, how: Normalization
) -> tuple[np.ndarray, np.ndarray, int, float, float]:
    """Kleinberg's iteration from all ones for at most ``limit`` steps.

    Returns ``(hubs, authorities, steps, last L1 change, estimated distance to the
    limit)``, the distance infinite unless it was accepted (below ``tol``); it stops
    early when it is, or when the change's contraction rate says that ``limit``
    steps will not get it there.
    """
    n = links.shape[0]
    hubs = np.ones(n)
    _normalise(hubs, how)
    authorities = hubs.copy()
    change = np.empty(n)
    error = previous = math.inf
    for step in range(1, limit + 1):
        new_authorities = links_t @ hubs
        _normalise(new_authorities, how)
        new_hubs = links @ new_authorities
        _normalise(new_hubs, how)
        np.subtract(new_authorities, authorities, out=change)
        error = float(np.abs(change, out=change).sum())
        np.subtract(new_hubs, hubs, out=change)
        error += float(np.abs(change, out=change).sum())
        hubs, authorities = new_hubs, new_authorities
        rate = error / previous
        # Accepted once the distance to the limit, estimated from the contraction
        # rate of two steps past the first (which only leaves the all-ones start), is
        # below tol. The change alone was not enough: two eigenvalues 2.5e-8 apart,
        # the start almost all on the lower one, changed by 7.6e-9 at step 2 and the
        # answer was the lower one's eigenvector, 12.7 (L1) from the limit.
        distance = 0.0 if error == 0.0 else (
            error * rate / (1.0 - rate) if step >= 3 and rate < 1.0 else math.inf)
        if distance < tol:
            return hubs, authorities, step, error, distance
        # The change shrinks by ~lambda_2/lambda_1 per step: with a rate r it needs
        # log(tol/error)/log(r) more steps. Only a confident "too many" switches early.
        if step >= _WARMUP and rate < 1.0:
            steps_needed = math.log(tol / error) / math.log(rate)
            if steps_needed > limit - step:
                return hubs, authorities, step, error, math.inf
        previous = error
    return hubs, authorities, limit, error, math.inf


def _eigen_hits(
    links: sp.csr_array, links_t: sp.csr_array, tol: float, budget: int
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """The iteration's limit by Lanczos/eigh; ``(hubs, authorities, applications, residual)``.

    Hubs and authorities have unit L2 norm. Raises :class:`_BudgetExhausted` when
    more than ``budget`` applications of ``A^T A`` would be needed.
    """
    n = links.shape[0]
    start = links_t @ np.ones(n)  # the iteration's first authority vector, A^T 1
    start /= np.linalg.norm(start)
    solver_budget = budget - _CHECK_APPLICATIONS
    if n <= min(_DENSE_LIMIT, solver_budget):
        # Forming A^T A densely costs about n applications; when they do not fit the
        # budget, Lanczos may still (63 pages were refused after 10 steps, while 65
        # were solved in 15).
        applications = n
        values, vectors = np.linalg.eigh((links_t @ links).toarray())
        top = vectors[:, values >= values.max() * (1.0 - tol)]
        # Projecting the start onto the top eigenspace is exactly what the iteration
        # converges to, degenerate or not; it also fixes the sign (A^T 1 >= 0 and the
        # limit of non-negative iterates is >= 0).
        authorities = top @ (top.T @ start)
    else:
        cap = max(1, min(_BASIS_BYTES // (8 * n), int(math.sqrt(_REORTH_FLOPS / (8 * n)))))
        steps = min(solver_budget, cap)
        if steps < 1:
            raise _BudgetExhausted
        # Its BLAS calls are small (a few dozen basis vectors); with several threads
        # they mostly wait for each other on a busy 2-core machine.
        with _blas_threads().limit(limits=1, user_api="blas"):
            authorities, applications = _krylov_projection(links, links_t, start, tol, steps,
                                                           capped=cap < solver_budget)
    # Clipping only removes rounding specks.
    authorities = np.maximum(authorities, 0.0)
    # One polishing HITS step (exact zeros for pages without in-links), then the check.
    hubs = _unit(links @ authorities)
    authorities = _unit(links_t @ hubs)
    image = links_t @ (links @ authorities)
    value = float(authorities @ image)
    hubs = _unit(links @ authorities)
    hub_image = links @ (links_t @ hubs)
    if value <= 0.0 or not math.isfinite(value):
        return hubs, authorities, applications + _CHECK_APPLICATIONS, math.inf
    residual = float(np.linalg.norm(image - value * authorities)) / value
    residual += float(np.linalg.norm(hub_image - value * hubs)) / value
    return hubs, authorities, applications + _CHECK_APPLICATIONS, residual


def _krylov_projection(links: sp.csr_array, links_t: sp.csr_array, start: np.ndarray,
                       tol: float, steps: int, *, capped: bool) -> tuple[np.ndarray, int]:
    """``start`` projected onto the top eigenspace of ``A^T A``, by Lanczos from it.

    Returns ``(projection, applications)``. Stops at a breakdown (the Krylov space is
    invariant: the projection is exact) or once the top Ritz values' residuals
    ``beta * |s_last|`` are at working precision (:data:`_RITZ_PRECISION`, relative),
    not at ``tol``: a small residual says a Ritz pair is near SOME eigenpair, not the
    top one, and the start itself (all but 4.5% on an in-star's eigenvector, 0.2%
    below the top eigenvalue) was accepted at tol 1e-3 after one step, nearly
    orthogonal to the limit. When ``steps`` steps
    did not get there, raises :class:`_StepsCapped` if they were the caps' (``capped``),
    else :class:`_BudgetExhausted`.
    """
    n = start.size
    basis = np.empty((min(steps + 1, 16), n))
    basis[0] = start
    alphas: list[float] = []
    betas: list[float] = []
    for j in range(steps):
        w = links_t @ (links @ basis[j])
        alphas.append(float(basis[j] @ w))
        done = basis[: j + 1]
        # Classical Gram-Schmidt twice: orthogonal to working precision.
        w -= done.T @ (done @ w)
        w -= done.T @ (done @ w)
        beta = float(np.linalg.norm(w))
        # The top Ritz values and only their vectors: all of them at every step made
        # the fallback cubic in its steps (14.6 s for 937 steps on 3,000 pages).
        diagonal, off = np.array(alphas), np.array(betas)
        largest = float(eigvalsh_tridiagonal(diagonal, off, select="i",
                                             select_range=(j, j))[0])
        scale = max(largest, np.finfo(float).tiny)
        # Ritz values >= largest * (1 - tol): "v" selects the half-open (low, high].
        low = np.nextafter(largest * (1.0 - tol), -np.inf) if j else -np.inf
        _, ritz = eigh_tridiagonal(diagonal, off, select="v", select_range=(low, np.inf))
        if beta <= _RITZ_PRECISION * scale or (
                beta * float(np.abs(ritz[-1]).max()) <= _RITZ_PRECISION * scale):
            # In the Lanczos basis the start is e_1: its projection onto the top Ritz
            # vectors has coordinates ritz_top @ ritz_top[0].
            return done.T @ (ritz @ ritz[0]), j + 1
        if j + 1 == steps:
            break
        if j + 1 == basis.shape[0]:
            grown = np.empty((min(2 * basis.shape[0], steps + 1), n))
            grown[: j + 1] = done
            basis = grown
        basis[j + 1] = w / beta
        betas.append(beta)
    raise _StepsCapped(steps) if capped else _BudgetExhausted


def _unit(vector: np.ndarray) -> np.ndarray:
    """``vector`` scaled to unit L2 norm (left as is when it is zero)."""
    size = float(np.linalg.norm(vector))
    return vector / size if size > 0.0 else vector
