"""Tests of the HITS solver (ranker.hits)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ranker.hits import hits
from rankstream.errors import ConvergenceError, InputError
from tests.reference_algorithms import ROUNDED_6, adjacency_matrix, random_edges, reference_hits

FIG2_EDGES = [(0, 1), (0, 2), (1, 2), (2, 0), (2, 1)]
NX_EDGES = [(1, 3), (1, 5), (2, 1), (3, 5), (5, 4), (5, 3), (6, 5)]


def test_fig2_l2_vectors() -> None:
    result = hits(adjacency_matrix(3, FIG2_EDGES))
    np.testing.assert_allclose(result.hubs, [0.736976, 0.327985, 0.591009], atol=ROUNDED_6)
    np.testing.assert_allclose(result.authorities, [0.327985, 0.736976, 0.591009], atol=ROUNDED_6)
    assert np.linalg.norm(result.hubs) == pytest.approx(1.0)
    assert result.error < 1e-10


def test_networkx_test_graph_sum_normalised() -> None:
    result = hits(adjacency_matrix(6, [(a - 1, b - 1) for a, b in NX_EDGES]), normalize="sum")
    np.testing.assert_allclose(
        result.authorities, [0, 0, 0.366025, 0.133975, 0.5, 0], atol=ROUNDED_6
    )
    np.testing.assert_allclose(
        result.hubs, [0.366025, 0, 0.211325, 0, 0.211325, 0.211325], atol=ROUNDED_6
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matches_networkx_on_connected_random_graphs(seed: int) -> None:
    graph = nx.gnp_random_graph(60, 0.15, seed=seed, directed=True)
    assert nx.is_strongly_connected(graph)
    edges = sorted(graph.edges())
    result = hits(adjacency_matrix(60, edges), normalize="sum", tol=1e-12)
    hubs, authorities = nx.hits(graph, tol=1e-12, max_iter=10_000)
    np.testing.assert_allclose(result.hubs, [hubs[page] for page in range(60)], atol=1e-8)
    np.testing.assert_allclose(
        result.authorities, [authorities[page] for page in range(60)], atol=1e-8
    )


@pytest.mark.parametrize(("num_nodes", "edges"), [
    (3, FIG2_EDGES), (6, [(a - 1, b - 1) for a, b in NX_EDGES]),
    (4, [(0, 1), (1, 2), (2, 3), (3, 0)]),  # a cycle: every page alike
])
@pytest.mark.parametrize("normalize", ["l2", "sum"])
def test_fixed_graphs_match_reference(num_nodes: int, edges: list[tuple[int, int]],
                                      normalize: str) -> None:
    result = hits(adjacency_matrix(num_nodes, edges), normalize=normalize,  # type: ignore[arg-type]
                  tol=1e-12, max_iter=100_000)
    hubs, authorities = reference_hits(num_nodes, edges, normalize=normalize, tol=1e-14)
    np.testing.assert_allclose(result.hubs, hubs, atol=1e-9)
    np.testing.assert_allclose(result.authorities, authorities, atol=1e-9)


@pytest.mark.parametrize("kind", ["gnp", "scale_free"])
@pytest.mark.parametrize("normalize", ["l2", "sum"])
def test_weighted_random_graphs_match_reference(kind: str, normalize: str) -> None:
    rng = np.random.default_rng(7)
    edges = [(u, v, float(w)) for (u, v), w in
             zip(random_edges(kind, 80, seed=7), rng.uniform(0.1, 3.0, 10_000), strict=False)]
    result = hits(adjacency_matrix(83, edges, weighted=True), normalize=normalize,  # type: ignore[arg-type]
                  tol=1e-12, max_iter=100_000)
    hubs, authorities = reference_hits(83, edges, normalize=normalize, tol=1e-12)
    np.testing.assert_allclose(result.hubs, hubs, atol=1e-9)
    np.testing.assert_allclose(result.authorities, authorities, atol=1e-9)


def test_link_weights_matter_and_duplicates_add_up() -> None:
    unweighted = hits(adjacency_matrix(3, FIG2_EDGES))
    heavy = [(0, 1, 3.0), (0, 2, 1.0), (1, 2, 1.0), (2, 0, 1.0), (2, 1, 1.0)]
    weighted = hits(adjacency_matrix(3, heavy, weighted=True))
    assert not np.allclose(weighted.authorities, unweighted.authorities, atol=1e-3)
    # The same weight given as three unsummed duplicate entries of 1.
    rows = [0, 0, 0, 0, 1, 2, 2]
    cols = [1, 1, 1, 2, 2, 0, 1]
    duplicated = sp.csr_matrix((np.ones(7), (rows, cols)), shape=(3, 3))
    duplicated = sp.csr_matrix((duplicated.data, duplicated.indices, duplicated.indptr))
    np.testing.assert_allclose(hits(duplicated).authorities, weighted.authorities, atol=1e-12)


def test_self_links_and_explicit_zeros_are_dropped() -> None:
    clean = hits(adjacency_matrix(3, FIG2_EDGES))
    cols = [0, 1, 2, 0, 2, 0, 1]  # rows 0, 0, 0 | 1, 1 | 2, 2
    vals = [5.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]  # self link 0->0, explicit zero 1->0
    messy = sp.csr_array((vals, cols, [0, 3, 5, 7]), shape=(3, 3))
    assert messy.nnz == 7
    np.testing.assert_allclose(hits(messy).hubs, clean.hubs, atol=1e-12)


def test_graph_without_links_gives_zeros() -> None:
    result = hits(sp.csr_array((4, 4)))
    np.testing.assert_array_equal(result.hubs, np.zeros(4))
    np.testing.assert_array_equal(result.authorities, np.zeros(4))
    assert (result.iterations, result.error) == (1, 0.0)
    assert hits(sp.csr_array((0, 0))).hubs.shape == (0,)


def test_max_iter_exhausted_raises_convergence_error() -> None:
    with pytest.raises(ConvergenceError) as caught:
        hits(adjacency_matrix(3, FIG2_EDGES), max_iter=1)
    assert caught.value.iterations == 1
    assert caught.value.error > 1e-10


@pytest.mark.parametrize(
    ("matrix", "kwargs", "message"),
    [
        (sp.csr_array((3, 2)), {}, "square"),
        (np.ones((2, 2)), {}, "sparse"),
        (sp.csr_array(np.array([[0.0, -2.0], [1.0, 0.0]])), {}, "non-negative"),
        (sp.csr_array((2, 2)), {"normalize": "max"}, "normalize"),
        (sp.csr_array((2, 2)), {"tol": -1.0}, "tol"),
        (sp.csr_array((2, 2)), {"max_iter": 0}, "max_iter"),
    ],
)
def test_bad_input_raises_input_error(matrix: object, kwargs: dict[str, object],
                                      message: str) -> None:
    with pytest.raises(InputError, match=message):
        hits(matrix, **kwargs)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=st.integers(min_value=1, max_value=10).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1),
                               st.sampled_from([0.5, 1.0, 2.0])), max_size=3 * n),
        )
    ),
    normalize=st.sampled_from(["l2", "sum"]),
)
def test_matches_reference_on_small_graphs(graph: tuple[int, list[tuple[int, int, float]]],
                                           normalize: str) -> None:
    num_nodes, edges = graph
    result = hits(adjacency_matrix(num_nodes, edges, weighted=True), normalize=normalize,  # type: ignore[arg-type]
                  tol=1e-11, max_iter=200_000)
    # The reference stops when a step changes less than tol, which leaves it about
    # tol / (1 - lambda2/lambda1) from its limit: on 4 pages with
    # 1->0, 2->0, 2->3, 3->1, 3->2 (weights 2, .5, .5, 2, .5) a hub score that is
    # exactly 0 was still 1.2e-9 at tol 1e-11 (hypothesis found it), so it runs to 1e-14.
    hubs, authorities = reference_hits(num_nodes, edges, normalize=normalize, tol=1e-14,
                                       max_iter=2_000_000)
    np.testing.assert_allclose(result.hubs, hubs, atol=1e-9)
    np.testing.assert_allclose(result.authorities, authorities, atol=1e-9)


# --- near-degenerate and degenerate top eigenvalues (the Lanczos fallback) ---------------


def _in_star(first: int, in_linkers: int, *, extra: bool = False) -> list[tuple[int, int]]:
    """Pages first..first+k-1 -> centre first+k; with ``extra``, page first also -> first+k+1.

    The extra link lifts lambda_1 of A^T A from k to just above k (k=50: 50.0204).
    """
    centre = first + in_linkers
    edges = [(first + i, centre) for i in range(in_linkers)]
    return [*edges, (first, centre + 1)] if extra else edges


def _near_degenerate_stars(in_linkers: int) -> tuple[int, list[tuple[int, int]]]:
    """A star with one extra link beside a plain star of the same size."""
    perturbed = _in_star(0, in_linkers, extra=True)
    return 2 * in_linkers + 3, perturbed + _in_star(in_linkers + 2, in_linkers)


def _top_projection(matrix: sp.csr_array, start: np.ndarray) -> np.ndarray:
    """Unit projection of ``start`` onto the top eigenspace of the dense A^T A (eigh)."""
    values, vectors = np.linalg.eigh((matrix.T @ matrix).toarray())
    top = vectors[:, values >= values[-1] * (1 - 1e-9)]
    projection = top @ (top.T @ start)
    return projection / np.linalg.norm(projection)


@pytest.mark.parametrize("in_linkers", [20, 50])  # 43 pages: dense eigh; 103: Lanczos
@pytest.mark.parametrize("normalize", ["l2", "sum"])
def test_near_degenerate_stars_converge_to_the_principal_eigenvector(
    in_linkers: int, normalize: str
) -> None:
    num_nodes, edges = _near_degenerate_stars(in_linkers)
    # lambda_2 / lambda_1 = 0.9974 (k=20) or 0.9996 (k=50): plain power iteration
    # needs thousands of steps, so it fails within the default max_iter=1000.
    with pytest.raises(RuntimeError, match="did not converge"):
        reference_hits(num_nodes, edges, tol=1e-10, max_iter=1000)
    matrix = adjacency_matrix(num_nodes, edges)
    result = hits(matrix, normalize=normalize)  # type: ignore[arg-type]
    assert result.iterations <= 1000
    assert result.error <= 1e-10
    _, vectors = np.linalg.eigh((matrix.T @ matrix).toarray())
    authorities = vectors[:, -1] * np.sign(vectors[:, -1].sum())
    hubs = matrix @ authorities
    for vector in (authorities, hubs):
        vector /= np.linalg.norm(vector) if normalize == "l2" else vector.sum()
    np.testing.assert_allclose(result.authorities, authorities, atol=1e-9)
    np.testing.assert_allclose(result.hubs, hubs, atol=1e-9)
    assert result.authorities.min() >= 0.0 and result.hubs.min() >= 0.0


def test_exactly_degenerate_top_eigenvalue_gives_the_all_ones_projection() -> None:
    # Two identical copies of the perturbed star share lambda_1 exactly; the plain
    # star just below keeps power iteration slow, so the fallback answers.
    copy = _in_star(0, 50, extra=True)
    edges = copy + [(u + 52, v + 52) for u, v in copy] + _in_star(104, 50)
    matrix = adjacency_matrix(155, edges)
    result = hits(matrix)
    again = hits(matrix)
    np.testing.assert_array_equal(result.authorities, again.authorities)
    np.testing.assert_array_equal(result.hubs, again.hubs)
    assert result.error <= 1e-10
    expected = _top_projection(matrix, np.ones(155))
    np.testing.assert_allclose(result.authorities, expected, atol=1e-9)
    # Here (symmetric copies) projecting 1 or A^T 1 is the same; both copies count equally.
    np.testing.assert_allclose(result.authorities, _top_projection(matrix, matrix.T @ np.ones(155)),
                               atol=1e-9)
    assert result.authorities[50] == pytest.approx(result.authorities[102], abs=1e-12)
    assert result.authorities[154] == pytest.approx(0.0, abs=1e-9)  # the plain star


def test_degenerate_top_eigenspace_keeps_kleinbergs_limit() -> None:
    # An in-star (50 -> centre 50) and an out-star (page 51 -> 52..101) both have
    # lambda = 50; a 49-star with an extra link (lambda 49.02) slows the iteration so
    # the fallback answers. The iteration's limit projects a_1 = A^T 1 (not 1) onto
    # the top eigenspace: centre 50 : each target 1.
    edges = _in_star(0, 50) + [(51, 52 + i) for i in range(50)] + _in_star(102, 49, extra=True)
    matrix = adjacency_matrix(153, edges)
    result = hits(matrix, tol=1e-12, max_iter=10_000)
    assert result.iterations < 1000  # power iteration alone needs ~1400 steps
    hubs, authorities = reference_hits(153, edges, tol=1e-12)
    np.testing.assert_allclose(result.authorities, authorities, atol=1e-9)
    np.testing.assert_allclose(result.hubs, hubs, atol=1e-9)
    assert result.authorities[50] == pytest.approx(50 / np.sqrt(2550), abs=1e-9)
    np.testing.assert_allclose(result.authorities[52:102], 1 / np.sqrt(2550), atol=1e-9)
    np.testing.assert_allclose(result.hubs[[*range(50), 51]], 1 / np.sqrt(51), atol=1e-9)


def test_fallback_stays_within_max_iter() -> None:
    num_nodes, edges = _near_degenerate_stars(50)
    with pytest.raises(ConvergenceError) as caught:
        hits(adjacency_matrix(num_nodes, edges), max_iter=12)
    assert caught.value.iterations <= 12


def test_many_identical_stars_are_solved_in_a_few_steps() -> None:
    """A base set of 150 roots with exactly 50 in-linkers and 150 with 49: the top
    eigenvalue is 50, 150 times over. A restarted eigensolver hunted for a basis of
    that eigenspace and failed within max_iter; the Krylov space from A^T 1 holds the
    answer after three steps. The limit: equal authority on the 50-star centres."""
    sizes = [50] * 150 + [49] * 150
    edges, centres, base = [], [], 0
    for size in sizes:
        edges += [(base + 1 + k, base) for k in range(size)]
        centres.append(base)
        base += size + 1
    matrix = adjacency_matrix(base, edges)
    result = hits(matrix, tol=1e-8, max_iter=1000)
    assert result.iterations < 150
    expected = np.zeros(base)
    expected[centres[:150]] = 1 / np.sqrt(150)
    np.testing.assert_allclose(result.authorities, expected, atol=1e-12)
    leaves = [(u, v) for u, v in edges if v in set(centres[:150])]
    expected_hubs = np.zeros(base)
    expected_hubs[[u for u, _ in leaves]] = 1 / np.sqrt(len(leaves))
    np.testing.assert_allclose(result.hubs, expected_hubs, atol=1e-12)


@pytest.mark.parametrize("scale", [1e-170, 1e160])
def test_the_scale_of_the_weights_does_not_matter(scale: float) -> None:
    num_nodes, edges = _near_degenerate_stars(50)
    matrix = adjacency_matrix(num_nodes, edges)
    expected = hits(matrix, tol=1e-10)
    scaled = hits(matrix * scale, tol=1e-10)
    np.testing.assert_allclose(scaled.authorities, expected.authorities, atol=1e-12)
    np.testing.assert_allclose(scaled.hubs, expected.hubs, atol=1e-12)


def test_a_fallback_that_would_run_long_stops_at_its_cap_and_says_so() -> None:
    """Forty eigenvalues within 4e-8 of the top on 6,000 pages: the unrestarted
    Lanczos needed 937 steps (14.6 s, its reorthogonalisation growing with the square
    of the steps). It stops at its cap instead, and the error names the cap, not
    max_iter."""
    rng = np.random.default_rng(0)
    pairs = 3000
    values = np.concatenate([1 - 1e-9 * np.arange(40), rng.random(pairs - 40) * 0.9])
    rows, cols = np.arange(pairs) * 2 + 1, np.arange(pairs) * 2
    matrix = sp.csr_array((np.sqrt(values), (rows, cols)), shape=(2 * pairs, 2 * pairs))
    with pytest.raises(ConvergenceError, match=r"reached its cap of \d+ steps on 6000 pages"):
        hits(matrix, tol=1e-8, max_iter=10_000)


# --- accepted too early (session 27's review) ---------------------------------------


def _star_beside_a_heavier_link(gap: float) -> sp.csr_array:
    """An in-star of 100 (lambda 100) beside one link whose weight gives lambda
    100 * (1 + gap): the start A^T 1 is almost all on the star."""
    rows = [*range(1, 101), 102]
    cols = [0] * 100 + [101]
    weights = [1.0] * 100 + [float(np.sqrt(100 * (1 + gap)))]
    return sp.csr_array((weights, (rows, cols)), shape=(103, 103))


def test_a_small_change_is_not_taken_for_the_limit_when_a_mode_is_still_growing() -> None:
    """Its L1 change at step 2 was 7.6e-9 < tol, and the answer was the star's
    eigenvector: 12.7 (L1) from the limit, the link's."""
    matrix = _star_beside_a_heavier_link(2.5e-8)
    result = hits(matrix, tol=1e-8)
    limit = _top_projection(matrix, matrix.T @ np.ones(103))
    np.testing.assert_allclose(result.authorities, limit, atol=1e-8)
    assert result.authorities[101] > 0.999 and result.authorities[0] < 1e-6


def test_lanczos_does_not_stop_on_a_ritz_pair_below_the_top() -> None:
    """A 1000-leaf in-star beside a 2 x 501 biclique (lambda 1002): at tol 1e-3 the
    fallback accepted its start, nearly orthogonal to the limit, after one step."""
    edges = [(1 + i, 0) for i in range(1000)]
    edges += [(1001 + i, 1003 + j) for i in range(2) for j in range(501)]
    matrix = adjacency_matrix(1504, edges)
    limit = _top_projection(matrix, matrix.T @ np.ones(1504))
    for tol in (1e-3, 1e-4):
        result = hits(matrix, tol=tol)
        np.testing.assert_allclose(result.authorities, limit, atol=1e-6)
        assert result.authorities[0] < 1e-6


def test_a_small_graph_the_dense_fallback_cannot_afford_gets_lanczos() -> None:
    """63 pages were refused after 10 power steps ("the Lanczos fallback ran out of
    iterations", which never ran) while the same graph on 65 pages took 15."""
    edges = [(1 + i, 0) for i in range(30)] + [(32 + i, 31) for i in range(31)]
    result = hits(adjacency_matrix(63, edges), max_iter=60)
    assert result.iterations <= 60 and result.authorities[31] > 0.999
