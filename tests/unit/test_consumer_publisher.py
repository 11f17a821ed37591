"""The score publisher's pure parts: what to write, how it is chunked and encoded."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.keys import Keys
from consumer.score_publisher import (
    ZSET_SCRIPT,
    Chunk,
    ScorePublisher,
    UrlTable,
    ZsetRecord,
    chunk_ids,
    plan_writes,
    unwritten_within,
)


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


def test_plan_grows_the_record_for_new_ids():
    rec = ZsetRecord()
    plan = plan_writes(np.array([0.5, 0.25]), np.array([True, True]), rec, threshold=0.0,
                       budget=1.0)
    assert plan.add_ids.tolist() == [0, 1] and rec.exists()


def test_url_table_gathers_members_of_any_id_set():
    urls = ["https://a.org/", "https://bb.org/x", "https://c.org/ü", "file:///d"]
    table = UrlTable()
    table.sync(urls.__getitem__, 2)
    table.sync(urls.__getitem__, 4)
    view = table.view()
    for ids in ([0, 1, 2, 3], [1, 3], [2], [0, 2, 3]):
        lengths, blob = view.members(np.array(ids))
        sizes = np.frombuffer(lengths, "<i4").tolist()
        expected = [urls[i].encode() for i in ids]
        assert sizes == [len(u) for u in expected] and blob == b"".join(expected)
    assert view.urls(np.array([3, 0])) == [urls[3], urls[0]]


def test_dense_chunks_travel_as_nan_padded_ranges():
    ids = np.array([10, 11, 13, 14, 40, 90])
    values = np.arange(6, dtype=float)
    chunks = list(chunk_ids(ids, values, 4))
    first_ids, first_scores = chunks[0]
    assert first_ids.tolist() == [10, 11, 12, 13, 14]
    assert np.isnan(first_scores[2]) and first_scores[[0, 1, 3, 4]].tolist() == [0, 1, 2, 3]
    second_ids, second_scores = chunks[1]  # sparse: sent as they are
    assert second_ids.tolist() == [40, 90] and second_scores.tolist() == [4.0, 5.0]


def publisher(bulk: bool) -> ScorePublisher:
    return ScorePublisher(None, Keys("p:"), damping=0.85, tolerance=1e-6,  # type: ignore[arg-type]
                          publish_threshold=0.0, bulk=bulk)


def test_chunk_commands_pack_scores_and_members_or_go_plain():
    urls = ["u0", "u1", "u22"]
    table = UrlTable()
    table.sync(urls.__getitem__, 3)
    chunk = Chunk("ZADD", "p:scores:wpr:next", np.array([0, 1, 2]),
                  np.array([0.25, np.nan, 1 / 3]))
    ((verb, script, nkeys, lease, token, meta, pub, op, key, lengths, members, packed),) = (
        publisher(True).chunk_commands(chunk, table.view(), ("p:lock", b"me"), ("p:m", "id")))
    assert (verb, script, nkeys, lease, token) == ("EVAL", ZSET_SCRIPT, 0, "p:lock", b"me")
    assert (meta, pub) == ("p:m", "id")
    assert (op, key) == ("ZADD", "p:scores:wpr:next")
    assert np.frombuffer(lengths, "<i4").tolist() == [2, 2, 3] and members == b"u0u1u22"
    assert np.isnan(np.frombuffer(packed, "<f8")[1])
    plain = publisher(False).chunk_commands(chunk, table.view())
    assert plain == [("ZADD", "p:scores:wpr:next", 0.25, "u0", 1 / 3, "u22")]
    removal = Chunk("ZREM", "k", np.array([1]))
    assert publisher(False).chunk_commands(removal, table.view()) == [("ZREM", "k", "u1")]
