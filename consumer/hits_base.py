"""HITS building blocks: the base set around a root set and its weighted subgraph.

Reads the consumer's public layout (``P out:{id}``, ``P in:{id}``, ``P page:url``,
``P scores:pagerank``) in a fixed number of round trips, whatever the size:

1. ``SMEMBERS`` of the root pages' out- and in-sets (one raw pipeline);
2. ``HMGET P page:url`` of every candidate page (one command);
3. ``ZMSCORE P scores:pagerank`` of the in-linkers competing for the ``max_in``
   places of a root page with more in-links than that (one command);
4. ``SMEMBERS`` of the out-sets of the remaining base pages (one raw pipeline).

A base set of 5k pages means ~5k ``SMEMBERS``. Sent through redis-py's pipeline
object, each costs ~10 us of Python packing and reply parsing, several times
what Redis spends on it; :func:`consumer.resp.read_sets` therefore writes the
RESP request in one buffer and reads the replies back with the connection's own
(hiredis) parser, through the public ``Connection.send_packed_command`` /
``read_response``. The server-side work is that of an ordinary pipeline: no
scripts, nothing that blocks Redis longer than the commands themselves.

Host weighting (Bharat & Henzinger 1998) is explained in :func:`host_weights`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from consumer.resp import read_sets
from rankstream.errors import InputError

__all__ = [
    "MAX_CANDIDATES",
    "MAX_IN_CANDIDATES",
    "BaseSubgraph",
    "base_subgraph",
    "host_weights",
    "read_sets",
    "url_host",
    "url_hosts",
]

# A root page with a huge in-link set (a site's home page) would otherwise cost a
# URL and a score lookup per in-linker; beyond this many, only the lowest ids (the
# pages seen first) compete for the max_in places. Deterministic, and bounded.
MAX_IN_CANDIDATES = 10_000
# Pages one query may look up (base set and in-link candidates together). Beyond it
# the query is refused (InputError, HTTP 400) rather than cut short by a rule nobody
# asked for: every out-link of every root joins the base set, so a thousand roots
# with 10k links each meant HMGETs of millions of fields on the Redis the consumer
# writes to. 5k-page base sets answer in about 90 ms at p50 (docs/benchmarks.md, HITS).
MAX_CANDIDATES = 100_000
# Keys per raw pipeline write: bounds the request buffer (and reply burst) size.
_SCORES = "pagerank"


@dataclass
class BaseSubgraph:
    """The base set in URL order and its weighted links.

    ``adjacency[i, j]`` is the weight of link ``urls[i] -> urls[j]`` (row = source)
    after the intrinsic-link filter and host weighting; ties in scores are broken
    by position, i.e. by URL.
    """

    page_ids: np.ndarray
    urls: list[str]
    is_root: np.ndarray
    adjacency: sp.csr_array
    links_in_base: int
    intrinsic_dropped: int
    unknown_seeds: list[str] = field(default_factory=list)


def url_host(url: str) -> str:
    """Host of a canonical URL, without userinfo and port ("" when it has none)."""
    scheme_sep = url.find(":")
    if scheme_sep < 0 or not url.startswith("://", scheme_sep):
        return ""
    rest = url[scheme_sep + 3 :]
    end = len(rest)
    for delimiter in "/?":
        index = rest.find(delimiter)
        if 0 <= index < end:
            end = index
    hostport = rest[:end].rpartition("@")[2]
    if hostport.startswith("["):
        return hostport[: hostport.find("]") + 1]
    return hostport.partition(":")[0]


# One pass over newline-joined canonical URLs (they never contain control
# characters) yields every host at once: the same answer as url_host, per line.
# The user part runs to the LAST "@" of the authority, as in urlsplit.
_HOSTS_RE = re.compile(r"^(?:[^:/?#\n]*://(?:[^/?#\n]*@)?(\[[^\]\n]*\]|[^:/?\n]*))?.*$", re.M)


def url_hosts(urls: Sequence[str]) -> list[str]:
    """:func:`url_host` of each URL, in one regex pass (the base set has thousands)."""
    if not urls:
        return []
    hosts: list[str] = _HOSTS_RE.findall("\n".join(urls))
    if len(hosts) != len(urls):  # not expected for canonical URLs; be exact anyway
        return [url_host(u) for u in urls]
    return hosts


def base_subgraph(
    redis: Any,
    prefix: str,
    roots: Sequence[int],
    urls: dict[int, str],
    *,
    max_in: int,
    drop_intrinsic: bool,
    host_weighting: bool,
) -> BaseSubgraph:
    """The base set of ``roots`` and its links; ``urls`` (root URLs) is filled in place."""
    root_ids = np.asarray(roots, dtype=np.int64)
    # max_in = 0 brings no in-linkers: their sets are not read (a home page's is huge).
    step = 2 if max_in > 0 else 1
    keys = [k for r in roots
            for k in (f"{prefix}out:{r}", f"{prefix}in:{r}")[:step]]
    lengths, flat = read_sets(redis, keys)
    pieces = np.split(flat, np.cumsum(lengths)[:-1]) if len(keys) else []
    out_sets = dict(zip(roots, pieces[0::step], strict=True))
    in_sets = dict(zip(roots, pieces[1::2], strict=True)) if step == 2 else {}

    base: set[int] = set(roots)
    for links in out_sets.values():
        base.update(links.tolist())
    contested: dict[int, np.ndarray] = {}
    for root, linkers in in_sets.items():
        if linkers.size <= max_in:
            base.update(linkers.tolist())
        elif max_in > 0:
            contested[root] = np.sort(linkers)[:MAX_IN_CANDIDATES]
    candidates = set(base)
    for linkers in contested.values():
        candidates.update(linkers.tolist())
    if len(candidates) > MAX_CANDIDATES:
        raise InputError(f"the base set would look up {len(candidates):,} pages, more than "
                         f"{MAX_CANDIDATES:,}: ask for fewer root pages (root_size), or for "
                         f"no in-linkers (max_in=0: each root with more in-links than max_in "
                         f"brings up to {MAX_IN_CANDIDATES:,} candidates)")
    _fetch_urls(redis, prefix, candidates, urls)
    if contested:
        base.update(_best_linkers(redis, prefix, contested, urls, max_in))
    # Ids without a URL (not expected; a reader racing a page removal) are left out.
    base_ids = np.array(sorted(p for p in base if p in urls), dtype=np.int64)

    rest = [int(p) for p in base_ids if int(p) not in out_sets]
    rest_lengths, rest_flat = read_sets(redis, [f"{prefix}out:{p}" for p in rest])
    owners = np.concatenate([root_ids, np.asarray(rest, dtype=np.int64)])
    out_lengths = np.concatenate([lengths[0::step], rest_lengths])
    targets = np.concatenate([*pieces[0::step], rest_flat])
    return _subgraph(base_ids, owners, out_lengths, targets, urls, root_ids,
                     drop_intrinsic=drop_intrinsic, host_weighting=host_weighting)


def _fetch_urls(redis: Any, prefix: str, ids: set[int], urls: dict[int, str]) -> None:
    wanted = [page for page in ids if page not in urls]
    if not wanted:
        return
    for page, raw in zip(wanted, redis.hmget(f"{prefix}page:url", wanted), strict=True):
        if raw is not None:
            urls[page] = raw if isinstance(raw, str) else raw.decode()


def _best_linkers(
    redis: Any, prefix: str, contested: dict[int, np.ndarray], urls: dict[int, str], max_in: int
) -> set[int]:
    """Per root, the ``max_in`` in-linkers with the highest PageRank (ties: URL)."""
    pool = np.array(sorted({p for links in contested.values() for p in links.tolist()
                            if p in urls}), dtype=np.int64)
    pool_urls = [urls[int(p)] for p in pool]
    raw = redis.zmscore(f"{prefix}scores:{_SCORES}", pool_urls)
    score = np.array([float(s) if s is not None else 0.0 for s in raw])
    url_rank = np.empty(pool.size, dtype=np.int64)
    url_rank[sorted(range(pool.size), key=pool_urls.__getitem__)] = np.arange(pool.size)
    chosen: set[int] = set()
    for linkers in contested.values():
        at = np.searchsorted(pool, linkers)
        at = at[(at < pool.size) & (pool[np.minimum(at, pool.size - 1)] == linkers)]
        best = at[np.lexsort((url_rank[at], -score[at]))[:max_in]]
        chosen.update(pool[best].tolist())
    return chosen


def _subgraph(
    base_ids: np.ndarray,
    owners: np.ndarray,
    out_lengths: np.ndarray,
    targets: np.ndarray,
    urls: dict[int, str],
    root_ids: np.ndarray,
    *,
    drop_intrinsic: bool,
    host_weighting: bool,
) -> BaseSubgraph:
    """Links among ``base_ids`` from the out-sets of ``owners``, in URL order."""
    ordered_urls = sorted(urls[int(p)] for p in base_ids)
    position = {url: i for i, url in enumerate(ordered_urls)}
    by_id = np.array([position[urls[int(p)]] for p in base_ids], dtype=np.int64)
    page_ids = np.empty_like(base_ids)
    page_ids[by_id] = base_ids
    n = base_ids.size

    src_ids = np.repeat(owners, out_lengths)
    src_at, src_in = _positions(base_ids, src_ids)
    dst_at, dst_in = _positions(base_ids, targets)
    inside = src_in & dst_in
    src, dst = by_id[src_at[inside]], by_id[dst_at[inside]]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    links_in_base = int(src.size)

    intrinsic_dropped = 0
    weights = np.ones(src.size)
    if drop_intrinsic or host_weighting:
        codes: dict[str, int] = {}
        host = np.array([codes.setdefault(h, len(codes)) for h in url_hosts(ordered_urls)],
                        dtype=np.int64)
        if drop_intrinsic:
            extrinsic = host[src] != host[dst]
            intrinsic_dropped = int(src.size - extrinsic.sum())
            src, dst = src[extrinsic], dst[extrinsic]
            weights = weights[extrinsic]
        if host_weighting:
            weights = host_weights(src, dst, host)
    adjacency = sp.csr_array((weights, (src, dst)), shape=(n, n))
    adjacency.sum_duplicates()
    return BaseSubgraph(page_ids, ordered_urls, np.isin(page_ids, root_ids), adjacency,
                        links_in_base, intrinsic_dropped)


def _positions(sorted_ids: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of each of ``ids`` in ``sorted_ids`` and whether it is there at all."""
    if sorted_ids.size == 0:
        return np.zeros(ids.size, dtype=np.int64), np.zeros(ids.size, dtype=bool)
    at = np.minimum(np.searchsorted(sorted_ids, ids), sorted_ids.size - 1)
    return at, sorted_ids[at] == ids


def host_weights(src: np.ndarray, dst: np.ndarray, host: np.ndarray) -> np.ndarray:
    """Bharat-Henzinger link weights, combined multiplicatively: ``1 / (k * l)``.

    ``k`` = pages of ``src``'s host linking to ``dst`` (authority weight ``1/k``);
    ``l`` = pages of ``dst``'s host that ``src`` links to (hub weight ``1/l``).
    B&H use ``1/k`` in the authority step and ``1/l`` in the hub step; one matrix
    with the product keeps ``A^T A`` symmetric positive semi-definite (plain
    power-iteration convergence), and a block of ``k`` pages of one host all
    linking to ``l`` pages of another, singular value ``sqrt(k*l)`` unweighted,
    gets singular value ``1/sqrt(k*l) <= 1``: no more than one independent link.
    """
    if src.size == 0:
        return np.zeros(0)
    n = int(max(src.max(), dst.max())) + 1
    hosts = int(host.max()) + 1
    _, auth_group, auth_k = np.unique(host[src] * n + dst, return_inverse=True,
                                      return_counts=True)
    _, hub_group, hub_l = np.unique(src * hosts + host[dst], return_inverse=True,
                                    return_counts=True)
    k = auth_k[np.asarray(auth_group).reshape(-1)]
    l_ = hub_l[np.asarray(hub_group).reshape(-1)]
    return 1.0 / (k * l_).astype(float)
