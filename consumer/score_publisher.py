"""Publishing live scores: ``P scores:{alg}`` (ZSET) and ``P meta:{alg}`` (HASH).

Readers must never see scores of one refresh with the meta of another, so every
publication becomes visible in ONE atomic, fenced step that also writes the meta.
It is double-buffered, because of what the streams look like:

* On a growing graph (an initial crawl) nearly every page's ``y`` moves by more
  than the tolerance allows to leave unwritten at every refresh (each new page
  shifts ``||y||_1`` by about 1, while the whole error budget is
  ``tolerance * sum(y)``, about 1e-6 per page). A publication then rewrites the
  whole ZSET: ~3.7 us of Redis CPU per member on our 2-core box (measured, AOF
  on; about the same in place or not). A single EXEC doing that held Redis for
  seconds and every graph transaction queued behind it.
* So the scores are written into a back buffer ``P scores:{alg}:next:{owner}``
  (private to this consumer process: ``owner`` comes from its lease token) in
  chunks of :data:`CHUNK_MEMBERS` members (~20 ms of Redis each) that graph
  transactions interleave with, and the publication is then made visible by
  renaming the buffers (O(1)) in the same atomic step as the meta. The old ZSET
  becomes the next back buffer, so a publication only rewrites the members that
  differ from it: on a stream of local edits, few. Memory: two ZSETs per algorithm.
* The chunks are plain ZADD/ZREM commands built as bytes by numpy
  (:mod:`consumer.score_wire`) and pipelined in ONE round trip: the thread that
  sends them gets few GIL turns while the engines run. They need no fencing,
  since no other process uses that back buffer: a stalled consumer that lost its
  lease can only write into its own, which expires (:data:`BACK_TTL_MS` after its
  last write) and is never made visible, because the swap (:mod:`consumer.score_swap`)
  is fenced (a script that checks the lease first, or WATCH with ``--plain-writes``)
  and checks that each buffer holds exactly the members recorded (ZCARD) before
  renaming anything.
* The swap runs at most once: it is skipped when meta already names its
  ``publication`` id (an earlier attempt committed and only the reply was lost), and
  a repeated publication then sends no chunk either, since the buffer they were
  meant for is now the live ZSET.

What is written into the back buffer (:func:`consumer.score_plan.plan_writes`):
every live page missing from it, a ZREM of every member that is no longer live,
and the members whose value differs from ``y`` by more than ``publish_threshold``,
largest difference first, until the unwritten rest fits the budget
``min(budget_fraction * tolerance * total, tolerance * total - engine bound)``
(smaller differences too, largest first, when they alone exceed it),
and at most ``max_updates`` per algorithm (setting ``publish_max_updates``); members
go in ascending score order, and a plan that would write more than a third of a
large ZSET drops the back buffer and refills it instead, which costs Redis about a
quarter as much per member (:data:`consumer.score_plan.REBUILD_SHARE`). The cap
is what keeps the event-to-score latency low on a growing graph: there every page
moves by more than the budget allows at every refresh (the graph grows by a few
percent between publications during an initial crawl), so an uncapped publication
is a full rewrite, seconds of Redis on a 1M-page graph. A capped one writes the new
pages and the largest moves; the published ``bound`` says exactly how far the rest
lags, ``fresh`` is 0 while it exceeds the tolerance, and the following publications
(and an idle consumer's refreshes) write the rest, largest first.

``bound`` in meta certifies the vector readers actually see: the engine's
certified ``||y_exact - y||_1`` plus ``||y - zset||_1``, computed exactly from our
record of what the ZSET holds. So for the ZSET as published,
``sum |zset - y_exact| <= bound`` (a missing member counts as 0).

The tolerance is RELATIVE, as in :mod:`ranker.residual`: fresh means
``bound <= tolerance * total`` (``total = sum(y)``). ``fresh`` is published as 1
only when the engine says so AND the published bound is within it: an
unconverged vector is never advertised as converged.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from typing import Any, AnyStr

import numpy as np
import redis

from consumer.keys import ALGORITHMS, Keys
from consumer.publication import (
    Chunk,
    Command,
    Publication,
    Published,
    is_fresh,
    meta_fields,
    names_publication,
)
from consumer.redis_store import redis_errors
from consumer.resp import command, send_commands, transient_refusal
from consumer.score_plan import ZsetRecord, plan_writes
from consumer.score_swap import BACK_TTL_MS, send_swap, swap_commands
from consumer.score_wire import UrlTable, zadd_command, zrem_command
from consumer.stats import iso_now
from rankstream.errors import ServiceError, ServiceUnavailable

CHUNK_MEMBERS = 5_000  # members per back-buffer command (~20 ms of Redis)
BUDGET_FRACTION = 0.5  # share of the tolerance that unwritten moves may use

class ScorePublisher:
    """Turns engine state into publications and writes them (see the module docstring).

    :meth:`prepare` runs on the thread that applies batches, between two of them
    and never while a publication is being sent; :meth:`send` may then run on
    another thread.
    """

    def __init__(self, client: redis.Redis, keys: Keys, *, damping: float,
                 tolerance: float, publish_threshold: float, owner: str = "0",
                 scripts: bool = True, chunk_members: int = CHUNK_MEMBERS,
                 budget_fraction: float = BUDGET_FRACTION,
                 max_updates: int | None = None) -> None:
        self.client = client
        self.keys = keys
        self.damping = damping
        self.tolerance = tolerance
        self.publish_threshold = publish_threshold
        self.owner = owner
        self.scripts = scripts
        self.chunk_members = max(int(chunk_members), 1)
        self.budget_fraction = budget_fraction
        self.max_updates = max_updates
        self.urls = UrlTable()
        self._live: dict[str, ZsetRecord] = {}
        self._back: dict[str, ZsetRecord] = {}
        self._live_known: dict[str, bool] = {}
        self._back_dropped: dict[str, bool] = {}
        self._published_ids: dict[str, str] = {}  # our last swap's id, per algorithm
        # The publication each known live ZSET record comes from (ours, or the one
        # adopted at start): meta must still name it when we swap (consumer.score_swap).
        self._record_ids: dict[str, str] = {}

    def back_key(self, algorithm: str) -> str:
        """This consumer's back buffer (internal; readers never read it)."""
        return f"{self.keys.scores(algorithm)}:next:{self.owner}"

    def renew_back_buffers(self) -> None:
        """Push back the expiry of this consumer's back buffers: only publications wrote
        them, so 15 idle minutes expired them and the next swap rewrote every page."""
        with redis_errors("renewing the score back buffers"):
            pipe = self.client.pipeline(transaction=False)
            for algorithm in self._back:
                pipe.pexpire(self.back_key(algorithm), BACK_TTL_MS)
            pipe.execute()

    def reset(self) -> None:
        """Forget what the ZSETs hold (start, rebuild, or a refused swap).

        The next publication drops the back buffer, writes every live page into it
        and REPLACES the live ZSET with it, which also clears members a crash may
        have left behind.
        """
        self.urls = UrlTable()
        self._live, self._back, self._live_known, self._back_dropped = {}, {}, {}, {}
        self._published_ids, self._record_ids = {}, {}

    def live_record(self, algorithm: str) -> tuple[str, np.ndarray] | None:
        """``(publication id, scores by page id)`` of the live ZSET as our last swap
        left it (NaN = absent), or None if we have not published it ourselves."""
        live = self._live.get(algorithm)
        publication = self._published_ids.get(algorithm)
        if live is None or publication is None or not self._live_known.get(algorithm):
            return None
        return publication, np.where(live.present, live.values, np.nan)

    def adopt(self, algorithm: str, values: np.ndarray, publication: str) -> None:
        """Record what the live ZSET of ``algorithm`` holds, as just read from Redis
        (by page id; NaN = absent: a live page's published score can be 0) under the
        lease, with ``publication``, the id its meta named then ("" if none).

        After a restart this saves one full rewrite: the first publication still
        fills an empty back buffer, but the live ZSET it replaces becomes a known
        back buffer, so the second one writes only differences. If the record is
        wrong (a member we have no id for), the swap's ZCARD check refuses it and
        the publisher starts over from scratch (:meth:`reset`).
        """
        values = np.asarray(values, dtype=np.float64)
        present = ~np.isnan(values)
        self._live[algorithm] = ZsetRecord(np.where(present, values, 0.0), present)
        self._live_known[algorithm] = True
        self._published_ids.pop(algorithm, None)
        self._record_ids[algorithm] = publication

    def adopt_live(self, published: Mapping[str, np.ndarray]) -> None:
        """At start, under the lease: :meth:`adopt` the live ZSETs as just read
        (``published``, by algorithm) with the publication their meta names, and
        :meth:`seed_back_buffer` from each. Repeatable."""
        self.reset()
        with redis_errors("adopting the published scores"):
            self._drop_buffers(foreign=True)
            for algorithm, values in published.items():
                named: Any = self.client.hget(self.keys.meta(algorithm), "publication")
                # Foreign bytes name no publication of ours: a full replacement follows.
                self.adopt(algorithm, values,
                           named.decode("utf-8", "replace") if named is not None else "")
                self.seed_back_buffer(algorithm)

    def release(self) -> None:
        """Drop our back buffers (a clean stop): each is a full copy of a ZSET."""
        with redis_errors("dropping the score back buffers"):
            self._drop_buffers(foreign=False)

    def _drop_buffers(self, *, foreign: bool) -> None:
        """UNLINK the registered back buffers of other consumers (``foreign``: at
        start; they died or were fenced, and their TTL would keep each, a full copy
        of a ZSET, for up to 15 minutes after every restart) or our own."""
        registry = self.keys.score_buffers
        if foreign:
            names: Any = self.client.smembers(registry)
            mine = {self.back_key(a).encode() for a in ALGORITHMS}
            drop = [name for name in names if name not in mine]
        else:
            drop = [self.back_key(a).encode() for a in ALGORITHMS]
        if drop:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.unlink(*drop, *map(filled_marker, drop))
                pipe.srem(registry, *drop)
                pipe.execute()

    def seed_back_buffer(self, algorithm: str) -> None:
        """Copy the adopted live ZSET into our back buffer, inside Redis (COPY).

        Without it the first publication after a restart rewrites every member into
        an empty back buffer: on a 1.4M-page graph 2.8M members and 15 s before the
        consumer could start. A COPY takes about a second of Redis, and the first
        publication then writes only what moved. The back buffer is private to this
        process, so this needs no fence; if the adopted record is wrong, the swap's
        ZCARD check refuses it and we start over (:meth:`reset`). No-op unless
        :meth:`adopt` was called for ``algorithm``.
        """
        live = self._live.get(algorithm)
        if live is None or not self._live_known.get(algorithm, False) or not live.members():
            return
        back_key = self.back_key(algorithm)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.copy(self.keys.scores(algorithm), back_key, replace=True)
            pipe.pexpire(back_key, BACK_TTL_MS)
            pipe.sadd(self.keys.score_buffers, back_key)
            copied, *_ = pipe.execute()
        if copied:
            self._back[algorithm] = ZsetRecord(live.values.copy(), live.present.copy())
            self._back_dropped[algorithm] = True

    def prepare(self, ranks: Any, reports: Mapping[str, Any], *, version: int,
                offsets: Mapping[str, int], capped: bool = True,
                live: np.ndarray | None = None) -> Publication:
        """Build the publication of the engines' current ``y`` (no I/O).

        ``capped``: at most ``max_updates`` value updates per algorithm (the largest
        moves); False writes every move the budget does not cover. ``live``: the live
        flags of the ids to publish (default: the graph's now); ids beyond it (interned
        by a batch not absorbed yet) are left out.

        Updates the record of the back buffer as if the chunks were written: if they
        are not (the lease was lost), the caller must :meth:`reset`.
        """
        graph = ranks.graph
        if live is None:
            live = graph.live_mask()
        n = live.size
        self.urls.sync(graph.key_of, n)
        pages = int(live.sum())
        now = iso_now()
        publication_id = uuid.uuid4().hex[:16]
        chunks: list[Chunk] = []
        renames: list[Command] = []
        metas: list[Command] = []
        checks: list[tuple[str, int]] = []
        meta_checks: list[tuple[str, str]] = []
        summary: list[Published] = []
        swapped: dict[str, bool] = {}
        size = self.chunk_members
        for algorithm, report in reports.items():  # before any record changes
            _check_finite(algorithm, np.asarray(ranks.scores(algorithm))[:n], live,
                          float(report.bound))
        for algorithm, report in reports.items():
            key, back_key = self.keys.scores(algorithm), self.back_key(algorithm)
            if not self._back_dropped.get(algorithm, False):
                chunks.append(Chunk("UNLINK", back_key))
                self._back_dropped[algorithm] = True
                self._back[algorithm] = ZsetRecord()
            back = self._back[algorithm]
            y = np.asarray(ranks.scores(algorithm))[:n]
            # sum(y) over exactly the pages published: the bound is relative to it.
            # (The engine's total covers the same pages, those of the last absorb.)
            total = float(np.sum(y, where=live))
            allowed = self.tolerance * total
            budget = max(0.0, min(self.budget_fraction * allowed, allowed - float(report.bound)))
            plan = plan_writes(y, live, back, threshold=self.publish_threshold,
                               budget=budget * (1.0 - 1e-9),
                               max_updates=self.max_updates if capped else None)
            if plan.rebuild:
                chunks.append(Chunk("UNLINK", back_key))
            for start in range(0, plan.remove_ids.size, size):
                chunks.append(Chunk("ZREM", back_key, plan.remove_ids[start:start + size]))
            for start in range(0, plan.add_ids.size, size):
                chunks.append(Chunk("ZADD", back_key, plan.add_ids[start:start + size],
                                    plan.add_values[start:start + size]))
            # Written after the chunks on the same connection, so a Redis that holds the
            # marker holds every chunk before it: one restored from a copy (a failover)
            # taken before they landed had the right member count, and the swap made an
            # older vector live under this publication's bound and fresh flag (a review).
            marker = filled_marker(back_key)
            chunks.append(Chunk("MARK", marker))
            meta_checks.append((marker, publication_id))
            checks.append((back_key, back.members()))
            live_known = self._live_known.get(algorithm, False)
            if live_known:
                checks.append((key, self._live[algorithm].members()))
                if self._record_ids.get(algorithm):
                    meta_checks.append((self.keys.meta(algorithm), self._record_ids[algorithm]))
            renames.extend(swap_commands(
                key, back_key, live_known=live_known, back_exists=back.members() > 0,
                live_exists=self._live.get(algorithm, ZsetRecord()).members() > 0))
            renames.append(("SADD", self.keys.score_buffers, back_key))
            swapped[algorithm] = live_known
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
        return Publication(publication_id, chunks, renames + metas, checks, meta_checks,
                           summary, self.urls.view(), swapped, first_meta, dict(reports))

    def finish(self, publication: Publication) -> None:
        """After the swap committed: the records trade places like the keys did."""
        for algorithm, swapped in publication.swapped.items():
            back = self._back[algorithm]
            if swapped:
                self._back[algorithm] = self._live[algorithm]
            else:
                # The unknown live ZSET was dropped; the back buffer is a COPY of the
                # new live one (empty if that is empty).
                self._back[algorithm] = ZsetRecord(back.values.copy(), back.present.copy())
            self._live[algorithm] = back
            self._live_known[algorithm] = True
            self._published_ids[algorithm] = publication.publication_id
            self._record_ids[algorithm] = publication.publication_id

    # -- I/O ---------------------------------------------------------------------------
    def chunk_payloads(self, publication: Publication) -> list[bytes]:
        """Every chunk as RESP bytes, each ZADD/ZREM followed by a PEXPIRE of its key
        (a back buffer never outlives its last write by more than the TTL)."""
        out: list[bytes] = []
        for chunk in publication.chunks:
            if chunk.op == "UNLINK":
                out.append(command("UNLINK", chunk.key))
                continue
            if chunk.op == "MARK":
                out.append(command("HSET", chunk.key, "publication", publication.publication_id))
                out.append(command("PEXPIRE", chunk.key, BACK_TTL_MS))
                continue
            if chunk.op == "ZADD":
                out.append(zadd_command(chunk.key, chunk.ids, chunk.values, publication.urls))
            else:
                out.append(zrem_command(chunk.key, chunk.ids, publication.urls))
            out.append(command("PEXPIRE", chunk.key, BACK_TTL_MS))
        return out

    def send_chunks(self, publication: Publication) -> None:
        """All chunks in one pipelined round trip (idempotent to repeat before the swap)."""
        if not publication.chunks:
            return
        replies = send_commands(self.client, self.chunk_payloads(publication))
        failures = [r for r in replies if isinstance(r, Exception)]
        refused = [f for f in failures if transient_refusal(f)]
        if refused:
            # Out of memory, a read-only replica...: retried like every other write
            # (the chunks are idempotent); it stopped the consumer, the swap's and the
            # graph's own refusals being retried.
            raise ServiceUnavailable(f"score publication chunk refused by Redis for now: "
                                     f"{refused[0]}")
        if failures:
            raise ServiceError(f"score publication chunk failed in Redis: {failures[0]}")

    def swapped_already(self, publication: Publication) -> bool:
        """True if meta names ``publication``: its swap committed."""
        done: Any = self.client.hget(publication.meta_key, "publication")
        return names_publication(done, publication.publication_id)

    def send_swap(self, publication: Publication, *, fence: Any | None = None) -> bool:
        """Make the publication visible (:func:`consumer.score_swap.send_swap`). If the
        swap was refused, nothing was written and the records are reset: False, and
        the caller publishes again, as a full replacement."""
        if send_swap(self.client, publication, scripts=self.scripts, fence=fence):
            return True
        self.reset()
        return False

    def send(self, publication: Publication, *, fence: Any | None = None) -> bool:
        """Chunks, swap, :meth:`finish`: the whole publication; repeatable after any
        error. False if the swap was refused (the records are reset: publish again)."""
        publication.attempts += 1
        with redis_errors("publishing scores"):
            if publication.attempts > 1 and self.swapped_already(publication):
                self.finish(publication)  # the last attempt committed; its reply was lost
                return True
            self.send_chunks(publication)
            if not self.send_swap(publication, fence=fence):
                return False
            self.finish(publication)
        return True


def filled_marker(back_key: AnyStr) -> AnyStr:
    """``{back buffer}:filled``: a hash naming the publication whose chunks all landed
    (bytes for the names read back from ``P scores:buffers``, which need not be UTF-8)."""
    if isinstance(back_key, bytes):
        return back_key + b":filled"
    return back_key + ":filled"


def _check_finite(algorithm: str, y: np.ndarray, live: np.ndarray, bound: float) -> None:
    """The last gate before Redis: a NaN or inf score (an engine bug) made meta say
    total "nan" or "inf", which every reader then refused, or crashed the consumer
    with a traceback when it reached a new page's member."""
    with np.errstate(over="ignore"):  # finite scores can still sum to inf
        total = float(np.sum(y, where=live))
    if not (math.isfinite(bound) and np.isfinite(y[live]).all() and math.isfinite(total)):
        raise ServiceError(f"refusing to publish {algorithm}: its scores, their sum or "
                           f"its bound are not finite (bound {bound!r}); an engine bug, "
                           "please report it")
