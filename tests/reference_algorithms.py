"""Slow, obvious reference implementations of PageRank, Weighted PageRank and HITS.

Written straight from the formulas in docs/algorithms.md with Python dicts and
loops, no numpy tricks, so that the fast solvers in :mod:`ranker` (and the
incremental engine) can be checked against something easy to read. Only use them
on small graphs (hundreds of pages).

Graphs are given as ``num_nodes`` plus an iterable of ``(src, dst)`` pairs over ids
``0..num_nodes-1`` (HITS also accepts ``(src, dst, weight)``). Self links are
dropped and duplicate links count once (HITS adds duplicate weights). Results are
numpy arrays indexed by page id, only so callers can compare them directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import networkx as nx
import numpy as np
import scipy.sparse as sp

Edge = tuple[int, int]

# How far a value may be from a test vector printed to 6 (8) decimals and still round
# to it: half a unit of the last digit, plus room for the solver's own 1e-10. A whole
# unit, as before, let through values that do not round to the printed digits.
ROUNDED_6 = 5e-7 + 1e-10
ROUNDED_8 = 5e-9 + 1e-10


def _live_links(
    num_nodes: int, edges: Iterable[Sequence[float]], alive: Sequence[bool] | np.ndarray | None
) -> tuple[list[bool], dict[int, set[int]], dict[int, set[int]]]:
    """Live flags, out-link sets R(m) and in-link sets B(n) of the live graph."""
    live = [True] * num_nodes if alive is None else [bool(flag) for flag in alive]
    out_links: dict[int, set[int]] = {page: set() for page in range(num_nodes)}
    in_links: dict[int, set[int]] = {page: set() for page in range(num_nodes)}
    for edge in edges:
        src, dst = int(edge[0]), int(edge[1])
        if src == dst or not live[src] or not live[dst]:
            continue
        out_links[src].add(dst)
        in_links[dst].add(src)
    return live, out_links, in_links


def _teleport_distribution(
    num_nodes: int, live: list[bool], teleport: Sequence[float] | np.ndarray | None
) -> dict[int, float]:
    """t restricted to live pages and normalised to sum 1 (uniform by default)."""
    weights = {}
    for page in range(num_nodes):
        if live[page]:
            weights[page] = 1.0 if teleport is None else float(teleport[page])
    total = sum(weights.values())
    return {page: weight / total for page, weight in weights.items()}


def reference_pagerank(
    num_nodes: int,
    edges: Iterable[Edge],
    *,
    damping: float = 0.85,
    teleport: Sequence[float] | np.ndarray | None = None,
    alive: Sequence[bool] | np.ndarray | None = None,
    scale: str = "paper",
    tol: float = 1e-14,
    max_iter: int = 100_000,
) -> np.ndarray:
    """PageRank by plain Jacobi sweeps.

    paper:       y[n] = (1-d)*n_live*t[n] + d * sum_{m in B(n)} y[m] / O[m]
    probability: the random surfer, computed on its own terms (not as y/sum(y)):
                 x[n] = (1-d)*t[n] + d * (sum_{m in B(n)} x[m]/O[m] + t[n]*dangling(x)),
                 where dangling(x) is the mass on live pages without out-links.
    Dead pages (alive False) and their links are not part of the graph: score 0.
    Sweeps until the L1 change is below ``tol`` times the vector's sum.
    """
    live, out_links, in_links = _live_links(num_nodes, edges, alive)
    live_pages = [page for page in range(num_nodes) if live[page]]
    if not live_pages:
        return np.zeros(num_nodes)
    t = _teleport_distribution(num_nodes, live, teleport)
    if scale == "paper":
        scores = {page: (1 - damping) * len(live_pages) * t[page] for page in live_pages}
    elif scale == "probability":
        scores = {page: 1.0 / len(live_pages) for page in live_pages}
    else:
        raise ValueError(f"unknown scale {scale!r}")

    for _ in range(max_iter):
        dangling = sum(scores[page] for page in live_pages if not out_links[page])
        new_scores = {}
        for page in live_pages:
            inflow = sum(scores[src] / len(out_links[src]) for src in in_links[page])
            if scale == "paper":
                new_scores[page] = (1 - damping) * len(live_pages) * t[page] + damping * inflow
            else:
                new_scores[page] = (1 - damping) * t[page] + damping * (
                    inflow + t[page] * dangling
                )
        change = sum(abs(new_scores[page] - scores[page]) for page in live_pages)
        scores = new_scores
        if change <= tol * max(1.0, sum(scores.values())):
            return np.array([scores.get(page, 0.0) for page in range(num_nodes)])
    raise RuntimeError("reference_pagerank did not converge")


def reference_wpr_weights(num_nodes: int, edges: Iterable[Edge]) -> dict[Edge, float]:
    """W[(m, n)] = Win(m,n) * Wout(m,n) for every link m -> n, per algorithms.md."""
    _, out_links, in_links = _live_links(num_nodes, edges, None)
    return _wpr_weights_of(out_links, in_links)


def _wpr_weights_of(
    out_links: dict[int, set[int]], in_links: dict[int, set[int]]
) -> dict[Edge, float]:
    weights: dict[Edge, float] = {}
    for m, targets in out_links.items():
        if not targets:
            continue
        sum_in = sum(len(in_links[p]) for p in targets)
        sum_out = sum(len(out_links[p]) for p in targets)
        for n in targets:
            w_in = len(in_links[n]) / sum_in
            w_out = len(out_links[n]) / sum_out if sum_out > 0 else 1.0 / len(targets)
            weights[(m, n)] = w_in * w_out
    return weights


def reference_weighted_pagerank(
    num_nodes: int,
    edges: Iterable[Edge],
    *,
    damping: float = 0.85,
    alive: Sequence[bool] | np.ndarray | None = None,
    tol: float = 1e-14,
    max_iter: int = 100_000,
) -> np.ndarray:
    """Weighted PageRank, paper scale: y[n] = (1-d) + d * sum_{m in B(n)} y[m]*W(m,n).

    Weights are those of the live graph (dead pages and their links removed first).
    """
    live, out_links, in_links = _live_links(num_nodes, edges, alive)
    weights = _wpr_weights_of(out_links, in_links)
    live_pages = [page for page in range(num_nodes) if live[page]]
    scores = {page: 1 - damping for page in live_pages}
    for _ in range(max_iter):
        new_scores = {}
        for page in live_pages:
            inflow = sum(scores[src] * weights[(src, page)] for src in in_links[page])
            new_scores[page] = (1 - damping) + damping * inflow
        change = sum(abs(new_scores[page] - scores[page]) for page in live_pages)
        scores = new_scores
        if change <= tol * max(1.0, sum(scores.values())):
            return np.array([scores.get(page, 0.0) for page in range(num_nodes)])
    raise RuntimeError("reference_weighted_pagerank did not converge")


def reference_hits(
    num_nodes: int,
    edges: Iterable[Sequence[float]],
    *,
    normalize: str = "l2",
    tol: float = 1e-13,
    max_iter: int = 100_000,
) -> tuple[np.ndarray, np.ndarray]:
    """(hubs, authorities) by Kleinberg's iteration from all ones.

    a[n] = sum_{m -> n} w(m,n) * h[m];  h[m] = sum_{m -> n} w(m,n) * a[n]; normalise
    each to unit L2 norm ("l2") or unit sum ("sum"); stop when the L1 change of both
    is below ``tol``. Edges are (src, dst) with weight 1 or (src, dst, weight);
    duplicate links add their weights; self links are dropped. No links: all zeros.
    """
    weight: dict[Edge, float] = {}
    for edge in edges:
        src, dst = int(edge[0]), int(edge[1])
        if src != dst:
            weight[(src, dst)] = weight.get((src, dst), 0.0) + (
                float(edge[2]) if len(edge) > 2 else 1.0
            )
    weight = {link: w for link, w in weight.items() if w != 0.0}
    if not weight:
        return np.zeros(num_nodes), np.zeros(num_nodes)

    def normalised(vector: list[float]) -> list[float]:
        if normalize == "l2":
            size = sum(value * value for value in vector) ** 0.5
        elif normalize == "sum":
            size = sum(vector)
        else:
            raise ValueError(f"unknown normalisation {normalize!r}")
        return [value / size for value in vector]

    hubs = normalised([1.0] * num_nodes)
    authorities = list(hubs)
    for _ in range(max_iter):
        new_authorities = [0.0] * num_nodes
        for (src, dst), w in weight.items():
            new_authorities[dst] += w * hubs[src]
        new_authorities = normalised(new_authorities)
        new_hubs = [0.0] * num_nodes
        for (src, dst), w in weight.items():
            new_hubs[src] += w * new_authorities[dst]
        new_hubs = normalised(new_hubs)
        change = sum(abs(x - y) for x, y in zip(new_authorities, authorities, strict=True))
        change += sum(abs(x - y) for x, y in zip(new_hubs, hubs, strict=True))
        hubs, authorities = new_hubs, new_authorities
        if change < tol:
            return np.array(hubs), np.array(authorities)
    raise RuntimeError("reference_hits did not converge")


def adjacency_matrix(
    num_nodes: int, edges: Iterable[Sequence[float]], *, weighted: bool = False
) -> sp.csr_array:
    """csr_array (row = source) of an edge list, as the fast solvers take it.

    Entries are 1 (duplicates collapse to 1) unless ``weighted``, in which case the
    third item of each edge is the value and duplicates add up. Self links are kept
    so callers can check that the solvers drop them.
    """
    link_weight: dict[Edge, float] = {}
    for edge in edges:
        link = (int(edge[0]), int(edge[1]))
        if weighted:
            link_weight[link] = link_weight.get(link, 0.0) + float(edge[2])
        else:
            link_weight[link] = 1.0
    rows = [src for src, _ in link_weight]
    cols = [dst for _, dst in link_weight]
    values = list(link_weight.values())
    return sp.csr_array(
        (np.array(values, dtype=np.float64), (np.array(rows, dtype=np.int64),
                                               np.array(cols, dtype=np.int64))),
        shape=(num_nodes, num_nodes),
    )


def random_edges(kind: str, num_nodes: int, seed: int) -> list[Edge]:
    """Seeded test graph over ids ``0..num_nodes-1``, self links and duplicates removed.

    ``"gnp"``: directed G(n, p) with mean out-degree 3; ``"scale_free"``: networkx's
    scale-free digraph. Both have dangling pages; size a matrix larger than
    ``num_nodes`` to add isolated pages.
    """
    if kind == "gnp":
        graph = nx.gnp_random_graph(num_nodes, 3.0 / num_nodes, seed=seed, directed=True)
    elif kind == "scale_free":
        graph = nx.DiGraph(nx.scale_free_graph(num_nodes, seed=seed))
    else:
        raise ValueError(f"unknown graph kind {kind!r}")
    return sorted({(int(u), int(v)) for u, v in graph.edges() if u != v})
