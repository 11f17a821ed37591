"""Benchmark: HITS query latency over a large synthetic graph in the real Redis.

    .venv/bin/python benchmarks/bench_hits.py [--pages 1000000] [--queries 40] [--keep]

1. Builds the seeded copying-model web graph of :mod:`ranker.synthetic` (about 10
   links per page, ~1000 pages per host), computes its PageRank with
   :func:`ranker.pagerank`, and writes it into Redis in the public layout
   (``page:id``, ``page:url``, ``out:``/``in:`` sets, ``scores:pagerank``) with
   pipelined bulk writes. Each page gets a title ``topic{t} area{a}`` indexed by
   :func:`consumer.text_index.index_text`, so a one-word query ``topic17``
   matches ~n/1000 pages and ``root_size`` (by PageRank) decides the base size.
   The graph is written directly, not replayed through Kafka and the consumer:
   the pipeline's own benchmark measures that path; this one measures queries.
2. For each target base size (~1k and ~5k pages) it tunes ``root_size`` on a
   few topics, then times ``run_hits`` (cache off: Redis reads + subgraph +
   solve) on ``--queries`` other topics and prints p50/p99, the per-stage
   medians, and side by side networkx ``hits`` on the very same subgraphs,
   already built in memory (only ``nx.hits`` is timed).
3. Times a cache hit, then deletes the keys unless ``--keep``; ``--reuse`` skips
   step 1 when a kept graph with the same ``--pages``/``--seed`` is there.

Target (issue 4): p50 <= 100 ms and p99 <= 300 ms at a 5k-page base set.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

import networkx as nx
import numpy as np
import redis as redis_py
import scipy.sparse as sp

from benchmarks.arguments import at_least, bench_parser
from consumer.hits_query import HitsQuery, collect_subgraph, run_hits
from consumer.text_index import index_text
from ranker.pagerank import pagerank
from ranker.synthetic import copying_model_graph, page_url
from rankstream.errors import ConvergenceError
from rankstream.settings import load_settings

TOPICS = 1000
AREAS = 37
CHUNK = 10_000


def title_of(page: int) -> str:
    return f"topic{page % TOPICS} area{page % AREAS}"


def load(client: redis_py.Redis, prefix: str, pages: int, seed: int) -> None:
    started = time.perf_counter()
    graph = copying_model_graph(pages, 10.0, seed=seed)
    src, dst = graph.src.astype(np.int64), graph.dst.astype(np.int64)
    adjacency = sp.csr_array((np.ones(src.size), (src, dst)), shape=(pages, pages))
    scores = pagerank(adjacency, tol=1e-6 * pages).scores
    print(f"generated {pages:,} pages / {src.size:,} links + PageRank in "
          f"{time.perf_counter() - started:.1f} s", flush=True)

    started = time.perf_counter()
    urls = [page_url(p) for p in range(pages)]
    pipe = client.pipeline(transaction=False)
    for lo in range(0, pages, CHUNK):
        hi = min(lo + CHUNK, pages)
        pipe.hset(f"{prefix}page:id", mapping={urls[p]: p for p in range(lo, hi)})
        pipe.hset(f"{prefix}page:url", mapping={p: urls[p] for p in range(lo, hi)})
        pipe.zadd(f"{prefix}scores:pagerank", {urls[p]: float(scores[p]) for p in range(lo, hi)})
        pipe.execute()
    for name, owners, members in (("out", src, dst), ("in", dst, src)):
        order = np.argsort(owners, kind="stable")
        owners_sorted, members_sorted = owners[order], members[order]
        bounds = np.flatnonzero(np.diff(owners_sorted)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [owners_sorted.size]))
        for k, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            pipe.sadd(f"{prefix}{name}:{int(owners_sorted[lo])}", *members_sorted[lo:hi].tolist())
            if k % CHUNK == CHUNK - 1:
                pipe.execute()
        pipe.execute()
    index_text(pipe, prefix, {p: title_of(p) for p in range(pages)}, ())
    pipe.hset(f"{prefix}graph", mapping={"version": 1, "pages": pages, "links": src.size,
                                         "bench_pages": pages, "bench_seed": seed})
    pipe.execute()
    print(f"wrote the graph to Redis in {time.perf_counter() - started:.1f} s "
          f"(used_memory {client.info('memory')['used_memory_human']})", flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def tune_root_size(client: redis_py.Redis, prefix: str, target: int, topics: list[int]) -> int:
    """Smallest root_size whose median base size over ``topics`` reaches ``target``."""
    low, high = 1, 1000
    while low < high:
        mid = (low + high) // 2
        sizes = [len(collect_subgraph(client, prefix, _query(t, mid)).urls) for t in topics]
        if statistics.median(sizes) >= target:
            high = mid
        else:
            low = mid + 1
    return low


def _query(topic: int, root_size: int) -> HitsQuery:
    return HitsQuery(text=f"topic{topic}", root_size=root_size, k=10)


def bench_size(client: redis_py.Redis, prefix: str, target: int, queries: int,
               rng: np.random.Generator) -> None:
    topics = rng.permutation(TOPICS).tolist()
    root_size = tune_root_size(client, prefix, target, topics[:5])
    latencies: list[float] = []
    stages: dict[str, list[float]] = {}
    nx_seconds: list[float] = []
    base_sizes: list[int] = []
    links: list[int] = []
    iterations: list[int] = []
    unconverged = 0
    converged: HitsQuery | None = None
    for topic in topics[5 : 5 + queries]:
        query = _query(topic, root_size)
        started = time.perf_counter()
        try:
            answer = run_hits(client, prefix, query, use_cache=False)
        except ConvergenceError:
            # Counted, and its time (max_iter steps) still goes into the latencies.
            latencies.append((time.perf_counter() - started) * 1000.0)
            unconverged += 1
            continue
        latencies.append((time.perf_counter() - started) * 1000.0)
        converged = converged or query
        for stage, ms in answer.timing_ms.items():
            stages.setdefault(stage, []).append(ms)
        base_sizes.append(answer.base_size)
        links.append(answer.links)
        iterations.append(answer.iterations)

        subgraph = collect_subgraph(client, prefix, query)  # same base set, not timed
        graph = nx.DiGraph()
        graph.add_nodes_from(range(len(subgraph.urls)))
        coo = subgraph.adjacency.tocoo()
        graph.add_edges_from(zip(coo.row.tolist(), coo.col.tolist(), strict=True))
        started = time.perf_counter()
        nx.hits(graph, max_iter=1000, tol=1e-10)
        nx_seconds.append((time.perf_counter() - started) * 1000.0)

    print(f"\nbase set ~{target}: root_size {root_size}, {queries} queries, base size "
          f"median {statistics.median(base_sizes):.0f} (min {min(base_sizes)}, max "
          f"{max(base_sizes)}), links median {statistics.median(links):.0f}, "
          f"iterations median {statistics.median(iterations):.0f} (max "
          f"{max(iterations)}); {unconverged} of {queries} did not converge in max_iter")
    print(f"  rankstream run_hits (Redis reads included): p50 {percentile(latencies, 50):7.1f} ms"
          f"   p99 {percentile(latencies, 99):7.1f} ms")
    print("    stage medians: " + ", ".join(
        f"{s} {statistics.median(v):.1f} ms" for s, v in stages.items()))
    print(f"  networkx hits on the same subgraph (in memory): p50 "
          f"{percentile(nx_seconds, 50):7.1f} ms   p99 {percentile(nx_seconds, 99):7.1f} ms")
    if converged is None:
        return
    run_hits(client, prefix, converged)
    hits_ms = []
    for _ in range(20):
        started = time.perf_counter()
        assert run_hits(client, prefix, converged).cached
        hits_ms.append((time.perf_counter() - started) * 1000.0)
    print(f"  cache hit: p50 {percentile(hits_ms, 50):.2f} ms")


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("python -m benchmarks.bench_hits", __doc__.splitlines()[0])
    parser.add_argument("--pages", type=at_least(1_000), default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--queries", type=at_least(1), default=40,
                        help="timed queries per base size")
    parser.add_argument("--sizes", type=at_least(1), nargs="+", default=[1000, 5000])
    parser.add_argument("--prefix", default="bench:hits:")
    parser.add_argument("--keep", action="store_true", help="leave the graph in Redis")
    parser.add_argument("--reuse", action="store_true", help="reuse a kept graph if it matches")
    args = parser.parse_args(argv)

    settings = load_settings()
    client = redis_py.Redis.from_url(settings.redis_url, username=settings.redis_username,
                                     password=settings.redis_password.get_secret_value()
                                     if settings.redis_password else None)
    prefix = args.prefix
    kept = client.hmget(f"{prefix}graph", ["bench_pages", "bench_seed"])
    if not (args.reuse and kept == [str(args.pages).encode(), str(args.seed).encode()]):
        _delete(client, prefix)
        load(client, prefix, args.pages, args.seed)
    try:
        rng = np.random.default_rng(args.seed)
        for size in args.sizes:
            bench_size(client, prefix, size, args.queries, rng)
    finally:
        if not args.keep:
            _delete(client, prefix)
        client.close()
    return 0


def _delete(client: redis_py.Redis, prefix: str) -> None:
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


if __name__ == "__main__":
    sys.exit(main())
