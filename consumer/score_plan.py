"""What a score publication must write so that a ZSET shows ``y`` within its budget (pure).

The publisher keeps a :class:`ZsetRecord` of what each of its Redis ZSETs holds and
asks :func:`plan_writes` for the changes that bring one to the engine's current
``y``: membership always exactly (live pages in, everything else out), values
largest move first until the unwritten rest fits the budget. The unwritten rest
``||y - zset||_1`` is computed exactly from the record, and it is what the
published bound adds to the engine's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# When a publication would write more than this share of a large ZSET's members, the
# back buffer is dropped and refilled instead: members inserted into an empty ZSET in
# ascending score order cost Redis 2.4 us each, against 7.1 us to update members in
# ascending order and 10 us in random order (1.4M URL members, AOF on, measured on
# this box). The drain after the 1M-page stream rewrote 2.5M members: 23 s of Redis.
REBUILD_SHARE = 1 / 3
REBUILD_MIN_MEMBERS = 10_000  # below this a ZSET costs too little to care


def unwritten_within(diffs: np.ndarray, budget: float) -> np.ndarray:
    """Mask of entries that may stay unwritten: smallest first, their sum <= ``budget``.

    O(n): entries are bucketed by binary exponent, whole buckets are taken from the
    smallest up, and only the bucket where the budget runs out is sorted.
    """
    keep = np.zeros(diffs.size, dtype=bool)
    if budget <= 0.0 or diffs.size == 0:
        return keep
    if float(diffs.sum()) <= budget:
        keep[:] = True
        return keep
    exponent = np.frexp(diffs)[1]
    # frexp(0) has exponent 0, which would rank a zero above every value below 0.5:
    # zeros go in the smallest bucket (they cost nothing to leave unwritten).
    exponent = np.where(diffs > 0.0, exponent, exponent.min())
    bucket = exponent - exponent.min()
    cumulative = np.cumsum(np.bincount(bucket, weights=diffs))
    full = int(np.searchsorted(cumulative, budget, side="right"))  # buckets that fit whole
    keep = bucket < full
    left = budget - (float(cumulative[full - 1]) if full else 0.0)
    edge = np.flatnonzero(bucket == full)
    if edge.size and left > 0.0:
        order = np.argsort(diffs[edge], kind="stable")
        fits = int(np.searchsorted(np.cumsum(diffs[edge][order]), left, side="right"))
        keep[edge[order[:fits]]] = True
    return keep


def _largest_moves(ids: np.ndarray, diffs: np.ndarray, count: int, room: float
                   ) -> tuple[np.ndarray, float]:
    """The ``count`` largest moves, and the budget ``room`` left once the others stay
    unwritten (negative: they do not all fit, so none of the largest can stay).

    The same outcome as leaving the smallest moves unwritten within ``room`` first
    and capping the rest at ``count`` (the budget always leaves the smallest), in
    one selection instead of a pass over every move and then a selection: on a
    growing 1.5M-page graph nearly every page moves, and those two steps took ~40 of
    the 65 ms per algorithm of choosing a publication's writes.
    """
    total = float(diffs.sum())
    if count == 0:
        return ids[:0], room - total
    # Select among the moves above a threshold read off a strided sample (about
    # twice ``count`` of them), not among all: a selection over 1.5M values costs
    # ~17 ms; when too few pass, over all of them after all.
    stride = max(1, diffs.size // (64 * count))
    sample = diffs[::stride]
    rank = min(sample.size - 1, 2 * count // stride)
    threshold = np.partition(sample, sample.size - 1 - rank)[sample.size - 1 - rank]
    pool = np.flatnonzero(diffs >= threshold)
    if pool.size < count:
        pool = np.arange(diffs.size)
    top = pool[np.argpartition(diffs[pool], pool.size - count)[pool.size - count:]]
    return ids[top], room - (total - float(diffs[top].sum()))


@dataclass
class ZsetRecord:
    """What one Redis ZSET holds, by page id: the score (0 where absent) and presence."""

    values: np.ndarray = field(default_factory=lambda: np.zeros(0))
    present: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def grow(self, n: int) -> None:
        if n > self.values.size:
            cap = max(n, self.values.size + (self.values.size >> 1), 1024)
            values = np.zeros(cap)
            values[: self.values.size] = self.values
            present = np.zeros(cap, dtype=bool)
            present[: self.present.size] = self.present
            self.values, self.present = values, present

    def members(self) -> int:
        """ZCARD of the ZSET (Redis deletes an empty ZSET: 0 means the key is absent)."""
        return int(np.count_nonzero(self.present))


@dataclass(frozen=True)
class WritePlan:
    """The changes that bring a ZSET record to ``y`` within the budget."""

    add_ids: np.ndarray  # ids to ZADD, in ascending order of add_values
    add_values: np.ndarray
    remove_ids: np.ndarray  # sorted ids to ZREM
    unwritten: int  # live pages left with a stale value
    remainder: float  # ||y - zset||_1 over live pages once written
    rebuild: bool = False  # drop the ZSET first: add_ids are then all live pages


def plan_writes(y: np.ndarray, live: np.ndarray, record: ZsetRecord, *, threshold: float,
                budget: float, max_updates: int | None = None) -> WritePlan:
    """What to write into ``record``'s ZSET so that it shows ``y``; updates ``record``.

    Live pages missing from the ZSET are always added and dead members always
    removed (membership is exact); value moves above ``threshold`` are written
    largest first until the unwritten ones fit ``budget`` (moves at or below it
    only when they alone exceed the budget), but at most
    ``max_updates`` of them (the largest): that caps the Redis time of one
    publication, and what is left stays in ``remainder``, which the published
    bound includes, for the next publication to write.

    Members are written in ascending score order (Redis inserts them faster), and
    a plan that would write most of a large ZSET rewrites it whole instead
    (``rebuild``, see :data:`REBUILD_SHARE`).
    """
    n = y.size
    record.grow(n)
    values, present = record.values[:n], record.present[:n]
    diff = np.abs(y - values)
    missing = live & ~present
    stale = live & present
    candidate = stale & (diff > threshold)
    dust = float(diff[stale & ~candidate].sum())
    add = missing | candidate
    cand_ids = np.flatnonzero(candidate)
    room = budget - dust
    spare = None if max_updates is None else max(max_updates, 0) - cand_ids.size
    if spare is not None and spare < 0:
        cand_ids, room = _largest_moves(cand_ids, diff[cand_ids], max(max_updates or 0, 0), room)
        add[candidate] = False
        add[cand_ids] = True
    if room > 0.0 and cand_ids.size:
        add[cand_ids[unwritten_within(diff[cand_ids], room)]] = False
    if dust > budget > 0.0 and (spare is None or spare > 0):
        # The moves below the threshold alone are over the budget, and nothing else
        # ever writes them: the published bound would stay over the tolerance however
        # often the scores were republished (and an idle consumer republishes until
        # they are fresh). Write the largest of them until the rest fits. (No budget
        # at all means the engine's own bound is over: writing dust cannot help.)
        dust_ids = np.flatnonzero(stale & ~candidate & (diff > 0.0))
        write = dust_ids[~unwritten_within(diff[dust_ids], budget)]
        if spare is not None and write.size > spare:
            write = write[np.argpartition(diff[write], write.size - spare)[write.size - spare:]]
        add[write] = True
    add_ids = np.flatnonzero(add)
    live_count = int(np.count_nonzero(live))
    rebuild = (live_count >= REBUILD_MIN_MEMBERS
               and add_ids.size > REBUILD_SHARE * live_count)
    if rebuild:
        add_ids = np.flatnonzero(live)
        values[:] = 0.0
        present[:] = False
    remove_ids = np.flatnonzero(present & ~live)
    add_values = y[add_ids].astype(np.float64, copy=True)
    order = np.argsort(add_values, kind="stable")
    add_ids, add_values = add_ids[order], add_values[order]
    values[add_ids] = add_values
    present[add_ids] = True
    values[remove_ids] = 0.0
    present[remove_ids] = False
    left = np.abs(y - values)
    remainder = float(left.sum(where=live))
    unwritten = int(np.count_nonzero(live & (left != 0.0)))
    return WritePlan(add_ids, add_values, remove_ids, unwritten, remainder, rebuild)
