"""What one score publication is: its meta hash, its back-buffer chunks, its swap.

Pure data and pure functions; :class:`consumer.score_publisher.ScorePublisher`
builds and sends them (see its module for the double-buffered protocol).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from consumer.score_wire import UrlSlice

Command = tuple[Any, ...]


def is_fresh(report_fresh: bool, bound: float, tolerance: float, total: float) -> bool:
    """The published ``fresh`` flag: never 1 with a bound above the (relative) tolerance.

    Judged on the published ``relative_bound`` itself, so that a reader comparing it
    with ``tolerance`` always agrees (``bound <= tolerance * total`` said 1 beside a
    relative bound one unit in the last place above the tolerance)."""
    return (bool(report_fresh) and math.isfinite(bound) and math.isfinite(total)
            and bound <= tolerance * total and relative_bound(bound, total) <= tolerance)


def names_publication(raw: Any, publication_id: str) -> bool:
    """Whether a meta ``publication`` field as read from Redis (bytes or None) is
    ``publication_id``; bytes that are not UTF-8 (not ours) name none, not a crash."""
    return raw is not None and raw.decode("utf-8", "replace") == publication_id


def relative_bound(bound: float, total: float) -> float:
    """The bound as a share of sum(y), as published: 0 for an empty, exact vector."""
    return bound / total if total > 0 else (0.0 if bound == 0 else float("inf"))


def meta_fields(*, total: float, bound: float, tolerance: float, fresh: bool, version: int,
                refreshed_at: str, offsets: Mapping[str, int], damping: float, pages: int,
                mode: str, engine_bound: float | None = None, publication: str = ""
                ) -> dict[str, str]:
    """The ``P meta:{alg}`` hash (all strings; floats in repr for full precision)."""
    relative = relative_bound(bound, total)
    return {
        "total": repr(float(total)),
        "bound": repr(float(bound)),
        "relative_bound": repr(float(relative)),
        "engine_bound": repr(float(bound if engine_bound is None else engine_bound)),
        "tolerance": repr(float(tolerance)),
        "tolerance_kind": "relative",
        "fresh": "1" if fresh else "0",
        "version": str(version),
        "refreshed_at": refreshed_at,
        "offsets": json.dumps(dict(sorted(offsets.items())), separators=(",", ":")),
        "damping": repr(float(damping)),
        "scale": "paper",
        "pages": str(pages),
        "mode": mode,
        "publication": publication,
    }


@dataclass(frozen=True)
class Published:
    """What one publication wrote, per algorithm."""

    algorithm: str
    written: int
    removed: int
    unwritten: int
    bound: float
    total: float
    fresh: bool
    refreshed_at: str


@dataclass(frozen=True)
class Chunk:
    """One back-buffer command: ZADD or ZREM of some members, UNLINK the key, or MARK
    its filled marker (``{back buffer}:filled``, see ScorePublisher.prepare)."""

    op: str  # "ZADD", "ZREM", "UNLINK" or "MARK"
    key: str
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class Publication:
    """A prepared publication: back-buffer chunks, then the swap with the meta."""

    publication_id: str
    chunks: list[Chunk]
    swap: list[Command]  # renames and TTLs, then every meta hash LAST
    checks: list[tuple[str, int]]  # (score key, ZCARD it must have) before the swap
    # (meta key, publication it must name) before the swap: the publication our
    # record of that algorithm's live ZSET comes from.
    meta_checks: list[tuple[str, str]]
    summary: list[Published]
    urls: UrlSlice
    swapped: dict[str, bool]  # per algorithm: live and back records trade places
    meta_key: str  # where the swap's idempotency check reads publication_id
    reports: dict[str, Any]  # what it publishes (to publish again if the swap is refused)
    attempts: int = 0

    @property
    def members(self) -> int:
        return int(sum(c.ids.size for c in self.chunks))
