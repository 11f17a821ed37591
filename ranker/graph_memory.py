"""The dynamic graph's memory budget: what counts, and when :class:`LinkGraph` compacts.

The issue's target is at most 40 bytes per link, URL strings excluded. Counted here:
the pools (neighbour and twin arrays, with slack and garbage), the per-page arrays
(33 bytes a page) and the key table (:func:`key_table_bytes`). Only the pools shrink
when the graph compacts; the rest grows with the pages. Also here: how much room a
row that overflows gets (:func:`rows_to_grow`).
"""

from __future__ import annotations

import sys

import numpy as np

# Compact when the pools (slack, garbage) pass this many bytes per link. Only the
# pools count here, as only they shrink: with the per-page arrays counted too, a graph
# with about as many pages as links (a crawl frontier) compacted after every batch (2M
# pages and links: a 10-link batch took 21 ms instead of 0.13). Compaction leaves
# every row 1/8 spare capacity and the pools 1/8 headroom (about 20 bytes per link):
# without the rows' spare, a growing graph re-grew every row that gained a link (all
# the hubs) after each compaction, and so compacted again after every 50k-link batch
# (measured: 56 compactions in 60 batches).
COMPACT_POOL_BYTES_PER_LINK = 34
# The whole graph's budget, and what compaction leaves the pools (with margin). A
# graph whose per-page part (arrays and key table: ~100 bytes a page at 1M pages)
# leaves room for compacted pools within the budget also compacts when it passes the
# budget: at ~10 links a page the pool rule alone let it reach 44.7 bytes a link. A
# frontier graph cannot get within it, and does not try.
BUDGET_BYTES_PER_LINK = 40
COMPACTED_POOL_BYTES_PER_LINK = 22
ROW_SPARE_SHIFT = 3  # compaction leaves each row 1/2**ROW_SPARE_SHIFT spare
COMPACT_MIN_LINKS = 4096  # smaller graphs never compact for their budget
# A batch with fewer link ends than 1/SORT_BELOW_SHARE of the ids groups them by sorting.
SORT_BELOW_SHARE = 16
# An id's int object is 28 bytes, but CPython's allocator hands out 16-byte multiples:
# 32 bytes each, as a tracemalloc of a million of them shows.
_INT_BYTES = -(-sys.getsizeof(1 << 20) // 16) * 16
_SHARED_INTS = 257  # CPython keeps one object of each int below 257


def key_table_bytes(keys: list[str], index: dict[str, int]) -> int:
    """The key -> id dict's hash table, the id -> key list and the int objects of the
    ids, the strings themselves excluded: about 67 bytes a page at 1M pages, 8 a link
    at the web's ~8 links a page."""
    ints = max(len(keys) - _SHARED_INTS, 0) * _INT_BYTES
    return sys.getsizeof(index) + sys.getsizeof(keys) + ints


def compaction_due(*, pools: int, per_page: int, links: int) -> bool:
    """Whether a graph holding ``pools`` bytes of pools and ``per_page`` bytes of
    everything else (per-page arrays, key table) should compact for its budget."""
    if links < COMPACT_MIN_LINKS:
        return False
    if pools > COMPACT_POOL_BYTES_PER_LINK * links:
        return True
    room = (BUDGET_BYTES_PER_LINK - COMPACTED_POOL_BYTES_PER_LINK) * links
    return (per_page + pools > BUDGET_BYTES_PER_LINK * links and per_page <= room
            and pools > COMPACTED_POOL_BYTES_PER_LINK * links)


def grown_pool(pool: np.ndarray, size: int, used: int) -> np.ndarray:
    """A larger pool of ``size`` entries holding ``pool[:used]`` (the rest
    uninitialised: only entries below the used mark are ever read)."""
    grown = np.empty(size, dtype=pool.dtype)
    grown[:used] = pool[:used]
    return grown


def rows_to_grow(ends: np.ndarray, length: np.ndarray, cap: np.ndarray, num_ids: int
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows among ``ends`` (one entry per link to add) too small for their new
    links, their new capacities (1.5x, or enough), and the capacity their moves free."""
    if 0 < ends.size * SORT_BELOW_SHARE < num_ids:
        # A small batch: sorting its ends beats a pass over every id (1M ids, 1k
        # links: 0.1 against 3 ms per direction).
        ordered = np.sort(ends)
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
        rows = ordered[starts]
        counts = np.diff(np.r_[starts, ordered.size])
    else:  # bincount, not np.unique: no sort (ids are dense and < num_ids)
        counts = np.bincount(ends, minlength=0)
        rows = np.flatnonzero(counts)
        counts = counts[rows]
    length, cap = length[rows], cap[rows]
    grow = length + counts > cap
    rows, length, cap, counts = rows[grow], length[grow], cap[grow], counts[grow]
    new_caps = np.maximum(length + counts, cap + (cap >> 1) + 2).astype(np.int64)
    return rows.astype(np.int32), new_caps, int(cap.sum())
