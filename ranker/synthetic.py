"""Seeded web-like graphs and random edit batches (benchmarks, tests, demo streams).

The graph is a copying model (Kleinberg et al. 1999; Kumar et al. 2000): pages
arrive one by one; each picks an earlier page as its prototype and fills each of
its link slots either with a uniformly random page (probability ``random_link``)
or with the prototype's link in the same slot. Copying makes a page's chance of
gaining a link proportional to the links it already has, which yields power-law
in-degrees (exponent about ``(2 - a) / (1 - a)`` for ``a = random_link``). Random
links may point to any page, later ones included, so the graph has cycles, as the
web does. With ``acyclic=True`` they point to earlier pages only, as in Kumar et
al.'s original model: every link then goes from a newer page to an older one and
the graph is a DAG (a different, less mixing benchmark case, not a replacement:
a change there reaches fewer pages). Finally a random ``uncrawled`` fraction of
pages loses its out-links: the crawl frontier, known only as link targets (dangling pages).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ranker._graph_kernels import copy_links
from ranker.edge_batches import EdgeBatch, sorted_unique, split_pair_keys
from ranker.linkgraph import LinkGraph


@dataclass(frozen=True)
class SyntheticGraph:
    """Links ``src[k] -> dst[k]`` (int32, no self links, no duplicates) on ``num_pages`` ids."""

    src: np.ndarray
    dst: np.ndarray
    num_pages: int

    @property
    def num_links(self) -> int:
        return int(self.src.size)

    def keys(self) -> list[str]:
        return synthetic_keys(self.num_pages)

    def to_linkgraph(self) -> LinkGraph:
        return LinkGraph.from_id_edges(self.src, self.dst, self.keys())


def page_url(page: int) -> str:
    """URL of synthetic page ``page`` (about 1000 pages per host)."""
    return f"https://site{page // 1000}.example/p/{page}"


def synthetic_keys(num_pages: int) -> list[str]:
    return [page_url(i) for i in range(num_pages)]


def copying_model_graph(
    num_pages: int,
    mean_out_degree: float = 10.0,
    *,
    random_link: float = 0.25,
    uncrawled: float = 0.2,
    seed: int = 0,
    acyclic: bool = False,
) -> SyntheticGraph:
    """A web-like graph: copying model, power-law in-degrees, dangling frontier.

    Args:
        num_pages: pages (ids ``0..num_pages-1``, randomly permuted so id order
            says nothing about age).
        mean_out_degree: mean slots of a crawled page before duplicates and self
            links are dropped (lognormal, capped at 500).
        random_link: probability a slot is a uniform random page instead of a copy.
        uncrawled: fraction of pages with no out-links.
        seed: everything is determined by it.
        acyclic: random slots pick a uniform EARLIER page (Kumar et al.'s original
            copying model; copies inherit that, so every link points back in
            arrival order and the graph is a DAG). Default: any page (cycles).
    """
    rng = np.random.default_rng(seed)
    n = int(num_pages)
    if n < 2:
        return SyntheticGraph(np.zeros(0, np.int32), np.zeros(0, np.int32), max(n, 0))
    sigma = 0.6
    mu = np.log(mean_out_degree) - sigma * sigma / 2
    degree = np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, 500).astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degree, out=offsets[1:])
    slots = int(offsets[-1])
    arrivals = np.arange(n)
    prototype = np.where(arrivals > 0, (rng.random(n) * arrivals).astype(np.int64), -1)
    is_random = rng.random(slots) < random_link
    sources = np.repeat(arrivals, degree)
    if acyclic:
        # Page 0 has no earlier page: its slots become self links and are dropped.
        random_target = (rng.random(slots) * sources).astype(np.int64)
    else:
        random_target = rng.integers(0, n, slots, dtype=np.int64)
    targets = np.empty(slots, dtype=np.int64)
    copy_links(degree, offsets, prototype, is_random, random_target, targets)

    crawled = rng.random(n) >= uncrawled
    keep = crawled[sources] & (sources != targets)
    relabel = rng.permutation(n)
    src = relabel[sources[keep]]
    dst = relabel[targets[keep]]
    pairs = sorted_unique((src << 32) | dst)
    return SyntheticGraph(*split_pair_keys(pairs), n)


def sample_links(graph: LinkGraph, count: int, rng: np.random.Generator) -> tuple[
        np.ndarray, np.ndarray]:
    """Up to ``count`` distinct present links, uniformly at random."""
    n = graph.num_ids
    if graph.num_links == 0 or count <= 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    cumulative = np.cumsum(graph.out_len[:n], dtype=np.int64)
    picks = rng.choice(graph.num_links, size=min(count, graph.num_links), replace=False)
    src = np.searchsorted(cumulative, picks, side="right").astype(np.int32)
    before = cumulative[src] - graph.out_len[src]
    dst = graph.out_nbr[graph.out_start[src] + (picks - before)]
    return src, dst.astype(np.int32)


def random_edit_batch(
    graph: LinkGraph,
    size: int,
    rng: np.random.Generator,
    *,
    random_link: float = 0.25,
    crawl_new: float = 0.1,
) -> EdgeBatch:
    """``size // 2`` deletions of present links and ``size - size // 2`` new links.

    New links follow the generator's rules: the source is a crawled page (or, with
    probability ``crawl_new``, any live page, so dangling pages gain links); the
    target copies the target of a random present link (preferential attachment)
    or, with probability ``random_link``, is a uniform random live page. Every
    inserted link is absent from the graph and from the rest of the batch.
    """
    deletions = size // 2
    insertions = size - deletions
    del_src, del_dst = sample_links(graph, deletions, rng)
    live = np.flatnonzero(graph.live_mask()).astype(np.int32)
    crawled = live[graph.out_len[live] > 0]
    if live.size < 2 or crawled.size == 0:
        return EdgeBatch(delete_src=del_src, delete_dst=del_dst)
    keys = np.zeros(0, dtype=np.int64)
    for _ in range(20):
        want = 2 * (insertions - keys.size) + 8
        src = np.where(rng.random(want) < crawl_new, rng.choice(live, want),
                       rng.choice(crawled, want)).astype(np.int32)
        _, copied = sample_links(graph, want, rng)
        if copied.size < want:
            copied = np.resize(copied, want) if copied.size else rng.choice(live, want)
        dst = np.where(rng.random(want) < random_link, rng.choice(live, want), copied)
        dst = dst.astype(np.int32)
        ok = (src != dst) & ~graph.links_exist(src, dst)
        fresh = np.unique((src[ok].astype(np.int64) << 32) | dst[ok])
        fresh = rng.permutation(fresh[~np.isin(fresh, keys)])
        keys = np.concatenate([keys, fresh[: insertions - keys.size]])
        if keys.size >= insertions:
            break
    insert_src, insert_dst = split_pair_keys(keys)
    return EdgeBatch(
        insert_src=insert_src,
        insert_dst=insert_dst,
        delete_src=del_src,
        delete_dst=del_dst,
    )
