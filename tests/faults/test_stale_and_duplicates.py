"""Out-of-order and duplicate deliveries of ``page`` (and ``page_removed``) events.

Each page is crawled several times (increasing ``ts``); the crawls are delivered
shuffled, a fifth of them twice, with a SIGKILL half-way so that the second half
is judged against the ``page:ts`` the first consumer left in Redis. The expected
graph comes from a ten-line reference model of the documented rules
(docs/events.md, "Stale rule"), written independently of the consumer's code,
and the harness audit checks the rest (counters, offsets, scores).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tests.faults.harness import Probe, audit, encode, replay, stored_graph
from tests.faults.stack import FaultStack, consumers, wait_for
from tests.faults.summary import record

PAGES = 40
CRAWLS = 4


def crawl_log(seed: int) -> list[dict[str, Any]]:
    pick = random.Random(seed)
    urls = [f"https://stale{i % 3}.example/page/{i}" for i in range(PAGES)]
    first = [{"type": "page", "url": u, "links": pick.sample(urls, 4), "ts": 1000}
             for u in urls]
    later: list[dict[str, Any]] = []
    for u in urls:
        for k in range(1, CRAWLS):
            ts = 1000 * (k + 1) + pick.randrange(500)
            if pick.random() < 0.15:
                later.append({"type": "page_removed", "url": u, "ts": ts})
            else:
                later.append({"type": "page", "url": u, "links": pick.sample(urls, 3),
                              "ts": ts})
    pick.shuffle(later)  # out of order: newer crawls often arrive before older ones
    for event in pick.sample(later, len(later) // 5):  # re-deliveries, later in the log
        later.insert(pick.randrange(len(later) + 1), dict(event))
    return first + later  # first crawls first: every URL is known before a removal


def reference_model(events: list[dict[str, Any]]
                    ) -> tuple[set[tuple[str, str]], set[str], set[int]]:
    """(links, live pages, positions of stale events) by the documented rules."""
    out: dict[str, set[str]] = {}
    last_ts: dict[str, int] = {}
    live: set[str] = set()
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
            live.update(out[url])
        else:
            out[url] = set()
            for targets in out.values():
                targets.discard(url)
            live.discard(url)
    return {(s, d) for s, ds in out.items() for d in ds}, live, stale


def test_out_of_order_and_duplicate_page_events(fault_stack: FaultStack, tmp_path: Path) -> None:
    settings = fault_stack.scenario("stale", partitions=1, batch_max_events=7)
    events = crawl_log(seed=71)
    log = [encode(e) for e in events]
    edges, live, stale = reference_model(events)
    assert len(stale) > 10  # the shuffle really produced stale deliveries
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
    client.close()
    assert int(graph[b"stale_ignored"]) == len(stale)
    assert int(graph[b"version"]) == len(log) - len(stale)
    record("Out-of-order + duplicate page events", faults=len(stale | redelivered) + 1,
           result=result,
           note=f"{len(stale)} stale (older ts) deliveries ignored, {len(redelivered)} "
                "re-deliveries applied idempotently, 1 SIGKILL half-way")
    result.check()
