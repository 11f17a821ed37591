"""Events -> one net :class:`~ranker.EdgeBatch` against a :class:`~ranker.LinkGraph`.

The consumer and ``rankstream rank --events`` both turn validated events into graph
edits here, so the two can never disagree about what a log means.

Semantics (``docs/events.md`` is the user-facing statement of them):

* events are interpreted IN ORDER against a per-batch overlay holding the out-link
  sets of the pages the batch touches (loaded lazily from ``graph.out_links``);
* ``page`` replaces the page's out-link set; ``link_added`` / ``link_removed`` edit
  one link; ``page_removed`` empties the page's out-links and deletes every link
  into it;
* a page removed in the batch stays removed (``removed_pages``) unless a later event
  of the same batch revives it: a ``page`` event for it, or a ``link_added`` to or
  from it (matching :class:`~ranker.EdgeBatch`, where inserting a link revives);
* stale rule: a ``page`` or ``page_removed`` event whose ``ts`` is older than the
  last ``ts`` recorded for that URL (by either kind) is ignored and counted. Events
  without ``ts`` are applied and record nothing. Link events have no stale rule;
* self links are no-ops; ``link_removed`` / ``page_removed`` of unknown URLs are
  no-ops and intern nothing;
* orphan rule: a page counts as CRAWLED once a ``page`` event for it or a
  ``link_added`` from it is applied, until it is removed. A page never crawled is
  known only as a link target; one that has no in-link left at the end of the batch
  (nobody links to it any more) is removed too (``orphans``), as ``page_removed``
  would, but without recording a ``ts``. No crawler sends ``page_removed`` for a URL
  it never fetched, so without the rule every URL ever linked to would keep a score
  forever. A later link to it revives it, as after any removal. The outcome does
  not depend on how events are cut into batches: a page removed this way at the end
  of one batch is in exactly the state it would have been in had its last in-link
  gone in a later batch.

The overlay is finally diffed against the graph, so the batch holds only net
changes: a link added then removed within the batch appears nowhere. New URLs are
interned with ``graph.intern`` (dense ids, first-seen order: a page's own URL, then
its links in order). The graph's LINKS are not touched: the caller persists the
result, then applies ``result.batch`` with ``graph.apply`` / ``LiveRanks.apply``.
The applier does keep its own record of the last ``ts`` per page, updated by
:meth:`EventApplier.apply`.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np

from producer.schema import (
    Event,
    LinkAddedEvent,
    LinkRemovedEvent,
    PageEvent,
    PageRemovedEvent,
)
from ranker.edge_batches import EdgeBatch, sorted_unique
from ranker.linkgraph import LinkGraph
from rankstream.text_changes import AnchorChanges, TextChanges

__all__ = ["NO_TS", "AppliedEvents", "EventApplier"]

NO_TS = np.iinfo(np.int64).min
"""The ``last_ts`` entry of a page for which no ``ts`` has been recorded."""


@dataclass
class AppliedEvents:
    """What a batch of events means for the graph, ready to persist and apply."""

    batch: EdgeBatch
    new_pages: list[tuple[int, str]] = field(default_factory=list)
    """``(id, url)`` of every id interned by this batch, in id order."""
    ts_updates: dict[int, int] = field(default_factory=dict)
    """Page id -> the ``ts`` to record (epoch ms) from applied page/page_removed events."""
    titles: dict[int, str] = field(default_factory=dict)
    """Page id -> title of its last applied ``page`` event. A later ``page_removed`` does
    not take it back: Redis keeps the titles of removed pages (a revived page shows
    its last title again), so a batch writes what one-event batches would have."""
    anchors: TextChanges = field(default_factory=TextChanges)
    """The anchor texts the batch sets or drops (:mod:`rankstream.text_changes`)."""
    crawled_changes: dict[int, bool] = field(default_factory=dict)
    """Page id -> its new crawled flag, for pages whose flag this batch changed."""
    orphans: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    """Pages the orphan rule removes (also in ``batch.removed_pages``)."""
    applied: int = 0
    stale_ignored: int = 0


class _Overlay:
    """Out-links of the touched pages, each stamped with the event index that added it.

    A removal of page ``x`` at event ``i`` just records ``removed_at[x] = i``: every
    link into ``x`` stamped before ``i`` is dead from then on, wherever it lives. That
    keeps ``page_removed`` O(1) (no reverse index, no scan of the overlay); the stamps
    are checked once, in :meth:`final_links`. Links loaded from the graph get stamp -1.
    """

    def __init__(self, graph: LinkGraph) -> None:
        self.graph = graph
        self.first_new_id = graph.num_ids
        self.out: dict[int, dict[int, int]] = {}
        self.base: dict[int, set[int]] = {}  # graph.out_links at load time, for the diff
        self.removed_at: dict[int, int] = {}  # page -> event index of its last removal
        self.dead: set[int] = set()  # removed and not revived (so far)
        self._final: dict[int, AbstractSet[int]] | None = None

    def _graph_out(self, page: int) -> set[int]:
        known = self.base.get(page)
        if known is None:
            # Most pages of a crawl were known only as link targets: no out-links yet.
            empty = page >= self.first_new_id or not self.graph.out_degree(page)
            known = set() if empty else set(self.graph.out_links(page).tolist())
            self.base[page] = known
        return known

    def _load(self, page: int) -> dict[int, int]:
        links = self.out.get(page)
        if links is None:
            links = self.out[page] = dict.fromkeys(self._graph_out(page), -1)
        return links

    def replace(self, page: int, targets: list[int], when: int) -> None:
        self.out[page] = dict.fromkeys(targets, when)
        if self.dead:
            self.dead.discard(page)
            self.dead.difference_update(targets)

    def add(self, src: int, dst: int, when: int) -> None:
        self._load(src)[dst] = when
        if self.dead:
            self.dead.discard(src)
            self.dead.discard(dst)

    def discard(self, src: int, dst: int) -> None:
        self._load(src).pop(dst, None)

    def remove_page(self, page: int, when: int) -> None:
        self.out[page] = {}
        self.removed_at[page] = when
        self.dead.add(page)

    def final_links(self) -> dict[int, AbstractSet[int]]:
        """Each touched page's out-links at the end of the batch."""
        if self._final is None:
            removed_at = self.removed_at
            if not removed_at:  # no removal: the links as they stand (no copies)
                self._final = {page: links.keys() for page, links in self.out.items()}
                return self._final
            removed = removed_at.keys()
            final: dict[int, AbstractSet[int]] = {}
            for page, links in self.out.items():
                current = set(links)
                for target in links.keys() & removed:
                    if links[target] < removed_at[target]:
                        current.discard(target)
                final[page] = current
            self._final = final
        return self._final

    def diff(self) -> EdgeBatch:
        """Net insertions and deletions of the overlay against the graph."""
        ins_src: list[int] = []
        ins_dst: list[int] = []
        del_src: list[int] = []
        del_dst: list[int] = []
        final = self.final_links()
        for page, links in final.items():
            old = self._graph_out(page)
            if not old:  # a page crawled for the first time: every link is new
                ins_src.extend([page] * len(links))
                ins_dst.extend(links)
                continue
            added = links - old
            if added:
                ins_src.extend([page] * len(added))
                ins_dst.extend(added)
            gone = old - links
            if gone:
                del_src.extend([page] * len(gone))
                del_dst.extend(gone)
        # A page removed and revived in this batch lost its old in-links too; those
        # from pages outside the overlay are not covered by the diff above (inside a
        # removed page's removal covers them).
        for page in self.removed_at.keys() - self.dead:
            if page < self.first_new_id:
                for source in self.graph.in_links(page).tolist():
                    if source not in final:
                        del_src.append(source)
                        del_dst.append(page)
        return EdgeBatch(
            insert_src=np.asarray(ins_src, dtype=np.int32),
            insert_dst=np.asarray(ins_dst, dtype=np.int32),
            delete_src=np.asarray(del_src, dtype=np.int32),
            delete_dst=np.asarray(del_dst, dtype=np.int32),
            removed_pages=np.asarray(sorted(self.dead), dtype=np.int32),
        )


class EventApplier:
    """Interprets event batches against a graph; keeps each page's last ``ts`` and
    crawled flag."""

    def __init__(self, graph: LinkGraph, last_ts: np.ndarray | None = None,
                 crawled: np.ndarray | None = None) -> None:
        """``last_ts[id]`` is the recorded ts of page ``id`` (``NO_TS`` if none),
        ``crawled[id]`` its crawled flag (see the orphan rule). A page with out-links
        counts as crawled whatever ``crawled`` says (only a crawl gives a page
        out-links), so the default, for a graph built from an edge list, is: the
        pages with out-links (and those without any link)."""
        self.graph = graph
        n = graph.num_ids
        size = max(n, 1024, 0 if last_ts is None else len(last_ts),
                   0 if crawled is None else len(crawled))
        self._last_ts = np.full(size, NO_TS, dtype=np.int64)
        if last_ts is not None:
            self._last_ts[: len(last_ts)] = np.asarray(last_ts, dtype=np.int64)
        self._crawled = np.zeros(size, dtype=bool)
        if crawled is not None:
            self._crawled[: len(crawled)] = np.asarray(crawled, dtype=bool)
        # The orphan rule holds between batches (_orphans relies on it): a live page
        # without in-links that is not flagged was flagged by nobody (a self link's
        # source in an edge list, flags a version before the rule left stale), and
        # is kept as crawled rather than removed whenever a batch happens to name it.
        unlinked = graph.live_mask() & (graph.in_len[:n] == 0)
        self._crawled[:n] |= (graph.out_len[:n] > 0) | unlinked

    @property
    def last_ts(self) -> np.ndarray:
        """Recorded ts per page id (``NO_TS`` where none), length ``graph.num_ids``."""
        return self._last_ts[: self.graph.num_ids]

    @property
    def crawled(self) -> np.ndarray:
        """Crawled flag per page id (see the orphan rule), length ``graph.num_ids``."""
        self._grow(self.graph.num_ids)
        return self._crawled[: self.graph.num_ids]

    def last_ts_of(self, page_id: int) -> int | None:
        """The recorded ts of ``page_id``, or None."""
        if page_id >= len(self._last_ts):
            return None
        value = int(self._last_ts[page_id])
        return None if value == NO_TS else value

    def apply(self, events: Sequence[Event]) -> AppliedEvents:
        """One net edge batch for ``events`` (see the module docstring for the rules)."""
        graph = self.graph
        intern, intern_list = graph.intern, graph.intern_list
        overlay = _Overlay(graph)
        ts_updates: dict[int, int] = {}
        titles: dict[int, str] = {}
        first_new = overlay.first_new_id
        anchors = AnchorChanges(lambda page: graph.in_links(page).tolist()
                                if page < first_new else ())
        crawled: dict[int, bool] = {}  # flags set by this batch, the last one wins
        stale = 0

        def is_stale(page: int, ts: int) -> bool:
            last = ts_updates.get(page)
            if last is None:
                last = self.last_ts_of(page)
            return last is not None and ts < last

        for when, event in enumerate(events):
            if isinstance(event, PageEvent):
                if event.ts is not None:
                    known = graph.id_of(event.url)
                    if known is not None and is_stale(known, event.ts):
                        stale += 1
                        continue
                page = intern(event.url)
                targets = intern_list(event.links)
                overlay.replace(page, targets, when)
                crawled[page] = True
                if event.ts is not None:
                    ts_updates[page] = event.ts
                if event.title is not None:
                    titles[page] = event.title
                by_url = dict(zip(event.links, targets, strict=True)) if event.anchors else {}
                anchors.page(page, {by_url[url]: text for url, text in event.anchors
                                    if by_url[url] != page})
            elif isinstance(event, LinkAddedEvent):
                if event.src != event.dst:
                    src_id = intern(event.src)
                    overlay.add(src_id, intern(event.dst), when)
                    crawled[src_id] = True
            elif isinstance(event, LinkRemovedEvent):
                src, dst = graph.id_of(event.src), graph.id_of(event.dst)
                if src is not None and dst is not None and src != dst:
                    overlay.discard(src, dst)
                    anchors.unlink(src, dst)
            elif isinstance(event, PageRemovedEvent):
                page_or_none = graph.id_of(event.url)
                if page_or_none is None:
                    continue
                if event.ts is not None:
                    if is_stale(page_or_none, event.ts):
                        stale += 1
                        continue
                    ts_updates[page_or_none] = event.ts
                overlay.remove_page(page_or_none, when)
                anchors.remove_page(page_or_none)
                crawled[page_or_none] = False
            else:  # pragma: no cover - the schema admits no other type
                raise TypeError(f"not an event: {event!r}")

        batch = overlay.diff()
        self._grow(graph.num_ids)
        crawled_changes = {page: flag for page, flag in crawled.items()
                           if flag != self._crawled[page]}
        if crawled_changes:
            changed = np.fromiter(crawled_changes, dtype=np.int64, count=len(crawled_changes))
            self._crawled[changed] = np.fromiter(crawled_changes.values(), dtype=bool,
                                                 count=len(crawled_changes))
        orphans = self._orphans(batch, overlay)
        if orphans.size:
            batch.removed_pages = np.union1d(batch.removed_pages, orphans).astype(np.int32)
        self._record(ts_updates)
        return AppliedEvents(
            batch=batch,
            new_pages=[(page, graph.key_of(page)) for page in range(first_new, graph.num_ids)],
            ts_updates=ts_updates,
            titles=titles,
            anchors=anchors.result(),
            crawled_changes=crawled_changes,
            orphans=orphans,
            applied=len(events) - stale,
            stale_ignored=stale,
        )

    def _orphans(self, batch: EdgeBatch, overlay: _Overlay) -> np.ndarray:
        """The pages the orphan rule removes: live at the end of ``batch``, never
        crawled, and without an in-link.

        Only three kinds of page can end a batch that way, since none started it so
        (the rule held at the end of the last one): those that lost an in-link
        (``delete_dst``), those interned or revived by this batch
        (``graph.pending_live``), and those removed and revived in it (a crawled page
        becomes uncrawled only by its removal).
        """
        graph = self.graph
        candidates = sorted_unique(np.concatenate([
            batch.delete_dst, graph.pending_live(),
            np.fromiter(overlay.removed_at, dtype=np.int32, count=len(overlay.removed_at))]))
        if candidates.size == 0:
            return candidates
        candidates = candidates[~self._crawled[candidates]]  # this batch's flags included
        if overlay.dead:
            candidates = candidates[~np.isin(candidates, list(overlay.dead))]
        if candidates.size == 0:
            return candidates
        # The batch is net: each deletion removes a present link, each insertion adds one.
        in_degree = graph.in_len[candidates].astype(np.int64)
        in_degree -= _count_of(candidates, batch.delete_dst)
        in_degree += _count_of(candidates, batch.insert_dst)
        return candidates[in_degree <= 0].astype(np.int32)

    def _grow(self, needed: int) -> None:
        if needed > len(self._last_ts):
            size = max(needed, 2 * len(self._last_ts))
            grown = np.full(size, NO_TS, dtype=np.int64)
            grown[: len(self._last_ts)] = self._last_ts
            self._last_ts = grown
            flags = np.zeros(size, dtype=bool)
            flags[: len(self._crawled)] = self._crawled
            self._crawled = flags

    def _record(self, ts_updates: dict[int, int]) -> None:
        if not ts_updates:
            return  # (apply grew the arrays to the graph's ids first)
        pages = np.fromiter(ts_updates.keys(), dtype=np.int64, count=len(ts_updates))
        stamps = np.fromiter(ts_updates.values(), dtype=np.int64, count=len(ts_updates))
        self._last_ts[pages] = stamps


def _count_of(values: np.ndarray, items: np.ndarray) -> np.ndarray:
    """How often each of the sorted, unique ``values`` occurs in ``items``."""
    if items.size == 0:
        return np.zeros(values.size, dtype=np.int64)
    ordered = np.sort(items)
    return (np.searchsorted(ordered, values, side="right")
            - np.searchsorted(ordered, values, side="left")).astype(np.int64)
