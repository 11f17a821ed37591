"""Integration tests: every test here runs against the real Kafka broker and redis-server."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import pytest
import redis as redis_py

from consumer.text_index import index_text
from producer.urls import canonicalize_url
from rankstream.services.kafka import delete_topics
from rankstream.services.stack import ensure_settings_topics, kafka_client_options
from rankstream.services.testing import Isolated, delete_keys, redis_client
from rankstream.settings import Settings


@pytest.fixture(autouse=True)
def _services_running(services: Settings) -> None:
    """Bring the services up (once per session) before any test in this directory."""


@pytest.fixture
def one_partition(isolated: Isolated) -> Iterator[Settings]:
    """The test's settings on a single-partition topic: the log order is total."""
    settings = isolated.settings.model_copy(update={
        "topic": f"{isolated.topic}.p1", "dlq_topic": f"{isolated.topic}.p1.dlq",
        "topic_partitions": 1})
    options = kafka_client_options(settings)
    ensure_settings_topics(settings)
    try:
        yield settings
    finally:
        delete_topics(settings.kafka_bootstrap, [settings.topic, settings.dlq_topic], **options)


@dataclass
class HandGraph:
    """Writes pages, links, titles, anchors and PageRank scores in the public layout."""

    client: redis_py.Redis
    prefix: str
    ids: dict[str, int] = field(default_factory=dict)

    def page(self, url: str) -> int:
        url = canonicalize_url(url)
        if url not in self.ids:
            page_id = len(self.ids)
            self.ids[url] = page_id
            self.client.hset(f"{self.prefix}page:id", url, page_id)
            self.client.hset(f"{self.prefix}page:url", page_id, url)
        return self.ids[url]

    def write(
        self,
        links: Iterable[tuple[str, str]] = (),
        *,
        titles: Mapping[str, str] | None = None,
        anchors: Iterable[tuple[str, str, str]] = (),
        pagerank: Mapping[str, float] | None = None,
        pages: Iterable[str] = (),
    ) -> None:
        for url in pages:
            self.page(url)
        pipe = self.client.pipeline(transaction=True)
        for src, dst in links:
            s, d = self.page(src), self.page(dst)
            pipe.sadd(f"{self.prefix}out:{s}", d)
            pipe.sadd(f"{self.prefix}in:{d}", s)
        index_text(
            pipe,
            self.prefix,
            {self.page(u): t for u, t in (titles or {}).items()},
            [(self.page(s), self.page(d), t) for s, d, t in anchors],
        )
        if pagerank:
            pipe.zadd(f"{self.prefix}scores:pagerank",
                      {canonicalize_url(u): y for u, y in pagerank.items()})
        pipe.hincrby(f"{self.prefix}graph", "version", 1)
        pipe.execute()

    def unlink(self, src: str, dst: str) -> None:
        s, d = self.ids[canonicalize_url(src)], self.ids[canonicalize_url(dst)]
        pipe = self.client.pipeline(transaction=True)
        pipe.srem(f"{self.prefix}out:{s}", d)
        pipe.srem(f"{self.prefix}in:{d}", s)
        pipe.hincrby(f"{self.prefix}graph", "version", 1)
        pipe.execute()


@pytest.fixture
def graph(services: Settings) -> Iterator[HandGraph]:
    """An empty graph under a fresh prefix (Redis only: no Kafka topics needed)."""
    prefix = f"test:hits:{uuid.uuid4().hex[:10]}:"
    client = redis_client(services)
    try:
        yield HandGraph(client, prefix)
    finally:
        client.close()
        delete_keys(services, prefix)
