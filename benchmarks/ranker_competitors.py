"""The competitors of :mod:`benchmarks.bench_ranker`, each timed at the accuracy asked:
our own cold solves, igraph's PRPACK and networkx, and the exact reference solve every
error is measured against. Each is calibrated untimed (the loosest tolerance of a
ladder whose measured max-abs error is within the accuracy), then timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import igraph
import networkx as nx
import numpy as np
from threadpoolctl import ThreadpoolController

from ranker.linkgraph import LinkGraph
from ranker.pagerank import pagerank
from ranker.results import RankResult
from ranker.weighted_pagerank import weighted_pagerank
from rankstream.errors import ConvergenceError

DAMPING = 0.85
SOLVERS: dict[str, Callable[..., RankResult]] = {"pagerank": pagerank, "wpr": weighted_pagerank}
COLD_LADDER = [10.0**k for k in range(3, -9, -1)]
NX_LADDER = [10.0**k for k in range(-4, -15, -1)]


def timed(func: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = func()
    return time.perf_counter() - start, value


def best_of(func: Callable[[], object], runs: int) -> float:
    """Fastest of ``runs`` timings (small graphs: one run is mostly timer noise)."""
    return min(timed(func)[0] for _ in range(runs))


def exact(graph: LinkGraph, algorithm: str, start: np.ndarray | None, tol: float) -> np.ndarray:
    """A tight cold solve (the reference every error is measured against)."""
    warm = None if start is None else start[: graph.num_ids]
    result = SOLVERS[algorithm](graph.to_csr(), damping=DAMPING, tol=tol, max_iter=5000,
                                start=warm, alive=graph.live_mask())
    return result.scores


def calibrate_cold(graph: LinkGraph, algorithm: str, reference: np.ndarray,
                   accuracy: float) -> float:
    """Loosest tolerance of COLD_LADDER whose cold solve is within ``accuracy``."""
    matrix, live = graph.to_csr(), graph.live_mask()
    for tol in COLD_LADDER:
        try:
            scores = SOLVERS[algorithm](matrix, damping=DAMPING, tol=tol, alive=live).scores
        except ConvergenceError:
            continue
        if np.abs(scores - reference).max() <= accuracy:
            return tol
    return COLD_LADDER[-1]


def runs_for(graph: LinkGraph) -> int:
    return 1 if graph.num_links > 1_000_000 else 5


def time_cold(graph: LinkGraph, algorithm: str, tol: float) -> float:
    matrix, live = graph.to_csr(), graph.live_mask()
    return best_of(lambda: SOLVERS[algorithm](matrix, damping=DAMPING, tol=tol, alive=live),
                   runs_for(graph))


def igraph_of(graph: LinkGraph) -> igraph.Graph:
    src, dst = graph.edges()
    return igraph.Graph(n=graph.num_ids, edges=np.column_stack([src, dst]).tolist(),
                        directed=True)


def time_igraph(graph: LinkGraph, reference: np.ndarray) -> tuple[float, float, int]:
    """(seconds, max-abs error on the paper scale, OpenMP threads) of igraph's PRPACK
    PageRank, at whichever of one or two threads is faster in this run.

    igraph's wheel ships its own OpenMP runtime, which runs two threads here by
    default and, unlike our kernels (ranker._thread_guard), does not drop to one when
    another process holds the second core: on a loaded box one thread was 1.5x
    faster (0.31 s against 0.48 on 300k pages), so timing only its default flattered
    our ratios."""
    ig = igraph_of(graph)
    openmp = [lib for lib in ThreadpoolController().lib_controllers
              if lib.internal_api == "openmp" and "igraph" in lib.filepath]
    choices = (1, 2) if openmp else (0,)
    default = openmp[0].num_threads if openmp else 0
    timings: dict[int, float] = {}
    try:
        for threads in choices:
            if openmp:
                openmp[0].set_num_threads(threads)
            timings[threads] = best_of(
                lambda: ig.pagerank(damping=DAMPING, implementation="prpack"),
                runs_for(graph))
    finally:
        if openmp:
            openmp[0].set_num_threads(default)
    threads = min(timings, key=timings.__getitem__)
    ranks = ig.pagerank(damping=DAMPING, implementation="prpack")
    # Uniform teleport and uniform dangling redistribution: x is exactly y / sum(y).
    paper = np.asarray(ranks) * float(reference.sum())
    return timings[threads], float(np.abs(paper - reference).max()), threads


def networkx_of(graph: LinkGraph) -> nx.DiGraph:
    src, dst = graph.edges()
    digraph = nx.DiGraph()
    digraph.add_nodes_from(range(graph.num_ids))
    digraph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    return digraph


def networkx_error(digraph: nx.DiGraph, tol: float, reference: np.ndarray) -> float:
    ranks = nx.pagerank(digraph, alpha=DAMPING, tol=tol, max_iter=10_000)
    paper = np.array([ranks[i] for i in range(len(reference))]) * float(reference.sum())
    return float(np.abs(paper - reference).max())


def calibrate_networkx(digraph: nx.DiGraph, reference: np.ndarray, accuracy: float) -> float:
    for tol in NX_LADDER:
        if networkx_error(digraph, tol, reference) <= accuracy:
            return tol
    return NX_LADDER[-1]
