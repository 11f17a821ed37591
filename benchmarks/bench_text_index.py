"""Benchmark: the exact term index against the grow-only one, in the real Redis.

    ./run bench text [--pages 200] [--crawls 200] [--batch 200]

1. Churn: ``--pages`` site pages re-crawled ``--crawls`` times; each crawl links 3
   site pages and 3 URLs new to that crawl with anchor text naming the crawl, and a
   page's title changes every 20 crawls. The same events, cut into batches of
   ``--batch``, are indexed three times under three prefixes, side by side: exactly
   by the consumer's script (:mod:`consumer.text_postings`), exactly without a script
   (``--plain-writes``: reads, then plain writes), and grow-only (the additions alone,
   what releases before session 32 did). Printed for each: the postings, the Redis
   memory of the index's keys (``MEMORY USAGE`` summed), the time to build the
   commands (tokenizing; for the plain path, its reads too) and the transactions'.
2. Script cost per ``page`` event, from one script call of 10,000 events each: no
   text at all; a title and 8 anchored links on a first crawl; the same re-crawled.

The events go through :class:`rankstream.graph_updates.EventApplier` as in the
consumer; the graph itself is not written (only the index's keys are measured).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis as redis_py

from benchmarks.arguments import at_least, bench_parser
from consumer.keys import Keys
from consumer.text_index import postings_commands
from consumer.text_postings import POSTINGS_SCRIPT, index_commands
from producer.schema import Event, make_event
from ranker import LinkGraph
from rankstream.graph_updates import AppliedEvents, EventApplier
from rankstream.services.testing import delete_keys, redis_client
from rankstream.settings import Settings, load_settings


def churn_events(pages: int, crawls: int) -> list[Event]:
    site = "https://site.example"
    events = []
    for crawl in range(crawls):
        for page in range(pages):
            links: list[object] = [f"{site}/{(page + k) % pages}" for k in (1, 2, 5)]
            links += [{"url": f"https://ads.example/{crawl}/{page}/{x}",
                       "text": f"offer{crawl} item{x} deal"} for x in range(3)]
            events.append(make_event({"type": "page", "url": f"{site}/{page}", "links": links,
                                      "title": f"page {page} edition{crawl // 20}"}))
    return events


def index_commands_of(client: redis_py.Redis, keys: Keys, result: AppliedEvents,
                      how: str) -> list[tuple[Any, ...]]:
    if how == "grow-only":
        anchors = ((source, target, text) for source, targets in result.anchors.replaced.items()
                   for target, text in targets.items())
        return postings_commands(keys.prefix, result.titles, anchors)
    return index_commands(client, keys, result.titles, result.anchors,
                          scripted=how == "exact, script")


def index_churn(client: redis_py.Redis, settings: Settings, events: list[Event],
                batch: int, how: str) -> tuple[int, float, float, float]:
    """(postings, MB, seconds building the commands, seconds of the transactions) of
    indexing ``events`` under a fresh prefix. The plain path's reads are in the build."""
    prefix = f"bench:text:{uuid.uuid4().hex[:8]}:"
    keys, graph = Keys(prefix), LinkGraph()
    applier = EventApplier(graph)
    build_seconds = redis_seconds = 0.0
    try:
        for start in range(0, len(events), batch):
            result = applier.apply(events[start:start + batch])
            graph.apply(result.batch)
            started = time.perf_counter()
            commands = index_commands_of(client, keys, result, how)
            built = time.perf_counter()
            pipe = client.pipeline(transaction=True)
            for command in commands:
                pipe.execute_command(*command)
            pipe.execute()
            build_seconds += built - started
            redis_seconds += time.perf_counter() - built
        postings, memory = 0, 0
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            memory += client.memory_usage(key) or 0
            if key.startswith(f"{prefix}term:".encode()):
                postings += client.scard(key)
        return postings, memory / 1e6, build_seconds, redis_seconds
    finally:
        delete_keys(settings, prefix)


def script_cost(client: redis_py.Redis, settings: Settings, events: int = 10_000) -> None:
    prefix = f"bench:text:{uuid.uuid4().hex[:8]}:"
    plain = [f"R {page} 1" for page in range(events)]
    texts = [f"R {page} 0\nt page title{page % 100}\n" + "\n".join(
                 f"{target} deal{(page + target) % 300} offer"
                 for target in sorted(events + (page * 8 + k) % events for k in range(8)))
             for page in range(events)]
    try:
        for what, payload in (("no text", plain), ("first crawl, title + 8 anchors", texts),
                              ("unchanged re-crawl", texts)):
            started = time.perf_counter()
            client.eval(POSTINGS_SCRIPT, 0, prefix, Keys(prefix).page_terms, *payload)
            seconds = time.perf_counter() - started
            print(f"  {what:32s} {seconds * 1e3:8.1f} ms  {seconds / events * 1e6:6.1f} us/event")
    finally:
        delete_keys(settings, prefix)


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("python -m benchmarks.bench_text_index", __doc__.splitlines()[0])
    parser.add_argument("--pages", type=at_least(10), default=200)
    parser.add_argument("--crawls", type=at_least(1), default=200)
    parser.add_argument("--batch", type=at_least(1), default=200)
    args = parser.parse_args(argv)
    settings = load_settings()
    client = redis_client(settings)
    try:
        events = churn_events(args.pages, args.crawls)
        print(f"churn: {args.pages} pages x {args.crawls} crawls = {len(events):,} page "
              f"events, batches of {args.batch}")
        figures = {}
        for how in ("grow-only", "exact, script", "exact, plain"):
            figures[how] = index_churn(client, settings, events, args.batch, how)
            postings, megabytes, build, transactions = figures[how]
            print(f"  {how:14s} postings {postings:>9,}  index {megabytes:8.2f} MB  "
                  f"commands built in {build:6.2f} s  transactions {transactions:6.2f} s")
        grow, exact_figures = figures["grow-only"], figures["exact, script"]
        print(f"  grow-only / exact: postings {grow[0] / max(exact_figures[0], 1):.0f}x, "
              f"memory {grow[1] / max(exact_figures[1], 1e-9):.0f}x, "
              f"transactions {grow[3] / max(exact_figures[3], 1e-9):.2f}x")
        print("script cost, one call of 10,000 page events:")
        script_cost(client, settings)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
