"""The certified bounds of ranker.bounds hold for any estimate, not only converged ones.

For a small random graph the exact paper-scale PageRank comes from the slow reference
solver; any vector ``y`` near it has a residual ``r = b + d*M*y - y``, and what
``r`` certifies must cover the true error of ``y``, whatever the perturbation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ranker import EdgeBatch, LinkGraph, LiveRanks
from ranker.bounds import (
    MIN_TOLERANCE,
    max_abs_bound,
    probability_bound,
    push_thresholds,
    tolerance_floor,
)
from rankstream.errors import InputError
from tests.reference_algorithms import random_edges, reference_pagerank

DAMPING = 0.85


def _transition(num_nodes: int, edges: list[tuple[int, int]]) -> np.ndarray:
    """Column-stochastic on pages with out-links, zero columns on dangling pages."""
    matrix = np.zeros((num_nodes, num_nodes))
    out_degree = np.zeros(num_nodes)
    for src, _ in edges:
        out_degree[src] += 1
    for src, dst in edges:
        matrix[dst, src] = 1.0 / out_degree[src]
    return matrix


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["gnp", "scale_free"]),
       scale=st.sampled_from([1e-9, 1e-4, 1e-1, 1.0]))
def test_the_residual_certifies_the_error_of_any_estimate(seed, kind, scale):
    num_nodes = 30
    edges = random_edges(kind, num_nodes, seed)
    exact = reference_pagerank(num_nodes, edges, damping=DAMPING)
    rng = np.random.default_rng(seed)
    y = np.maximum(exact + scale * rng.standard_normal(num_nodes) * exact, 0.0)
    r = (1.0 - DAMPING) + DAMPING * _transition(num_nodes, edges) @ y - y
    error = exact - y
    paper = np.abs(r).sum() / (1.0 - DAMPING)
    slack = 1e-12 * exact.sum()  # the reference solve's own accuracy
    assert np.abs(error).sum() <= paper + slack
    assert np.abs(error).max() <= max_abs_bound(np.abs(r).max(), y.max(), DAMPING) + slack
    x_error = np.abs(exact / exact.sum() - y / y.sum()).sum()
    assert x_error <= probability_bound(paper, y.sum()) + 1e-12


@given(tolerance=st.floats(1e-9, 1e-2), total=st.floats(1.0, 1e7),
       y_max=st.floats(0.0, 1e4), live=st.integers(1, 10**7),
       eps_scale=st.just(1.0) | st.floats(1.0, 1e6), max_error=st.none() | st.floats(1e-9, 1.0),
       unseen_share=st.just(0.0) | st.floats(0.0, 0.5))
def test_push_thresholds_reach_the_targets_they_promise(tolerance, total, y_max, live,
                                                        eps_scale, max_error, unseen_share):
    # unseen: rounding the certificates add, a share of the per-page room it leaves.
    unseen = unseen_share * (max_error or 0.0) * (1.0 - DAMPING)
    target, eps = push_thresholds(tolerance=tolerance, damping=DAMPING, total=total,
                                  y_max=y_max, live_count=live, eps_scale=eps_scale,
                                  max_error=max_error, unseen=unseen)
    assert target == tolerance * (1.0 - DAMPING) * total
    assert 0.0 < eps <= target
    assert eps <= eps_scale * target / live * (1 + 1e-12)
    if eps_scale == 1.0:
        # At its floor, every page at or below the threshold keeps ||r||_1 in the target.
        assert live * eps <= target * (1 + 1e-12)
    if max_error is not None:
        # Every page at or below the threshold certifies the per-page accuracy asked for,
        # the unseen rounding included.
        assert max_abs_bound(eps, y_max, DAMPING, unseen) <= max_error * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 10_000), size=st.integers(1, 40),
       spread=st.sampled_from([1e-9, 1e-3, 1.0, 1e3]))
def test_the_probability_bound_holds_for_any_two_vectors(seed, size, spread):
    # probability_bound only uses ||y_exact - y||_1 <= B: check it on arbitrary
    # non-negative pairs, lopsided ones included (one part of y far off).
    rng = np.random.default_rng(seed)
    exact = rng.random(size) * rng.choice([1.0, 1e-6], size)
    y = np.maximum(exact + spread * rng.standard_normal(size) * rng.random(size), 0.0)
    if y.sum() == 0.0 or exact.sum() == 0.0:
        return
    bound = np.abs(exact - y).sum()
    x_error = np.abs(exact / exact.sum() - y / y.sum()).sum()
    assert x_error <= probability_bound(bound, y.sum()) * (1 + 1e-12) + 1e-15


def test_bounds_at_their_edges():
    assert probability_bound(5.0, 4.0) == 2.0  # the bound exceeds the total: nothing known
    assert probability_bound(0.0, 4.0) == 0.0
    assert probability_bound(1.0, 4.0) == 0.5  # 2B/S, not the looser 2B/(S-B) = 2/3
    assert probability_bound(1.0, 0.0) == 2.0  # an empty graph's total
    assert max_abs_bound(1.0 - DAMPING, 1.0, DAMPING) == np.inf
    assert max_abs_bound(0.0, 3.0, DAMPING) == 0.0
    # Unseen rounding is amplified like the rest (y_exact may exceed y_max by E).
    rho = 0.5
    assert max_abs_bound(rho * (1 - DAMPING), 2.0, DAMPING, unseen=1e-3) == pytest.approx(
        (rho * 2.0 + 1e-3 / (1 - DAMPING)) / (1 - rho))


def test_the_tolerance_floor_grows_as_one_over_one_minus_d() -> None:
    assert tolerance_floor(0.5) == tolerance_floor(0.85) == MIN_TOLERANCE
    assert tolerance_floor(0.9999) == pytest.approx(1.5e-9)
    with pytest.raises(InputError, match=r"at least 1\.5e-09 at damping 0\.9999"):
        LiveRanks(damping=0.9999, tolerance=1e-12)


@pytest.mark.parametrize("damping", [0.999, 0.9999])
def test_a_fresh_report_holds_for_the_exactly_recomputed_residual(damping: float) -> None:
    """Near d = 1 hundreds of sweeps leave rounding drift in the kept residual, which
    the bound divides by 1 - d: once, at d = 0.9999, a kept relative bound of 9.9e-13
    was called fresh where the exact residual's was 1.9e-10. The engine counts that
    drift and recomputes r when it stands in the way."""
    tolerance = tolerance_floor(damping)
    for seed in range(3):
        rng = np.random.default_rng(seed)
        n = 40
        graph = LinkGraph.from_id_edges(rng.integers(0, n, 160), rng.integers(0, n, 160),
                                        [f"p{i}" for i in range(n)])
        ranks = LiveRanks(graph, damping=damping, tolerance=tolerance, max_iter=200_000)
        # Every refresh also ends fresh: one whose residual meets the target but whose
        # unseen rounding does not recomputes r exactly instead of stopping short (the
        # stop rule once ignored that rounding, and a cold start once did not mark its
        # residual stale for the recomputation: a mutation review).
        for report in ranks.cold_start().values():
            assert report.fresh, (seed, report)
        for _ in range(3):
            src, dst = graph.edges()
            batch = EdgeBatch(insert_src=rng.integers(0, n, 2), insert_dst=rng.integers(0, n, 2),
                              delete_src=src[:1], delete_dst=dst[:1])
            for name, report in ranks.apply(batch).items():
                assert report.fresh, (seed, name, report.relative_bound, tolerance)
                engine = ranks.engines[name]
                engine.recompute_residual()
                exact_bound = engine.l1 / (1.0 - damping)
                assert exact_bound <= report.bound * (1 + 1e-9), (seed, name)
                assert exact_bound <= tolerance * report.total * (1 + 1e-9), (seed, name)
