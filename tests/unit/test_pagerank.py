"""Tests of the cold PageRank solver (ranker.pagerank)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ranker.pagerank import STALL_SWEEPS, pagerank, solve_fixed_point
from rankstream.errors import ConvergenceError, InputError
from tests.reference_algorithms import (
    ROUNDED_6,
    ROUNDED_8,
    adjacency_matrix,
    random_edges,
    reference_pagerank,
)

FIG2_EDGES = [(0, 1), (0, 2), (1, 2), (2, 0), (2, 1)]  # A->B, A->C, B->C, C->A, C->B
NX_EDGES = [(1, 2), (1, 3), (3, 1), (3, 2), (3, 5), (4, 5), (4, 6), (5, 4), (5, 6), (6, 4)]


def residual_l1(edges: list[tuple[int, int]], num_nodes: int, y: np.ndarray, damping: float,
                base: np.ndarray) -> float:
    """||b + d*M*y - y||_1 computed independently, link by link."""
    out_degree = [0] * num_nodes
    for src, _ in edges:
        out_degree[src] += 1
    image = base.copy()
    for src, dst in edges:
        image[dst] += damping * y[src] / out_degree[src]
    return float(np.abs(image - y).sum())


def networkx_pagerank(num_nodes: int, edges: list[tuple[int, int]], **kwargs: object) -> np.ndarray:
    graph = nx.DiGraph()
    graph.add_nodes_from(range(num_nodes))
    graph.add_edges_from(edges)
    ranks = nx.pagerank(graph, tol=1e-13, max_iter=10_000, **kwargs)
    return np.array([ranks[page] for page in range(num_nodes)])


def test_fig2_paper_and_probability_vectors() -> None:
    matrix = adjacency_matrix(3, FIG2_EDGES)
    paper = pagerank(matrix)
    np.testing.assert_allclose(paper.scores, [0.701754, 1.0, 1.298246], atol=ROUNDED_6)
    assert paper.total == pytest.approx(3.0, abs=1e-9)
    assert paper.bound <= 1e-10
    probability = pagerank(matrix, scale="probability")
    np.testing.assert_allclose(probability.scores, [0.233918, 0.333333, 0.432749], atol=ROUNDED_6)
    assert probability.scores.sum() == pytest.approx(1.0, abs=1e-15)


def test_networkx_test_graph_at_d09() -> None:
    matrix = adjacency_matrix(6, [(a - 1, b - 1) for a, b in NX_EDGES])
    result = pagerank(matrix, damping=0.9, scale="probability")
    expected = [0.03721197, 0.05395735, 0.04150565, 0.37508082, 0.20599833, 0.28624589]
    np.testing.assert_allclose(result.scores, expected, atol=ROUNDED_8)


def test_csr_matrix_and_csr_array_agree() -> None:
    array = adjacency_matrix(3, FIG2_EDGES)
    matrix = sp.csr_matrix(array)
    np.testing.assert_array_equal(pagerank(array).scores, pagerank(matrix).scores)


def test_isolated_page_gets_one_minus_d_and_dangling_mass_leaks() -> None:
    # 0 -> 1, 1 dangling, 2 isolated.
    result = pagerank(adjacency_matrix(3, [(0, 1)]), damping=0.85)
    np.testing.assert_allclose(result.scores, [0.15, 0.15 + 0.85 * 0.15, 0.15], atol=1e-12)
    assert result.total < 3.0


def test_graph_without_links_converges_in_one_sweep() -> None:
    result = pagerank(sp.csr_array((4, 4)), damping=0.8)
    np.testing.assert_allclose(result.scores, 0.2)
    assert result.iterations == 1
    # Exact, but certified with the rounding of its residual's computation.
    assert 0.0 < result.residual_l1 < 1e-14
    assert result.bound == pytest.approx(result.residual_l1 / 0.2)


def test_empty_graph_returns_empty_arrays() -> None:
    for scale in ("paper", "probability"):
        result = pagerank(sp.csr_array((0, 0)), scale=scale)
        assert result.scores.shape == (0,)
        assert result.iterations == 0


def test_explicit_zeros_self_links_and_duplicates_are_ignored() -> None:
    clean = pagerank(adjacency_matrix(3, FIG2_EDGES)).scores
    rows = [0, 0, 1, 2, 2, 1, 0, 0]
    cols = [1, 2, 2, 0, 1, 1, 1, 0]
    vals = [1.0, 2.0, 1.0, 1.0, 1.0, 5.0, 3.0, 0.0]  # dup 0->1, self 1->1, zero 0->0
    messy = sp.csr_array((vals, (rows, cols)), shape=(3, 3))
    messy = sp.csr_array((messy.data, messy.indices, messy.indptr), shape=(3, 3))
    np.testing.assert_allclose(pagerank(messy).scores, clean, atol=1e-12)


@pytest.mark.parametrize("kind", ["gnp", "scale_free"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_probability_scale_matches_networkx(kind: str, seed: int) -> None:
    edges = random_edges(kind, 200, seed)
    num_nodes = 205  # five isolated pages on top of the naturally dangling ones
    result = pagerank(adjacency_matrix(num_nodes, edges), scale="probability", tol=1e-11)
    expected = networkx_pagerank(num_nodes, edges)
    assert np.abs(result.scores - expected).sum() < 1e-9
    assert result.bound < 1e-9


@pytest.mark.parametrize("seed", [4, 5])
def test_personalised_teleport_matches_networkx_with_dangling_t(seed: int) -> None:
    edges = random_edges("scale_free", 150, seed)
    num_nodes = 153
    rng = np.random.default_rng(seed)
    teleport = rng.random(num_nodes) * (rng.random(num_nodes) < 0.3)
    teleport[0] = 1.0
    result = pagerank(adjacency_matrix(num_nodes, edges), scale="probability",
                      teleport=teleport * 7.0, damping=0.8)  # any positive scale
    t = {page: float(teleport[page]) for page in range(num_nodes)}
    expected = networkx_pagerank(num_nodes, edges, alpha=0.8, personalization=t, dangling=t)
    assert np.abs(result.scores - expected).sum() < 1e-9


FIXED_GRAPHS = [
    (3, FIG2_EDGES),
    (6, [(a - 1, b - 1) for a, b in NX_EDGES]),
    (5, [(0, 1), (1, 2), (2, 0), (3, 0)]),  # 4 isolated, 3 no in-links
    (4, [(0, 1), (0, 2), (0, 3)]),  # star of dangling pages
]


@pytest.mark.parametrize(("num_nodes", "edges"), FIXED_GRAPHS)
@pytest.mark.parametrize("scale", ["paper", "probability"])
def test_fixed_graphs_match_reference(num_nodes: int, edges: list[tuple[int, int]],
                                      scale: str) -> None:
    result = pagerank(adjacency_matrix(num_nodes, edges), scale=scale)  # type: ignore[arg-type]
    expected = reference_pagerank(num_nodes, edges, scale=scale)
    np.testing.assert_allclose(result.scores, expected, atol=1e-9)


@pytest.mark.parametrize("kind", ["gnp", "scale_free"])
@pytest.mark.parametrize("scale", ["paper", "probability"])
def test_random_graphs_with_teleport_and_alive_match_reference(kind: str, scale: str) -> None:
    rng = np.random.default_rng(11)
    edges = random_edges(kind, 60, seed=11)
    num_nodes = 63
    teleport = rng.random(num_nodes)
    alive = rng.random(num_nodes) > 0.2
    result = pagerank(adjacency_matrix(num_nodes, edges), scale=scale,  # type: ignore[arg-type]
                      teleport=teleport, alive=alive, damping=0.9)
    expected = reference_pagerank(num_nodes, edges, scale=scale, teleport=list(teleport),
                                  alive=list(alive), damping=0.9)
    np.testing.assert_allclose(result.scores, expected, atol=1e-9)
    assert (result.scores[~alive] == 0.0).all()


def test_alive_mask_equals_graph_without_the_dead_pages() -> None:
    edges = random_edges("gnp", 80, seed=3)
    alive = np.ones(80, dtype=bool)
    alive[[0, 5, 17]] = False
    masked = pagerank(adjacency_matrix(80, edges), alive=alive)
    survivors = [(u, v) for u, v in edges if alive[u] and alive[v]]
    dropped = pagerank(adjacency_matrix(80, survivors)).scores
    dropped[~alive] = 0.0
    np.testing.assert_allclose(masked.scores, dropped, atol=1e-10)


def test_reported_residual_is_that_of_the_returned_vector() -> None:
    edges = random_edges("scale_free", 120, seed=8)
    for tol in (1e-2, 1e-6, 1e-10):
        result = pagerank(adjacency_matrix(120, edges), tol=tol, damping=0.85)
        recomputed = residual_l1(edges, 120, result.scores, 0.85, np.full(120, 0.15))
        # Certified: the measured residual plus its computation's rounding (~1e-13).
        assert recomputed - 1e-13 <= result.residual_l1 <= recomputed + 1e-12
        assert result.bound == pytest.approx(result.residual_l1 / 0.15)
        assert result.bound <= tol


def test_warm_start_from_the_solution_takes_one_sweep() -> None:
    matrix = adjacency_matrix(100, random_edges("gnp", 100, seed=6))
    cold = pagerank(matrix, tol=1e-11)
    warm = pagerank(matrix, tol=1e-10, start=cold.scores)
    assert warm.iterations == 1
    np.testing.assert_allclose(warm.scores, cold.scores, rtol=1e-14)
    wild = pagerank(matrix, tol=1e-11, start=np.random.default_rng(0).random(100) * 50)
    np.testing.assert_allclose(wild.scores, cold.scores, atol=1e-11)


def test_warm_start_ignores_dead_entries() -> None:
    matrix = adjacency_matrix(10, [(i, (i + 1) % 10) for i in range(10)])
    alive = np.arange(10) != 4
    result = pagerank(matrix, start=np.full(10, 9.0), alive=alive)
    assert result.scores[4] == 0.0


def test_max_iter_exhausted_raises_convergence_error() -> None:
    with pytest.raises(ConvergenceError) as caught:
        pagerank(adjacency_matrix(3, FIG2_EDGES), max_iter=1)
    assert caught.value.iterations == 1
    assert caught.value.error > 1e-10


def test_residual_that_stops_shrinking_fails_before_max_iter() -> None:
    # In floating point PageRank nearly always lands on an exact fixed point, so a
    # real stall is hard to provoke; an operator breaking the contraction (identity:
    # the residual stays ||b||) exercises the guard deterministically.
    base = np.ones(4)
    with pytest.raises(ConvergenceError, match="stalled") as caught:
        solve_fixed_point(sp.eye_array(4, format="csr"), base, damping=0.5, tol=1e-9,
                          max_iter=10_000, start=None, algorithm="test")
    # The plain sweeps' stall hands over to the accurate steps, which stall too.
    assert caught.value.iterations == 2 * STALL_SWEEPS + 1
    assert caught.value.error == pytest.approx(8.0)


@pytest.mark.parametrize("pages", [500, 1500])
def test_a_star_converges_at_the_default_tolerance(pages: int) -> None:
    """A hub and its leaves linked both ways: the plain mat-vec's rounding at the hub
    (hundreds of in-links) stalled the sweeps just above the default tolerance,
    which the accurate steps reach (a review, session 29: "stalled at 1.26e-10")."""
    edges = [(0, leaf) for leaf in range(1, pages)] + [(leaf, 0) for leaf in range(1, pages)]
    result = pagerank(adjacency_matrix(pages, edges))
    exact = reference_pagerank(pages, edges)
    assert float(np.abs(result.scores - exact).sum()) <= result.bound


@pytest.mark.parametrize(
    ("matrix", "kwargs", "message"),
    [
        (sp.csr_array((3, 4)), {}, "square"),
        (np.eye(3), {}, "sparse"),
        (sp.csr_array(np.array([[0.0, -1.0], [0.0, 0.0]])), {}, "non-negative"),
        (sp.csr_array(np.array([[0.0, np.nan], [0.0, 0.0]])), {}, "finite"),
        (sp.csr_array((2, 2)), {"damping": 0.0}, "damping"),
        (sp.csr_array((2, 2)), {"damping": 1.0}, "damping"),
        (sp.csr_array((2, 2)), {"damping": 1.5}, "damping"),
        (sp.csr_array((2, 2)), {"tol": 0.0}, "tol"),
        (sp.csr_array((2, 2)), {"tol": "1e-3"}, "tol"),
        # Ints too large for a float: an OverflowError escaped (session 27's review).
        (sp.csr_array((2, 2)), {"tol": 10**400}, "tol"),
        (sp.csr_array((2, 2)), {"damping": 10**400}, "damping must be a number"),
        (sp.csr_array((2, 2)), {"teleport": [10**400, 1]}, "teleport must be a vector"),
        (sp.csr_array((2, 2)), {"start": [10**400, 1]}, "start must be a vector"),
        (sp.csr_array((2, 2)), {"damping": "x"}, "damping must be a number"),
        (sp.csr_array((2, 2)), {"damping": None}, "damping must be a number"),
        (sp.csr_array((2, 2)), {"max_iter": 0}, "max_iter"),
        (sp.csr_array((2, 2)), {"scale": "log"}, "scale"),
        (sp.csr_array((2, 2)), {"teleport": [1.0, -1.0]}, "non-negative"),
        (sp.csr_array((2, 2)), {"teleport": [0.0, 0.0]}, "positive"),
        (sp.csr_array((2, 2)), {"teleport": [1.0]}, "shape"),
        (sp.csr_array((2, 2)), {"start": [1.0, 1.0, 1.0]}, "shape"),
        (sp.csr_array((2, 2)), {"start": [1.0, np.inf]}, "finite"),
        (sp.csr_array((2, 2)), {"alive": [1, 1]}, "boolean"),
        (sp.csr_array((2, 2)), {"alive": np.ones(3, dtype=bool)}, "shape"),
        (sp.csr_array((2, 2)), {"teleport": [0.0, 1.0], "alive": np.array([True, False])},
         "positive"),
    ],
)
def test_bad_input_raises_input_error(matrix: object, kwargs: dict[str, object],
                                      message: str) -> None:
    with pytest.raises(InputError, match=message):
        pagerank(matrix, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("weight", [1e308, 5e-324])
def test_teleport_weights_at_the_ends_of_float64_are_only_a_direction(weight: float) -> None:
    """Their sum overflowed to inf (all-zero scores, certified) or the scaling did."""
    matrix = adjacency_matrix(3, FIG2_EDGES)
    uniform = pagerank(matrix).scores
    np.testing.assert_allclose(pagerank(matrix, teleport=[weight] * 3).scores, uniform,
                               rtol=1e-9)


def test_all_dead_graph_scores_zero() -> None:
    matrix = adjacency_matrix(3, FIG2_EDGES)
    dead = np.zeros(3, dtype=bool)
    for scale in ("paper", "probability"):
        result = pagerank(matrix, alive=dead, scale=scale)
        np.testing.assert_array_equal(result.scores, 0.0)
        assert result.total == 0.0


graphs = st.integers(min_value=1, max_value=12).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4 * n),
    )
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=graphs,
    damping=st.floats(min_value=0.3, max_value=0.95),
    tol=st.floats(min_value=1e-8, max_value=1e-1),
    use_teleport=st.booleans(),
    use_start=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_certified_bound_holds(graph: tuple[int, list[tuple[int, int]]], damping: float,
                               tol: float, use_teleport: bool, use_start: bool,
                               seed: int) -> None:
    num_nodes, edges = graph
    rng = np.random.default_rng(seed)
    teleport = rng.random(num_nodes) + 0.01 if use_teleport else None
    start = rng.uniform(-1.0, 5.0, num_nodes) if use_start else None
    matrix = adjacency_matrix(num_nodes, edges)
    paper = pagerank(matrix, damping=damping, tol=tol, teleport=teleport, start=start)
    exact = reference_pagerank(num_nodes, edges, damping=damping, teleport=teleport)
    slack = 1e-10 * max(1.0, float(exact.sum()))  # the reference's own error
    assert paper.bound <= tol
    assert np.abs(exact - paper.scores).sum() <= paper.bound + slack

    probability = pagerank(matrix, damping=damping, tol=tol, teleport=teleport,
                           scale="probability")
    assert probability.scores.sum() == pytest.approx(1.0, abs=1e-12)
    exact_x = reference_pagerank(num_nodes, edges, damping=damping, teleport=teleport,
                                 scale="probability")
    assert np.abs(exact_x - probability.scores).sum() <= probability.bound + 1e-10


# --- the static certificate counts its residual's rounding (session 27's review) -------


def _hub_graph() -> tuple[sp.csr_array, np.ndarray]:
    """2,000 pages, 12,000 random links drawn towards low ids (max in-degree 1,646),
    and its exact PageRank at d = 0.99 by Jacobi in long double (to ~1e-17 of sum)."""
    rng = np.random.default_rng(1)
    n, m = 2000, 12_000
    rows, cols = rng.integers(0, n, m), (rng.pareto(1.2, m) * 3).astype(int) % n
    matrix = sp.csr_array((np.ones(m), (rows, cols)), shape=(n, n))
    pairs = np.unique(np.stack([rows, cols], axis=1), axis=0)
    src, dst = pairs[pairs[:, 0] != pairs[:, 1]].T
    share = np.longdouble(1) / np.bincount(src, minlength=n)[src].astype(np.longdouble)
    order = np.argsort(dst, kind="stable")
    src, dst, share = src[order], dst[order], share[order]
    targets, starts = np.unique(dst, return_index=True)
    damping = np.longdouble(0.99)
    y = np.ones(n, dtype=np.longdouble)
    for _ in range(5000):
        pulled = np.zeros(n, dtype=np.longdouble)
        pulled[targets] = np.add.reduceat(y[src] * share, starts)
        y = (1 - damping) + damping * pulled
    return matrix, y


def test_a_certificate_is_never_below_the_true_error_nor_a_tol_below_float64():
    """A plain mat-vec's residual shrank to nothing where the rounded update maps y
    onto itself: tol 1e-10 at d = 0.99 was certified (9.8e-11) for a true L1 error of
    2.1e-9 around a hub of 1,646 in-links."""
    matrix, exact = _hub_graph()
    for tol in (1e-10, 1e-8, 1e-7):
        try:
            result = pagerank(matrix, damping=0.99, tol=tol, max_iter=20_000)
        except ConvergenceError as exc:
            assert "below what float64 can certify" in str(exc) and tol < 1e-8
            continue
        error = float(np.abs(result.scores.astype(np.longdouble) - exact).sum())
        assert error <= result.bound <= tol
    default = pagerank(matrix, damping=0.99, max_iter=20_000)  # certifiable by default
    error = float(np.abs(default.scores.astype(np.longdouble) - exact).sum())
    assert error <= default.bound
