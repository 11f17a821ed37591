"""Out-of-order and duplicate deliveries of ``page`` (and ``page_removed``) events.

Each page is crawled several times (increasing ``ts``); the crawls are delivered
shuffled, a fifth of them twice, with a SIGKILL half-way so that the second half
is judged against the ``page:ts`` the first consumer left in Redis. Each crawl
also links to one of a few external URLs that are never crawled, so re-crawls
leave some of them without in-links: the orphan rule removes those. The expected
graph comes from a short reference model of the documented rules (docs/events.md,
"Stale rule" and "Orphan rule"), and the expected scores from the slow reference
solvers (tests/reference_algorithms.py), both written independently of the
consumer's code; the harness audit checks the rest (counters, offsets, scores
against the consumer's own cold solver).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from consumer.keys import ALGORITHMS, Keys
from consumer.readers import meta
from tests.faults.harness import Probe, audit, replay, stored_graph
from tests.faults.known_log import encode
from tests.faults.stack import FaultStack, consumers, wait_for
from tests.faults.summary import record
from tests.reference_algorithms import reference_pagerank, reference_weighted_pagerank

PAGES = 40
CRAWLS = 4


def crawl_log(seed: int) -> list[dict[str, Any]]:
    pick = random.Random(seed)
    urls = [f"https://stale{i % 3}.example/page/{i}" for i in range(PAGES)]
    external = [f"https://elsewhere{i % 2}.example/{i}" for i in range(30)]  # never crawled
    first = [{"type": "page", "url": u, "links": pick.sample(urls, 4), "ts": 1000}
             for u in urls]
    later: list[dict[str, Any]] = []
    for u in urls:
        for k in range(1, CRAWLS):
            ts = 1000 * (k + 1) + pick.randrange(500)
            if pick.random() < 0.15:
                later.append({"type": "page_removed", "url": u, "ts": ts})
            else:
                links = [*pick.sample(urls, 3), pick.choice(external)]
                later.append({"type": "page", "url": u, "links": links, "ts": ts})
    pick.shuffle(later)  # out of order: newer crawls often arrive before older ones
    for event in pick.sample(later, len(later) // 5):  # re-deliveries, later in the log
        later.insert(pick.randrange(len(later) + 1), dict(event))
    return first + later  # first crawls first: every URL is known before a removal


def reference_model(events: list[dict[str, Any]]
                    ) -> tuple[set[tuple[str, str]], set[str], set[int], set[str]]:
    """(links, live pages, positions of stale events, orphans removed at the end) by
    the documented rules. The orphan rule acts at the end of each consumer batch, but
    judging it once at the end of the log gives the same graph: a page that is not
    crawled has no out-links, so its removal changes nothing else, and a later link to
    it revives it either way (docs/events.md)."""
    out: dict[str, set[str]] = {}
    last_ts: dict[str, int] = {}
    live: set[str] = set()
    crawled: set[str] = set()
    stale: set[int] = set()
    for position, e in enumerate(events):
        url = e["url"]
        if e["ts"] < last_ts.get(url, -1):
            stale.add(position)
            continue
        last_ts[url] = e["ts"]
        if e["type"] == "page":
            out[url] = set(e["links"]) - {url}
            live.add(url)
            crawled.add(url)
            live.update(out[url])
        else:
            out[url] = set()
            for targets in out.values():
                targets.discard(url)
            live.discard(url)
            crawled.discard(url)
    links = {(s, d) for s, ds in out.items() for d in ds}
    orphans = live - crawled - {d for _, d in links}
    return links, live - orphans, stale, orphans


def reference_scores(links: set[tuple[str, str]], live: set[str],
                     damping: float) -> dict[str, dict[str, float]]:
    """Paper-scale PageRank and WPR of the model's graph, by the slow reference solvers."""
    pages = sorted(live)
    index = {url: i for i, url in enumerate(pages)}
    edges = [(index[s], index[d]) for s, d in links]
    solved = {"pagerank": reference_pagerank(len(pages), edges, damping=damping),
              "wpr": reference_weighted_pagerank(len(pages), edges, damping=damping)}
    return {alg: dict(zip(pages, y.tolist(), strict=True)) for alg, y in solved.items()}


def test_out_of_order_and_duplicate_page_events(fault_stack: FaultStack, tmp_path: Path) -> None:
    settings = fault_stack.scenario("stale", partitions=1, batch_max_events=7)
    events = crawl_log(seed=71)
    log = [encode(e) for e in events]
    edges, live, stale, orphans = reference_model(events)
    assert len(stale) > 10  # the shuffle really produced stale deliveries
    assert len(orphans) >= 3  # and re-crawls really left never-crawled targets unlinked
    seen: set[bytes] = set()
    redelivered = set()
    for position, message in enumerate(log):
        if message.value in seen:
            redelivered.add(position)
        seen.add(message.value)
    half = len(log) // 2
    client = fault_stack.client()
    probe = Probe(client, settings)
    with consumers(settings, tmp_path) as spawn:
        replay(settings, log[:half])
        first = spawn()
        wait_for(lambda: probe.consumed() == half, 120, "the first half")
        first.kill()
        replay(settings, log[half:])
        second = spawn("--until-caught-up")
        assert second.wait(timeout=180) == 0, second.output()[-3000:]
    stored_edges, stored_live = stored_graph(client, settings)
    assert stored_edges == edges
    assert stored_live == live
    result = audit(client, settings, log)
    graph = client.hgetall(probe.keys.graph)
    published: dict[str, dict[str, float]] = {}
    for alg in ALGORITHMS:
        rows: Any = client.zrange(Keys(settings.key_prefix).scores(alg), 0, -1,
                                  withscores=True)
        published[alg] = {url.decode(): float(value) for url, value in rows}
    metas = {alg: meta(client, settings.key_prefix, alg) for alg in ALGORITHMS}
    client.close()
    for alg, exact in reference_scores(edges, live, settings.damping).items():
        assert set(published[alg]) == live, alg
        l1 = sum(abs(published[alg][url] - y) for url, y in exact.items())
        # The published bound is certified against the exact scores; the reference's
        # own error (tol 1e-14 of the sum) and the ZSET's float rounding fit in 1e-9.
        assert l1 <= metas[alg].bound + 1e-9, (alg, l1, metas[alg].bound)
    assert int(graph[b"stale_ignored"]) == len(stale)
    assert int(graph[b"version"]) == len(log) - len(stale)
    record("Out-of-order + duplicate page events", faults=len(stale | redelivered) + 1,
           result=result,
           note=f"{len(stale)} stale (older ts) deliveries ignored, {len(redelivered)} "
                f"re-deliveries applied idempotently, {len(orphans)} orphans removed, "
                "1 SIGKILL half-way")
    result.check()
