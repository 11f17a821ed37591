"""Tests of the cold Weighted PageRank solver and its weight matrix."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ranker.weighted_pagerank import weighted_pagerank, wpr_matrix
from rankstream.errors import ConvergenceError, InputError
from tests.reference_algorithms import (
    ROUNDED_6,
    adjacency_matrix,
    random_edges,
    reference_weighted_pagerank,
    reference_wpr_weights,
)

FIG2_EDGES = [(0, 1), (0, 2), (1, 2), (2, 0), (2, 1)]


def assert_weights_match_reference(num_nodes: int, edges: list[tuple[int, int]]) -> None:
    weights = wpr_matrix(adjacency_matrix(num_nodes, edges))
    expected = reference_wpr_weights(num_nodes, edges)
    coo = weights.tocoo()
    got = {(int(m), int(n)): float(w) for m, n, w in zip(coo.row, coo.col, coo.data, strict=True)}
    assert got.keys() == expected.keys()
    for link, value in expected.items():
        assert got[link] == pytest.approx(value, rel=1e-12, abs=1e-15)


def test_fig2_vector() -> None:
    result = weighted_pagerank(adjacency_matrix(3, FIG2_EDGES))
    np.testing.assert_allclose(result.scores, [0.233671, 0.266775, 0.442965], atol=ROUNDED_6)
    assert result.bound <= 1e-10
    assert result.total == pytest.approx(result.scores.sum())


def test_fig2_weights() -> None:
    # I = (1, 2, 2), O = (2, 1, 2). Row A: R = {B, C}, sum I = 4, sum O = 3.
    weights = wpr_matrix(adjacency_matrix(3, FIG2_EDGES)).toarray()
    expected = np.array([
        [0.0, (2 / 4) * (1 / 3), (2 / 4) * (2 / 3)],
        [0.0, 0.0, 1.0],
        [(1 / 3) * (2 / 3), (2 / 3) * (1 / 3), 0.0],
    ])
    np.testing.assert_allclose(weights, expected, rtol=1e-14)


def test_equal_share_when_every_target_has_no_out_links() -> None:
    # 0 -> {1, 2, 3}; none of them links anywhere; 4 -> 1 raises I[1] to 2.
    weights = wpr_matrix(adjacency_matrix(5, [(0, 1), (0, 2), (0, 3), (4, 1)])).toarray()
    np.testing.assert_allclose(weights[0, 1:4], [(2 / 4) / 3, (1 / 4) / 3, (1 / 4) / 3])
    assert weights[4, 1] == pytest.approx(1.0)


FIXED_GRAPHS = [
    (3, FIG2_EDGES),
    (5, [(0, 1), (0, 2), (0, 3), (4, 1)]),
    (6, [(0, 1), (1, 2), (2, 0), (3, 0), (3, 4)]),  # 5 isolated, 4 dangling
    (4, []),
]


@pytest.mark.parametrize(("num_nodes", "edges"), FIXED_GRAPHS)
def test_fixed_graphs_match_reference(num_nodes: int, edges: list[tuple[int, int]]) -> None:
    assert_weights_match_reference(num_nodes, edges)
    result = weighted_pagerank(adjacency_matrix(num_nodes, edges))
    expected = reference_weighted_pagerank(num_nodes, edges)
    np.testing.assert_allclose(result.scores, expected, atol=1e-9)


@pytest.mark.parametrize("kind", ["gnp", "scale_free"])
@pytest.mark.parametrize("seed", [1, 2])
def test_random_graphs_match_reference(kind: str, seed: int) -> None:
    edges = random_edges(kind, 120, seed)
    num_nodes = 124
    assert_weights_match_reference(num_nodes, edges)
    alive = np.random.default_rng(seed).random(num_nodes) > 0.15
    result = weighted_pagerank(adjacency_matrix(num_nodes, edges), alive=alive, damping=0.9)
    expected = reference_weighted_pagerank(num_nodes, edges, alive=list(alive), damping=0.9)
    np.testing.assert_allclose(result.scores, expected, atol=1e-9)
    assert (result.scores[~alive] == 0.0).all()


def test_csr_matrix_input_and_messy_entries() -> None:
    clean = weighted_pagerank(adjacency_matrix(3, FIG2_EDGES)).scores
    messy = sp.csr_matrix(adjacency_matrix(3, [*FIG2_EDGES, (1, 1)]))
    messy[0, 1] = 7.0  # a value, not a second link
    np.testing.assert_allclose(weighted_pagerank(messy).scores, clean, atol=1e-12)


def test_warm_start_from_the_solution_takes_one_sweep() -> None:
    matrix = adjacency_matrix(90, random_edges("scale_free", 90, seed=5))
    cold = weighted_pagerank(matrix, tol=1e-12)
    warm = weighted_pagerank(matrix, tol=1e-10, start=cold.scores)
    assert warm.iterations == 1
    np.testing.assert_allclose(warm.scores, cold.scores, rtol=1e-14)


def test_empty_graph_returns_empty_arrays() -> None:
    assert weighted_pagerank(sp.csr_array((0, 0))).scores.shape == (0,)
    assert wpr_matrix(sp.csr_array((0, 0))).shape == (0, 0)


def test_max_iter_exhausted_raises_convergence_error() -> None:
    with pytest.raises(ConvergenceError) as caught:
        weighted_pagerank(adjacency_matrix(3, FIG2_EDGES), max_iter=1)
    assert caught.value.iterations == 1


@pytest.mark.parametrize(
    ("matrix", "kwargs", "message"),
    [
        (sp.csr_array((2, 3)), {}, "square"),
        (np.zeros((2, 2)), {}, "sparse"),
        (sp.csr_array((2, 2)), {"damping": -0.1}, "damping"),
        (sp.csr_array((2, 2)), {"start": np.ones(5)}, "shape"),
        (sp.csr_array((2, 2)), {"alive": np.ones(2)}, "boolean"),
    ],
)
def test_bad_input_raises_input_error(matrix: object, kwargs: dict[str, object],
                                      message: str) -> None:
    with pytest.raises(InputError, match=message):
        weighted_pagerank(matrix, **kwargs)  # type: ignore[arg-type]
    if not kwargs:
        with pytest.raises(InputError, match=message):
            wpr_matrix(matrix)


graphs = st.integers(min_value=1, max_value=12).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4 * n),
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs)
def test_row_weights_sum_to_at_most_one(graph: tuple[int, list[tuple[int, int]]]) -> None:
    num_nodes, edges = graph
    weights = wpr_matrix(adjacency_matrix(num_nodes, edges))
    # One stored entry per link; a link to a page without out-links may weigh 0.
    assert weights.nnz == len({(u, v) for u, v in edges if u != v})
    assert (weights.data >= 0).all()
    assert (weights.sum(axis=1) <= 1.0 + 1e-12).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=graphs,
    damping=st.floats(min_value=0.3, max_value=0.95),
    tol=st.floats(min_value=1e-8, max_value=1e-1),
)
def test_certified_bound_holds(graph: tuple[int, list[tuple[int, int]]], damping: float,
                               tol: float) -> None:
    num_nodes, edges = graph
    result = weighted_pagerank(adjacency_matrix(num_nodes, edges), damping=damping, tol=tol)
    exact = reference_weighted_pagerank(num_nodes, edges, damping=damping)
    assert result.bound <= tol
    assert np.abs(exact - result.scores).sum() <= result.bound + 1e-10 * max(1.0, exact.sum())
