"""Publishing live scores: ``P scores:{alg}`` (ZSET) and ``P meta:{alg}`` (HASH).

Readers must never see scores of one refresh with the meta of another, so every
publication becomes visible in ONE atomic step that also writes the meta. It is
double-buffered, because of what the streams look like:

* On a growing graph (an initial crawl) nearly every page's ``y`` moves by more
  than the tolerance allows to leave unwritten at every refresh (each new page
  shifts ``||y||_1`` by about 1, while the whole error budget is
  ``tolerance * sum(y)``, about 1e-6 per page). A publication then rewrites the
  whole ZSET, 4-6 us of Redis CPU per member on our 2-core box (measured; ZADD
  itself is ~3.5 of it, in place or not); a single EXEC doing that held Redis for
  seconds and every graph transaction queued behind it.
* So the scores are written into a private back buffer ``P scores:{alg}:next``
  in chunks of :data:`CHUNK_MEMBERS` members (~25 ms of Redis each) that graph
  transactions interleave with, and the publication is then made visible by
  renaming the buffers (O(1)) in the same atomic step as the meta. The old ZSET
  becomes the next back buffer, so a publication only rewrites the members that
  differ from it: on a stream of local edits, few. Memory: two ZSETs per algorithm.
* With the scripts (the default) every step checks the lease itself, so a whole
  publication is ONE pipelined round trip: the thread that sends it gets few GIL
  turns while the engines run, and a round trip per chunk made publications take
  several times their Redis time. The final step runs at most once (meta names
  its ``publication`` id; chunks after it are no-ops), so the whole publication
  may be repeated after any error. ``--plain-writes`` sends the same steps as
  WATCH-fenced MULTI/EXECs.

What is written into the back buffer: every live page missing from it, every
member that is no longer live (ZREM), and the members whose value differs from
``y`` by more than ``publish_threshold``, largest difference first, until the
unwritten rest fits the budget ``min(budget_fraction * tolerance * total,
tolerance * total - engine bound)``. On a stream of local edits that leaves most
small moves unwritten; on a growing graph almost nothing can wait.

``bound`` in meta certifies the vector readers actually see: the engine's
certified ``||y_exact - y||_1`` plus ``||y - zset||_1``, computed exactly from
our record of what the ZSET holds (:class:`ZsetRecord`). So for the ZSET as
published, ``sum |zset - y_exact| <= bound`` (a missing member counts as 0).

The tolerance is RELATIVE, as in :mod:`ranker.residual`: fresh means
``bound <= tolerance * total`` (``total = sum(y)``). ``fresh`` is published as 1
only when the engine says so AND the published bound is within it: an
unconverged vector is never advertised as converged.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from consumer.keys import Keys
from consumer.lock import LockLost
from consumer.stats import iso_now
from rankstream.errors import ServiceError

CHUNK_MEMBERS = 5_000  # members per back-buffer step (~25 ms of Redis)
BUDGET_FRACTION = 0.5  # share of the tolerance that unwritten moves may use
MEMBERS_PER_CALL = 2000  # members per plain ZADD/ZREM (the script also calls with <= 4000 args)

Command = tuple[Any, ...]

# ARGV: lease key, lease value, meta key, publication id, op ("ZADD", "ZREM" or
# "UNLINK"), key, member lengths (int32 LE), members concatenated, scores (float64 LE,
# ZADD only). The lease is checked first (fencing without WATCH, so a whole
# publication can be pipelined; an empty lease key means unfenced). If meta already
# names this publication its swap committed and the key is now another buffer:
# nothing is written (so the whole publication can be repeated). A NaN score skips
# its member, so a dense run of page ids travels as one slice of the URL table.
# Lengths instead of a separator: members may hold any byte. Redis passes Lua numbers
# to commands with 17 significant digits, so scores arrive as exact doubles.
ZSET_SCRIPT = r"""
if ARGV[1] ~= '' and redis.call('GET', ARGV[1]) ~= ARGV[2] then
  return redis.error_reply('LEASELOST the consumer lease changed')
end
if redis.call('HGET', ARGV[3], 'publication') == ARGV[4] then
  return 0
end
local op, key, lengths, members, scores = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
if op == 'UNLINK' then
  return redis.call('UNLINK', key)
end
local unpack_, sub, call = struct.unpack, string.sub, redis.call
local add = op == 'ZADD'
local args, m, pos, done = {}, 0, 1, 0
for i = 1, #lengths / 4 do
  local len = unpack_('<i4', lengths, 4 * i - 3)
  local member = sub(members, pos, pos + len - 1)
  pos = pos + len
  if add then
    local score = unpack_('<d', scores, 8 * i - 7)
    if score == score then
      args[m + 1] = score
      args[m + 2] = member
      m = m + 2
    end
  else
    args[m + 1] = member
    m = m + 1
  end
  if m >= 4000 then
    call(op, key, unpack(args, 1, m))
    done = done + m
    m = 0
  end
end
if m > 0 then
  call(op, key, unpack(args, 1, m))
  done = done + m
end
return done
"""

# The swap, atomically: lease check; "done" if meta already names this publication
# (an earlier attempt committed); "mismatch" without writing anything if a score key
# is not as recorded; else run the commands (renames, then the meta hashes).
# ARGV: lease key, lease value, meta key, publication id, number of checks, then
# (key, expected EXISTS) per check, then each command as (argc, args...).
SWAP_SCRIPT = r"""
if ARGV[1] ~= '' and redis.call('GET', ARGV[1]) ~= ARGV[2] then
  return redis.error_reply('LEASELOST the consumer lease changed')
end
if redis.call('HGET', ARGV[3], 'publication') == ARGV[4] then
  return 'done'
end
local pos = 6
for i = 1, tonumber(ARGV[5]) do
  if redis.call('EXISTS', ARGV[pos]) ~= tonumber(ARGV[pos + 1]) then
    return 'mismatch'
  end
  pos = pos + 2
end
while pos <= #ARGV do
  local argc = tonumber(ARGV[pos])
  redis.call(unpack(ARGV, pos + 1, pos + argc))
  pos = pos + argc + 1
end
return 'ok'
"""


def is_fresh(report_fresh: bool, bound: float, tolerance: float, total: float) -> bool:
    """The published ``fresh`` flag: never 1 with a bound above the (relative) tolerance."""
    return (bool(report_fresh) and math.isfinite(bound) and math.isfinite(total)
            and bound <= tolerance * total)


def meta_fields(*, total: float, bound: float, tolerance: float, fresh: bool, version: int,
                refreshed_at: str, offsets: Mapping[str, int], damping: float, pages: int,
                mode: str, engine_bound: float | None = None, publication: str = ""
                ) -> dict[str, str]:
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
        "publication": publication,
    }


# -- what to write (pure) ------------------------------------------------------------

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

    def exists(self) -> bool:
        """Redis deletes an empty ZSET, so the key exists iff a member is present."""
        return bool(self.present.any())


@dataclass(frozen=True)
class WritePlan:
    """The changes that bring a ZSET record to ``y`` within the budget."""

    add_ids: np.ndarray  # sorted ids to ZADD (with add_values)
    add_values: np.ndarray
    remove_ids: np.ndarray  # sorted ids to ZREM
    unwritten: int  # live pages left with a stale value
    remainder: float  # ||y - zset||_1 over live pages once written


def plan_writes(y: np.ndarray, live: np.ndarray, record: ZsetRecord, *, threshold: float,
                budget: float) -> WritePlan:
    """What to write into ``record``'s ZSET so that it shows ``y`` (pure; see module doc).

    Live pages missing from the ZSET are always added and dead members always
    removed (membership is exact); value moves above ``threshold`` are written
    largest first until the unwritten ones fit ``budget``. Updates ``record``.
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
    if budget - dust > 0.0:
        cand_ids = np.flatnonzero(candidate)
        keep = unwritten_within(diff[cand_ids], budget - dust)
        add[cand_ids[keep]] = False
    add_ids = np.flatnonzero(add)
    remove_ids = np.flatnonzero(present & ~live)
    add_values = y[add_ids].astype(np.float64, copy=True)
    values[add_ids] = add_values
    present[add_ids] = True
    values[remove_ids] = 0.0
    present[remove_ids] = False
    remainder = float(np.abs(y[live] - values[live]).sum())
    unwritten = int(np.count_nonzero(live & (values != y)))
    return WritePlan(add_ids, add_values, remove_ids, unwritten, remainder)


# -- URLs as bytes ---------------------------------------------------------------------

class UrlTable:
    """Every page URL (UTF-8) in one byte buffer, by id, kept in step with the graph.

    Members of any id set are then gathered with numpy instead of one Python string
    per member; a dense run of ids is a single slice. Append-only: bytes already
    handed out in a :class:`UrlSlice` are never overwritten.
    """

    def __init__(self) -> None:
        self._buffer = np.zeros(1 << 16, dtype=np.uint8)
        self._size = 0
        self._offsets = np.zeros(1024, dtype=np.int64)
        self.count = 0

    def sync(self, key_of: Any, num_ids: int) -> None:
        """Append the URLs of ids ``count .. num_ids - 1`` (``key_of(id) -> str``)."""
        if num_ids <= self.count:
            return
        encoded = [key_of(pid).encode("utf-8") for pid in range(self.count, num_ids)]
        joined = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        if self._size + len(joined) > self._buffer.size:
            grown = np.zeros(max(self._size + len(joined), 2 * self._buffer.size), np.uint8)
            grown[: self._size] = self._buffer[: self._size]
            self._buffer = grown
        if num_ids + 1 > self._offsets.size:
            offsets = np.zeros(max(num_ids + 1, 2 * self._offsets.size), dtype=np.int64)
            offsets[: self.count + 1] = self._offsets[: self.count + 1]
            self._offsets = offsets
        self._buffer[self._size: self._size + len(joined)] = np.frombuffer(joined, np.uint8)
        self._offsets[self.count + 1: num_ids + 1] = self._size + np.cumsum(lengths)
        self._size += len(joined)
        self.count = num_ids

    def view(self) -> UrlSlice:
        """An immutable view of the table as of now."""
        return UrlSlice(self._buffer[: self._size], self._offsets[: self.count + 1])


@dataclass(frozen=True)
class UrlSlice:
    """The URL bytes of ids ``0 .. len(offsets) - 2``."""

    buffer: np.ndarray
    offsets: np.ndarray

    def members(self, ids: np.ndarray) -> tuple[bytes, bytes]:
        """(lengths as int32 LE, the members concatenated) of sorted ``ids``."""
        starts = self.offsets[ids]
        lengths = self.offsets[ids + 1] - starts
        if ids.size and int(ids[-1]) - int(ids[0]) + 1 == ids.size:  # one dense run
            blob = self.buffer[starts[0]: self.offsets[ids[-1] + 1]].tobytes()
        else:
            # Byte positions of every member: each run start, then +1 per byte.
            shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
            blob = self.buffer[shift + np.arange(shift.size)].tobytes()
        return lengths.astype("<i4").tobytes(), blob

    def urls(self, ids: np.ndarray) -> list[str]:
        off = self.offsets
        return [self.buffer[off[i]: off[i + 1]].tobytes().decode("utf-8") for i in ids.tolist()]


# -- publications ----------------------------------------------------------------------

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
    """One back-buffer transaction: ZADD or ZREM of some members (or UNLINK the key)."""

    op: str  # "ZADD", "ZREM" or "UNLINK"
    key: str
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    scores: np.ndarray | None = None  # ZADD: per id; NaN = skip the member


@dataclass
class Publication:
    """A prepared publication: back-buffer chunks, then the swap with the meta."""

    publication_id: str
    chunks: list[Chunk]
    swap: list[Command]  # renames, then every meta hash LAST
    summary: list[Published]
    urls: UrlSlice
    swapped: dict[str, bool]  # per algorithm: live and back records trade places
    meta_key: str  # where the swap's idempotency check reads publication_id
    reports: dict[str, Any]  # what it publishes (to publish again if the swap is refused)

    @property
    def members(self) -> int:
        return int(sum(c.ids.size for c in self.chunks))


def chunk_ids(ids: np.ndarray, values: np.ndarray, size: int
              ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Split sorted ``ids`` into groups of ``size``; a group whose ids are dense
    becomes the whole id range, NaN-padded (a slice of the URL table, no gather)."""
    for start in range(0, ids.size, size):
        part, vals = ids[start:start + size], values[start:start + size]
        first, last = int(part[0]), int(part[-1])
        span = last - first + 1
        if span <= 2 * part.size and span != part.size:
            scores = np.full(span, np.nan)
            scores[part - first] = vals
            yield np.arange(first, last + 1, dtype=np.int64), scores
        else:
            yield part.astype(np.int64), vals


class ScorePublisher:
    """Turns engine state into publications and writes them (see the module docstring).

    :meth:`prepare` runs on the thread that applies batches, between two of them
    and never while a publication is being sent; :meth:`send` (or its steps
    :meth:`send_pipelined` / :meth:`send_chunk` + :meth:`send_swap`, then
    :meth:`finish`) may then run on another thread.
    """

    def __init__(self, client: redis.Redis, keys: Keys, *, damping: float,
                 tolerance: float, publish_threshold: float, bulk: bool = True,
                 chunk_members: int = CHUNK_MEMBERS,
                 budget_fraction: float = BUDGET_FRACTION) -> None:
        self.client = client
        self.bulk = bulk
        self.keys = keys
        self.damping = damping
        self.tolerance = tolerance
        self.publish_threshold = publish_threshold
        self.chunk_members = max(int(chunk_members), 1)
        self.budget_fraction = budget_fraction
        self.urls = UrlTable()
        self._live: dict[str, ZsetRecord] = {}
        self._back: dict[str, ZsetRecord] = {}
        self._live_known: dict[str, bool] = {}
        self._back_dropped: dict[str, bool] = {}

    def back_key(self, algorithm: str) -> str:
        """The private back buffer (internal; readers never read it)."""
        return f"{self.keys.scores(algorithm)}:next"

    def reset(self) -> None:
        """Forget what the ZSETs hold (start, rebuild, or a failed swap).

        The next publication drops the back buffer, writes every live page into it
        and REPLACES the live ZSET with it, which also clears members a crash may
        have left behind.
        """
        self.urls = UrlTable()
        self._live, self._back, self._live_known, self._back_dropped = {}, {}, {}, {}

    def prepare(self, ranks: Any, reports: Mapping[str, Any], *, version: int,
                offsets: Mapping[str, int]) -> Publication:
        """Build the publication of the engines' current ``y`` (no I/O).

        Updates the record of the back buffer as if the chunks were written: if they
        are not (the lease was lost), the caller must :meth:`reset`.
        """
        graph = ranks.graph
        n = graph.num_ids
        self.urls.sync(graph.key_of, n)
        live = graph.live_mask()[:n]
        pages = int(live.sum())
        now = iso_now()
        publication_id = uuid.uuid4().hex[:16]
        chunks: list[Chunk] = []
        renames: list[Command] = []
        metas: list[Command] = []
        summary: list[Published] = []
        swapped: dict[str, bool] = {}
        for algorithm, report in reports.items():
            key, back_key = self.keys.scores(algorithm), self.back_key(algorithm)
            if not self._back_dropped.get(algorithm, False):
                chunks.append(Chunk("UNLINK", back_key))
                self._back_dropped[algorithm] = True
                self._back[algorithm] = ZsetRecord()
            back = self._back[algorithm]
            y = np.asarray(ranks.scores(algorithm))[:n]
            total = float(report.total)
            allowed = self.tolerance * total
            budget = max(0.0, min(self.budget_fraction * allowed, allowed - float(report.bound)))
            plan = plan_writes(y, live, back, threshold=self.publish_threshold,
                               budget=budget * (1.0 - 1e-9))
            if plan.remove_ids.size:
                for start in range(0, plan.remove_ids.size, self.chunk_members):
                    chunks.append(Chunk("ZREM", back_key,
                                        plan.remove_ids[start:start + self.chunk_members]))
            for ids, scores in chunk_ids(plan.add_ids, plan.add_values, self.chunk_members):
                chunks.append(Chunk("ZADD", back_key, ids, scores))
            renames.extend(self._swap_commands(algorithm, key, back_key, back))
            swapped[algorithm] = self._live_known.get(algorithm, False)
            bound = float(report.bound) + plan.remainder
            fresh = is_fresh(report.fresh, bound, self.tolerance, total)
            fields = meta_fields(
                total=total, bound=bound, tolerance=self.tolerance, fresh=fresh,
                version=version, refreshed_at=now, offsets=offsets, damping=self.damping,
                pages=pages, mode=str(report.mode), engine_bound=float(report.bound),
                publication=publication_id)
            metas.append(("HSET", self.keys.meta(algorithm),
                          *[x for kv in fields.items() for x in kv]))
            summary.append(Published(algorithm, int(plan.add_ids.size),
                                     int(plan.remove_ids.size), plan.unwritten, bound, total,
                                     fresh, now))
        first_meta = self.keys.meta(next(iter(reports))) if reports else ""
        return Publication(publication_id, chunks, renames + metas, summary, self.urls.view(),
                           swapped, first_meta, dict(reports))

    def _swap_commands(self, algorithm: str, key: str, back_key: str, back: ZsetRecord
                       ) -> list[Command]:
        """Make the back buffer the live ZSET (O(1) renames; no member is copied).

        If we know what the live ZSET holds it becomes the next back buffer;
        otherwise it is dropped (UNLINK frees it off the main thread) and the next
        publication starts the back buffer from empty.
        """
        back_exists = back.exists()
        if not self._live_known.get(algorithm, False):
            cmds: list[Command] = [("UNLINK", key)]
            if back_exists:
                cmds.append(("RENAME", back_key, key))
            return cmds
        live_exists = self._live.get(algorithm, ZsetRecord()).exists()
        spare = f"{back_key}:swap"
        if live_exists and back_exists:
            return [("RENAME", key, spare), ("RENAME", back_key, key), ("RENAME", spare, back_key)]
        if live_exists:
            return [("RENAME", key, back_key)]
        if back_exists:
            return [("RENAME", back_key, key)]
        return []

    def finish(self, publication: Publication) -> None:
        """After the swap committed: the records trade places like the keys did."""
        for algorithm, swapped in publication.swapped.items():
            back = self._back[algorithm]
            if swapped:
                self._back[algorithm] = self._live[algorithm]
            else:
                # The unknown live ZSET was dropped: the back buffer starts empty.
                self._back[algorithm] = ZsetRecord()
            self._live[algorithm] = back
            self._live_known[algorithm] = True

    # -- I/O ---------------------------------------------------------------------------
    def chunk_commands(self, chunk: Chunk, urls: UrlSlice, lease: tuple[str, bytes] = ("", b""),
                       guard: tuple[str, str] = ("", "")) -> list[Command]:
        """The commands of one chunk: one EVAL of :data:`ZSET_SCRIPT` (checking
        ``lease = (key, value)`` and ``guard = (meta key, publication id)``), or plain
        ones (the caller fences them with WATCH and checks the guard)."""
        if self.bulk:
            lengths, members = urls.members(chunk.ids) if chunk.ids.size else (b"", b"")
            args: list[Any] = ["EVAL", ZSET_SCRIPT, 0, *lease, *guard, chunk.op, chunk.key,
                               lengths, members]
            if chunk.op == "ZADD":
                assert chunk.scores is not None
                args.append(np.asarray(chunk.scores, dtype="<f8").tobytes())
            return [tuple(args)]
        if chunk.op == "UNLINK":
            return [("UNLINK", chunk.key)]
        ids, names = chunk.ids, None
        if chunk.op == "ZADD":
            assert chunk.scores is not None
            keep = ~np.isnan(chunk.scores)
            ids, values = ids[keep], chunk.scores[keep].tolist()
            names = urls.urls(ids)
            flat = [x for pair in zip(values, names, strict=True) for x in pair]
            step = 2 * MEMBERS_PER_CALL
            return [("ZADD", chunk.key, *flat[i:i + step]) for i in range(0, len(flat), step)]
        names = urls.urls(ids)
        return [("ZREM", chunk.key, *names[i:i + MEMBERS_PER_CALL])
                for i in range(0, len(names), MEMBERS_PER_CALL)]

    def _pipeline(self, stack: contextlib.ExitStack, fence: Any | None) -> Any:
        """A transaction pipeline, WATCHing the lease (and checking it) when fenced."""
        if fence is not None:
            stack.enter_context(fence.fenced())
        pipe = stack.enter_context(self.client.pipeline(transaction=True))
        if fence is not None:
            fence.check_in(pipe)
        return pipe

    def send_chunk(self, publication: Publication, chunk: Chunk, *,
                   fence: Any | None = None) -> None:
        """Write one chunk into the back buffer: one fenced MULTI (idempotent to repeat;
        nothing once the publication's swap committed)."""
        guard = (publication.meta_key, publication.publication_id)
        with contextlib.ExitStack() as stack:
            pipe = self._pipeline(stack, fence)
            pipe.watch(guard[0])
            done = pipe.hget(guard[0], "publication")
            if done is not None and done.decode() == guard[1]:
                return
            pipe.multi()
            for cmd in self.chunk_commands(chunk, publication.urls, _lease(fence), guard):
                pipe.execute_command(*cmd)
            replies: list[Any] = pipe.execute(raise_on_error=False)
        failures = [r for r in replies if isinstance(r, Exception)]
        if failures:
            raise ServiceError(f"score publication chunk failed in Redis: {failures[0]}")

    def send_swap(self, publication: Publication, *, fence: Any | None = None) -> bool:
        """Make the publication visible: renames and meta in one fenced MULTI.

        At most once: if ``publication`` in meta already names it, an earlier attempt
        committed (the connection broke after EXEC) and nothing is sent again. The
        score keys are WATCHed and checked to be as recorded, so a rename cannot fail
        inside EXEC (leaving meta and scores apart); if they are not as recorded
        (deleted behind our back) nothing is written, the records are reset and
        False is returned: the caller publishes again, as a full replacement.
        """
        with contextlib.ExitStack() as stack:
            pipe = self._pipeline(stack, fence)
            watched = [k for alg in publication.swapped
                       for k in (self.keys.scores(alg), self.back_key(alg))]
            pipe.watch(publication.meta_key, *watched)
            done = pipe.hget(publication.meta_key, "publication")
            if done is not None and done.decode() == publication.publication_id:
                return True
            for algorithm, live_known in publication.swapped.items():
                expected = [(self.back_key(algorithm), self._back[algorithm].exists())]
                if live_known:
                    expected.append((self.keys.scores(algorithm),
                                     self._live[algorithm].exists()))
                for key, exists in expected:
                    if bool(pipe.exists(key)) != exists:
                        self.reset()
                        return False
            pipe.multi()
            for cmd in publication.swap:
                pipe.execute_command(*cmd)
            replies: list[Any] = pipe.execute(raise_on_error=False)
        failures = [r for r in replies if isinstance(r, Exception)]
        if failures:
            raise ServiceError(f"score publication failed in Redis: {failures[0]}")
        return True

    def send_pipelined(self, publication: Publication, *, fence: Any | None = None) -> bool:
        """The whole publication in one pipeline, fenced inside the scripts.

        One round trip, no WATCH: a thread whose GIL turns are scarce (the engines
        run on the main thread) would otherwise spend most of a publication waiting
        between its many small transactions. Redis still runs other clients' graph
        transactions between the chunks. Chunks are idempotent and the swap runs at
        most once, so the whole call may simply be repeated. Raises
        :class:`~consumer.lock.LockLost` if the lease changed; returns False if the
        score keys were not as recorded (see :meth:`send_swap`).
        """
        lease = _lease(fence)
        checks: list[Any] = []
        for algorithm, live_known in publication.swapped.items():
            checks += [self.back_key(algorithm), int(self._back[algorithm].exists())]
            if live_known:
                checks += [self.keys.scores(algorithm), int(self._live[algorithm].exists())]
        body: list[Any] = []
        for cmd in publication.swap:
            body += [len(cmd), *cmd]
        guard = (publication.meta_key, publication.publication_id)
        with self.client.pipeline(transaction=False) as pipe:
            for chunk in publication.chunks:
                for cmd in self.chunk_commands(chunk, publication.urls, lease, guard):
                    pipe.execute_command(*cmd)
            pipe.execute_command("EVAL", SWAP_SCRIPT, 0, *lease, publication.meta_key,
                                 publication.publication_id, len(checks) // 2, *checks, *body)
            replies: list[Any] = pipe.execute(raise_on_error=False)
        failures = [r for r in replies if isinstance(r, Exception)]
        if any("LEASELOST" in str(r) for r in failures):
            if fence is not None:
                fence.lost.set()
            raise LockLost(f"lost the consumer lock {lease[0]}")
        if failures:
            raise ServiceError(f"score publication failed in Redis: {failures[0]}")
        if replies[-1] == b"mismatch":
            self.reset()
            return False
        return True

    def send(self, publication: Publication, *, fence: Any | None = None) -> bool:
        """Write the whole publication (pipelined with the scripts, step by step with
        plain commands) and :meth:`finish` it. Repeatable after any error; False if the
        swap was refused (the records are reset: publish again)."""
        if self.bulk:
            sent = self.send_pipelined(publication, fence=fence)
        else:
            for chunk in publication.chunks:
                self.send_chunk(publication, chunk, fence=fence)
            sent = self.send_swap(publication, fence=fence)
        if sent:
            self.finish(publication)
        return sent


def _lease(fence: Any | None) -> tuple[str, bytes]:
    """(lease key, our lease value) for the scripts' fencing; ("", b"") = unfenced."""
    return (fence.key, fence.value) if fence is not None else ("", b"")
