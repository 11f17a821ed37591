"""Publishing live scores: moved pages into ``P scores:{alg}``, the rest into meta.

After each graph transaction the incremental engine reports, per algorithm, the
pages whose score moved by more than the publish threshold. Only those are
written (ZADD; ZREM for pages no longer live), together with ``P meta:{alg}``,
in ONE fenced MULTI/EXEC so a reader never sees scores from one refresh with the
total or bound of another.

``fresh`` is published as 1 only when the engine says so AND the certified bound
is within the tolerance: an unconverged vector is never advertised as converged.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from consumer.keys import Keys
from consumer.stats import iso_now

ZADD_CHUNK = 4000  # (score, member) pairs per ZADD


@dataclass(frozen=True)
class Published:
    """What one publication wrote, per algorithm."""

    algorithm: str
    written: int
    removed: int
    bound: float
    total: float
    fresh: bool
    refreshed_at: str


def is_fresh(report_fresh: bool, bound: float, tolerance: float) -> bool:
    """The published ``fresh`` flag: never 1 with a bound above the tolerance."""
    return bool(report_fresh) and math.isfinite(bound) and bound <= tolerance


def meta_fields(*, total: float, bound: float, tolerance: float, fresh: bool, version: int,
                refreshed_at: str, offsets: Mapping[str, int], damping: float, pages: int,
                mode: str) -> dict[str, str]:
    """The ``P meta:{alg}`` hash (all strings; floats in repr for full precision)."""
    return {
        "total": repr(float(total)),
        "bound": repr(float(bound)),
        "tolerance": repr(float(tolerance)),
        "fresh": "1" if fresh else "0",
        "version": str(version),
        "refreshed_at": refreshed_at,
        "offsets": json.dumps(dict(sorted(offsets.items())), separators=(",", ":")),
        "damping": repr(float(damping)),
        "scale": "paper",
        "pages": str(pages),
        "mode": mode,
    }


def score_commands(keys: Keys, algorithm: str, moved_ids: np.ndarray,
                   moved_scores: np.ndarray, live: np.ndarray, key_of: Any,
                   removed_ids: Sequence[int] = ()) -> tuple[list[tuple[Any, ...]], int, int]:
    """ZADD/ZREM commands for moved pages (pure). Returns (commands, written, removed).

    ``live`` is the graph's live mask; a moved page that is not live is ZREMed, as is
    every id in ``removed_ids`` (pages the batch removed).
    """
    zkey = keys.scores(algorithm)
    ids = np.asarray(moved_ids, dtype=np.int64)
    values = np.asarray(moved_scores, dtype=np.float64)
    alive = live[ids] if ids.size else np.zeros(0, dtype=bool)
    add_ids, add_values = ids[alive].tolist(), values[alive].tolist()
    gone = set(ids[~alive].tolist()) | {int(i) for i in removed_ids}
    cmds: list[tuple[Any, ...]] = []
    for start in range(0, len(add_ids), ZADD_CHUNK):
        args: list[Any] = []
        for pid, value in zip(add_ids[start:start + ZADD_CHUNK],
                              add_values[start:start + ZADD_CHUNK], strict=True):
            args.append(value)
            args.append(key_of(pid))
        cmds.append(("ZADD", zkey, *args))
    gone_urls = [key_of(pid) for pid in sorted(gone)]
    for start in range(0, len(gone_urls), ZADD_CHUNK):
        cmds.append(("ZREM", zkey, *gone_urls[start:start + ZADD_CHUNK]))
    return cmds, len(add_ids), len(gone_urls)


class ScorePublisher:
    """Writes engine reports to Redis (see the module docstring)."""

    def __init__(self, client: redis.Redis, keys: Keys, *, damping: float,
                 tolerance: float) -> None:
        self.client = client
        self.keys = keys
        self.damping = damping
        self.tolerance = tolerance

    def publish(self, ranks: Any, reports: Mapping[str, Any], *, version: int,
                offsets: Mapping[str, int], removed_ids: Sequence[int] = (),
                fence: Any | None = None) -> list[Published]:
        """One MULTI/EXEC with every algorithm's moved scores and meta.

        ``ranks`` is the :class:`ranker.LiveRanks` the reports came from (for the
        graph's URLs and live mask). Connection errors propagate for the caller's
        retry loop; re-publishing the same reports is idempotent.
        """
        graph = ranks.graph
        live = graph.live_mask()
        pages = int(live.sum())
        now = iso_now()
        out: list[Published] = []
        with contextlib.ExitStack() as stack:
            if fence is not None:
                stack.enter_context(fence.fenced())
            pipe = stack.enter_context(self.client.pipeline(transaction=True))
            if fence is not None:
                fence.check_in(pipe)
                pipe.multi()
            for algorithm, report in reports.items():
                cmds, written, removed = score_commands(
                    self.keys, algorithm, report.moved_ids, report.moved_scores, live,
                    graph.key_of, removed_ids)
                for cmd in cmds:
                    pipe.execute_command(*cmd)
                fresh = is_fresh(report.fresh, report.bound, self.tolerance)
                pipe.hset(self.keys.meta(algorithm), mapping=meta_fields(  # type: ignore[arg-type]
                    total=report.total, bound=report.bound, tolerance=self.tolerance,
                    fresh=fresh, version=version, refreshed_at=now, offsets=offsets,
                    damping=self.damping, pages=pages, mode=str(report.mode)))
                out.append(Published(algorithm, written, removed, float(report.bound),
                                     float(report.total), fresh, now))
            pipe.execute()
        return out
