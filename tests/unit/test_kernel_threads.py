"""The kernels' threads: limited per calling thread, and the guard that drops to one
thread while another process holds the second core."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from ranker import _kernels as K
from ranker import _scaled_sweep as SK
from ranker import _split_sweep as SS
from ranker import _thread_guard as TG
from ranker._thread_guard import ThreadGuard
from ranker.incremental import LiveRanks
from ranker.synthetic import copying_model_graph, random_edit_batch
from tests.unit.test_residual import exact


def test_kernel_threads_are_limited_per_calling_thread() -> None:
    # The consumer keeps its ranker thread's kernels serial (Settings.ranker_threads)
    # while the thread that loads the mirror keeps every core.
    import threading

    import numba

    from ranker import set_kernel_threads

    before = numba.get_num_threads()
    seen: dict[str, int] = {}

    def limited() -> None:
        seen["set"] = set_kernel_threads(1)
        seen["there"] = numba.get_num_threads()
        seen["clamped"] = set_kernel_threads(10_000)

    worker = threading.Thread(target=limited)
    worker.start()
    worker.join()
    assert seen["set"] == 1 and seen["there"] == 1
    assert seen["clamped"] == numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    assert numba.get_num_threads() == before


def test_thread_guard_pauses_two_threads_while_the_process_lacks_a_core() -> None:
    if numba.config.NUMBA_NUM_THREADS < 2:  # type: ignore[attr-defined]
        pytest.skip("one kernel thread only")
    now = [0.0]
    guard = ThreadGuard(clock=lambda: now[0])
    large = SS.SPLIT_MIN_PAGES  # a graph large enough for two threads
    before = numba.get_num_threads()
    with guard.kernel_threads(large):
        assert numba.get_num_threads() == before
        wall = TG.JUDGED_WALL / 2
        assert guard.timed(wall, 0.0)  # too short to judge yet: CPU clocks move in ticks
        assert not guard.timed(wall, 2 * wall)  # judged together: one core of two
        assert guard.paused() and numba.get_num_threads() == 1
        assert guard.taken_count == 1  # what the ranker benchmark reports
    assert numba.get_num_threads() == before  # the caller's limit, whatever happened
    with guard.kernel_threads(large):
        assert numba.get_num_threads() == 1  # paused: one kernel thread from the start
    now[0] = TG.PAUSE_SECONDS
    with guard.kernel_threads(large):
        assert numba.get_num_threads() == before  # tried again
        assert guard.timed(TG.JUDGED_WALL, TG.SHARED_CORES * TG.JUDGED_WALL)
        assert not guard.paused() and guard.taken_count == 1
    # A small graph's kernels always run on one thread: there two only add waiting.
    with guard.kernel_threads(large - 1):
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == before


def test_refresh_goes_on_with_one_thread_when_a_core_is_taken() -> None:
    if numba.config.NUMBA_NUM_THREADS < 2:  # type: ignore[attr-defined]
        pytest.skip("one kernel thread only")
    graph = copying_model_graph(3000, 8.0, seed=37).to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-9, max_error=1e-8, local_work=0.0)
    ranks.cold_start()
    now = [0.0]
    ranks.thread_guard.clock = lambda: now[0]
    # Kernel calls, with the calling thread's kernel thread limit at each.
    calls: dict[str, list[int]] = {"split": [], "one": []}
    wrapped = {}
    for module, name, kind in ((SS, "split_sweep", "split"), (SS, "split_sweep_scaled", "split"),
                               (K, "sweep", "one"), (SK, "sweep_scaled", "one")):
        kernel = getattr(module, name)

        def counted(*args: object, _kernel=kernel, _kind=kind) -> object:
            calls[_kind].append(numba.get_num_threads())
            return _kernel(*args)
        wrapped[(module, name)] = counted
    before = numba.get_num_threads()
    rng = np.random.default_rng(38)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SS, "SPLIT_MIN_PAGES", 0)
        patch.setattr(TG, "JUDGED_WALL", 0.0)  # every two-thread sweep judged...
        patch.setattr(TG, "SHARED_CORES", np.inf)  # ...as if it lacked a core
        for (module, name), counted in wrapped.items():
            patch.setattr(module, name, counted)
        reports = ranks.apply(random_edit_batch(graph, 3000, rng))
        for name, report in reports.items():
            assert report.mode == "global" and report.fresh, report
            truth = exact(ranks, name)
            assert np.abs(ranks.scores(name) - truth).max() <= report.max_abs_bound + 1e-12
        # One two-thread sweep (PageRank's first), then every sweep on one kernel
        # thread, WPR's too: the engines share the guard.
        assert len(calls["split"]) == 1 and len(calls["one"]) > 2
        assert set(calls["one"]) == {1} and numba.get_num_threads() == before
        ranks.apply(random_edit_batch(graph, 3000, rng))  # still paused
        assert len(calls["split"]) == 1 and set(calls["one"]) == {1}
        now[0] = TG.PAUSE_SECONDS  # the pause is over: two threads are tried again
        ranks.apply(random_edit_batch(graph, 3000, rng))
        assert len(calls["split"]) == 2
    assert numba.get_num_threads() == before
