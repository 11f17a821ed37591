"""Redis key names under the configurable prefix (the public layout of docs/redis-keys.md).

One place builds the graph's, the scores' and the service's keys so the consumer,
the readers and the tests cannot drift apart. The keys of one feature live with it:
the term index's (``term:``, :func:`consumer.text_index.term_key`; ``termcount:``,
:func:`consumer.text_postings.termcount_key`, and its Lua script, which builds both
from the prefix), the HITS cache's (:mod:`consumer.hits_query`) and the publication's
back buffers (:mod:`consumer.score_publisher`). Keys are ``str``; members and ids
are decimal strings in Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankstream.errors import ConfigError, ServiceError

ALGORITHMS: tuple[str, ...] = ("pagerank", "wpr")

# The version of this layout, kept in the ``layout`` field of ``P graph`` (written by
# every graph transaction). It goes up whenever a key or field changes meaning, and
# the consumer and the readers refuse data of any other version rather than misread
# it or write a mix of two layouts (:func:`consumer.redis_store.check_layout`). Data
# without the field is layout 1: it was written before the field existed.
LAYOUT_VERSION = 1
LAYOUT_FIELD = "layout"
# Set in P graph from the first write of `rankstream rekey` to its last: a copy cut
# short is refused by every reader and consumer (consumer.redis_store.check_layout).
UNFINISHED_FIELD = "rekey_unfinished"


def check_layout_value(keys: Keys, raw: bytes | str | None) -> None:
    """Refuse a ``layout`` field of ``P graph`` other than this layout's (None, no
    field, is this layout): :func:`consumer.redis_store.check_layout` at start, and
    every graph transaction, which reads it with its fence."""
    if raw is None:
        return
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if not (text.isascii() and text.isdigit() and len(text) < 10):
        raise ServiceError(f"{keys.graph} field {LAYOUT_FIELD} is {text!r}: not written "
                           "by rankstream")
    if int(text) != LAYOUT_VERSION:
        raise ConfigError(
            f"Redis holds rankstream key layout {int(text)} under prefix {keys.prefix!r}; "
            f"this rankstream reads and writes layout {LAYOUT_VERSION}: run the release "
            "that wrote it, or use another RANKSTREAM_KEY_PREFIX")


@dataclass(frozen=True)
class Keys:
    """All keys of one deployment, given its prefix ``P`` (default ``rs:``)."""

    prefix: str

    @property
    def page_id(self) -> str:
        """HASH canonical URL -> page id."""
        return f"{self.prefix}page:id"

    @property
    def page_url(self) -> str:
        """HASH page id -> canonical URL."""
        return f"{self.prefix}page:url"

    @property
    def page_ts(self) -> str:
        """HASH page id -> ts (epoch ms) of the last applied page/page_removed event."""
        return f"{self.prefix}page:ts"

    @property
    def page_title(self) -> str:
        """HASH page id -> title from its last page event."""
        return f"{self.prefix}page:title"

    @property
    def page_terms(self) -> str:
        """HASH page id -> the index terms it gives each page (consumer.text_postings)."""
        return f"{self.prefix}page:terms"

    @property
    def page_removed(self) -> str:
        """SET of ids of removed pages (ids are never reused; a later event revives)."""
        return f"{self.prefix}page:removed"

    @property
    def page_crawled(self) -> str:
        """Bitmap (STRING): bit ``id`` set while page ``id`` counts as crawled (the
        orphan rule of :mod:`rankstream.graph_updates`)."""
        return f"{self.prefix}page:crawled"

    @property
    def out_head(self) -> str:
        """``out_links(id)`` is this followed by the decimal id."""
        return f"{self.prefix}out:"

    @property
    def in_head(self) -> str:
        """``in_links(id)`` is this followed by the decimal id."""
        return f"{self.prefix}in:"

    def out_links(self, page_id: int) -> str:
        """SET of ids that ``page_id`` links to."""
        return f"{self.out_head}{page_id}"

    def in_links(self, page_id: int) -> str:
        """SET of ids linking to ``page_id``."""
        return f"{self.in_head}{page_id}"

    @property
    def offsets(self) -> str:
        """HASH "topic:partition" -> next offset to read (same MULTI as the graph)."""
        return f"{self.prefix}offsets"

    @property
    def graph(self) -> str:
        """HASH of graph counters (version, links, pages, ids, stale_ignored, dlq)."""
        return f"{self.prefix}graph"

    def scores(self, algorithm: str) -> str:
        """ZSET canonical URL -> paper-scale score y."""
        return f"{self.prefix}scores:{algorithm}"

    @property
    def score_buffers(self) -> str:
        """SET of the names of the score back buffers consumers created (internal): a
        consumer starting under the lease drops those its predecessors left."""
        return f"{self.prefix}scores:buffers"

    def meta(self, algorithm: str) -> str:
        """HASH describing the published scores of one algorithm."""
        return f"{self.prefix}meta:{algorithm}"

    @property
    def status(self) -> str:
        """HASH of consumer health and counters."""
        return f"{self.prefix}status"

    @property
    def lock(self) -> str:
        """STRING lease of the single running consumer (JSON holder, PX ttl)."""
        return f"{self.prefix}lock"


def offset_field(topic: str, partition: int) -> str:
    """Field name of one partition in ``P offsets``."""
    return f"{topic}:{partition}"
