"""Pure parts of the consumer's graph write: planning and command shapes (no Redis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.connection import Connection

from consumer.graph_write import (
    MEMBER_CHUNK,
    GraphCounters,
    GraphWrite,
    adjacency_commands,
    adjacency_payload,
    bookkeeping_commands,
    group_members,
    plan_links,
)
from consumer.keys import Keys, offset_field
from ranker.edge_batches import EdgeBatch
from ranker.linkgraph import LinkGraph

KEYS = Keys("t:")


def _graph(num: int, edges: list[tuple[int, int]]) -> LinkGraph:
    keys = [f"https://e.org/{i}" for i in range(num)]
    src = np.array([s for s, _ in edges], dtype=np.int32)
    dst = np.array([d for _, d in edges], dtype=np.int32)
    return LinkGraph.from_id_edges(src, dst, keys)


pairs = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(pairs, pairs, pairs, st.lists(st.integers(0, 11), max_size=4))
def test_plan_links_predicts_exactly_what_apply_changes(start, inserts, deletes, removed):
    graph = _graph(12, start)
    batch = EdgeBatch(
        insert_src=np.array([s for s, _ in inserts], dtype=np.int32),
        insert_dst=np.array([d for _, d in inserts], dtype=np.int32),
        delete_src=np.array([s for s, _ in deletes], dtype=np.int32),
        delete_dst=np.array([d for _, d in deletes], dtype=np.int32),
        removed_pages=np.array(removed, dtype=np.int32),
    )
    before_src, before_dst = graph.edges()
    before = set(zip(before_src.tolist(), before_dst.tolist(), strict=True))
    planned = plan_links(graph, batch)
    graph.apply(batch)
    after_src, after_dst = graph.edges()
    after = set(zip(after_src.tolist(), after_dst.tolist(), strict=True))
    deleted = set(zip(planned.delete_src.tolist(), planned.delete_dst.tolist(), strict=True))
    inserted = set(zip(planned.insert_src.tolist(), planned.insert_dst.tolist(), strict=True))
    assert deleted == before - after
    assert inserted == after - before
    assert planned.links_after == graph.num_links == len(after)


def test_group_members_groups_by_owner_and_splits_long_runs():
    owners = np.array([5, 1, 5, 1, 9], dtype=np.int32)
    members = np.array([50, 10, 51, 11, 90], dtype=np.int32)
    group_owner, counts, ordered = group_members(owners, members)
    assert group_owner.tolist() == [1, 5, 9]
    assert counts.tolist() == [2, 2, 1]
    assert ordered.tolist() == [10, 11, 50, 51, 90]
    long_owner = np.zeros(MEMBER_CHUNK * 2 + 3, dtype=np.int32)
    group_owner, counts, _ = group_members(long_owner, np.arange(long_owner.size, dtype=np.int32))
    assert group_owner.tolist() == [0, 0, 0]
    assert counts.tolist() == [MEMBER_CHUNK, MEMBER_CHUNK, 3]


def test_adjacency_commands_write_both_directions_deletions_first():
    write = GraphWrite(delete_src=np.array([1], np.int32), delete_dst=np.array([2], np.int32),
                       insert_src=np.array([3, 3], np.int32),
                       insert_dst=np.array([4, 5], np.int32))
    assert adjacency_commands(KEYS, write) == [
        ("SREM", "t:out:1", 2),
        ("SREM", "t:in:2", 1),
        ("SADD", "t:out:3", 4, 5),
        ("SADD", "t:in:4", 3),
        ("SADD", "t:in:5", 3),
    ]


ids = st.integers(0, 2**31 - 1) | st.sampled_from([0, 1, 9, 10, 99, 100, 12345])
id_lists = st.lists(st.tuples(ids, ids), max_size=30)


@settings(max_examples=150, deadline=None)
@given(id_lists, id_lists, st.sampled_from(["t:", "", "rs:ünï:"]))
def test_adjacency_payload_is_the_resp_of_the_plain_commands(deletes, inserts, prefix):
    """The compiled encoder sends exactly what redis-py would send for the same commands."""
    keys = Keys(prefix)
    write = GraphWrite(delete_src=np.array([s for s, _ in deletes], np.int32),
                       delete_dst=np.array([d for _, d in deletes], np.int32),
                       insert_src=np.array([s for s, _ in inserts], np.int32),
                       insert_dst=np.array([d for _, d in inserts], np.int32))
    payload, count = adjacency_payload(keys, write)
    plain = adjacency_commands(keys, write)
    assert count == len(plain)
    expected = b"".join(b"".join(Connection().pack_command(*cmd)) for cmd in plain)
    assert b"".join(payload) == expected


def test_bookkeeping_ends_with_counters_and_offsets():
    write = GraphWrite(new_pages=[(0, "https://a.org/"), (1, "https://b.org/")],
                       removed_ids=[1], revived_ids=[7], ts_updates={0: 123},
                       counters=GraphCounters(version=2, links=1, pages=1, ids=2),
                       offsets={offset_field("topic", 0): 10})
    cmds = bookkeeping_commands(KEYS, write)
    assert cmds[0] == ("HSET", "t:page:id", "https://a.org/", 0, "https://b.org/", 1)
    assert cmds[1] == ("HSET", "t:page:url", 0, "https://a.org/", 1, "https://b.org/")
    # Revivals are undone before removals are recorded (a page can be both).
    assert cmds.index(("SREM", "t:page:removed", 7)) < cmds.index(("SADD", "t:page:removed", 1))
    assert cmds[-2][:2] == ("HSET", "t:graph")
    assert cmds[-1] == ("HSET", "t:offsets", "topic:0", 10)


def test_offset_field_round_trips_dotted_topics_and_skips_other_fields():
    from consumer.redis_store import topic_offsets

    fields = {offset_field("rankstream.links", 3): 7, offset_field("rankstream", 1): 2,
              "a note by hand": "x"}
    assert topic_offsets(fields, "rankstream.links") == {3: 7}


def test_new_pages_travel_as_one_script_call_or_plain_hsets():
    from consumer.graph_write import NEW_PAGES_SCRIPT, new_pages_commands

    pages = [(0, "https://a.org/"), (1, "https://b.org/x?q=1 2")]
    (cmd,) = new_pages_commands(KEYS, pages, bulk=True)
    assert cmd[:5] == ("EVAL", NEW_PAGES_SCRIPT, 0, "t:page:id", "t:page:url")
    assert np.frombuffer(cmd[5], "<i4").tolist() == [0, 1]
    assert cmd[6].split("\n") == ["https://a.org/", "https://b.org/x?q=1 2"]
    plain = new_pages_commands(KEYS, pages, bulk=False)
    assert plain[0] == ("HSET", "t:page:id", "https://a.org/", 0, "https://b.org/x?q=1 2", 1)


def test_plan_links_ignores_removals_of_pages_already_removed():
    """A re-delivered page_removed of a page removed already is no removal: counted as
    one, the `pages` counter of P graph came out one too low."""
    from consumer.graph_write import plan_links
    from ranker import EdgeBatch, LinkGraph

    graph = LinkGraph.from_edges(["a", "c"], ["b", "b"])
    b = graph.id_of("b")
    graph.apply(EdgeBatch(removed_pages=np.array([b], dtype=np.int32)))
    live_before = int(graph.live_mask().sum())
    planned = plan_links(graph, EdgeBatch(removed_pages=np.array([b], dtype=np.int32)))
    assert planned.removed_ids.size == 0
    # what Mirror.plan stores as the P graph `pages` counter
    assert int(graph.live_mask().sum()) - int(planned.removed_ids.size) == live_before
