"""The score publisher's pure parts: what to write, and the bytes that write it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.resp import command
from consumer.score_plan import ZsetRecord, plan_writes, unwritten_within
from consumer.score_wire import SCORE_TOKEN, UrlTable, score_tokens, zadd_command, zrem_command
from tests.publisher_fakes import FakeGraph, Report


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-12, 1.0), max_size=60), st.floats(0.0, 5.0))
def test_unwritten_moves_fit_the_budget_smallest_first(diffs, budget):
    d = np.array(diffs)
    keep = unwritten_within(d, budget)
    assert d[keep].sum() <= budget * (1 + 1e-12)
    if keep.any() and (~keep).any():
        assert d[~keep].min() >= d[keep].max()  # the smallest moves are the ones left
    if d.sum() <= budget:
        assert keep.all()


def record(values, present):
    return ZsetRecord(np.array(values, dtype=float), np.array(present))


def test_plan_adds_missing_removes_dead_and_writes_big_moves_first():
    y = np.array([1.0, 2.0, 0.0, 3.0, 4.0])
    live = np.array([True, True, False, True, True])
    rec = record([1.0, 2.5, 7.0, 3.0 + 1e-3, 0.0], [True, True, True, True, False])
    plan = plan_writes(y, live, rec, threshold=1e-9, budget=1e-2)
    # Page 4 is missing (always added), page 2 is dead (removed), page 1 moved by
    # 0.5 (over the budget: written); page 3's 1e-3 fits the budget and waits.
    assert plan.add_ids.tolist() == [1, 4] and plan.add_values.tolist() == [2.0, 4.0]
    assert plan.remove_ids.tolist() == [2]
    assert plan.unwritten == 1 and abs(plan.remainder - 1e-3) < 1e-15
    assert rec.values[:5].tolist() == [1.0, 2.0, 0.0, 3.0 + 1e-3, 4.0]
    assert rec.present[:5].tolist() == [True, True, False, True, True]
    assert rec.members() == 4
    # Nothing to do once the ZSET shows y (within the budget).
    again = plan_writes(y, live, rec, threshold=1e-9, budget=1e-2)
    assert again.add_ids.size == 0 and again.remove_ids.size == 0


def test_plan_with_no_budget_writes_every_move_above_the_threshold():
    y = np.array([1.0, 2.0, 3.0])
    live = np.ones(3, dtype=bool)
    rec = record([1.0 + 1e-12, 2.1, 3.0 + 1e-6], [True, True, True])
    plan = plan_writes(y, live, rec, threshold=1e-9, budget=0.0)
    assert plan.add_ids.tolist() == [1, 2]
    assert plan.remainder == abs(1.0 - (1.0 + 1e-12))  # below the threshold: dust


def test_dust_over_the_budget_is_written_largest_first_until_the_rest_fits():
    """Moves below the threshold are never written otherwise: dust over the budget
    kept the published bound over the tolerance for good (an idle consumer then
    republished every poll, each time writing nothing)."""
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    live = np.ones(5, dtype=bool)
    rec = record(y + np.array([4e-8, 1e-8, 3e-8, 2e-8, 5e-7]), [True] * 5)
    plan = plan_writes(y, live, rec, threshold=1e-7, budget=3.5e-8)
    # 5e-7 is over the threshold; the dust (1e-7) is over the budget: 4e-8 and 3e-8
    # are written, 1e-8 + 2e-8 stay.
    assert sorted(plan.add_ids.tolist()) == [0, 2, 4]
    assert plan.remainder <= 3.5e-8 and plan.unwritten == 2
    capped = record(y + np.array([4e-8, 1e-8, 3e-8, 2e-8, 5e-7]), [True] * 5)
    plan = plan_writes(y, live, capped, threshold=1e-7, budget=3.5e-8, max_updates=2)
    assert sorted(plan.add_ids.tolist()) == [0, 4]  # the cap leaves one dust write
    unmoved = np.zeros(5)
    unmoved[[0, 1]] = [4e-8, 3e-8]  # the rest did not move: never rewritten
    plan = plan_writes(y, live, record(y + unmoved, [True] * 5), threshold=1e-7,
                       budget=3.5e-8)
    assert plan.add_ids.tolist() == [0]
    assert unwritten_within(np.array([0.0, 1e-10, 1e-10, 5e-10]), 2.5e-10).tolist() == [
        True, True, True, False]
    full = record(y + np.array([4e-8, 1e-8, 3e-8, 2e-8, 5e-7]), [True] * 5)
    plan = plan_writes(y, live, full, threshold=1e-7, budget=3.5e-8, max_updates=1)
    assert plan.add_ids.tolist() == [4]  # no room left under the cap


def _reference_updates(diff: np.ndarray, room: float, cap: int) -> np.ndarray:
    """Slow and obvious: leave the smallest moves unwritten while they fit ``room``,
    then write only the ``cap`` largest of the rest. Returns the written diffs."""
    ordered = np.sort(diff)
    left = int(np.searchsorted(np.cumsum(ordered), room, side="right")) if room > 0 else 0
    rest = ordered[left:]
    return rest[rest.size - min(cap, rest.size):]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 60), st.floats(0.0, 40.0),
       st.sampled_from([0, 3, 1000]))
def test_capped_plan_writes_what_budget_then_cap_would_on_large_zsets(seed, cap, budget, levels):
    # Thousands of moves, so the selection reads its threshold off a sample;
    # ``levels`` quantizes the moves into that many values (ties at the threshold).
    rng = np.random.default_rng(seed)
    n = 5000
    y = rng.random(n) + 0.5
    move = rng.exponential(0.01, n)
    if levels:
        move = np.round(move * levels / move.max()) / levels * move.max()
    rec = record(y + move, np.ones(n, dtype=bool))
    live = np.ones(n, dtype=bool)
    plan = plan_writes(y, live, rec, threshold=0.0, budget=budget, max_updates=cap)
    written = np.sort(move[plan.add_ids])
    expected = _reference_updates(move[move > 0.0], budget, cap)
    assert written.size == expected.size
    assert np.allclose(written, expected, rtol=0, atol=1e-12)
    assert math.isclose(plan.remainder, float(move.sum() - written.sum()), rel_tol=1e-9,
                        abs_tol=1e-12)


@given(st.integers(0, 2**32 - 1), st.integers(0, 30))
def test_capped_plan_adds_every_new_page_and_only_the_largest_moves(seed, cap):
    rng = np.random.default_rng(seed)
    n = 40
    y = rng.random(n)
    live = rng.random(n) < 0.9
    present = rng.random(n) < 0.7
    rec = record(np.where(present, y + rng.normal(0, 0.1, n), 0.0), present)
    before = rec.values[:n].copy()
    plan = plan_writes(y, live, rec, threshold=0.0, budget=0.0, max_updates=cap)
    added = set(plan.add_ids.tolist())
    assert set(np.flatnonzero(live & ~present).tolist()) <= added  # membership exact
    updates = [i for i in added if present[i]]
    assert len(updates) <= cap
    diff = np.abs(y - before)
    skipped = [i for i in np.flatnonzero(live & present) if i not in added]
    if updates and skipped:
        assert diff[skipped].max() <= diff[updates].min()
    assert math.isclose(plan.remainder, float(np.abs(y[live] - rec.values[:n][live]).sum()),
                        abs_tol=1e-12)


def test_plan_grows_the_record_for_new_ids():
    rec = ZsetRecord()
    plan = plan_writes(np.array([0.5, 0.25]), np.array([True, True]), rec, threshold=0.0,
                       budget=1.0)
    # Written in ascending score order: Redis inserts those faster.
    assert plan.add_ids.tolist() == [1, 0] and plan.add_values.tolist() == [0.25, 0.5]
    assert rec.members() == 2 and not plan.rebuild


def test_a_plan_that_would_write_most_of_a_large_zset_rewrites_it_whole():
    n = 30_000
    rng = np.random.default_rng(3)
    live = rng.random(n) < 0.9
    y = np.where(live, rng.random(n) + 0.1, 0.0)
    rec = ZsetRecord()
    first = plan_writes(y, live, rec, threshold=0.0, budget=0.0)
    assert first.rebuild and first.add_ids.size == live.sum()  # an empty ZSET
    assert np.all(np.diff(first.add_values) >= 0) and first.remove_ids.size == 0
    # A few moves: written as updates. Half of the pages: dropped and refilled, so
    # the removed pages need no ZREM and the record holds exactly the live pages.
    few = np.where(live & (rng.random(n) < 0.05), y + 1.0, y)
    small = plan_writes(few, live, rec, threshold=0.0, budget=0.0)
    assert not small.rebuild and small.add_ids.size < 0.1 * n
    live2 = live & (rng.random(n) < 0.97)
    many = np.where(live2 & (rng.random(n) < 0.5), few + 1.0, few) * live2
    big = plan_writes(many, live2, rec, threshold=0.0, budget=0.0)
    assert big.rebuild and big.remove_ids.size == 0 and big.remainder == 0.0
    assert sorted(big.add_ids.tolist()) == np.flatnonzero(live2).tolist()
    assert np.array_equal(rec.present[:n], live2) and np.array_equal(rec.values[:n], many)


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=1, max_size=40))
def test_score_tokens_are_exact_fixed_width_hex_floats(values):
    tokens = score_tokens(np.array(values))
    assert tokens.shape == (len(values), SCORE_TOKEN)
    for row, value in zip(tokens, values, strict=True):
        raw = row.tobytes()
        assert raw.startswith(b"$24\r\n") and raw.endswith(b"\r\n")
        parsed = float.fromhex(raw[5:-2].decode())  # what strtod reads back
        assert parsed == value and math.copysign(1, parsed) == math.copysign(1, value)


def test_special_scores():
    values = np.array([0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308])
    for row, value in zip(score_tokens(values), values, strict=True):
        assert float.fromhex(row.tobytes()[5:-2].decode()) == value


def resp_args(payload: bytes) -> list[bytes]:
    """Parse one RESP array of bulk strings."""
    assert payload.startswith(b"*")
    head, _, rest = payload.partition(b"\r\n")
    args = []
    for _ in range(int(head[1:])):
        size, _, rest = rest.partition(b"\r\n")
        length = int(size[1:])
        args.append(rest[:length])
        assert rest[length:length + 2] == b"\r\n"
        rest = rest[length + 2:]
    assert rest == b""
    return args


def test_zadd_and_zrem_commands_are_valid_resp():
    urls = ["https://a.org/", "https://bb.org/x", "https://c.org/ü", "file:///d"]
    table = UrlTable()
    table.sync(urls.__getitem__, 2)
    table.sync(urls.__getitem__, 4)  # appended in two steps
    view = table.view()
    ids = np.array([0, 2, 3])
    values = np.array([0.25, 1 / 3, 1e-9])
    args = resp_args(zadd_command("p:scores:wpr:next:x", ids, values, view))
    assert args[:2] == [b"ZADD", b"p:scores:wpr:next:x"]
    assert [float.fromhex(a.decode()) for a in args[2::2]] == values.tolist()
    assert [a.decode() for a in args[3::2]] == [urls[i] for i in ids]
    assert resp_args(zrem_command("k", np.array([1]), view)) == [b"ZREM", b"k", urls[1].encode()]
    assert view.url(2) == urls[2]
    assert resp_args(command("PEXPIRE", "k", 5)) == [b"PEXPIRE", b"k", b"5"]


def test_the_published_total_counts_only_the_pages_published():
    """A refresh that recomputes its residual while the next batch is planned once
    counted the pages that plan interned (1-d each): the meta total must not, or
    readers' probability-scale scores (y / total) are off while fresh says they are
    not. The engines now keep to the absorbed pages too (ResidualEngine.live)."""
    from consumer.keys import Keys
    from consumer.publishing import ScoresAsOf
    from consumer.score_publisher import ScorePublisher
    from ranker import EdgeBatch, LinkGraph, LiveRanks

    rng = np.random.default_rng(1)
    n = 2000
    graph = LinkGraph.from_id_edges(rng.integers(0, n, 16_000), rng.integers(0, n, 16_000),
                                    [f"u{i}" for i in range(n)])
    ranks = LiveRanks(graph)
    ranks.cold_start()
    ranks.absorb(EdgeBatch(insert_src=rng.integers(0, n, 300), insert_dst=rng.integers(0, 9, 300)))
    absorbed_live = graph.live_mask()
    assert (ranks.absorbed_live == absorbed_live).all()
    for i in range(500):  # the next batch's plan, on the main thread
        graph.intern(f"https://new.example/{i}")
    for engine in ranks.engines.values():
        engine.stale = True  # the refresh recomputes r, reading the graph as it is now
    reports = ranks.refresh()
    scores = ScoresAsOf(graph, {a: np.array(ranks.scores(a)) for a in reports})
    publisher = ScorePublisher(None, Keys("rs:"), damping=0.85, tolerance=1e-6,
                               publish_threshold=1e-7)
    publication = publisher.prepare(scores, reports, version=1, offsets={}, capped=False,
                                    live=absorbed_live)
    for item in publication.summary:
        members = scores.y[item.algorithm][:n][absorbed_live].sum()
        assert item.total == pytest.approx(members, rel=1e-12)
        assert reports[item.algorithm].total == pytest.approx(members, rel=1e-12)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_score_is_refused_before_anything_is_written(bad):
    """Meta said total "nan" (every reader then failed), or a new page's member
    crashed the consumer with a traceback."""
    from consumer.keys import Keys
    from consumer.publishing import ScoresAsOf
    from consumer.score_publisher import ScorePublisher
    from ranker import LinkGraph, LiveRanks
    from rankstream.errors import ServiceError

    graph = LinkGraph.from_id_edges(np.array([0, 1, 2]), np.array([1, 2, 0]),
                                    ["a", "b", "c"])
    ranks = LiveRanks(graph)
    reports = ranks.cold_start()
    y = {a: np.array(ranks.scores(a)) for a in reports}
    y["wpr"][1] = bad
    publisher = ScorePublisher(None, Keys("rs:"), damping=0.85, tolerance=1e-6,
                               publish_threshold=1e-7)
    with pytest.raises(ServiceError, match="refusing to publish wpr"):
        publisher.prepare(ScoresAsOf(graph, y), reports, version=1, offsets={})
    assert publisher._back == {}  # no record changed


def test_a_redis_user_without_eval_is_told_about_plain_writes():
    import redis

    from consumer.keys import Keys
    from consumer.publishing import ScoresAsOf
    from consumer.score_publisher import ScorePublisher
    from ranker import LinkGraph, LiveRanks
    from rankstream.errors import ServiceError

    class NoEval:
        def execute_command(self, *args: object) -> None:
            raise redis.exceptions.NoPermissionError(
                "this user has no permissions to run the 'eval' command")

    graph = LinkGraph.from_id_edges(np.array([0, 1]), np.array([1, 0]), ["a", "b"])
    ranks = LiveRanks(graph)
    reports = ranks.cold_start()
    publisher = ScorePublisher(NoEval(), Keys("rs:"), damping=0.85, tolerance=1e-6,
                               publish_threshold=1e-7)
    publication = publisher.prepare(
        ScoresAsOf(graph, {a: np.array(ranks.scores(a)) for a in reports}), reports,
        version=1, offsets={})
    with pytest.raises(ServiceError, match="--plain-writes"):
        publisher.send_swap(publication)


def test_unwritten_moves_never_make_a_fresh_engine_vector_unfresh():
    """The budget for unwritten moves leaves room for the engine's own bound
    (min(tol*total/2, tol*total - engine bound)): a fresh vector stays fresh."""
    from consumer.keys import Keys
    from consumer.publishing import ScoresAsOf
    from consumer.score_publisher import ScorePublisher

    n, tol = 100, 1e-4
    graph = FakeGraph([f"https://p.org/{i}" for i in range(n)], np.ones(n, dtype=bool))
    y0 = np.ones(n)
    publisher = ScorePublisher(None, Keys("rs:"), damping=0.85, tolerance=tol,
                               publish_threshold=0.0)
    first = {"pagerank": Report(0.0, float(y0.sum()))}
    publisher.prepare(ScoresAsOf(graph, {"pagerank": y0}), first, version=1, offsets={})
    y1 = y0.copy()
    y1[:40] += 1e-4  # moves summing to 0.4 * tolerance * total, all above the threshold
    total = float(y1.sum())
    engine = Report(bound=0.7 * tol * total, total=total)  # the engine itself is fresh
    publication = publisher.prepare(ScoresAsOf(graph, {"pagerank": y1}), {"pagerank": engine},
                                    version=2, offsets={})
    (summary,) = publication.summary
    assert summary.bound <= tol * summary.total
    assert summary.fresh


def test_url_table_survives_growth_across_syncs():
    """The URL table's offsets grow after a first sync with every URL kept."""
    from consumer.score_wire import UrlTable

    urls = [f"https://u.org/{i}" for i in range(3000)]
    table = UrlTable()
    table.sync(urls.__getitem__, 1000)
    table.sync(urls.__getitem__, 3000)  # offsets grow past 1024 with count > 0
    view = table.view()
    assert [view.url(i) for i in range(3000)] == urls
