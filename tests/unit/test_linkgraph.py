"""LinkGraph against a plain Python model (sets of pairs) under random operations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ranker.edge_batches import EdgeBatch
from ranker.linkgraph import LinkGraph
from rankstream.errors import InputError


def assert_integrity(graph: LinkGraph) -> None:
    """Both directions and every twin index agree, rows fit their capacity, and the
    row lengths add up to ``num_links``."""
    n = graph.num_ids
    for direction, other in (("out", "in"), ("in", "out")):
        start, length, cap, nbr, twin = (
            getattr(graph, f"{direction}_{x}") for x in ("start", "len", "cap", "nbr", "twin"))
        o_start, o_nbr, o_twin = (getattr(graph, f"{other}_{x}") for x in ("start", "nbr", "twin"))
        for page in range(n):
            assert length[page] <= cap[page], f"{direction}-row {page} exceeds its capacity"
            for i in range(int(length[page])):
                v = int(nbr[start[page] + i])
                j = int(twin[start[page] + i])
                assert o_nbr[o_start[v] + j] == page and o_twin[o_start[v] + j] == i, (
                    f"{direction}-entry {page}->{v} has a bad twin")
    assert int(graph.out_len[:n].sum()) == graph.num_links == int(graph.in_len[:n].sum())

Pair = tuple[int, int]
pair_lists = st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)), max_size=30)


def as_pairs(src: np.ndarray, dst: np.ndarray) -> list[Pair]:
    return list(zip(src.tolist(), dst.tolist(), strict=True))


def batch_of(inserts: list[Pair], deletes: list[Pair], removed: list[int]) -> EdgeBatch:
    return EdgeBatch(
        insert_src=np.array([p[0] for p in inserts], dtype=np.int32),
        insert_dst=np.array([p[1] for p in inserts], dtype=np.int32),
        delete_src=np.array([p[0] for p in deletes], dtype=np.int32),
        delete_dst=np.array([p[1] for p in deletes], dtype=np.int32),
        removed_pages=np.array(removed, dtype=np.int32),
    )


class LinkGraphMachine(RuleBasedStateMachine):
    """Every operation is mirrored on ``links`` (a set of pairs) and ``live`` (a set)."""

    def __init__(self) -> None:
        super().__init__()
        self.graph = LinkGraph()
        self.links: set[Pair] = set()
        self.live: set[int] = set()
        self.live_at_apply: set[int] = set()

    @initialize(size=st.integers(0, 8), edges=pair_lists)
    def bulk_load(self, size: int, edges: list[Pair]) -> None:
        keys = [f"https://h{i % 3}.test/{i}" for i in range(size)]
        edges = [(s % size, d % size) for s, d in edges] if size else []
        self.graph = LinkGraph.from_id_edges(
            np.array([e[0] for e in edges], dtype=np.int32),
            np.array([e[1] for e in edges], dtype=np.int32), keys)
        self.links = {e for e in edges if e[0] != e[1]}
        self.live = set(range(size))
        self.live_at_apply = set(self.live)

    @rule(count=st.integers(1, 4))
    def intern_new(self, count: int) -> None:
        for _ in range(count):
            key = f"https://new.test/{self.graph.num_ids}"
            page = self.graph.intern(key)
            assert page == self.graph.num_ids - 1
            assert self.graph.intern(key) == page
            self.live.add(page)

    @rule(picks=st.lists(st.integers(0, 15), max_size=12))
    def intern_many_like_intern(self, picks: list[int]) -> None:
        """Known (live or removed) and new keys, repeats included: the ids of one
        intern() per key, in order, and every one of them live."""
        first = self.graph.num_ids
        keys = [self.graph.key_of(p) if p < first else f"https://many.test/{first}/{p}"
                for p in picks]
        expected: dict[str, int] = {}
        next_id = first
        for key in keys:
            if key not in expected:
                known = self.graph.id_of(key)
                expected[key] = next_id if known is None else known
                next_id += known is None
        ids = self.graph.intern_many(keys)
        assert ids.dtype == np.int32
        assert ids.tolist() == [expected[k] for k in keys]
        assert self.graph.num_ids == next_id
        self.live.update(ids.tolist())

    @precondition(lambda self: self.graph.num_ids > 0)
    @rule(data=st.data())
    def revive_by_intern(self, data: st.DataObject) -> None:
        page = data.draw(st.integers(0, self.graph.num_ids - 1))
        assert self.graph.intern(self.graph.key_of(page)) == page
        self.live.add(page)

    @precondition(lambda self: self.graph.num_ids > 1)
    @rule(inserts=pair_lists, deletes=pair_lists, removed=st.lists(st.integers(0, 11), max_size=3),
          existing=st.integers(0, 12))
    def apply_batch(self, inserts: list[Pair], deletes: list[Pair], removed: list[int],
                    existing: int) -> None:
        n = self.graph.num_ids
        inserts = [(s % n, d % n) for s, d in inserts]
        deletes = [(s % n, d % n) for s, d in deletes] + sorted(self.links, reverse=True)[:existing]
        removed = [p % n for p in removed]
        before, live_before = set(self.links), set(self.live)

        gone = set(removed) & self.live
        self.links = {e for e in self.links if e[0] not in gone and e[1] not in gone}
        self.live -= gone
        self.links -= set(deletes)
        for s, d in inserts:
            if s != d:
                self.links.add((s, d))
                self.live |= {s, d}

        applied = self.graph.apply(batch_of(inserts, deletes, removed))
        inserted, deleted = as_pairs(applied.inserted_src, applied.inserted_dst), as_pairs(
            applied.deleted_src, applied.deleted_dst)
        assert sorted(inserted) == sorted(self.links - before)
        assert sorted(deleted) == sorted(before - self.links)
        assert sorted(applied.removed_pages.tolist()) == sorted(gone)
        expected_new = (self.live - self.live_at_apply) | (gone & self.live)
        assert sorted(applied.new_pages.tolist()) == sorted(expected_new)
        assert live_before >= gone
        self.live_at_apply = set(self.live)

    @rule()
    def compact(self) -> None:
        self.graph.compact()

    @invariant()
    def same_graph(self) -> None:
        g = self.graph
        n = g.num_ids
        assert g.num_links == len(self.links)
        assert set(np.flatnonzero(g.live_mask()).tolist()) == self.live
        for page in range(n):
            assert set(g.out_links(page).tolist()) == {d for s, d in self.links if s == page}
            assert set(g.in_links(page).tolist()) == {s for s, d in self.links if d == page}
            assert g.out_degree(page) == len(g.out_links(page))
        matrix = g.to_csr()
        assert matrix.shape == (n, n)
        rows, cols = matrix.nonzero()
        assert set(zip(rows.tolist(), cols.tolist(), strict=True)) == self.links
        assert (matrix.data == 1.0).all()
        for s, d in list(self.links)[:5]:
            assert g.has_link(s, d)
        if n > 1:
            assert not g.has_link(0, 0)
        assert g.memory_bytes() > 0
        assert_integrity(g)


TestLinkGraphMachine = LinkGraphMachine.TestCase
TestLinkGraphMachine.settings = settings(max_examples=80, stateful_step_count=15, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])


def test_from_edges_interns_keys_and_drops_self_links_and_duplicates() -> None:
    graph = LinkGraph.from_edges(["a", "a", "b", "c", "c"], ["b", "b", "c", "c", "a"])
    assert graph.num_ids == 3
    assert graph.num_links == 3
    a, b, c = (graph.intern(k) for k in "abc")
    assert graph.has_link(a, b) and graph.has_link(b, c) and graph.has_link(c, a)
    assert not graph.has_link(c, c)
    assert graph.key_of(b) == "b"
    assert graph.id_of("zzz") is None


def test_intern_revives_removed_page_and_reports_it_new() -> None:
    graph = LinkGraph.from_edges(["a", "b"], ["b", "a"])
    b = graph.id_of("b")
    assert b is not None
    applied = graph.apply(EdgeBatch(removed_pages=np.array([b])))
    assert applied.removed_pages.tolist() == [b]
    assert applied.deleted_src.size == 2
    assert not graph.is_live(b) and graph.num_links == 0
    assert graph.intern("b") == b and graph.is_live(b)
    applied = graph.apply(EdgeBatch())
    assert applied.new_pages.tolist() == [b]


def test_delete_and_reinsert_in_one_batch_is_no_change() -> None:
    graph = LinkGraph.from_edges(["a"], ["b"])
    a, b = graph.intern("a"), graph.intern("b")
    applied = graph.apply(EdgeBatch(insert_src=np.array([a]), insert_dst=np.array([b]),
                                    delete_src=np.array([a]), delete_dst=np.array([b])))
    assert applied.inserted_src.size == 0 and applied.deleted_src.size == 0
    assert graph.has_link(a, b) and graph.num_links == 1


def test_rows_grow_past_capacity_and_compact_reclaims_garbage() -> None:
    graph = LinkGraph()
    hub = graph.intern("hub")
    pages = graph.intern_many([f"p{i}" for i in range(3000)])
    for chunk in np.array_split(pages, 30):
        graph.apply(EdgeBatch(insert_src=chunk, insert_dst=np.full(chunk.size, hub),
                              delete_src=np.full(chunk.size, hub), delete_dst=chunk))
        graph.apply(EdgeBatch(insert_src=np.full(chunk.size, hub), insert_dst=chunk))
    assert graph.in_degree(hub) == 3000 and graph.out_degree(hub) == 3000
    assert set(graph.in_links(hub).tolist()) == set(pages.tolist())
    graph.compact()
    # Two links a page: the key table alone is ~35 bytes a link, so only the arrays
    # (what compaction reclaims) are held to the budget here.
    assert (graph.memory_bytes() - graph.key_table_bytes()) / graph.num_links <= 40
    # Deleting from the middle of big rows keeps both directions consistent.
    graph.apply(EdgeBatch(delete_src=pages[::2], delete_dst=np.full(1500, hub)))
    assert set(graph.in_links(hub).tolist()) == set(pages[1::2].tolist())
    assert all(graph.out_links(int(p)).tolist() == [] for p in pages[::2])
    assert graph.num_links == 4500


@pytest.mark.parametrize("sort_below", [0, 10**9])
def test_small_and_large_batches_group_their_rows_alike(sort_below: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows that must grow are found by sorting a small batch's ends, by counting over
    # every id for a large one; forcing either path gives the same graph.
    import ranker.graph_memory as graph_memory

    monkeypatch.setattr(graph_memory, "SORT_BELOW_SHARE", sort_below)
    rng = np.random.default_rng(4)
    graph = LinkGraph.from_id_edges(rng.integers(0, 400, 2000), rng.integers(0, 400, 2000),
                                    [str(i) for i in range(400)])
    model = set(as_pairs(*graph.edges()))
    for _ in range(5):
        src, dst = rng.integers(0, 400, 300), rng.integers(0, 40, 300)  # hub rows grow
        graph.apply(EdgeBatch(insert_src=src.astype(np.int32), insert_dst=dst.astype(np.int32)))
        model |= {(s, d) for s, d in zip(src.tolist(), dst.tolist(), strict=True) if s != d}
        assert_integrity(graph)
    assert set(as_pairs(*graph.edges())) == model


def test_memory_per_link_of_bulk_loaded_graph() -> None:
    rng = np.random.default_rng(0)
    src = rng.integers(0, 5000, 50_000)
    dst = rng.integers(0, 5000, 50_000)
    graph = LinkGraph.from_id_edges(src, dst, [str(i) for i in range(5000)])
    assert graph.memory_bytes() / graph.num_links <= 40


def test_reserve_leaves_room_so_the_next_batch_moves_no_row() -> None:
    # The consumer's restart reserves room at load, so its first batch neither grows
    # the per-page arrays nor relocates every row that gains a link.
    rng = np.random.default_rng(1)
    src = rng.integers(0, 5000, 50_000)
    dst = rng.integers(0, 5000, 50_000)
    graph = LinkGraph.from_id_edges(src, dst, [str(i) for i in range(5000)])
    before = sorted(as_pairs(*graph.edges()))
    graph.reserve(7500)
    assert graph.id_capacity >= 7500
    assert sorted(as_pairs(*graph.edges())) == before
    assert_integrity(graph)
    assert graph.memory_bytes() / graph.num_links <= 40
    pools = (graph.out_nbr, graph.in_nbr)
    new = graph.intern_many([f"new{i}" for i in range(100)])
    graph.apply(EdgeBatch(insert_src=np.repeat(new, 3), insert_dst=np.tile([0, 1, 2], 100)))
    assert graph.out_nbr is pools[0] and graph.in_nbr is pools[1]
    assert graph.id_capacity >= 7500 and graph.in_degree(0) >= 100
    assert_integrity(graph)


def test_bad_batches_are_input_errors() -> None:
    graph = LinkGraph.from_edges(["a"], ["b"])
    with pytest.raises(InputError):
        graph.apply(EdgeBatch(insert_src=np.array([0]), insert_dst=np.array([7])))
    with pytest.raises(InputError):
        EdgeBatch(insert_src=np.array([0, 1]), insert_dst=np.array([1]))
    with pytest.raises(InputError):
        EdgeBatch(removed_pages=np.array([0.5]))
    with pytest.raises(InputError):
        LinkGraph.from_edges(["a"], [])
    # Wider ids are checked before the int32 cast, which would wrap 2**32 + 1 to 1.
    with pytest.raises(InputError, match="int32"):
        graph.apply(EdgeBatch(insert_src=np.array([2**32 + 1]), insert_dst=np.array([0])))
    with pytest.raises(InputError, match="int32"):
        LinkGraph.from_id_edges(np.array([0, 2**32 + 1]), np.array([1, 0]), ["a", "b"])
    with pytest.raises(InputError, match="differ in length"):
        graph.links_exist(np.array([0, 1, 0]), np.array([1]))
    for key in (1, 1.0, True, None):
        with pytest.raises(InputError, match="strings"):
            graph.intern(key)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="strings"):
        LinkGraph.from_edges([1, "1"], ["x", "y"])  # type: ignore[list-item]
    with pytest.raises(InputError, match="strings"):
        LinkGraph.from_id_edges([0], [1], [1, 2])  # type: ignore[list-item]


def test_a_refused_intern_list_interns_none_of_its_keys() -> None:
    """The good keys before a bad one used to stay interned, live and queued."""
    graph = LinkGraph.from_edges(["a"], ["b"])
    graph.apply(EdgeBatch())
    with pytest.raises(InputError, match="strings"):
        graph.intern_list(["a", "new", 3])  # type: ignore[list-item]
    with pytest.raises(InputError, match="NoneType"):
        graph.intern_list(["new", None])  # type: ignore[list-item]
    assert graph.num_ids == 2 and graph.id_of("new") is None
    assert graph.pending_live().size == 0


@pytest.mark.parametrize("page", [0.9, 1.99, True, "1", None])
def test_page_ids_that_are_not_integers_are_input_errors_not_truncated(page: object) -> None:
    graph = LinkGraph.from_edges(["a"], ["b"])
    for query in (graph.out_links, graph.in_links, graph.out_degree, graph.key_of):
        with pytest.raises(InputError):
            query(page)  # type: ignore[arg-type]
    assert graph.key_of(np.int64(1)) == "b"


@pytest.mark.parametrize("page", [-1, 2, 10**7])
def test_ids_outside_the_graph_are_input_errors_not_aliases_or_wild_reads(page: int) -> None:
    """-1 used to read the last page, and gather_out([10**7]) crashed the process."""
    graph = LinkGraph.from_edges(["a"], ["b"])
    for query in (graph.out_links, graph.in_links, graph.out_degree, graph.in_degree,
                  graph.key_of):
        with pytest.raises(InputError, match="no page id"):
            query(page)
    for gather in (graph.gather_out, graph.gather_in):
        with pytest.raises(InputError, match=r"outside 0\.\.1"):
            gather(np.array([0, page]))


@pytest.fixture
def compactions(monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """One entry per LinkGraph.compact call from here on."""
    calls: list[None] = []
    compact = LinkGraph.compact

    def counted(self: LinkGraph) -> None:
        calls.append(None)
        compact(self)

    monkeypatch.setattr(LinkGraph, "compact", counted)
    return calls


def test_a_graph_with_as_many_pages_as_links_does_not_compact_every_batch(
        compactions: list[None]) -> None:
    """A crawl frontier: the per-page arrays alone pass the per-link budget, and
    compacting cannot shrink them."""
    rng = np.random.default_rng(6)
    graph = LinkGraph()
    for _ in range(30):
        first = graph.num_ids
        new = graph.intern_many([f"p{first + i}" for i in range(2200)])
        src = rng.choice(new, 2000).astype(np.int32)
        dst = rng.integers(0, graph.num_ids, 2000).astype(np.int32)
        graph.apply(EdgeBatch(insert_src=src, insert_dst=dst))
    assert graph.num_links > 50_000 and graph.num_ids > graph.num_links
    assert len(compactions) <= 3


def test_a_growing_graph_stays_within_the_memory_budget_without_compacting_every_batch(
        compactions: list[None]) -> None:
    """New pages linking mostly to hubs: every batch grows the hubs' in-rows."""
    rng = np.random.default_rng(5)
    graph = LinkGraph()
    for _ in range(40):
        first = graph.num_ids
        new = graph.intern_many([f"p{first + i}" for i in range(500)])
        src = np.repeat(new, 10)
        dst = ((rng.pareto(1.2, src.size) * 20).astype(np.int64) % graph.num_ids)
        graph.apply(EdgeBatch(insert_src=src, insert_dst=dst.astype(np.int32)))
        assert graph.memory_bytes() / graph.num_links <= 40
    # 16 with the key table counted in the budget (10 before, without it; the graph
    # then reached 44.7 bytes a link): far from compacting after every batch.
    assert len(compactions) <= 20


def test_rows_to_grow_exactly_full_and_empty_batches() -> None:
    import numpy as np

    from ranker.graph_memory import rows_to_grow
    length = np.array([2, 0, 5], dtype=np.int64)
    cap = np.array([3, 4, 5], dtype=np.int64)
    # Row 0 fills to exactly its capacity: no move (GM3).
    rows, caps, freed = rows_to_grow(np.array([0], dtype=np.int32), length, cap, 100)
    assert rows.size == 0 and caps.size == 0 and freed == 0
    # Row 2 overflows by one: 1.5x + 2 (GM5), freeing its old capacity (GM6).
    rows, caps, freed = rows_to_grow(np.array([2], dtype=np.int32), length, cap, 100)
    assert rows.tolist() == [2] and caps.tolist() == [5 + 2 + 2] and freed == 5
    # Row 1 (empty, capacity 4) gets 5 links: exactly enough, and its 4 slots freed (GM6).
    rows, caps, freed = rows_to_grow(np.full(5, 1, dtype=np.int32), length, cap, 100)
    assert rows.tolist() == [1] and caps.tolist() == [max(5, 4 + 2 + 2)] and freed == 4
    # No links to add (LinkGraph never asks; the pure function still answers), on either path (GM1).
    for num_ids in (3, 1000):
        rows, caps, freed = rows_to_grow(np.array([], dtype=np.int32), length, cap,
                                         num_ids)
        assert rows.size == 0 and freed == 0
