"""ResidualEngine internals: fused WPR re-weighing, over-relaxed sweeps, the early switch."""

from __future__ import annotations

import numpy as np
import pytest

from ranker import _column_kernels as CK
from ranker import _kernels as K
from ranker import _scaled_sweep as SK
from ranker import _split_sweep as SS
from ranker import refresh, residual
from ranker.bounds import static_tolerance
from ranker.dominant_mode import NO_MODE
from ranker.edge_batches import EdgeBatch
from ranker.incremental import LiveRanks
from ranker.pagerank import pagerank
from ranker.refresh import SLOW_SWEEP, Refresh
from ranker.synthetic import copying_model_graph, random_edit_batch
from ranker.weighted_pagerank import weighted_pagerank

SOLVERS = {"pagerank": pagerank, "wpr": weighted_pagerank}


def exact(ranks: LiveRanks, algorithm: str) -> np.ndarray:
    graph = ranks.graph
    return SOLVERS[algorithm](graph.to_csr(), damping=ranks.damping, max_iter=5000,
                              tol=static_tolerance(graph.num_ids, ranks.damping),
                              alive=graph.live_mask()).scores


def assert_sums_exact(ranks: LiveRanks) -> None:
    """WPR's kept SI, SO and signed factors equal a re-summation of the current graph
    (while a re-weigh is owed, the batch's ends keep their old factors until the
    refresh: ranker._deferred_reweigh)."""
    graph, engine = ranks.graph, ranks.engines["wpr"]
    n = graph.num_ids
    si, so = np.zeros(n), np.zeros(n)
    CK.all_sums(n, graph.out_start, graph.out_len, graph.out_nbr, graph.in_len, si, so)
    assert np.array_equal(si, engine.si[:n]) and np.array_equal(so, engine.so[:n])
    in_len, out_len = graph.in_len[:n].astype(float), graph.out_len[:n].astype(float)
    weight = np.maximum(in_len, 1.0)  # a page without in-links: its scale, see set_factors
    factor = np.where(out_len > 0, weight * out_len, -weight)
    kept = np.ones(n, dtype=bool)
    if engine.owed is not None:
        kept[engine.owed[1]] = False
    assert np.array_equal(factor[kept], engine.factor[:n][kept])
    assert not engine.is_source.any() and not engine.has_prev.any()


def test_wpr_reweighing_keeps_sums_and_residual_exact() -> None:
    graph = copying_model_graph(3000, 8.0, seed=21).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("wpr",), tolerance=1e-9, recompute_every=10_000)
    ranks.cold_start()
    engine = ranks.engines["wpr"]
    rng = np.random.default_rng(22)
    for size in (4, 60, 600):
        batch = random_edit_batch(graph, size, rng)
        # Page removals and revivals change the degrees of all their neighbours.
        gone = rng.choice(graph.num_ids, 3, replace=False).astype(np.int32)
        batch = EdgeBatch(batch.insert_src, batch.insert_dst, batch.delete_src,
                          batch.delete_dst, gone)
        report = ranks.apply(batch)["wpr"]
        assert report.fresh
        assert_sums_exact(ranks)
        assert engine.recompute_residual() <= 1e-12
        truth = exact(ranks, "wpr")
        assert np.abs(ranks.scores("wpr") - truth).sum() <= report.bound + 1e-12 * truth.sum()


@pytest.mark.parametrize("omega", [1.15, 1.9])
def test_over_relaxed_sweeps_keep_the_certified_bound(omega: float) -> None:
    graph = copying_model_graph(2000, 8.0, seed=23).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("pagerank",), tolerance=1e-9, max_error=1e-8,
                      local_work=0.0)
    ranks.cold_start()
    engine = ranks.engines["pagerank"]
    engine.omega = omega
    engine.relax = True  # as if plain sweeps had been measured to be slow
    engine.global_runs = 1  # not a probe refresh
    rng = np.random.default_rng(24)
    for _ in range(3):
        report = ranks.apply(random_edit_batch(graph, 4000, rng))["pagerank"]
        assert report.mode == "global" and report.fresh, report
        truth = exact(ranks, "pagerank")
        error = ranks.scores("pagerank") - truth
        assert np.abs(error).sum() <= report.bound + 1e-12 * max(1.0, float(truth.sum()))
        assert np.abs(error).max() <= report.max_abs_bound + 1e-12
        assert engine.recompute_residual() <= 1e-10


def test_over_relaxed_sweep_keeps_the_residual_invariant() -> None:
    graph = copying_model_graph(500, 6.0, seed=25).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("pagerank", "wpr"), tolerance=1e-3)
    ranks.cold_start()
    n = graph.num_ids
    for engine in ranks.engines.values():
        engine.r[:n] += np.random.default_rng(26).normal(0.0, 0.1, n)  # any y will do
        engine.y[:n] += engine.r[:n] * 0.5
        engine.recompute_residual()
        K.sweep(engine.kind, engine.damping, 0.0, 1.3, n, engine.y, engine.r,
                *engine.arrays(), engine.touched, engine.qstate, engine.is_touched, 2**62,
                0.0, NO_MODE)
        assert engine.recompute_residual() <= 1e-12


@pytest.mark.parametrize(("omega", "max_work"), [(1.0, 2**62), (1.3, 2**62), (1.0, 900)])
def test_scaled_wpr_sweep_equals_the_plain_one(omega: float, max_work: int) -> None:
    graph = copying_model_graph(800, 6.0, seed=29).to_linkgraph()
    n0 = graph.num_ids
    dangling = np.flatnonzero(graph.out_len[:n0] == 0)
    # Pages no link reaches (scale 1), and pages linking only to pages without
    # out-links (mode-2 columns, pushing into r_dangling).
    fresh = np.array([graph.intern(f"https://fresh.example/{i}") for i in range(6)])
    graph.apply(EdgeBatch(insert_src=np.repeat(fresh, 3), insert_dst=np.tile(dangling[:3], 6),
                          removed_pages=np.arange(0, n0, 61, dtype=np.int32)))
    ranks = LiveRanks(graph, algorithms=("wpr",), tolerance=1e-3)
    ranks.cold_start()
    engine = ranks.engines["wpr"]
    n = graph.num_ids
    assert (graph.in_len[:n] == 0).any() and (engine.so[:n][graph.out_len[:n] > 0] == 0).any()
    engine.r[:n] += np.random.default_rng(30).normal(0.0, 0.1, n)
    results = []
    for scaled in (False, True):
        y, r, r_dangling = engine.y.copy(), engine.r.copy(), np.zeros_like(engine.r)
        touched, is_touched = np.zeros_like(engine.touched), np.zeros_like(engine.is_touched)
        qstate = np.zeros_like(engine.qstate)
        if scaled:
            SK.to_scaled(n, r, r_dangling, engine.factor)
            p, w, l1, peak, y_sum, y_max = SK.sweep_scaled(
                engine.damping, 0.02, omega, n, y, r, r_dangling, graph.out_start,
                graph.out_len, graph.out_nbr, engine.factor, engine.si, engine.so, touched,
                qstate, is_touched, max_work)
            SK.from_scaled(n, r, r_dangling, engine.factor)
        else:
            p, w, l1, peak, _, y_sum, y_max = K.sweep(
                engine.kind, engine.damping, 0.02, omega, n, y, r, *engine.arrays(), touched,
                qstate, is_touched, max_work, 0.0, NO_MODE)
        results.append((p, w, sorted(touched[:qstate[K.T_COUNT]]), y[:n], r[:n],
                        [l1, peak, y_sum, y_max]))
    (p0, w0, t0, y0, r0, stats0), (p1, w1, t1, y1, r1, stats1) = results
    assert (p0, w0, t0) == (p1, w1, t1) and 0 < p0 < n
    np.testing.assert_allclose(y1, y0, rtol=0, atol=1e-13)
    np.testing.assert_allclose(r1, r0, rtol=0, atol=1e-13)
    np.testing.assert_allclose(stats1, stats0, rtol=1e-12)


@pytest.mark.parametrize(("algorithm", "shift"), [("pagerank", 0.0), ("pagerank", 0.3),
                                                ("wpr", 0.0)])
def test_two_thread_sweep_keeps_the_residual_and_touches_what_it_pushes(
        algorithm: str, shift: float) -> None:
    graph = copying_model_graph(3001, 6.0, seed=33).to_linkgraph()  # odd: unequal halves
    n0 = graph.num_ids
    dangling = np.flatnonzero(graph.out_len[:n0] == 0)
    fresh = np.array([graph.intern(f"https://fresh.example/{i}") for i in range(6)])
    graph.apply(EdgeBatch(insert_src=np.repeat(fresh, 3), insert_dst=np.tile(dangling[:3], 6),
                          removed_pages=np.arange(0, n0, 61, dtype=np.int32)))
    ranks = LiveRanks(graph, algorithms=(algorithm,), tolerance=1e-3)
    ranks.cold_start()
    engine = ranks.engines[algorithm]
    n = graph.num_ids
    engine.y[:n] += np.random.default_rng(34).normal(0.0, 0.1, n)  # any y will do
    w = np.random.default_rng(35).normal(0.0, 0.01, engine.r.size) if shift else NO_MODE
    engine.recompute_residual()
    before = engine.y.copy()
    engine.touched[0] = 7  # already touched before the sweep: kept, not repeated
    engine.is_touched[7] = True
    engine.qstate[K.T_COUNT] = 1
    cross, cross_dangling, scratch = engine.split_buffers()
    g = graph
    if algorithm == "wpr":
        SK.to_scaled(n, engine.r, engine.r_dangling, engine.factor)
        p, work, l1, peak, y_sum, y_max = SS.split_sweep_scaled(
            engine.damping, 0.02, 1.0, n, engine.y, engine.r, engine.r_dangling, g.out_start,
            g.out_len, g.out_nbr, engine.factor, engine.si, engine.so, engine.touched,
            engine.qstate, engine.is_touched, cross, cross_dangling, scratch)
        SK.from_scaled(n, engine.r, engine.r_dangling, engine.factor)
    else:
        p, work, l1, peak, along, y_sum, y_max = SS.split_sweep(
            engine.damping, 0.02, 1.0, n, engine.y, engine.r, g.out_start, g.out_len,
            g.out_nbr, engine.touched, engine.qstate, engine.is_touched, shift, w, cross,
            scratch)
        if shift:
            np.testing.assert_allclose(along, float(np.dot(engine.r[:n], w[:n])), rtol=1e-9)
            engine.r[:n] -= shift * w[:n]  # r of y alone: the shift is the caller's to move
    assert not cross.any() and not cross_dangling.any()
    r = engine.r[:n].copy()
    expected = _residual_reference(graph, engine.kind, engine.damping, engine.y, engine.si[:n],
                                   engine.so[:n])
    np.testing.assert_allclose(r, expected, rtol=0, atol=1e-12)
    pushed = np.flatnonzero(engine.y[:n] != before[:n])
    touched = engine.touched[:engine.qstate[K.T_COUNT]]
    assert touched[0] == 7 and sorted(touched[1:]) == sorted(set(pushed) - {7})
    assert 0 < p < n and p == pushed.size and work == g.out_len[pushed].sum()
    stats = [np.abs(expected).sum(), np.abs(expected).max(), engine.y[:n].sum(),
             engine.y[:n].max()]
    if shift:
        stats[:2] = [np.abs(r + shift * w[:n]).sum(), np.abs(r + shift * w[:n]).max()]
    np.testing.assert_allclose([l1, peak, y_sum, y_max], stats, rtol=1e-9)


@pytest.mark.parametrize(("algorithm", "acyclic"), [("pagerank", True), ("wpr", False),
                                                  ("pagerank", False)])
def test_global_refresh_ends_from_a_queue_once_sweeps_thin_out(
        algorithm: str, acyclic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    tails = []
    tail_pass = Refresh.tail_pass

    def counted(self: Refresh) -> tuple[float, float]:
        tails.append(self.sweeps)
        return tail_pass(self)

    monkeypatch.setattr(Refresh, "tail_pass", counted)
    # Any share is safe; a large one makes the tail start early on a small graph.
    monkeypatch.setattr(refresh, "TAIL_SHARE", 0.2)
    graph = copying_model_graph(5000, 8.0, seed=33, acyclic=acyclic).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=(algorithm,), tolerance=1e-9, max_error=1e-9,
                      local_work=0.0)
    ranks.cold_start()
    engine = ranks.engines[algorithm]
    rng = np.random.default_rng(34)
    for size in (30, 300):
        tails.clear()
        report = ranks.apply(random_edit_batch(graph, size, rng))[algorithm]
        assert report.mode == "global" and report.fresh
        if algorithm == "pagerank" and not acyclic:
            # Its sweeps remove the dominant mode, which the queue's pushes cannot:
            # they keep sweeping (from the queue: 10x the pushes on 1M pages).
            assert engine.mode is not None and engine.mode.available and not tails
        else:
            assert tails and min(tails) >= 1
        truth = exact(ranks, algorithm)
        error = ranks.scores(algorithm) - truth
        assert np.abs(error).sum() <= report.bound + 1e-12 * max(1.0, float(truth.sum()))
        assert np.abs(error).max() <= report.max_abs_bound + 1e-12
        assert engine.recompute_residual() <= 1e-10


def test_plain_sweeps_decide_relaxation_and_similar_batches_go_global_at_once() -> None:
    graph = copying_model_graph(3000, 8.0, seed=27).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("pagerank",), tolerance=1e-9, max_error=1e-9,
                      local_work=0.05)
    ranks.cold_start()
    engine = ranks.engines["pagerank"]
    rng = np.random.default_rng(28)
    first = ranks.apply(random_edit_batch(graph, 400, rng))["pagerank"]
    assert first.mode == "global" and first.fresh
    # The first global refresh sweeps plainly and measures the convergence rate.
    assert 0.0 < engine.last_rate < 1.0
    assert engine.relax == (engine.last_rate > SLOW_SWEEP)
    bar = engine.global_from
    assert np.isfinite(bar)
    second = ranks.apply(random_edit_batch(graph, 400, rng))["pagerank"]
    assert second.mode == "global" and second.fresh
    assert engine.global_from > bar  # went global without burning the push budget
    small = ranks.apply(random_edit_batch(graph, 2, rng))["pagerank"]
    assert small.fresh


def test_wpr_full_recompute_absorb_matches_the_column_re_weigh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Large WPR batches are absorbed by recomputing SI, SO and r (FULL_RESIDUAL_SHARE);
    # both ways must leave the same state, and so the same refreshed scores.
    states = []
    for share in (0.0, np.inf):
        monkeypatch.setattr(residual, "FULL_RESIDUAL_SHARE", share)
        graph = copying_model_graph(2000, 8.0, seed=33).to_linkgraph()
        ranks = LiveRanks(graph, algorithms=("wpr",), tolerance=1e-10,
                          recompute_every=10_000)
        ranks.cold_start()
        rng = np.random.default_rng(34)
        for size in (10, 300, 3000):
            ranks.apply(random_edit_batch(graph, size, rng))
        engine = ranks.engines["wpr"]
        n = graph.num_ids
        assert engine.recompute_residual() <= 1e-12
        states.append((engine.si[:n].copy(), engine.so[:n].copy(), ranks.scores("wpr").copy()))
    (si_a, so_a, y_a), (si_b, so_b, y_b) = states
    assert np.array_equal(si_a, si_b) and np.array_equal(so_a, so_b)
    assert np.abs(y_a - y_b).sum() <= 2e-10 * y_a.sum()


def test_stale_wpr_batches_keep_the_sums_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    # Batches absorbed while r is stale (left to the next refresh) still keep SI and
    # SO, so the recomputation does not re-sum every link: after each batch (new
    # pages, insertions, deletions, removals) they equal a re-summation from scratch.
    monkeypatch.setattr(residual, "FULL_RESIDUAL_SHARE", 0.0)
    graph = copying_model_graph(2000, 8.0, seed=35).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("wpr",), tolerance=1e-10, recompute_every=10_000)
    ranks.cold_start()
    engine = ranks.engines["wpr"]
    rng = np.random.default_rng(36)
    for _ in range(4):
        edits = random_edit_batch(graph, 200, rng)
        new = _new_pages_batch(ranks, 20, 5, rng)
        gone = rng.choice(2000, 4, replace=False).astype(np.int32)
        ranks.absorb(EdgeBatch(np.concatenate([edits.insert_src, new.insert_src]),
                               np.concatenate([edits.insert_dst, new.insert_dst]),
                               edits.delete_src, edits.delete_dst, gone))
        # The first batch's re-weigh is owed to the refresh's first sweep; the next
        # one cannot build on that residual, so from then on it is stale.
        assert (engine.stale or engine.owed is not None) and engine.sums_exact
        assert_sums_exact(ranks)
    report = ranks.refresh()["wpr"]
    assert report.fresh and not engine.stale
    truth = exact(ranks, "wpr")
    assert np.abs(ranks.scores("wpr") - truth).sum() <= report.bound + 1e-9


def _residual_reference(graph, kind: int, damping: float, y, si, so):
    """``r = b + d*M*y - y`` edge by edge, with M as defined in ranker._kernels."""
    n = graph.num_ids
    src, dst = graph.edges()
    out_len = graph.out_len[:n].astype(np.float64)
    in_len = graph.in_len[:n].astype(np.float64)
    if kind == K.KIND_PAGERANK:
        weight = 1.0 / out_len[src]
    else:
        has_so = so[src] > 0.0
        by_so = in_len[dst] * out_len[dst] / np.where(has_so, si[src] * so[src], 1.0)
        weight = np.where(has_so, by_so, in_len[dst] / (si[src] * out_len[src]))
    pushed = np.bincount(dst, weights=damping * y[src] * weight, minlength=n)
    return np.where(graph.live_mask()[:n], 1.0 - damping, 0.0) - y[:n] + pushed


@pytest.mark.parametrize("algorithm", ["pagerank", "wpr"])
def test_parallel_pulled_residual_equals_the_reference(algorithm: str) -> None:
    graph = copying_model_graph(3000, 6.0, seed=31).to_linkgraph()
    graph.apply(EdgeBatch(removed_pages=np.arange(0, 3000, 97, dtype=np.int32)))
    ranks = LiveRanks(graph, algorithms=(algorithm,), tolerance=1e-6)
    ranks.cold_start()
    engine = ranks.engines[algorithm]
    n = graph.num_ids
    y = engine.y.copy()
    y[::13] = 0.0
    pulled = np.zeros_like(engine.r)
    l1, peak, _ = K.full_residual_pull(engine.kind, engine.damping, n, graph.live_mask(), y,
                                       pulled, graph.in_start, graph.in_len, graph.in_nbr,
                                       graph.out_len, engine.si, engine.so)
    expected = _residual_reference(graph, engine.kind, engine.damping, y, engine.si[:n],
                                   engine.so[:n])
    np.testing.assert_allclose(pulled[:n], expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose([l1, peak], [np.abs(expected).sum(), np.abs(expected).max()],
                               rtol=1e-12)


def _new_pages_batch(ranks: LiveRanks, count: int, links: int,
                     rng: np.random.Generator) -> EdgeBatch:
    """``count`` new pages, each linking to ``links`` existing pages (a growing crawl)."""
    graph = ranks.graph
    existing = graph.num_ids
    new = np.array([graph.intern(f"https://new{graph.num_ids}.example/{i}")
                    for i in range(count)], dtype=np.int64)
    return EdgeBatch(insert_src=np.repeat(new, links),
                     insert_dst=rng.integers(0, existing, count * links))


def test_capped_refresh_spends_at_most_its_share_of_a_sweep_and_says_so() -> None:
    graph = copying_model_graph(20_000, 8.0, seed=51).to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-9, local_work=0.0)
    ranks.cold_start()
    rng = np.random.default_rng(52)
    ranks.absorb(_new_pages_batch(ranks, 500, 10, rng))
    pending = {name: engine.pending_work for name, engine in ranks.engines.items()}
    capped = ranks.refresh(max_sweeps=0.25)
    widest = int(graph.out_len[: graph.num_ids].max())
    for name, report in capped.items():
        assert not report.fresh and report.relative_bound > 1e-9
        # The column updates, the local push's floor budget (local_work=0), then a
        # quarter of a sweep of link visits; a pass stops after the page that crosses it.
        assert report.work - pending[name] <= 10_000 + widest + 0.25 * graph.num_links + widest
        error = np.abs(exact(ranks, name) - ranks.scores(name)[: graph.num_ids]).sum()
        assert error <= report.bound
    after = ranks.refresh()
    for name, report in after.items():
        assert report.fresh
        error = np.abs(exact(ranks, name) - ranks.scores(name)[: graph.num_ids]).sum()
        assert error <= report.bound <= 1e-9 * report.total


def test_new_pages_count_as_change_so_a_growing_crawl_goes_global_at_once() -> None:
    # A new page has y = 0, so adding its column visits nothing; its links are still
    # what the refresh must push through. Counted as change, a batch of new pages
    # about as large as one that went global goes global without a local push.
    graph = copying_model_graph(3000, 8.0, seed=53).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=("pagerank",), tolerance=1e-9, local_work=0.05)
    ranks.cold_start()
    engine = ranks.engines["pagerank"]
    rng = np.random.default_rng(54)
    first = ranks.apply(_new_pages_batch(ranks, 300, 10, rng))["pagerank"]
    assert first.mode == "global" and first.fresh
    bar = engine.global_from
    assert bar >= 2500  # about the 300 pages' 3,000 links, not zero
    second = ranks.apply(_new_pages_batch(ranks, 300, 10, rng))["pagerank"]
    assert second.mode == "global" and second.fresh
    assert engine.global_from > bar  # no push budget burnt first


@pytest.mark.parametrize("algorithm", ["pagerank", "wpr"])
@pytest.mark.parametrize("mode", ["local", "global"])
def test_a_refresh_keeps_to_the_ids_it_started_with(algorithm: str, mode: str) -> None:
    # The consumer interns the next batch's pages on its main thread while a refresh
    # runs on the ranker thread: ids beyond the engine's arrays must not be swept.
    graph = copying_model_graph(400, 6.0, seed=41).to_linkgraph()
    ranks = LiveRanks(graph, algorithms=(algorithm,), tolerance=1e-9)
    ranks.cold_start()
    ranks.absorb(random_edit_batch(graph, 40, np.random.default_rng(42)))
    engine = ranks.engines[algorithm]
    started = graph.num_ids
    run = Refresh(engine, mode, None, None)
    graph.intern_many([f"https://late.example/{i}" for i in range(3 * graph.id_capacity)])
    assert graph.num_ids > engine.y.size
    report = run.run()
    assert report.fresh
    assert report.moved_ids.size and report.moved_ids.max() < started
    scores = engine.y[:started]
    reference = exact(ranks, algorithm)[:started]
    assert np.abs(scores - reference).sum() <= 1e-9 * scores.sum()
