"""PageRank's dominant-mode deflation (ranker.dominant_mode) inside ResidualEngine."""

from __future__ import annotations

import numpy as np
import pytest

from ranker import _kernels as K
from ranker import dominant_mode
from ranker.bounds import static_tolerance
from ranker.dominant_mode import Deflation
from ranker.edge_batches import EdgeBatch
from ranker.incremental import LiveRanks
from ranker.linkgraph import LinkGraph
from ranker.pagerank import pagerank
from ranker.residual import ResidualEngine
from ranker.synthetic import copying_model_graph, random_edit_batch


def exact(ranks: LiveRanks) -> np.ndarray:
    graph = ranks.graph
    return pagerank(graph.to_csr(), damping=ranks.damping, max_iter=5000,
                    tol=static_tolerance(graph.num_ids, ranks.damping),
                    alive=graph.live_mask()).scores


def image_reference(engine: ResidualEngine) -> np.ndarray:
    """``d*M*v - v`` link by link, for the engine's current graph."""
    graph, mode = engine.graph, engine.mode
    assert mode is not None
    n = graph.num_ids
    src, dst = graph.edges()
    pushed = np.bincount(dst, weights=engine.damping * mode.v[src] / graph.out_len[src],
                         minlength=n)
    return pushed - mode.v[:n]


def deflating_ranks(seed: int, *, pages: int = 2000) -> tuple[LiveRanks, ResidualEngine]:
    """Engine whose global refreshes deflate (as if plain sweeps had been measured slow)."""
    graph = copying_model_graph(pages, 8.0, seed=seed).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("pagerank",), tolerance=1e-9, max_error=1e-8,
                      local_work=0.0, recompute_every=10_000)
    ranks.cold_start()
    engine = ranks.engines["pagerank"]
    engine.relax = True
    engine.global_runs = 1  # not a probe refresh
    return ranks, engine


def test_deflating_refreshes_keep_the_certified_bounds() -> None:
    ranks, engine = deflating_ranks(41)
    rng = np.random.default_rng(42)
    for _ in range(3):
        report = ranks.apply(random_edit_batch(ranks.graph, 3000, rng))["pagerank"]
        assert report.mode == "global" and report.fresh, report
        assert engine.mode is not None and engine.mode.available
        truth = exact(ranks)
        error = ranks.scores("pagerank") - truth
        assert np.abs(error).sum() <= report.bound + 1e-9
        assert np.abs(error).max() <= report.max_abs_bound + 1e-12
        assert engine.recompute_residual() <= 1e-10


def test_refreshes_deflate_even_after_plain_sweeps_were_measured_fast() -> None:
    # One batch that hardly excites the mode measures fast plain sweeps; deflation
    # used to hang on that measurement, leaving the next 63 refreshes at 30 sweeps.
    ranks, engine = deflating_ranks(44)
    engine.relax = False
    # A capped refresh (the consumer's, after a batch) has no use for the mode.
    engine.mode = dominant_mode.DominantMode(ranks.graph, ranks.damping)
    engine.mode.grow(engine.y.size)
    ranks.apply(random_edit_batch(ranks.graph, 3000, np.random.default_rng(4)), max_sweeps=1.0)
    assert not engine.mode.available
    report = ranks.apply(random_edit_batch(ranks.graph, 3000, np.random.default_rng(5)))
    assert report["pagerank"].mode == "global" and report["pagerank"].fresh
    assert engine.mode.available  # computed for, and used by, that refresh


def test_the_modes_image_stays_exact_through_edits_removals_and_new_pages() -> None:
    ranks, engine = deflating_ranks(43)
    rng = np.random.default_rng(44)
    ranks.apply(random_edit_batch(ranks.graph, 3000, rng))  # computes the mode
    mode = engine.mode
    assert mode is not None and mode.available
    graph = ranks.graph
    for step in range(4):
        edits = random_edit_batch(graph, 300, rng)
        new = graph.intern_many([f"https://new.example/{step}/{k}" for k in range(5)])
        old = rng.choice(graph.num_ids - 5, 10).astype(np.int32)
        gone = rng.choice(graph.num_ids - 5, 3, replace=False).astype(np.int32)
        batch = EdgeBatch(np.concatenate([edits.insert_src, np.repeat(new, 2)]),
                          np.concatenate([edits.insert_dst, old]),
                          edits.delete_src, edits.delete_dst, gone)
        ranks.absorb(batch)
        n = graph.num_ids
        np.testing.assert_allclose(mode.w[:n], image_reference(engine), rtol=0, atol=1e-13)
        dead = gone[~graph.live_mask()[gone]]  # a batch may revive a page it removes
        assert dead.size and not mode.v[dead].any()
        assert ranks.refresh()["pagerank"].fresh
    # The drift guard recomputes the image too.
    mode.w[: graph.num_ids] += 1.0
    engine.recompute_residual()
    np.testing.assert_allclose(mode.w[: graph.num_ids], image_reference(engine), rtol=0,
                               atol=1e-13)


@pytest.mark.parametrize("max_work", [2**62, 3000])
def test_a_deflating_sweep_keeps_the_residual_exact(max_work: int) -> None:
    # The shift reaches each page as the sweep does; once the sweep is over (even one
    # that stopped pushing early), r is again exactly y's residual.
    ranks, engine = deflating_ranks(45, pages=500)
    rng = np.random.default_rng(46)
    ranks.apply(random_edit_batch(ranks.graph, 800, rng))
    mode = engine.mode
    assert mode is not None and mode.available
    n = ranks.graph.num_ids
    engine.y[:n] += rng.normal(0.0, 0.05, n)
    engine.recompute_residual()
    along = float(np.dot(engine.r[:n], mode.w[:n]))
    deflation = Deflation(mode, n)
    deflation.shift = mode.shift_for(along)
    assert deflation.shift != 0.0
    _, _, _, _, along, _, _ = K.sweep(engine.kind, engine.damping, 1e-3, 1.0, n, engine.y, engine.r,
                                *engine.arrays(), engine.touched, engine.qstate,
                                engine.is_touched, max_work, deflation.shift, deflation.w)
    assert along == pytest.approx(float(np.dot(engine.r[:n], mode.w[:n])), rel=1e-9)
    deflation.swept(0, along, n)  # y now owes the shift the sweep added to r
    assert deflation.moved != 0.0 and deflation.shift == 0.0
    assert deflation.finish(engine.y, engine.touched, engine.qstate, engine.is_touched)
    assert engine.recompute_residual() <= 1e-12
    assert engine.is_touched[:n][mode.v[:n] != 0.0].all()


def test_the_shift_minimises_the_residual_along_the_mode() -> None:
    ranks, engine = deflating_ranks(50, pages=500)
    ranks.apply(random_edit_batch(ranks.graph, 800, np.random.default_rng(51)))
    mode = engine.mode
    assert mode is not None and mode.available
    n = ranks.graph.num_ids
    noise = np.random.default_rng(52).normal(0.0, np.abs(mode.w[:n]).mean(), n)
    r = noise + 3.0 * mode.w[:n]
    a = mode.shift_for(float(np.dot(r, mode.w[:n])))
    assert a == pytest.approx(-3.0, abs=0.5)
    best = np.linalg.norm(r + a * mode.w[:n])
    for other in (a - 0.1, a + 0.1):
        assert np.linalg.norm(r + other * mode.w[:n]) > best


def test_a_dag_has_no_mode_and_falls_back_to_over_relaxation() -> None:
    graph = copying_model_graph(2000, 8.0, seed=47, acyclic=True).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("pagerank",), tolerance=1e-9, max_error=1e-8,
                      local_work=0.0)
    ranks.cold_start()
    engine = ranks.engines["pagerank"]
    assert engine.mode is not None
    pulls: list[int] = []
    pull = engine.mode._pull

    def counted(x: np.ndarray, out: np.ndarray, n: int) -> None:
        pulls.append(1)
        pull(x, out, n)

    engine.mode._pull = counted  # type: ignore[method-assign]
    assert not engine.mode.compute(engine.y, engine.graph.num_ids)  # M is nilpotent: no mode...
    assert len(pulls) < dominant_mode.POWER_STEPS  # ...seen as it dies out, not after 40 pulls
    assert not engine.mode.available
    # Not retried on every refresh: only once the graph has changed enough.
    assert not engine.mode.wanted(graph.num_links)
    assert engine.mode.wanted(int(graph.num_links * (1 + 2 * dominant_mode.STALE_SHARE)))
    engine.relax = True
    engine.global_runs = 1
    # Deletions only: the graph stays a DAG, and the over-relaxed sweeps converge.
    edits = random_edit_batch(graph, 600, np.random.default_rng(48))
    report = ranks.apply(EdgeBatch(delete_src=edits.delete_src,
                                   delete_dst=edits.delete_dst))["pagerank"]
    assert report.fresh
    assert not engine.mode.available


def test_wpr_keeps_no_mode() -> None:
    graph = copying_model_graph(300, 6.0, seed=49).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("wpr",))
    assert ranks.engines["wpr"].mode is None


def test_a_shift_that_raised_the_residual_is_still_moved_into_y(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The L2-best shift can raise ||r||_1; deflation then stops, but the sweep already
    # added the shift to r, so y must still take it (found by review: the lost shift
    # left r the residual of another vector, and a "fresh" bound 4e8x too small).
    ranks, engine = deflating_ranks(53)
    mode = engine.mode
    assert mode is not None
    rng = np.random.default_rng(54)
    ranks.apply(random_edit_batch(ranks.graph, 3000, rng))
    assert mode.available
    calls = []

    def overshoot(along: float) -> float:
        calls.append(along)
        return 1e4 if len(calls) == 1 else 0.0

    monkeypatch.setattr(mode, "shift_for", overshoot)
    report = ranks.apply(random_edit_batch(ranks.graph, 3000, rng))["pagerank"]
    assert calls and report.fresh
    assert engine.recompute_residual() <= 1e-10
    error = ranks.scores("pagerank") - exact(ranks)
    assert np.abs(error).sum() <= report.bound + 1e-9


@pytest.mark.parametrize("damping", [0.95, 0.99])
def test_over_relaxation_never_passes_on_more_than_a_pages_residual(damping: float) -> None:
    # Without a mode (mode=None here), slow sweeps over-relax; at d * omega > 1 a sweep
    # along a ring (i -> i+1, i+2, i+4) grew ||r||_1 to 1e44 within one sweep.
    n = 3000
    src = np.repeat(np.arange(n), 3).astype(np.int32)
    dst = ((src + np.tile([1, 2, 4], n)) % n).astype(np.int32)
    graph = LinkGraph.from_id_edges(src, dst, [f"https://ring.test/{i}" for i in range(n)])
    ranks = LiveRanks(graph, algorithms=("pagerank",), tolerance=1e-9, damping=damping,
                      local_work=0.0, max_iter=3000)
    ranks.cold_start()
    engine = ranks.engines["pagerank"]
    engine.mode = None
    engine.relax = True
    engine.global_runs = 1
    report = ranks.apply(random_edit_batch(graph, 200, np.random.default_rng(0)))["pagerank"]
    assert report.fresh
    assert engine.recompute_residual() <= 1e-10
    assert np.abs(ranks.scores("pagerank") - exact(ranks)).sum() <= report.bound + 1e-9
