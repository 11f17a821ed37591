"""Publishing live scores: moved pages into ``P scores:{alg}``, the rest into meta.

After each graph transaction the incremental engine reports, per algorithm, the
pages whose score moved by more than the publish threshold. Only those are
written (ZADD; ZREM for pages no longer live), together with ``P meta:{alg}``,
in ONE fenced MULTI/EXEC so a reader never sees scores from one refresh with the
total or bound of another.

``bound`` in meta certifies the vector readers actually see: the engine's
certified ``||y_exact - y||_1`` plus ``||y - y_published||_1`` (scores that moved
by less than the publish threshold keep their older published value). So for the
ZSET as published, ``sum |zset - y_exact| <= bound``.

The tolerance is RELATIVE, as in :mod:`ranker.residual`: fresh means
``bound <= tolerance * total`` (``total = sum(y)``), i.e. about ``tolerance`` in
L1 on the probability scale. ``fresh`` is published as 1 only when the engine
says so AND the published bound is within it: an unconverged vector is never
advertised as converged.
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

# ARGV: the ZSET key, scores (float64 LE), members joined by "\n". ZADDs in chunks.
# Redis passes Lua numbers to commands with 17 significant digits: exact doubles.
ZADD_SCRIPT = r"""
local key, scores, members = ARGV[1], ARGV[2], ARGV[3]
local args = {}
local pos = 1
for i = 1, #scores / 8 do
  local score = struct.unpack('<d', scores, 8 * i - 7)
  local stop = string.find(members, '\n', pos, true)
  local member
  if stop then
    member = string.sub(members, pos, stop - 1)
    pos = stop + 1
  else
    member = string.sub(members, pos)
  end
  args[#args + 1] = score
  args[#args + 1] = member
  if #args >= 4000 then
    redis.call('ZADD', key, unpack(args))
    args = {}
  end
end
if #args > 0 then
  redis.call('ZADD', key, unpack(args))
end
return #scores / 8
"""


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


def is_fresh(report_fresh: bool, bound: float, tolerance: float, total: float) -> bool:
    """The published ``fresh`` flag: never 1 with a bound above the (relative) tolerance."""
    return (bool(report_fresh) and math.isfinite(bound) and math.isfinite(total)
            and bound <= tolerance * total)


def publication_drift(ranks: Any, algorithm: str, live: np.ndarray,
                      publish_threshold: float) -> float:
    """``||y - y_published||_1`` over live pages (what the threshold left unwritten).

    Read from the engine when it exposes its arrays; otherwise the worst case,
    ``publish_threshold`` per live page.
    """
    engine = getattr(ranks, "engines", {}).get(algorithm)
    y = getattr(engine, "y", None)
    published = getattr(engine, "published", None)
    n = live.size
    if y is None or published is None or len(y) < n or len(published) < n:
        return float(publish_threshold) * int(live.sum())
    return float(np.abs(y[:n] - published[:n])[live].sum())


def meta_fields(*, total: float, bound: float, tolerance: float, fresh: bool, version: int,
                refreshed_at: str, offsets: Mapping[str, int], damping: float, pages: int,
                mode: str, engine_bound: float | None = None) -> dict[str, str]:
    """The ``P meta:{alg}`` hash (all strings; floats in repr for full precision)."""
    relative = bound / total if total > 0 else (0.0 if bound == 0 else float("inf"))
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
    }


def score_commands(keys: Keys, algorithm: str, moved_ids: np.ndarray,
                   moved_scores: np.ndarray, live: np.ndarray, key_of: Any,
                   removed_ids: Sequence[int] = (), *, bulk: bool = False
                   ) -> tuple[list[tuple[Any, ...]], int, int]:
    """ZADD/ZREM commands for moved pages (pure). Returns (commands, written, removed).

    ``live`` is the graph's live mask; a moved page that is not live is ZREMed, as is
    every id in ``removed_ids`` (pages the batch removed). With ``bulk`` the ZADDs are
    one EVAL of :data:`ZADD_SCRIPT` (packed scores, newline-joined URLs).
    """
    zkey = keys.scores(algorithm)
    ids = np.asarray(moved_ids, dtype=np.int64)
    values = np.asarray(moved_scores, dtype=np.float64)
    alive = live[ids] if ids.size else np.zeros(0, dtype=bool)
    add_ids, add_values = ids[alive].tolist(), values[alive].tolist()
    # A page removed by an earlier batch may be live again by now (revived).
    gone = set(ids[~alive].tolist()) | {int(i) for i in removed_ids if not live[int(i)]}
    cmds: list[tuple[Any, ...]] = []
    if bulk and add_ids:
        urls = [key_of(pid) for pid in add_ids]
        if not any("\n" in url for url in urls):
            packed = np.asarray(add_values, dtype="<f8").tobytes()
            cmds.append(("EVAL", ZADD_SCRIPT, 0, zkey, packed, "\n".join(urls)))
            add_ids = []
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
    return cmds, int(alive.sum()), len(gone_urls)


class PendingScores:
    """Moved pages of refreshes not yet published, merged across batches.

    Publication is coalesced: while one publication is being written, the moved
    pages of the following batches accumulate here and go out together in the
    next one (with their scores as of then), so a slow publication never holds up
    the graph transactions.
    """

    def __init__(self) -> None:
        self._moved: dict[str, list[np.ndarray]] = {}
        self._removed: list[np.ndarray] = []
        self.reports: dict[str, Any] = {}
        self.batches = 0

    def add(self, reports: Mapping[str, Any], removed_ids: Sequence[int] | np.ndarray = ()
            ) -> None:
        for algorithm, report in reports.items():
            self._moved.setdefault(algorithm, []).append(
                np.asarray(report.moved_ids, dtype=np.int64))
            self.reports[algorithm] = report
        removed = np.asarray(removed_ids, dtype=np.int64)
        if removed.size:
            self._removed.append(removed)
        self.batches += 1

    def __bool__(self) -> bool:
        return bool(self.reports)

    def take(self) -> tuple[dict[str, Any], dict[str, np.ndarray], list[int]]:
        """(latest report per algorithm, distinct moved ids per algorithm, removed ids)."""
        moved = {alg: np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
                 for alg, parts in self._moved.items()}
        removed = (np.unique(np.concatenate(self._removed)).tolist()
                   if self._removed else [])
        reports = self.reports
        self._moved, self._removed, self.reports, self.batches = {}, [], {}, 0
        return reports, moved, removed


@dataclass(frozen=True)
class Publication:
    """A prepared publication: the commands of its MULTI and what they publish."""

    commands: list[tuple[Any, ...]]
    summary: list[Published]


class ScorePublisher:
    """Writes engine reports to Redis (see the module docstring)."""

    def __init__(self, client: redis.Redis, keys: Keys, *, damping: float,
                 tolerance: float, publish_threshold: float, bulk: bool = True) -> None:
        self.client = client
        self.bulk = bulk
        self.keys = keys
        self.damping = damping
        self.tolerance = tolerance
        self.publish_threshold = publish_threshold

    def prepare(self, ranks: Any, pending: PendingScores, *, version: int,
                offsets: Mapping[str, int]) -> Publication:
        """Build the publication of everything ``pending`` holds (no I/O); empties it.

        Scores are the engines' CURRENT ``y`` of the pending pages, with the meta of
        the latest refresh. Must run on the thread that applies batches, between two
        of them; :meth:`send` may then run on another thread.
        """
        graph = ranks.graph
        live = graph.live_mask()
        pages = int(live.sum())
        now = iso_now()
        reports, moved, removed_ids = pending.take()
        commands: list[tuple[Any, ...]] = []
        summary: list[Published] = []
        for algorithm, report in reports.items():
            ids = moved[algorithm]
            scores = np.asarray(ranks.scores(algorithm))
            values = scores[ids] if ids.size else np.zeros(0)
            cmds, written, removed = score_commands(
                self.keys, algorithm, ids, values, live, graph.key_of, removed_ids,
                bulk=self.bulk)
            commands.extend(cmds)
            bound = float(report.bound) + publication_drift(
                ranks, algorithm, live, self.publish_threshold)
            total = float(report.total)
            fresh = is_fresh(report.fresh, bound, self.tolerance, total)
            fields = meta_fields(
                total=total, bound=bound, tolerance=self.tolerance, fresh=fresh,
                version=version, refreshed_at=now, offsets=offsets, damping=self.damping,
                pages=pages, mode=str(report.mode), engine_bound=float(report.bound))
            commands.append(("HSET", self.keys.meta(algorithm),
                             *[x for kv in fields.items() for x in kv]))
            summary.append(Published(algorithm, written, removed, bound, total, fresh, now))
        return Publication(commands, summary)

    def send(self, publication: Publication, *, fence: Any | None = None) -> list[Published]:
        """One fenced MULTI/EXEC with the whole publication (idempotent to repeat).

        Connection errors propagate for the caller's retry loop.
        """
        with contextlib.ExitStack() as stack:
            if fence is not None:
                stack.enter_context(fence.fenced())
            pipe = stack.enter_context(self.client.pipeline(transaction=True))
            if fence is not None:
                fence.check_in(pipe)
                pipe.multi()
            for cmd in publication.commands:
                pipe.execute_command(*cmd)
            pipe.execute()
        return publication.summary
