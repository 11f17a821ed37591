"""The consumer's in-memory mirror of the Redis graph, and how one batch is planned.

The mirror is a cache of what Redis holds: the :class:`ranker.LinkGraph` (inside
:class:`ranker.LiveRanks`), the :class:`rankstream.graph_updates.EventApplier`
with its last-ts record and crawled flags, the removed-page flags, the counters and
the offsets. It is built from Redis at start (:meth:`Mirror.load`; from a restart
snapshot instead when one still matches Redis, :mod:`consumer.snapshot`) and rebuilt
whenever it may disagree with Redis (another writer took the lease in between).
During normal operation it runs at most two batches ahead of Redis: the batch whose
transaction is in flight and the next one being planned meanwhile (the service
publishes scores only for committed batches).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import redis

from consumer.graph_write import GraphCounters, GraphWrite, plan_links
from consumer.keys import Keys, offset_field
from consumer.redis_store import (
    StoredState,
    check_layout,
    crawled_bitmap,
    load_published,
    load_stored,
)
from consumer.snapshot import read_identity, read_snapshot, unused_snapshot
from rankstream.errors import InputError
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer.mirror")


@dataclass
class PlannedBatch:
    """A batch ready to commit: the Redis write, and what to apply afterwards."""

    write: GraphWrite
    applied: Any  # rankstream.graph_updates.AppliedEvents
    partition_offsets: dict[int, int]
    removed_ids: np.ndarray
    revived_ids: np.ndarray
    messages: int
    dead_letters: int


@dataclass
class Mirror:
    """Graph, ranks, applier and bookkeeping, consistent with Redis between batches."""

    ranks: Any  # ranker.LiveRanks
    applier: Any  # rankstream.graph_updates.EventApplier
    removed_flag: np.ndarray
    counters: GraphCounters
    offsets: dict[int, int]  # partition -> next offset (committed in Redis)
    topic: str
    load_seconds: float = 0.0
    start_reports: dict[str, Any] = field(default_factory=dict)
    # Redis holds no page:crawled bitmap (data of a version before the orphan rule):
    # the next batch writes it whole.
    crawled_unwritten: bool = False
    # What the live score ZSETs held at load (by id, NaN = absent), so the publisher
    # need not rewrite them from scratch; empty when loaded with another warm start.
    published: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def graph(self) -> Any:
        return self.ranks.graph

    @property
    def absorbed_live(self) -> np.ndarray:
        """Live flags of the ids the engines have absorbed: what a publication covers.
        The next batch is planned (new URLs interned, removed pages revived) while the
        engines refresh, and none of that is committed yet."""
        return self.ranks.absorbed_live

    @classmethod
    def load(cls, client: redis.Redis, keys: Keys, settings: Settings,
             warm: Mapping[str, np.ndarray] | None = None,
             snapshot: Path | None = None) -> Mirror:
        """Rebuild everything from Redis and warm-start the engines.

        ``warm`` overrides the published vectors as the warm start (used after a
        recovery, when the in-memory vectors are at least as good). ``snapshot``: a
        restart snapshot file (:mod:`consumer.snapshot`) to read instead of the
        graph and the ZSETs, if it still matches what Redis holds.
        """
        from ranker.incremental import LiveRanks
        from rankstream.graph_updates import NO_TS, EventApplier

        started = time.perf_counter()
        check_layout(client, keys)  # at start, and at every rebuild after a recovery
        found = None
        if snapshot is not None and warm is None:
            found = read_snapshot(snapshot, read_identity(client, keys), settings.topic)
        stored: StoredState
        from_snapshot: dict[str, np.ndarray]
        graph = None
        if found is not None:
            stored, from_snapshot = found
            graph = _snapshot_graph(stored, snapshot)
            if graph is None:
                found = None
        if graph is None:
            stored, from_snapshot = load_stored(client, keys, settings.topic), {}
            graph = _stored_graph(stored)
        n = graph.num_ids
        # Room to grow before the first batch arrives, not during it (see reserve).
        graph.reserve(n + (n >> 1))
        last_ts = np.full(n, NO_TS, dtype=np.int64)
        if stored.last_ts:
            ids = np.fromiter(stored.last_ts.keys(), dtype=np.int64, count=len(stored.last_ts))
            stamps = np.fromiter(stored.last_ts.values(), dtype=np.int64,
                                 count=len(stored.last_ts))
            inside = (ids >= 0) & (ids < n)
            last_ts[ids[inside]] = stamps[inside]
        removed_flag = np.zeros(n, dtype=bool)
        removed_flag[stored.removed] = True
        crawled = stored.crawled
        if crawled is None:
            # Written by a version before the orphan rule: which targets were never
            # crawled is not known, so every live page counts as crawled (the rule then
            # removes only pages seen from now on).
            crawled = graph.live_mask()
        loaded = time.perf_counter()
        published: dict[str, np.ndarray] = {}
        if warm is not None:
            warm = {alg: np.asarray(vec[:n]) for alg, vec in warm.items()}
        elif found is not None:
            warm = published = {alg: vec[:n] for alg, vec in from_snapshot.items()}
        else:
            warm = published = load_published(client, keys, graph.id_of, n)
        ranks = LiveRanks(graph, damping=settings.damping, tolerance=settings.tolerance,
                          publish_threshold=settings.publish_threshold,
                          max_iter=settings.max_iter)
        # The first publication after a load replaces the ZSETs wholesale (see
        # consumer.score_publisher), which also drops members of pages removed by a
        # graph transaction whose publication a crash prevented.
        reports = ranks.cold_start(warm=dict(warm) if warm else None)
        counters = replace(stored.counters, ids=n, links=graph.num_links,
                           pages=graph.num_live)
        log.info("mirror loaded", extra={"fields": {
            "from": "redis" if found is None else f"snapshot {snapshot}",
            "pages": counters.pages, "links": counters.links, "ids": n,
            "version": counters.version, "load_seconds": round(loaded - started, 3),
            "warm": sorted(warm), "rank_seconds": round(time.perf_counter() - loaded, 3),
            "redis_read_seconds": round(stored.seconds, 3)}})
        return cls(ranks=ranks, applier=EventApplier(graph, last_ts, crawled),
                   removed_flag=removed_flag, counters=counters, offsets=dict(stored.offsets),
                   topic=settings.topic, load_seconds=time.perf_counter() - started,
                   start_reports=reports, published=published,
                   crawled_unwritten=stored.crawled is None)

    def stored_state(self) -> StoredState:
        """What Redis holds once every planned batch has committed (for snapshots)."""
        from rankstream.graph_updates import NO_TS

        graph = self.graph
        n = graph.num_ids
        src, dst = graph.edges()
        last_ts = self.applier.last_ts
        with_ts = np.flatnonzero(last_ts != NO_TS)
        return StoredState(
            urls=[graph.key_of(page) for page in range(n)],
            removed=np.flatnonzero(self.removed_flag[:n]).astype(np.int32),
            edge_src=src, edge_dst=dst,
            last_ts=dict(zip(with_ts.tolist(), last_ts[with_ts].tolist(), strict=True)),
            offsets=dict(self.offsets), counters=self.counters,
            crawled=None if self.crawled_unwritten else self.applier.crawled.copy())

    def plan(self, events: Sequence[Any], partition_offsets: Mapping[int, int],
             messages: int, dead_letters: int) -> PlannedBatch:
        """Interpret ``events`` (interning new URLs) and build the batch's Redis write.

        ``partition_offsets`` are the next offsets after this batch. Nothing but
        the applier's id interning and ts record changes here; if the write never
        commits, the mirror must be rebuilt (see the module docstring).
        """
        graph = self.graph
        ids_before = len(self.removed_flag)
        applied = self.applier.apply(events)
        planned = plan_links(graph, applied.batch)
        live = graph.live_mask()
        # intern() revives removed pages that events mention again.
        revived = np.flatnonzero(self.removed_flag[:ids_before] & live[:ids_before])
        counters = GraphCounters(
            version=self.counters.version + applied.applied,
            links=planned.links_after,
            pages=int(live.sum()) - int(planned.removed_ids.size),
            ids=graph.num_ids,
            stale_ignored=self.counters.stale_ignored + applied.stale_ignored,
            dlq=self.counters.dlq + dead_letters,
        )
        offsets = {offset_field(self.topic, p): off for p, off in partition_offsets.items()}
        write = GraphWrite(
            new_pages=applied.new_pages,
            removed_ids=planned.removed_ids.tolist(),
            revived_ids=revived.tolist(),
            delete_src=planned.delete_src,
            delete_dst=planned.delete_dst,
            insert_src=planned.insert_src,
            insert_dst=planned.insert_dst,
            ts_updates=applied.ts_updates,
            titles=applied.titles,
            anchors=applied.anchors,
            crawled_changes=applied.crawled_changes,
            crawled_bitmap=(crawled_bitmap(self.applier.crawled) if self.crawled_unwritten
                            else None),
            counters=counters,
            offsets=offsets,
        )
        return PlannedBatch(write, applied, dict(partition_offsets), planned.removed_ids,
                            revived, messages, dead_letters)

    def absorb_planned(self, batch: PlannedBatch) -> None:
        """Apply the batch to the graph and engines (while or after its EXEC runs): the
        graph, the engines' residuals, the counters and offsets all reflect the batch;
        ``y`` waits for a refresh (``ranks.refresh``).

        Once this returns, the next batch may be planned (:meth:`plan` only reads the
        graph and interns) while the engines refresh on another thread. If the batch's
        transaction then cannot commit (another consumer took the lease and wrote),
        the mirror no longer matches Redis: the caller rebuilds it.
        """
        n = self.graph.num_ids
        if n > len(self.removed_flag):
            self.removed_flag = np.concatenate(
                [self.removed_flag, np.zeros(n - len(self.removed_flag), dtype=bool)])
        self.removed_flag[batch.revived_ids] = False
        self.ranks.absorb(batch.applied.batch)
        self.removed_flag[batch.removed_ids] = True
        self.counters = batch.write.counters
        self.offsets.update(batch.partition_offsets)
        if batch.write.crawled_bitmap is not None:
            self.crawled_unwritten = False
        if self.graph.num_links != self.counters.links:
            log.error("link count of the mirror differs from the planned one", extra={
                "fields": {"mirror": int(self.graph.num_links), "planned": self.counters.links}})

    def offsets_fields(self) -> dict[str, int]:
        """``P offsets`` as published in meta (topic:partition -> next offset)."""
        return {offset_field(self.topic, p): off for p, off in sorted(self.offsets.items())}



def _stored_graph(stored: StoredState) -> Any:
    """The :class:`ranker.LinkGraph` of ``stored`` (its links, then its removed pages)."""
    from ranker import EdgeBatch, LinkGraph

    graph = LinkGraph.from_id_edges(stored.edge_src, stored.edge_dst, stored.urls)
    if stored.removed.size:
        graph.apply(EdgeBatch(removed_pages=stored.removed))
    return graph


def _snapshot_graph(stored: StoredState, path: Path | None) -> Any:
    """The graph of a snapshot's ``stored``, or None (logged) if it is not the graph
    its counters describe: self links, duplicates and links of removed pages leave
    fewer links (its ids, types and ranges are checked already, in read_snapshot)."""
    try:
        graph = _stored_graph(stored)
    except InputError as exc:
        why = f"its graph is not loadable: {exc}"
    else:
        if graph.num_links == stored.counters.links:
            return graph
        why = (f"its graph has {graph.num_links} distinct links between live pages, "
               f"the counters {stored.counters.links}")
    unused_snapshot(path, why)
    return None
