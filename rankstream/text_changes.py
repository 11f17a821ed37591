"""Which anchor texts a batch of events adds to or takes from the term index.

The term index (:mod:`consumer.text_index`) files a page under the terms of its title
and of the anchor text of the links *currently* pointing to it. Anchor text belongs to
a link: it arrives with the source's ``page`` event and lasts as long as that link
does. So every way a link can go takes its anchor with it:

* a ``page`` event replaces all of its source's anchors with its own (a link it no
  longer lists, or lists without text, loses its old text);
* ``link_removed`` drops the one link's anchor; ``link_added`` carries no text and
  leaves an existing link's anchor alone (the link was already there);
* ``page_removed`` of a page drops the anchors of its out-links and of every link
  into it (the graph deletes both).

:class:`AnchorChanges` follows a batch's applied events in order and ends with, per
source page, either the complete anchor set it has after the batch (``replaced``) or
the targets whose stored anchors are gone (``dropped``); the consumer's index script
(:data:`consumer.text_postings.POSTINGS_SCRIPT`) turns that into posting changes
against what Redis stored. Pure Python: no Redis here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["AnchorChanges", "TextChanges"]


@dataclass
class TextChanges:
    """A batch's anchor-text changes, per source page id (see the module docstring)."""

    replaced: dict[int, dict[int, str]] = field(default_factory=dict)
    """Source -> its anchors after the batch (target -> text), for every source whose
    stored anchors the batch replaced (a ``page`` event, or its removal: then ``{}``)."""
    dropped: dict[int, set[int]] = field(default_factory=dict)
    """Source -> targets whose stored anchor the batch removed, for sources not in
    ``replaced``. May name targets the source never had an anchor for (harmless)."""

    def __bool__(self) -> bool:
        return bool(self.replaced or self.dropped)


class AnchorChanges:
    """Collects :class:`TextChanges` while a batch's events are applied in order.

    ``stored_in_links(page)`` gives the sources linking to ``page`` in the graph as it
    was before the batch: a removal must drop their anchors too, and only the graph
    knows them (a superset is fine: dropping an anchor that is not there is a no-op).
    """

    def __init__(self, stored_in_links: Callable[[int], Iterable[int]]) -> None:
        self._stored_in_links = stored_in_links
        self._replaced: dict[int, dict[int, str]] = {}
        self._dropped: defaultdict[int, set[int]] = defaultdict(set)
        # target -> sources whose anchors set in this batch may point to it, so that a
        # removal finds them without scanning every replaced source.
        self._into: defaultdict[int, set[int]] = defaultdict(set)

    def page(self, source: int, anchors: dict[int, str]) -> None:
        """A ``page`` event of ``source`` with these anchors (target -> text)."""
        self._replaced[source] = dict(anchors)
        self._dropped.pop(source, None)
        for target in anchors:
            self._into[target].add(source)

    def unlink(self, source: int, target: int) -> None:
        """A ``link_removed`` of ``source -> target``."""
        replaced = self._replaced.get(source)
        if replaced is not None:
            replaced.pop(target, None)
        else:
            self._dropped[source].add(target)

    def remove_page(self, page: int) -> None:
        """A ``page_removed`` of ``page``: its out-links and in-links go."""
        self.page(page, {})
        for source in self._into.pop(page, ()):
            self._replaced[source].pop(page, None)
        for source in self._stored_in_links(page):
            self.unlink(source, page)

    def result(self) -> TextChanges:
        return TextChanges(
            replaced=self._replaced,
            dropped={source: targets for source, targets in self._dropped.items() if targets},
        )
