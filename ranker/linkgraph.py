"""The in-memory dynamic link graph the consumer mirrors and the engines walk.

Page keys (URLs) are interned to dense int32 ids. Links live in two flat int32
pools (out-rows and in-rows) with per-page start/length/capacity, so numba kernels
walk them directly and there is no Python object per link. A row that overflows is
moved to the pool tail with 1.5x capacity (its old slot becomes garbage, reclaimed
by :meth:`LinkGraph.compact`, which also runs by itself once garbage outweighs live
entries). Deletion is swap-remove; each entry keeps the index of its twin entry in
the other direction, so deleting a link into a hub with a million in-links costs
O(out-degree of the source), not a scan of the hub's in-row.

Memory: 16 bytes per link (neighbour + twin, both directions) times the slack of
row capacities and pool growth, plus 33 bytes per page of id capacity. Key strings
are extra.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import cast

import numpy as np
import scipy.sparse as sp

from ranker import _graph_kernels as K
from ranker.edge_batches import (
    EMPTY_IDS,
    AppliedBatch,
    EdgeBatch,
    as_ids,
    pair_keys,
    sorted_unique,
    split_pair_keys,
)
from ranker.graph_memory import (
    ROW_SPARE_SHIFT,
    compaction_due,
    grown_pool,
    key_table_bytes,
    rows_to_grow,
)
from rankstream.errors import InputError

# out_start, out_len, out_nbr, out_twin, in_start, in_len, in_nbr, in_twin
Adjacency = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                  np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class LinkGraph:
    """Directed graph of interned pages with fast in/out neighbour access.

    Attributes:
        num_links: number of links present.
    """

    def __init__(self) -> None:
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._pending_live: list[int] = []
        self._removals = False  # some page was ever removed (intern_list must revive)
        self.num_links = 0
        self._node_cap = 0
        self._live = np.zeros(0, dtype=np.bool_)
        self.out_start = np.zeros(0, dtype=np.int64)
        self.out_len = np.zeros(0, dtype=np.int32)
        self.out_cap = np.zeros(0, dtype=np.int32)
        self.in_start = np.zeros(0, dtype=np.int64)
        self.in_len = np.zeros(0, dtype=np.int32)
        self.in_cap = np.zeros(0, dtype=np.int32)
        self.out_nbr = np.zeros(0, dtype=np.int32)
        self.out_twin = np.zeros(0, dtype=np.int32)
        self.in_nbr = np.zeros(0, dtype=np.int32)
        self.in_twin = np.zeros(0, dtype=np.int32)
        self._out_used = 0
        self._in_used = 0
        self._garbage = 0
        self._grow_nodes(16)

    # ------------------------------------------------------------------ ids
    @property
    def num_ids(self) -> int:
        """Ids assigned so far (dense ``0..num_ids-1``), removed pages included."""
        return len(self._keys)

    @property
    def num_live(self) -> int:
        return int(np.count_nonzero(self._live[: self.num_ids]))

    @property
    def id_capacity(self) -> int:
        """Ids the per-page arrays hold before they must grow (by 1.5x, see intern)."""
        return self._node_cap

    def reserve(self, num_ids: int) -> None:
        """Room for ``num_ids`` ids, and spare capacity in every row (:meth:`compact`).

        A graph built by :meth:`from_id_edges` is packed tight: the first batch after
        it moves every row that gains a link and grows both pools and the per-page
        arrays, all at once. On the consumer's restart with 1.4M pages that batch took
        0.77-0.96 s against ~0.1 s for the next ones (measured: 0.28 s in the graph,
        0.49 s growing the engines' arrays, which follow :attr:`id_capacity`); the
        backlog it left lasted the whole latency measurement.
        """
        if num_ids > self._node_cap:
            self._grow_nodes(num_ids)
        self.compact()

    def intern(self, key: str) -> int:
        """Id of ``key``, assigning the next one if new; revives a removed page."""
        try:
            page = self._index.get(key)
        except TypeError as exc:  # unhashable: a list, a dict
            raise InputError(f"page keys must be strings, got {type(key).__name__}") from exc
        if page is None:
            if type(key) is not str:  # 1, 1.0 and True would share one id
                raise InputError(f"page keys must be strings, got {type(key).__name__}")
            page = len(self._keys)
            if page >= self._node_cap:
                self._grow_nodes(page + 1)
            self._keys.append(key)
            self._index[key] = page
            self._live[page] = True
            self._pending_live.append(page)
        elif not self._live[page]:
            self._live[page] = True
            self._pending_live.append(page)
        return page

    def intern_many(self, keys: Sequence[str]) -> np.ndarray:
        """:meth:`intern` of each key, in order, as an int32 array."""
        return np.array(self.intern_list(keys), dtype=np.int32)

    def intern_list(self, keys: Sequence[str]) -> list[int]:
        """:meth:`intern` of each key, in order.

        Same ids as calling :meth:`intern` key by key, but known keys are looked up in
        one ``map``, and removed pages among them (only possible once the graph has
        removed any) are revived in one vectorised step: the consumer interns every
        link of every ``page`` event (~10 per event), and a Python call per link was
        the largest cost of planning a batch. Planning 5,000 events on a 400k-page
        graph: 81 ms, 55-60 ms with this and the out-link reads the applier skips. A
        list, because the applier keeps per-page sets of ids: without an array built
        and converted back per event, and without the liveness check on a graph that
        never removed a page, planning took 15.0-17.1 us per event instead of
        17.2-20.2 (5,000-event batches of the 1M-page stream, interleaved runs).
        """
        try:
            found: list[int | None] = list(map(self._index.get, keys))
        except TypeError as exc:  # an unhashable key
            bad = next(key for key in keys if type(key) is not str)
            raise InputError(f"page keys must be strings, got {type(bad).__name__}") from exc
        if None in found:  # new keys, in first-seen order (a repeated one gets one id)
            # Every new key checked before any is interned: a bad key must not leave
            # the good ones before it interned, live and queued for the next apply.
            wrong = [type(key).__name__ for key, page in zip(keys, found, strict=True)
                     if page is None and type(key) is not str]
            if wrong:
                raise InputError(f"page keys must be strings, got {wrong[0]}")
            for i, page in enumerate(found):
                if page is None:
                    found[i] = self.intern(keys[i])
        ids = cast(list[int], found)
        if self._removals:
            array = np.array(ids, dtype=np.int32)
            dead = array[~self._live[array]]
            if dead.size:
                dead = np.unique(dead)
                self._live[dead] = True
                self._pending_live.extend(dead.tolist())
        return ids

    def pending_live(self) -> np.ndarray:
        """Ids interned or revived since the last :meth:`apply` (repeats possible)."""
        return np.asarray(self._pending_live, dtype=np.int32)

    def id_of(self, key: str) -> int | None:
        """Id of ``key`` or None; does not assign or revive."""
        return self._index.get(key)

    def key_of(self, page_id: int) -> str:
        return self._keys[self._page(page_id)]

    def is_live(self, page_id: int) -> bool:
        """Interned and not removed."""
        return 0 <= page_id < self.num_ids and bool(self._live[page_id])

    def live_mask(self) -> np.ndarray:
        """Copy of the live flags of ids ``0..num_ids-1``."""
        return self._live[: self.num_ids].copy()

    # ------------------------------------------------------------------ queries
    def _page(self, page_id: int) -> int:
        # Not numpy's indexing: -1 would read the last page, and an id past num_ids
        # spare capacity or an IndexError.
        try:  # an integer, numpy's included; 0.9 or True must not read page 0 or 1
            page = operator.index(page_id)
        except TypeError as exc:
            raise InputError(f"page ids are integers, got {type(page_id).__name__}") from exc
        if type(page_id) is bool or not 0 <= page < self.num_ids:
            raise InputError(f"no page id {page_id!r} (ids are 0..{self.num_ids - 1})")
        return page

    def checked_ids(self, values: object, name: str, *, where: str | None = None
                    ) -> np.ndarray:
        """``values`` as int32 ids of pages of this graph, or InputError naming ``name``."""
        ids = as_ids(values, name)
        n = self.num_ids
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise InputError(f"{name} holds an id outside 0..{n - 1}", where=where or name)
        return ids

    def out_links(self, page_id: int) -> np.ndarray:
        page = self._page(page_id)
        s = int(self.out_start[page])
        return self.out_nbr[s : s + int(self.out_len[page])].copy()

    def in_links(self, page_id: int) -> np.ndarray:
        page = self._page(page_id)
        s = int(self.in_start[page])
        return self.in_nbr[s : s + int(self.in_len[page])].copy()

    def out_degree(self, page_id: int) -> int:
        return int(self.out_len[self._page(page_id)])

    def in_degree(self, page_id: int) -> int:
        return int(self.in_len[self._page(page_id)])

    def has_link(self, src: int, dst: int) -> bool:
        if not (0 <= src < self.num_ids and 0 <= dst < self.num_ids):
            return False
        return bool(self.links_exist(np.array([src]), np.array([dst]))[0])

    def links_exist(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`has_link` (out-of-range ids are absent)."""
        sources, targets = as_ids(src, "src"), as_ids(dst, "dst")
        if sources.size != targets.size:
            raise InputError(f"src and dst differ in length ({sources.size} != {targets.size})")
        return K.links_exist(sources, targets, *self._adjacency())

    def gather_out(self, pages: np.ndarray) -> np.ndarray:
        """Out-neighbours of ``pages`` concatenated (repeats kept)."""
        return K.gather_rows(self.checked_ids(pages, "pages"), self.out_start, self.out_len,
                             self.out_nbr)

    def gather_in(self, pages: np.ndarray) -> np.ndarray:
        """In-neighbours of ``pages`` concatenated (repeats kept)."""
        return K.gather_rows(self.checked_ids(pages, "pages"), self.in_start, self.in_len,
                             self.in_nbr)

    # ------------------------------------------------------------------ updates
    def check_batch(self, batch: EdgeBatch) -> None:
        """InputError unless every id ``batch`` names is a page of this graph."""
        for name in ("insert_src", "insert_dst", "delete_src", "delete_dst", "removed_pages"):
            self.checked_ids(getattr(batch, name), name, where="EdgeBatch")

    def apply(self, batch: EdgeBatch) -> AppliedBatch:
        """Apply removals, deletions, insertions (in that order); report what changed."""
        n = self.num_ids
        self.check_batch(batch)
        # Only pages a batch inserts links at, and those interned or revived since the
        # last apply (_pending_live), can be new: looking at them alone saves two passes
        # over every id per batch (1M ids: ~4 ms).
        pending = np.asarray(self._pending_live, dtype=np.int32)
        self._pending_live = []
        pending = pending[pending < n]
        candidates = sorted_unique(np.concatenate([batch.insert_src, batch.insert_dst, pending]))
        was_live = self._live[candidates]
        was_live[np.isin(candidates, pending)] = False  # new to readers

        removed = sorted_unique(batch.removed_pages)
        removed = removed[self._live[removed]]
        rem_src, rem_dst = self._remove_pages(removed)

        done = K.delete_links(batch.delete_src, batch.delete_dst, *self._adjacency())
        del_src = np.concatenate([rem_src, batch.delete_src[done]])
        del_dst = np.concatenate([rem_dst, batch.delete_dst[done]])

        keep = batch.insert_src != batch.insert_dst
        ins_src, ins_dst = batch.insert_src[keep], batch.insert_dst[keep]
        if ins_src.size:
            self._live[ins_src] = True  # inserting a link revives both ends
            self._live[ins_dst] = True
            self._reserve(ins_src, ins_dst)
            done = K.insert_links(ins_src, ins_dst, *self._adjacency())
            ins_src, ins_dst = ins_src[done], ins_dst[done]
        self.num_links += int(ins_src.size) - int(del_src.size)

        if ins_src.size and del_src.size:
            # A link deleted and re-inserted by one batch did not change.
            ins_keys, del_keys = pair_keys(ins_src, ins_dst), pair_keys(del_src, del_dst)
            back = np.isin(ins_keys, del_keys)
            if back.any():
                gone = ~np.isin(del_keys, ins_keys[back])
                ins_src, ins_dst = ins_src[~back], ins_dst[~back]
                del_src, del_dst = del_src[gone], del_dst[gone]

        # Removed, then revived by an insertion of this batch: new to readers too.
        was_live[np.isin(candidates, removed)] = False
        new_pages = candidates[self._live[candidates] & ~was_live].astype(np.int32)
        if self._garbage > max(self._out_used + self._in_used, 1 << 16) // 2 or compaction_due(
                pools=self._pool_bytes(), per_page=self._per_page_bytes(), links=self.num_links):
            self.compact()
        return AppliedBatch(ins_src, ins_dst, del_src.astype(np.int32), del_dst.astype(np.int32),
                            removed.astype(np.int32), new_pages)

    def _remove_pages(self, pages: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if pages.size == 0:
            return EMPTY_IDS, EMPTY_IDS
        bound = int(self.out_len[pages].sum()) + int(self.in_len[pages].sum())
        del_src = np.empty(bound, dtype=np.int32)
        del_dst = np.empty(bound, dtype=np.int32)
        count = K.remove_pages(pages, *self._adjacency(), del_src, del_dst)
        self._live[pages] = False
        self._removals = True
        return del_src[:count], del_dst[:count]

    def _reserve(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Give every row that will receive links room for all of them (no-ops included).

        When the moves would outgrow a pool while much of the pools is garbage, the
        graph is compacted first instead of growing the pool, which keeps memory
        within the budget between batches too (growing first overshot it by 10-20%).
        """
        plans = [self._rows_to_grow("out", src), self._rows_to_grow("in", dst)]
        used = self._out_used + self._in_used
        if self._garbage > used // 4 and any(
                self._pool_end(direction) + int(new_caps.sum()) > self._pool_size(direction)
                for direction, (_, new_caps, _) in zip(("out", "in"), plans, strict=True)):
            self.compact()
            plans = [self._rows_to_grow("out", src), self._rows_to_grow("in", dst)]
        for direction, (rows, new_caps, freed) in zip(("out", "in"), plans, strict=True):
            if rows.size:
                self._relocate(direction, rows, new_caps, freed)

    def _rows_to_grow(self, direction: str, ends: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, int]:
        return rows_to_grow(ends, getattr(self, f"{direction}_len"),
                            getattr(self, f"{direction}_cap"), self.num_ids)

    def _pool_end(self, direction: str) -> int:
        return self._out_used if direction == "out" else self._in_used

    def _pool_size(self, direction: str) -> int:
        return int(getattr(self, f"{direction}_nbr").size)

    def _relocate(self, direction: str, rows: np.ndarray, new_caps: np.ndarray,
                  freed: int) -> None:
        used = self._pool_end(direction)
        need = used + int(new_caps.sum())
        nbr = getattr(self, f"{direction}_nbr")
        twin = getattr(self, f"{direction}_twin")
        if need > nbr.size:
            size = max(need, nbr.size + (nbr.size >> 1) + 1024)
            # Not np.resize: it fills the new tail by repeating the array (a second copy).
            nbr, twin = grown_pool(nbr, size, used), grown_pool(twin, size, used)
            setattr(self, f"{direction}_nbr", nbr)
            setattr(self, f"{direction}_twin", twin)
        end = K.relocate_rows(rows, new_caps, getattr(self, f"{direction}_start"),
                              getattr(self, f"{direction}_len"), getattr(self, f"{direction}_cap"),
                              nbr, twin, used)
        if direction == "out":
            self._out_used = int(end)
        else:
            self._in_used = int(end)
        self._garbage += freed

    def compact(self) -> None:
        """Pack rows back to back (1/8 spare per row, 1/8 spare pool); frees garbage."""
        n = self.num_ids
        for direction in ("out", "in"):
            length = getattr(self, f"{direction}_len")
            total = int((length[:n] + (length[:n] >> ROW_SPARE_SHIFT)).sum())
            new_nbr = np.empty(total + (total >> 3), dtype=np.int32)
            new_twin = np.empty(total + (total >> 3), dtype=np.int32)
            end = K.pack_rows(getattr(self, f"{direction}_start"), length,
                              getattr(self, f"{direction}_cap"), getattr(self, f"{direction}_nbr"),
                              getattr(self, f"{direction}_twin"), new_nbr, new_twin, n,
                              ROW_SPARE_SHIFT)
            setattr(self, f"{direction}_nbr", new_nbr)
            setattr(self, f"{direction}_twin", new_twin)
            if direction == "out":
                self._out_used = int(end)
            else:
                self._in_used = int(end)
        self._garbage = 0

    def _grow_nodes(self, need: int) -> None:
        cap = max(need, self._node_cap + (self._node_cap >> 1), 16)
        for name in ("_live", "out_start", "out_len", "out_cap", "in_start", "in_len", "in_cap"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)
        self._node_cap = cap

    def _adjacency(self) -> Adjacency:
        return (self.out_start, self.out_len, self.out_nbr, self.out_twin,
                self.in_start, self.in_len, self.in_nbr, self.in_twin)

    # ------------------------------------------------------------------ export
    def to_csr(self) -> sp.csr_array:
        """0/1 adjacency ``(num_ids x num_ids)``, row = source, sorted indices."""
        n = self.num_ids
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(self.out_len[:n], out=indptr[1:])
        indices = K.rows_flat(self.out_start, self.out_len, self.out_nbr, n, indptr)
        data = np.ones(indices.size, dtype=np.float64)
        matrix = sp.csr_array((data, indices, indptr), shape=(n, n))
        matrix.sort_indices()
        return matrix

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """All links as ``(src, dst)`` int32 arrays, grouped by source."""
        matrix = self.to_csr()
        src = np.repeat(np.arange(self.num_ids, dtype=np.int32), np.diff(matrix.indptr))
        return src, matrix.indices.astype(np.int32)

    def memory_bytes(self) -> int:
        """Bytes the graph holds, key strings excluded: the adjacency and per-page
        arrays (allocated capacity, not use) and the key table (:meth:`key_table_bytes`)."""
        return self._per_page_bytes() + self._pool_bytes()

    def _per_page_bytes(self) -> int:
        """The per-page arrays and the key table: what grows with pages, not links."""
        arrays = (self._live, self.out_start, self.out_len, self.out_cap, self.in_start,
                  self.in_len, self.in_cap)
        return int(sum(a.nbytes for a in arrays)) + self.key_table_bytes()

    def key_table_bytes(self) -> int:
        """Bytes of the key table (:func:`ranker.graph_memory.key_table_bytes`)."""
        return key_table_bytes(self._keys, self._index)

    def _pool_bytes(self) -> int:
        return int(sum(a.nbytes for a in (self.out_nbr, self.out_twin, self.in_nbr,
                                          self.in_twin)))

    # ------------------------------------------------------------------ bulk load
    @classmethod
    def from_edges(cls, src_keys: Sequence[str], dst_keys: Sequence[str]) -> LinkGraph:
        """Build from parallel key lists (vectorised; ids follow sorted key order)."""
        if len(src_keys) != len(dst_keys):
            raise InputError("src_keys and dst_keys differ in length", where="from_edges")
        both = np.asarray(list(src_keys) + list(dst_keys), dtype=object)
        if both.size == 0:
            return cls()
        if not all(type(key) is str for key in both):
            raise InputError("page keys must be Python str (not numpy strings, bytes or "
                             "numbers)", where="from_edges")
        keys, inverse = np.unique(both, return_inverse=True)
        inverse = inverse.astype(np.int32)
        m = len(src_keys)
        return cls.from_id_edges(inverse[:m], inverse[m:], [str(k) for k in keys])

    @classmethod
    def from_id_edges(cls, src: np.ndarray, dst: np.ndarray, keys: Sequence[str]) -> LinkGraph:
        """Build from id arrays over ``keys`` (every key becomes a live page)."""
        n = len(keys)
        src = as_ids(src, "src")
        dst = as_ids(dst, "dst")
        if src.size != dst.size:
            raise InputError("src and dst differ in length", where="from_id_edges")
        if src.size and (min(int(src.min()), int(dst.min())) < 0
                         or max(int(src.max()), int(dst.max())) >= n):
            raise InputError(f"edge ids must lie in 0..{n - 1}", where="from_id_edges")
        pairs = sorted_unique(pair_keys(src, dst)[src != dst])
        src, dst = split_pair_keys(pairs)
        if not all(type(key) is str for key in keys):  # as intern: 1 and True are one key
            raise InputError("page keys must be strings", where="from_id_edges")
        graph = cls()
        graph._keys = list(keys)
        graph._index = {k: i for i, k in enumerate(graph._keys)}
        if len(graph._index) != n:
            raise InputError("keys must be distinct", where="from_id_edges")
        graph._grow_nodes(n)
        graph._live[:n] = True
        count = src.size
        links = np.arange(count, dtype=np.int64)
        out_len = np.bincount(src, minlength=n).astype(np.int32)
        in_len = np.bincount(dst, minlength=n).astype(np.int32)
        out_start = np.concatenate([[0], np.cumsum(out_len[:-1], dtype=np.int64)]) if n else \
            np.zeros(0, dtype=np.int64)
        in_start = np.concatenate([[0], np.cumsum(in_len[:-1], dtype=np.int64)]) if n else \
            np.zeros(0, dtype=np.int64)
        in_pos = K.bucket_positions(dst, in_start)
        by_dst = np.empty(count, dtype=np.int64)
        by_dst[in_pos] = links
        out_rel = (links - out_start[src]).astype(np.int32)
        in_rel = (in_pos - in_start[dst]).astype(np.int32)
        graph.out_start[:n], graph.out_len[:n], graph.out_cap[:n] = out_start, out_len, out_len
        graph.in_start[:n], graph.in_len[:n], graph.in_cap[:n] = in_start, in_len, in_len
        graph.out_nbr, graph.out_twin = dst, in_rel
        graph.in_nbr, graph.in_twin = src[by_dst], out_rel[by_dst]
        graph._out_used = graph._in_used = count
        graph.num_links = count
        return graph
