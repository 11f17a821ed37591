"""The reference for the term index: what a page should be filed under, and what Redis has.

A page is filed under a term while its current title, or the anchor text of a link
pointing to it now, contains the term. :class:`Model` replays events one at a time on
plain dicts (no batches, no ids, no Redis), so the consumer's path (EventApplier ->
TextChanges -> the script in Redis) can be checked against it however the events
were cut into batches, and whatever faults the consumer went through.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from consumer.text_index import tokenize
from producer.schema import (
    Event,
    LinkAddedEvent,
    LinkRemovedEvent,
    PageEvent,
    PageRemovedEvent,
)

Sources = Counter[tuple[str, str]]
"""(term, url) -> how many sources (the page's title, each anchor) give it the term."""


class Model:
    """The events replayed one at a time: current anchors and titles, by URL."""

    def __init__(self) -> None:
        self.out: dict[str, dict[str, str | None]] = {}
        # dst -> the sources linking to it now, so that a removal does not scan every
        # page's links (the soak replays millions of events into one model).
        self.into: dict[str, set[str]] = {}
        self.titles: dict[str, str] = {}
        self.last_ts: dict[str, int] = {}
        self.known: set[str] = set()  # URLs the graph has interned

    def apply(self, event: Event) -> None:
        if isinstance(event, PageEvent | PageRemovedEvent) and event.ts is not None:
            if event.ts < self.last_ts.get(event.url, event.ts):
                return  # the stale rule
            if isinstance(event, PageEvent) or event.url in self.known:
                self.last_ts[event.url] = event.ts  # (removing an unknown URL records none)
        if isinstance(event, PageEvent):
            self.known.update((event.url, *event.links))
            texts = dict(event.anchors)
            self._set_out(event.url, {dst: texts.get(dst) for dst in event.links
                                      if dst != event.url})
            if event.title is not None:
                self.titles[event.url] = event.title
        elif isinstance(event, LinkAddedEvent):
            if event.src != event.dst:
                self.known.update((event.src, event.dst))
                self.out.setdefault(event.src, {}).setdefault(event.dst, None)
                self.into.setdefault(event.dst, set()).add(event.src)
        elif isinstance(event, LinkRemovedEvent):
            self.out.get(event.src, {}).pop(event.dst, None)
            self.into.get(event.dst, set()).discard(event.src)
        elif isinstance(event, PageRemovedEvent):
            self._set_out(event.url, {})
            for source in self.into.pop(event.url, set()):
                self.out[source].pop(event.url, None)

    def _set_out(self, source: str, links: dict[str, str | None]) -> None:
        for dst in self.out.get(source, {}):
            self.into[dst].discard(source)
        self.out[source] = links
        for dst in links:
            self.into.setdefault(dst, set()).add(source)

    def sources(self) -> Sources:
        given: Sources = Counter()
        for page, title in self.titles.items():
            given.update((term, page) for term in tokenize(title))
        for links in self.out.values():
            for dst, text in links.items():
                if text:
                    given.update((term, dst) for term in tokenize(text))
        return given


def model_of(events: Iterable[Event]) -> Sources:
    model = Model()
    for event in events:
        model.apply(event)
    return model.sources()


def stored_sources(client: Any, prefix: str, key_of: Any = None) -> Sources:
    """The index as Redis holds it under ``prefix``: members plus their extra counts.

    URLs from ``key_of(id)`` if given (a :class:`ranker.LinkGraph`'s), else from
    ``P page:url``. Fails on a count left for a page not filed under its term, or
    left at 0 (the script deletes it).
    """
    if key_of is None:
        urls = {int(k): v.decode() for k, v in client.hgetall(f"{prefix}page:url").items()}
        key_of = urls.__getitem__
    found: Sources = Counter()
    head = f"{prefix}term:"
    for key in client.scan_iter(match=f"{head}*", count=1000):
        term = key.decode()[len(head):]
        extra = {int(k): int(v) for k, v in
                 client.hgetall(f"{prefix}termcount:{term}").items()}
        assert all(count > 0 for count in extra.values()), extra
        for member in client.smembers(key):
            page = int(member)
            found[(term, key_of(page))] = 1 + extra.pop(page, 0)
        assert not extra, f"counts of pages not filed under {term!r}: {extra}"
    return found
