"""WPR's re-weigh owed to the sweeps (ranker._deferred_reweigh): paid exactly, or recomputed."""

from __future__ import annotations

import numpy as np
import pytest

from ranker import _deferred_reweigh as DR
from ranker import residual
from ranker.edge_batches import EdgeBatch
from ranker.incremental import LiveRanks
from ranker.linkgraph import LinkGraph
from ranker.synthetic import copying_model_graph, random_edit_batch
from tests.unit.test_residual import assert_sums_exact, exact


@pytest.fixture(autouse=True)
def every_batch_owes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every batch with a plan is owed, however small the graph or large the batch.
    monkeypatch.setattr(residual, "FULL_RESIDUAL_SHARE", 0.0)
    monkeypatch.setattr(residual, "OWED_SHARE", np.inf)


def _wpr(graph: LinkGraph) -> LiveRanks:
    ranks = LiveRanks(graph, algorithms=("wpr",), tolerance=1e-10, recompute_every=10_000)
    ranks.cold_start()
    return ranks


def _mixed_batch(ranks: LiveRanks, size: int, rng: np.random.Generator) -> EdgeBatch:
    """Random edits, removed pages, new pages, and pages without out-links gaining some
    (their factor changes sign, so their residual is summed again)."""
    graph = ranks.graph
    n = graph.num_ids
    edits = random_edit_batch(graph, size, rng)
    bare = np.flatnonzero(graph.out_len[:n] == 0)
    starters = rng.choice(bare, min(10, bare.size), replace=False)
    new = np.array([graph.intern(f"https://new.example/{graph.num_ids}") for _ in range(5)])
    src = np.concatenate([edits.insert_src, starters, new])
    dst = np.concatenate([edits.insert_dst, rng.integers(0, n, starters.size + new.size)])
    gone = rng.choice(n, 3, replace=False)
    return EdgeBatch(src, dst, edits.delete_src, edits.delete_dst, gone)


@pytest.mark.parametrize("acyclic", [False, True])
def test_an_owed_reweigh_is_paid_exactly_before_the_first_sweep(
        acyclic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    flipped: list[int] = []
    rescale = DR.rescale_ends

    def counted(*args: np.ndarray) -> np.ndarray:
        pages: np.ndarray = rescale(*args)
        flipped.append(pages.size)
        return pages

    monkeypatch.setattr(DR, "rescale_ends", counted)
    graph = copying_model_graph(3000, 8.0, seed=61, acyclic=acyclic).to_linkgraph()
    ranks = _wpr(graph)
    engine = ranks.engines["wpr"]
    rng = np.random.default_rng(62)
    paid = 0
    for size in (6, 60, 600, 60, 6, 200):
        ranks.absorb(_mixed_batch(ranks, size, rng))
        paid += engine.owed is not None
        report = engine.refresh(mode="global")
        assert report.fresh and engine.owed is None and not engine.pending.any()
        assert_sums_exact(ranks)
        assert engine.recompute_residual() <= 1e-12
        truth = exact(ranks, "wpr")
        assert np.abs(ranks.scores("wpr") - truth).sum() <= report.bound + 1e-9
    # Some batches had a column change mode (recomputed, tested below); the paid ones
    # included pages whose factor changed sign, summed again from their in-links.
    assert paid == len(flipped) >= 3 and sum(flipped) > 0


@pytest.mark.parametrize("then", ["capped", "local", "second batch"])
def test_an_owed_reweigh_is_recomputed_when_no_sweep_pays_it(then: str) -> None:
    graph = copying_model_graph(3000, 8.0, seed=63).to_linkgraph()
    ranks = _wpr(graph)
    engine = ranks.engines["wpr"]
    rng = np.random.default_rng(64)
    ranks.absorb(random_edit_batch(graph, 40, rng))
    assert engine.owed is not None
    if then == "capped":
        report = engine.refresh(max_sweeps=0.25)
    elif then == "local":
        engine.local_work = 1e6  # the push never runs out of budget
        report = engine.refresh(mode="local")
        assert report.mode == "local"
    else:
        ranks.absorb(random_edit_batch(graph, 40, rng))
        assert engine.stale and engine.owed is None
        report = engine.refresh(mode="global")
    assert engine.owed is None and not engine.pending.any()
    assert engine.recompute_residual() <= 1e-12
    truth = exact(ranks, "wpr")
    assert np.abs(ranks.scores("wpr") - truth).sum() <= report.bound + 1e-9


def test_a_column_changing_mode_sends_the_batch_to_a_recompute() -> None:
    # Page 0's targets 1 and 2 have no out-links, so its column is mode 2 (SO = 0);
    # page 1 gaining one turns it to mode 1, which pushes into the other residual
    # array: an owed re-weigh cannot express that.
    keys = [f"p{i}" for i in range(6)]
    graph = LinkGraph.from_id_edges(np.array([0, 0, 3, 4, 5, 5]), np.array([1, 2, 0, 3, 4, 0]),
                                    keys)
    ranks = _wpr(graph)
    engine = ranks.engines["wpr"]
    assert engine.so[0] == 0.0
    ranks.absorb(EdgeBatch(np.array([1]), np.array([4])))
    assert engine.stale and engine.owed is None and not engine.pending.any()
    assert engine.so[0] > 0.0
    report = engine.refresh(mode="global")
    assert report.fresh and engine.recompute_residual() <= 1e-12
    assert np.abs(ranks.scores("wpr") - exact(ranks, "wpr")).sum() <= report.bound + 1e-9


def test_a_batch_re_weighing_most_links_is_recomputed_instead(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Past OWED_SHARE of the links the full pull costs less than the settle would.
    monkeypatch.setattr(residual, "OWED_SHARE", 0.45)
    graph = copying_model_graph(3000, 8.0, seed=65).to_linkgraph()
    ranks = _wpr(graph)
    engine = ranks.engines["wpr"]
    rng = np.random.default_rng(66)
    ranks.absorb(random_edit_batch(graph, 3000, rng))
    assert engine.stale and engine.owed is None and not engine.pending.any()
    assert_sums_exact(ranks)
    report = engine.refresh(mode="global")
    assert report.fresh and engine.recompute_residual() <= 1e-12
