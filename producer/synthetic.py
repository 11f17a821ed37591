"""A seeded, web-like stream of events for demos, tests and load (``produce --synthetic``).

The link structure comes from :func:`ranker.synthetic.copying_model_graph` (copying
model, power-law in-degrees, 20% of pages never crawled so they appear only as link
targets); this module only turns it into a crawl:

* most events are first crawls: a ``page`` event per crawled page, in a random crawl
  order, with its full link list;
* the rest (``edit_fraction``, 25% by default) happen to pages crawled earlier:
  re-crawls (``page`` events whose link list lost a few links and gained a few),
  ``link_added``, ``link_removed`` and ``page_removed``.

``ts`` increases by ``ts_step_ms`` per event from ``ts_start_ms``, so the stale rule
never fires on a synthetic stream. Same arguments, same stream, on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from producer.schema import DEFAULT_LIMITS, Event, Limits, make_event

__all__ = ["TEXT_VOCABULARY", "synthetic_event_dicts", "synthetic_events", "with_text"]

# Shares of the edit events (they sum to 1).
_EDIT_MIX = (("recrawl", 0.5), ("link_added", 0.22), ("link_removed", 0.2),
             ("page_removed", 0.08))
_UNCRAWLED = 0.2
DEFAULT_TS_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
# Words of with_text's vocabulary: w1 .. w4999.
TEXT_VOCABULARY = 5_000


def synthetic_event_dicts(
    count: int,
    *,
    seed: int = 0,
    links_per_page: float = 10.0,
    edit_fraction: float = 0.25,
    ts_start_ms: int = DEFAULT_TS_START_MS,
    ts_step_ms: int = 10,
) -> Iterator[dict[str, Any]]:
    """``count`` events as JSON-ready dicts (canonical URLs; cheap to encode or validate).

    Args:
        count: events to yield.
        seed: everything is determined by it.
        links_per_page: mean links of a crawled page.
        edit_fraction: share of events that are re-crawls and edits (0 gives a pure
            first-crawl stream of ``page`` events).
        ts_start_ms, ts_step_ms: the ``ts`` of event ``i`` is ``start + i * step``.
    """
    from ranker.synthetic import copying_model_graph, page_url

    if count <= 0:
        return
    if not 0.0 <= edit_fraction < 1.0:
        raise ValueError(f"edit_fraction must be in [0, 1), got {edit_fraction}")
    first_crawls = max(1, round(count * (1.0 - edit_fraction)))
    num_pages = max(2, round(first_crawls / (1.0 - _UNCRAWLED)) + 1)
    graph = copying_model_graph(num_pages, links_per_page, uncrawled=_UNCRAWLED, seed=seed)
    indptr = np.zeros(num_pages + 1, dtype=np.int64)
    np.cumsum(np.bincount(graph.src, minlength=num_pages), out=indptr[1:])
    targets = graph.dst  # src is sorted, so page p's links are targets[indptr[p]:indptr[p+1]]
    rng = np.random.default_rng(seed + 1)
    crawl_order = rng.permutation(np.flatnonzero(np.diff(indptr) > 0)).tolist()
    if not crawl_order:  # a graph too small to have links: crawl link-less pages
        crawl_order = list(range(num_pages))
    pick = random.Random(seed + 2)

    current: dict[int, list[int]] = {}  # link lists that differ from the graph's
    crawled: list[int] = []
    removed: set[int] = set()

    def links_of(page: int) -> list[int]:
        found = current.get(page)
        return found if found is not None else targets[indptr[page] : indptr[page + 1]].tolist()

    def popular_target() -> int:
        # The target of a random link: preferential attachment, as in the model.
        if targets.size == 0:
            return pick.randrange(num_pages)
        return int(targets[pick.randrange(targets.size)])

    def some_crawled_page() -> int | None:
        for _ in range(8):
            page = crawled[pick.randrange(len(crawled))]
            if page not in removed:
                return page
        return None

    kinds = [kind for kind, _ in _EDIT_MIX]
    weights = [weight for _, weight in _EDIT_MIX]
    next_crawl = 0
    for index in range(count):
        ts = ts_start_ms + index * ts_step_ms
        event: dict[str, Any] | None = None
        wants_edit = next_crawl >= len(crawl_order) or (
            len(crawled) >= 10 and pick.random() < edit_fraction
        )
        if wants_edit and crawled:
            kind = pick.choices(kinds, weights)[0]
            page = some_crawled_page()
            if page is not None:
                event = _edit(kind, page, links_of(page), current, removed, popular_target,
                              pick, page_url)
        if event is None:
            page = crawl_order[next_crawl % len(crawl_order)]
            next_crawl += 1
            crawled.append(page)
            removed.discard(page)
            event = {"type": "page", "url": page_url(page),
                     "links": [page_url(t) for t in links_of(page)]}
        event["ts"] = ts
        yield event


def _edit(
    kind: str,
    page: int,
    links: list[int],
    current: dict[int, list[int]],
    removed: set[int],
    popular_target: Any,
    pick: random.Random,
    page_url: Any,
) -> dict[str, Any] | None:
    """One edit event on a crawled page, updating the generator's view of it."""
    url = page_url(page)
    if kind == "recrawl":
        kept = [t for t in links if pick.random() >= 0.2]
        fresh = [popular_target() for _ in range(1 + pick.randrange(3))]
        new_links = list(dict.fromkeys(t for t in kept + fresh if t != page))
        current[page] = new_links
        return {"type": "page", "url": url, "links": [page_url(t) for t in new_links]}
    if kind == "link_added":
        target = popular_target()
        if target == page or target in links:
            return None
        current[page] = [*links, target]
        return {"type": "link_added", "src": url, "dst": page_url(target)}
    if kind == "link_removed":
        if not links:
            return None
        target = links[pick.randrange(len(links))]
        current[page] = [t for t in links if t != target]
        return {"type": "link_removed", "src": url, "dst": page_url(target)}
    removed.add(page)
    current[page] = []
    return {"type": "page_removed", "url": url}


def synthetic_events(
    count: int, *, limits: Limits = DEFAULT_LIMITS, **options: Any
) -> Iterator[Event]:
    """:func:`synthetic_event_dicts`, validated into events (same arguments)."""
    for data in synthetic_event_dicts(count, **options):
        yield make_event(data, limits)


def with_text(event: dict[str, Any], pick: random.Random) -> dict[str, Any]:
    """``event`` (a ``page`` event's dict) with a 4-word title and, on half its links,
    a 2-word anchor text, from a vocabulary of :data:`TEXT_VOCABULARY` words drawn
    with a power law (a few are very common): the HITS term index's load in
    ``bench pipeline --texts`` and the texted soak."""
    def words(n: int) -> str:
        return " ".join(f"w{int(TEXT_VOCABULARY ** pick.random())}" for _ in range(n))

    links = [{"url": link, "text": words(2)} if pick.random() < 0.5 else link
             for link in event["links"]]
    return {**event, "links": links, "title": words(4)}
