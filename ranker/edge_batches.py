"""Batches of link changes on interned page ids, and the sorted-set helpers they share.

:class:`EdgeBatch` is what callers hand to :meth:`ranker.LinkGraph.apply`;
:class:`AppliedBatch` is what the graph reports back as actually changed, which the
incremental engines absorb and the consumer writes to Redis. Kept apart from the
graph's storage so that the engines and the consumer's writers can use the batch
types without reading through the pool management.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankstream.errors import InputError

EMPTY_IDS = np.zeros(0, dtype=np.int32)


_INT32 = np.iinfo(np.int32)


def as_ids(values: object, name: str) -> np.ndarray:
    """``values`` as a contiguous int32 id array, or InputError naming ``name``."""
    array = np.asarray(values)
    if array.size == 0:
        return EMPTY_IDS
    if array.dtype.kind not in "iu":
        raise InputError(f"{name} must hold integer page ids, got {array.dtype}", where=name)
    if array.dtype != np.int32:
        # Checked before the cast, which would wrap 2**32 + k to page k silently.
        low, high = int(array.min()), int(array.max())
        if low < _INT32.min or high > _INT32.max:
            bad = low if low < _INT32.min else high
            raise InputError(f"{name} holds {bad}, beyond the int32 page-id range", where=name)
    return np.ascontiguousarray(array.reshape(-1), dtype=np.int32)


@dataclass
class EdgeBatch:
    """A batch of link changes on already interned ids.

    Applied in this order: page removals (every in- and out-link of the page goes
    too), then deletions, then insertions. Self links are dropped; inserting a
    present link and deleting an absent one are no-ops. Inserting a link to or
    from a removed page revives it.
    """

    insert_src: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    insert_dst: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    delete_src: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    delete_dst: np.ndarray = field(default_factory=lambda: EMPTY_IDS)
    removed_pages: np.ndarray = field(default_factory=lambda: EMPTY_IDS)

    def __post_init__(self) -> None:
        self.insert_src = as_ids(self.insert_src, "insert_src")
        self.insert_dst = as_ids(self.insert_dst, "insert_dst")
        self.delete_src = as_ids(self.delete_src, "delete_src")
        self.delete_dst = as_ids(self.delete_dst, "delete_dst")
        self.removed_pages = as_ids(self.removed_pages, "removed_pages")
        if self.insert_src.size != self.insert_dst.size:
            raise InputError("insert_src and insert_dst differ in length", where="EdgeBatch")
        if self.delete_src.size != self.delete_dst.size:
            raise InputError("delete_src and delete_dst differ in length", where="EdgeBatch")

    def __len__(self) -> int:
        return int(self.insert_src.size + self.delete_src.size + self.removed_pages.size)


@dataclass(frozen=True)
class AppliedBatch:
    """What :meth:`LinkGraph.apply` actually changed (the consumer writes exactly this).

    A link both deleted and re-inserted by one batch is in neither list. Deleted
    links include those that went with a removed page. ``new_pages`` are pages live
    now that were not live at the previous ``apply`` (newly interned, revived by
    ``intern`` or by an inserted link); a page can be in ``removed_pages`` and
    ``new_pages`` when an insertion revived it in the same batch.
    """

    inserted_src: np.ndarray
    inserted_dst: np.ndarray
    deleted_src: np.ndarray
    deleted_dst: np.ndarray
    removed_pages: np.ndarray
    new_pages: np.ndarray


def pair_keys(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """One int64 per link ``src -> dst``, ordered by source then target."""
    return (src.astype(np.int64) << 32) | dst.astype(np.int64)


def split_pair_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The int32 ``(src, dst)`` of :func:`pair_keys`' keys."""
    return (keys >> 32).astype(np.int32), (keys & 0xFFFFFFFF).astype(np.int32)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` by sort-and-compare (numpy 2's hash-based unique is ~5x slower here)."""
    ordered = np.sort(values)
    if ordered.size < 2:
        return ordered
    keep = np.empty(ordered.size, dtype=np.bool_)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
