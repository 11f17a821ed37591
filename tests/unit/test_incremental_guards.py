"""What guards the incremental engine's promises: warm starts from published (or
bogus) vectors, the drift guard, ``fresh`` needing the per-page accuracy too, and the
moved pages collected whole however the touched list is split (refreshes near d = 1
ending fresh: test_bounds)."""

from __future__ import annotations

import numpy as np
import pytest

from ranker import EdgeBatch, LinkGraph, LiveRanks
from ranker import _kernels as K
from ranker.synthetic import copying_model_graph, random_edit_batch
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


def test_drift_guard_changes_nothing_beyond_rounding() -> None:
    synthetic = copying_model_graph(400, 6.0, seed=3)
    graph = synthetic.to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-9, recompute_every=10_000)
    ranks.cold_start()
    rng = np.random.default_rng(4)
    for _ in range(60):
        ranks.apply(random_edit_batch(graph, 20, rng))
    for engine in ranks.engines.values():
        assert engine.recompute_residual() <= 1e-12


def test_warm_restart_from_published_vectors() -> None:
    synthetic = copying_model_graph(500, 6.0, seed=7)
    graph = synthetic.to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-9)
    cold = ranks.cold_start()
    assert {r.mode for r in cold.values()} == {"cold"}
    assert all(r.moved_ids.size == graph.num_live for r in cold.values())
    saved = {name: ranks.scores(name).copy() for name in ranks.engines}
    again = LiveRanks(graph, tolerance=1e-9)
    warm = again.cold_start(warm=saved)
    for name, report in warm.items():
        # Already within the tolerance: only pages the cold start's last sweep left
        # above the push threshold move, and by no more than the bounds.
        assert report.fresh and report.mode == "local"
        moved = np.abs(again.scores(name) - saved[name]).sum()
        assert moved <= report.bound + cold[name].bound
    noisy = {name: vector * 1.3 for name, vector in saved.items()}
    third = LiveRanks(graph, tolerance=1e-9)
    for name, report in third.cold_start(warm=noisy).items():
        exact = exact_scores(graph, name)
        assert report.fresh
        assert np.abs(third.scores(name) - exact).sum() <= report.bound + 1e-9 * exact.sum()


def test_a_warm_start_repairs_non_finite_and_negative_entries() -> None:
    """A NaN or inf in a warm vector would spread through every sweep, never repaired."""
    graph = copying_model_graph(300, 6.0, seed=5).to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-9)
    bad = np.ones(graph.num_ids)
    bad[:3] = [np.nan, np.inf, -5.0]
    for name, report in ranks.cold_start(warm={"pagerank": bad, "wpr": bad}).items():
        assert report.fresh and np.isfinite(report.bound), name
        exact = exact_scores(graph, name)
        assert np.abs(ranks.scores(name) - exact).sum() <= report.bound + 1e-9 * exact.sum()


@pytest.mark.parametrize("huge", [1e20, 1e300])
def test_a_warm_start_with_scores_no_page_can_have_is_repaired_not_called_fresh(
        huge: float) -> None:
    # One bogus published score (ZADD ... 1e20) reached a restarted consumer's warm
    # start: cancellation left a zero kept residual, a negative total and everything in
    # the drift, and the report called that fresh.
    graph = copying_model_graph(300, 6.0, seed=3).to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-6)
    warm = np.full(graph.num_ids, huge)
    for name, report in ranks.cold_start(warm={"pagerank": warm, "wpr": warm}).items():
        exact = exact_scores(graph, name)
        assert report.fresh and report.total > 0, name
        assert np.abs(ranks.scores(name) - exact).sum() <= report.bound + 1e-9 * exact.sum()
