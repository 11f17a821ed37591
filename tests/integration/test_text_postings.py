"""The term index stays exact (consumer/text_postings.py), on a real redis-server.

The reference is tests/text_index_model.py: events replayed one by one on plain
dicts. The consumer's path (EventApplier -> TextChanges -> the script inside Redis)
must agree with it however the events are cut into batches.
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
import redis as redis_py
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from consumer.keys import Keys
from consumer.text_postings import index_commands
from producer.schema import (
    Event,
    LinkAddedEvent,
    LinkRemovedEvent,
    PageEvent,
    PageRemovedEvent,
)
from ranker import LinkGraph
from rankstream.graph_updates import EventApplier
from rankstream.services.testing import delete_keys, redis_client
from rankstream.settings import Settings
from tests.text_index_model import model_of, stored_sources

NAMES = "abcd"
# "the" is a stop word; the others have bytes 0x85 / 0xA0 in UTF-8, combining marks,
# an underscore (two terms), and a case fold that changes length.
WORDS = ("alpha", "beta", "gamma", "the", "à", "Å", "हिन्दी", "x_y", "İstanbul")


def url(name: str) -> str:
    return f"https://example.org/{name}"


@pytest.fixture
def client(services: Settings) -> Iterator[redis_py.Redis]:
    redis = redis_client(services)
    try:
        yield redis
    finally:
        redis.close()


def index_in_batches(client: redis_py.Redis, batches: Sequence[Sequence[Event]],
                     *, twice: bool = False, scripted: bool = True) -> Counter[tuple[str, str]]:
    """The index the consumer's path leaves in Redis (``scripted=False``: that of
    ``--plain-writes``). ``twice``: every batch's transaction is sent again after it
    committed, as a retry after a lost reply does (the plain path computes it anew)."""
    prefix = f"test:postings:{uuid.uuid4().hex[:10]}:"
    keys = Keys(prefix)
    graph = LinkGraph()
    applier = EventApplier(graph)
    try:
        for batch in batches:
            result = applier.apply(list(batch))
            graph.apply(result.batch)
            for attempt in range(2 if twice else 1):
                commands = index_commands(client, keys, result.titles, result.anchors,
                                          scripted=scripted)
                if attempt and not scripted:
                    assert commands == []  # nothing left to change
                pipe = client.pipeline(transaction=True)
                for command in commands:
                    pipe.execute_command(*command)
                pipe.execute()
        return stored_sources(client, prefix, graph.key_of)
    finally:
        keys_left = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys_left:
            client.unlink(*keys_left)


texts = st.lists(st.sampled_from(WORDS), max_size=3).map(" ".join)


@st.composite
def events(draw: st.DrawFn) -> Event:
    kind = draw(st.sampled_from(["page", "page", "added", "removed", "gone"]))
    src = url(draw(st.sampled_from(NAMES)))
    if kind == "page":
        links = [
            {"url": url(name), "text": draw(texts)} if draw(st.booleans()) else url(name)
            for name in draw(st.lists(st.sampled_from(NAMES), max_size=4))]
        title = draw(st.none() | texts)
        return PageEvent(url=src, links=links, title=title)
    if kind == "gone":
        return PageRemovedEvent(url=src)
    dst = url(draw(st.sampled_from(NAMES)))
    if kind == "added":
        return LinkAddedEvent(src=src, dst=dst)
    return LinkRemovedEvent(src=src, dst=dst)


# The client is only a connection: each example indexes under its own prefix.
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=st.lists(events(), max_size=25), cuts=st.lists(st.integers(0, 25), max_size=5))
# Cases the derandomized search had missed (mutants of text_changes.py they kill):
@example(log=[PageEvent(url=url("a"), links=[{"url": url("b"), "text": "alpha"}]),
              LinkRemovedEvent(src=url("a"), dst=url("b"))], cuts=[])
@example(log=[PageEvent(url=url("a"), links=[], title="alpha"),
              PageEvent(url=url("a"), links=[{"url": url("b"), "text": "beta"}])], cuts=[1])
@example(log=[PageEvent(url=url("a"), links=[{"url": url("b"), "text": "alpha"}]),
              PageRemovedEvent(url=url("b")), LinkAddedEvent(src=url("a"), dst=url("b"))],
         cuts=[])
@example(log=[PageEvent(url=url("a"), links=[{"url": url("b"), "text": "alpha"}]),
              LinkRemovedEvent(src=url("a"), dst=url("b")),
              PageEvent(url=url("a"), links=[{"url": url("b"), "text": "beta"}])],
         cuts=[1])
def test_the_index_equals_the_current_titles_and_anchors_however_batched(
        client: redis_py.Redis, log: list[Event], cuts: list[int]) -> None:
    bounds = sorted({0, len(log), *(c for c in cuts if c < len(log))})
    batches = [log[a:b] for a, b in itertools.pairwise(bounds)]
    expected = model_of(log)
    for scripted in (True, False):
        assert index_in_batches(client, batches, scripted=scripted) == expected
        assert index_in_batches(client, [log], twice=True, scripted=scripted) == expected


def test_a_page_loses_an_old_title_and_a_removed_links_anchor(client: redis_py.Redis) -> None:
    log: list[Event] = [
        PageEvent(url=url("a"), links=[{"url": url("b"), "text": "tutorial"}],
                  title="Python two"),
        PageEvent(url=url("c"), links=[{"url": url("b"), "text": "tutorial intro"}]),
        PageEvent(url=url("a"), links=[url("b")], title="Python three"),
        LinkRemovedEvent(src=url("c"), dst=url("b")),
    ]
    assert index_in_batches(client, [log[:2], log[2:3], log[3:]]) == Counter({
        ("python", url("a")): 1, ("three", url("a")): 1})


def test_two_sources_of_one_term_keep_the_page_until_both_go(client: redis_py.Redis) -> None:
    two = [PageEvent(url=url(name), links=[{"url": url("t"), "text": "tutorial"}])
           for name in "ab"]
    assert index_in_batches(client, [two]) == Counter({("tutorial", url("t")): 2})
    one_left = [*two, PageRemovedEvent(url=url("a"))]
    assert index_in_batches(client, [two, one_left[2:]]) == Counter(
        {("tutorial", url("t")): 1})
    none_left = [*one_left, LinkRemovedEvent(src=url("b"), dst=url("t"))]
    assert index_in_batches(client, [two, none_left[2:3], none_left[3:]]) == Counter()


def test_three_sources_then_one_goes(client: redis_py.Redis) -> None:
    """The count goes 2 -> 1 extra source, the page stays filed (a term that changes
    for one page only in a batch takes the script's one-page path)."""
    three = [PageEvent(url=url(name), links=[{"url": url("t"), "text": "tutorial"}])
             for name in "abc"]
    drop = [PageEvent(url=url("a"), links=[url("t")])]
    assert index_in_batches(client, [three, drop]) == Counter({("tutorial", url("t")): 2})
    assert index_in_batches(client, [three, drop], scripted=False) == Counter(
        {("tutorial", url("t")): 2})


def test_removing_a_page_drops_the_anchors_into_it(client: redis_py.Redis) -> None:
    """A removal deletes the links into the page; a later crawl revives it without
    their anchors, as one-event batches and the graph both have it."""
    log: list[Event] = [
        PageEvent(url=url("a"), links=[{"url": url("b"), "text": "gamma"}]),
        PageRemovedEvent(url=url("b")),
        PageEvent(url=url("b"), links=[], title="beta"),
    ]
    expected = Counter({("beta", url("b")): 1})
    assert model_of(log) == expected
    assert index_in_batches(client, [log]) == expected
    assert index_in_batches(client, [[e] for e in log]) == expected


@pytest.mark.parametrize("scripted", [True, False])
def test_a_legacy_posting_stays_as_one_source(client: redis_py.Redis, services: Settings,
                                              scripted: bool) -> None:
    """A prefix indexed before counts existed: its postings count as one source each,
    so a counted source that goes never unfiles the page (the old index only grew)."""
    prefix = f"test:postings:{uuid.uuid4().hex[:10]}:"
    keys = Keys(prefix)
    graph = LinkGraph()
    applier = EventApplier(graph)
    try:
        target = graph.intern(url("t"))
        client.sadd(f"{prefix}term:tutorial", target)  # written by an older release
        for batch in ([PageEvent(url=url("a"), links=[{"url": url("t"), "text": "tutorial"}])],
                      [LinkRemovedEvent(src=url("a"), dst=url("t"))]):
            result = applier.apply(batch)
            graph.apply(result.batch)
            for command in index_commands(client, keys, result.titles, result.anchors,
                                          scripted=scripted):
                client.execute_command(*command)
        assert stored_sources(client, prefix, graph.key_of) == Counter(
            {("tutorial", url("t")): 1})
    finally:
        delete_keys(services, prefix)


def test_through_kafka_and_the_consumer_a_query_no_longer_finds_a_lost_anchor(
        one_partition: Settings) -> None:
    """End to end: the root set of a text query follows the live anchors and titles.
    Before the index was exact, ``b`` kept matching "tutorial" after ``a`` dropped
    the anchor, and ``a`` kept matching its first title."""
    from consumer.text_index import match
    from tests.integration.test_consumer_pipeline import consume, publish

    settings = one_partition
    site = "https://site.example"
    publish(settings, [
        {"type": "page", "url": f"{site}/a", "title": "Python two",
         "links": [{"url": f"{site}/b", "text": "tutorial"}]},
        {"type": "page", "url": f"{site}/c", "links": [{"url": f"{site}/d", "text": "tutorial"}]},
    ])
    consume(settings)
    client = redis_client(settings)
    try:
        def roots(query: str) -> set[str]:
            return {found.url for found in match(client, settings.key_prefix, [query], 10)}

        assert roots("tutorial") == {f"{site}/b", f"{site}/d"}
        assert roots("two") == {f"{site}/a"}
        publish(settings, [{"type": "page", "url": f"{site}/a", "title": "Python three",
                            "links": [f"{site}/b"]}])
        consume(settings)
        assert roots("tutorial") == {f"{site}/d"}
        assert roots("two") == set() and roots("three") == {f"{site}/a"}
    finally:
        client.close()
