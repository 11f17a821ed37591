"""What the incremental engine promises beyond its bound, each pinned by a test a
mutation review found missing: ``fresh`` needs the per-page accuracy too, the periodic
drift guard really recomputes the residual, and the moved pages are collected whole
however the touched list is split (refreshes near d = 1 ending fresh: test_bounds)."""

from __future__ import annotations

import numpy as np
import pytest

from ranker import EdgeBatch, LinkGraph, LiveRanks
from ranker import _kernels as K
from tests.unit.test_incremental import exact_scores


def _graph(n: int, m: int, seed: int) -> LinkGraph:
    rng = np.random.default_rng(seed)
    return LinkGraph.from_id_edges(rng.integers(0, n, m).astype(np.int32),
                                   rng.integers(0, n, m).astype(np.int32),
                                   [f"p{i}" for i in range(n)])


@pytest.mark.parametrize("algorithm", ["pagerank", "wpr"])
def test_capped_refresh_is_not_fresh_while_the_per_page_bound_misses_max_error(algorithm):
    """A refresh capped by max_sweeps can meet the L1 target and still miss max_error:
    a caller that asked for per-page accuracy must not get its scores labelled fresh."""
    graph = _graph(300, 1500, 1)
    ranks = LiveRanks(graph, algorithms=(algorithm,), tolerance=0.1, max_error=1e-12,
                      local_work=0.0)
    ranks.cold_start()
    rng = np.random.default_rng(2)
    ranks.absorb(EdgeBatch(insert_src=rng.integers(0, 300, 200),
                           insert_dst=rng.integers(0, 300, 200)))
    report = ranks.refresh(max_sweeps=2)[algorithm]
    assert report.relative_bound <= 0.1  # the L1 target alone is met...
    assert report.max_abs_bound > 1e-12  # ...the per-page one is not
    assert not report.fresh


def test_recompute_every_wipes_out_residual_drift():
    """The periodic full residual recomputation is what stops drift the kept residual
    cannot show from outliving it (ranker.incremental's docstring rests on it).
    PageRank only: on a graph this small nearly every WPR batch re-weighs enough
    links to recompute its residual in full anyway."""
    graph = _graph(60, 240, 3)
    ranks = LiveRanks(graph, algorithms=("pagerank",), tolerance=1e-9, recompute_every=3)
    ranks.cold_start()
    ranks.engines["pagerank"].r[5] += 1e-3  # drift: the kept r no longer equals b - A y
    rng = np.random.default_rng(4)
    for _ in range(3):
        src, dst = graph.edges()
        ranks.apply(EdgeBatch(insert_src=rng.integers(0, 60, 1),
                              insert_dst=rng.integers(0, 60, 1),
                              delete_src=src[:1], delete_dst=dst[:1]))
    exact = exact_scores(graph, "pagerank", ranks.damping)
    error = np.abs(ranks.scores("pagerank") - exact).sum()
    assert error <= ranks.bound("pagerank") + 1e-12 * exact.sum()


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_moved_pages_are_collected_whole_however_the_touched_list_is_split(parts):
    """collect_moved compacts each part's finds in place; with parts that find nothing
    between parts that do (only tested through two kernel threads before)."""
    n = 20
    touched = np.array([3, 1, 4, 15, 9, 2, 6, 5, 13, 18], dtype=np.int32)
    is_touched = np.zeros(n, dtype=np.bool_)
    is_touched[touched] = True
    live = np.ones(n, dtype=np.bool_)
    live[9] = False  # a dead page is never reported
    published = np.zeros(n)
    y = np.zeros(n)
    moves = {4: 0.5, 9: 0.5, 13: -0.5, 18: 2e-7, 6: 1.0}  # 18 stays under the threshold
    for page, move in moves.items():
        y[page] = move
    qstate = np.zeros(8, dtype=np.int64)
    qstate[K.T_COUNT] = touched.size
    moved = K.collect_moved(parts, touched, qstate, is_touched, live, y, published, 1e-6)
    assert sorted(moved.tolist()) == [4, 6, 13]
    assert qstate[K.T_COUNT] == 0 and not is_touched.any()
    assert published[[4, 6, 13]].tolist() == [0.5, 1.0, -0.5] and published[18] == 0.0
