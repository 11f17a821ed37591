"""HITS on demand over the live graph in Redis: query -> root set -> base set -> scores.

Kleinberg's procedure (algorithms.md, "HITS"), read from the Redis layout the
consumer keeps (docs/redis-keys.md; our own keys in docs/hits.md):

1. **Root set.** Seed URLs (canonicalised, looked up in ``P page:id``) or the pages
   matching a text query (:func:`consumer.text_index.match`: most matching terms,
   then PageRank), capped at ``root_size``.
2. **Base set.** The root set, every page a root page links to (``P out:{id}``),
   and up to ``max_in`` pages linking to each root page (``P in:{id}``), chosen by
   highest PageRank, ties by URL.
3. **Subgraph.** The links between base-set pages; same-host ("intrinsic") links
   dropped unless asked to keep them; optional host weighting.
4. :func:`ranker.hits` from all-ones vectors, L2 (Kleinberg) or sum (networkx).

Every step reads Redis in pipelined round trips (about eight per query, whatever
the base-set size), never one command per page; :mod:`consumer.hits_base` builds
the base set and the subgraph (and documents the host weighting).

Answers are cached in Redis (``P hits:cache:{digest}``, a JSON string with a TTL)
keyed by the query's normal form, the options, ``P graph`` ``version`` and
the id of the current PageRank publication (``P meta:pagerank`` ``publication``).
A graph change bumps the version and a new publication changes the id, so the next
query misses; an answer whose computation overlapped a graph change is not
cached at all.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import redis as redis_py
from pydantic import TypeAdapter

from consumer.hits_base import BaseSubgraph, base_subgraph, url_host
from consumer.redis_store import redis_errors, stored_data
from consumer.text_index import match, query_terms
from producer.urls import UrlError, canonicalize_url
from ranker.hits import hits
from rankstream.errors import InputError

log = logging.getLogger("rankstream.consumer.hits")

__all__ = [
    "DEFAULT_CACHE_TTL",
    "MAX_CACHE_TTL",
    "MAX_IN",
    "MAX_K",
    "MAX_QUERY_CHARS",
    "MAX_ROOT_SIZE",
    "MAX_SEEDS",
    "BaseSubgraph",
    "HitsAnswer",
    "HitsQuery",
    "ScoredPage",
    "check_cache_ttl",
    "collect_subgraph",
    "run_hits",
    "url_host",
]

Normalization = Literal["l2", "sum"]

MAX_QUERY_CHARS = 512
MAX_SEEDS = 50
MAX_ROOT_SIZE = 1000
MAX_IN = 500
MAX_K = 1000
MAX_ITER = 10_000
DEFAULT_CACHE_TTL = 300
# A day: an answer is read only while the graph's version is unchanged, which on a
# live stream is seconds. Redis refuses an EX it cannot hold in milliseconds, and
# the cache write is best effort: a huge --cache-ttl silently cached nothing.
MAX_CACHE_TTL = 86_400
# Bumped whenever HitsAnswer's JSON changes, so old cache entries are never read.
_CACHE_FORMAT = 1
_SCORE_ALGORITHM = "pagerank"


@dataclass(frozen=True)
class HitsQuery:
    """One HITS request: a text query XOR seed URLs, plus options.

    Attributes:
        text: the text query (tokenised, lower-cased, stop words dropped).
        seeds: seed URLs (canonicalised); used instead of ``text``.
        k: how many hubs and authorities to return.
        root_size: root-set cap (Kleinberg: 200).
        max_in: in-linking pages added per root page (Kleinberg's t = 50).
        drop_intrinsic: drop links between pages of the same host (Kleinberg).
        host_weighting: Bharat & Henzinger weights (:func:`consumer.hits_base.host_weights`).
        normalize: ``"l2"`` (Kleinberg) or ``"sum"`` (networkx).
        tol, max_iter: passed to :func:`ranker.hits` (tol bounds the L1 change of hubs
            plus authorities in one power step, or their eigen-residual when the
            Lanczos fallback ran; max_iter caps both; default 1e-8).
    """

    text: str | None = None
    seeds: tuple[str, ...] = ()
    k: int = 10
    root_size: int = 200
    max_in: int = 50
    drop_intrinsic: bool = True
    host_weighting: bool = False
    normalize: Normalization = "l2"
    tol: float = 1e-8
    max_iter: int = 1000

    def __post_init__(self) -> None:
        # A list given by the caller becomes a tuple, so the query stays hashable.
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if (self.text is None) == (not self.seeds):
            raise InputError("give either a text query or seed URLs, not both or neither")
        if self.text is not None and len(self.text) > MAX_QUERY_CHARS:
            raise InputError(f"longer than {MAX_QUERY_CHARS} characters", where="q")
        if len(self.seeds) > MAX_SEEDS:
            raise InputError(f"more than {MAX_SEEDS} seeds", where="seed")
        _check_range("k", self.k, 1, MAX_K)
        _check_range("root_size", self.root_size, 1, MAX_ROOT_SIZE)
        _check_range("max_in", self.max_in, 0, MAX_IN)
        _check_range("max_iter", self.max_iter, 1, MAX_ITER)
        if self.normalize not in ("l2", "sum"):
            raise InputError("must be 'l2' or 'sum'", where="normalize")
        if not 0.0 < self.tol <= 1e-2:
            raise InputError("must be in (0, 0.01]", where="tol")

    def normal_form(self) -> dict[str, Any]:
        """The query as the cache sees it: sorted terms or distinct canonical seeds, plus
        options. Seeds are sorted unless there are more than ``root_size``: the root set
        takes the first ``root_size`` known ones, so then their order matters."""
        form: dict[str, Any] = {k: v for k, v in asdict(self).items() if k not in ("text", "seeds")}
        if self.text is not None:
            form["terms"] = query_terms(self.text)
        else:
            seeds = self.canonical_seeds()
            form["seeds"] = seeds if len(seeds) > self.root_size else sorted(seeds)
        return form

    def canonical_seeds(self) -> list[str]:
        """The seeds canonicalised, duplicates dropped, first occurrence order kept."""
        canonical: dict[str, None] = {}
        for seed in self.seeds:
            try:
                canonical[canonicalize_url(seed)] = None
            except UrlError as exc:
                raise InputError(f"bad seed URL {seed[:80]!r}: {exc}", where="seed") from exc
        return list(canonical)


@dataclass(frozen=True)
class ScoredPage:
    """A page and its hub or authority score."""

    url: str
    score: float


@dataclass(frozen=True)
class HitsAnswer:
    """What :func:`run_hits` returns (``to_dict`` is the JSON of the CLI and HTTP API)."""

    query: dict[str, Any]
    authorities: list[ScoredPage]
    hubs: list[ScoredPage]
    root_size: int
    base_size: int
    links: int
    intrinsic_dropped: int
    iterations: int
    error: float
    graph_version: int
    unknown_seeds: list[str]
    cached: bool = False
    timing_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HitsAnswer:
        """``to_dict`` reversed, every field's type checked (pydantic's ValidationError
        is a ValueError): a cached answer of the wrong shape must be recomputed, not
        crash the reader that prints it."""
        return _ANSWER.validate_python(data)


_ANSWER = TypeAdapter(HitsAnswer)


def run_hits(
    redis: Any,
    prefix: str,
    query: HitsQuery,
    *,
    cache_ttl: int = DEFAULT_CACHE_TTL,
    use_cache: bool = True,
) -> HitsAnswer:
    """Answer ``query`` from the live graph under ``prefix`` (or from the cache).

    Raises:
        InputError: a bad seed URL or a text query without searchable terms.
        ServiceUnavailable / ServiceError: Redis is down or answered with an error.
        ConvergenceError: HITS did not reach ``tol`` in ``max_iter`` steps.
    """
    started = time.perf_counter()
    normal = query.normal_form()
    with redis_errors("answering a HITS query"):
        versions = _versions(redis, prefix)
        key = _cache_key(prefix, normal, versions)
        if use_cache and (cached := _cached_answer(redis.get(key))) is not None:
            total = (time.perf_counter() - started) * 1000.0
            return replace(cached, cached=True, timing_ms={"total": total})
        timing: dict[str, float] = {}
        subgraph = collect_subgraph(redis, prefix, query, timing=timing)
        solve_started = time.perf_counter()
        result = hits(
            subgraph.adjacency, tol=query.tol, max_iter=query.max_iter, normalize=query.normalize
        )
        timing["solve"] = (time.perf_counter() - solve_started) * 1000.0
        answer = HitsAnswer(
            query=normal,
            authorities=_top(subgraph.urls, result.authorities, query.k, result.distance),
            hubs=_top(subgraph.urls, result.hubs, query.k, result.distance),
            root_size=int(subgraph.is_root.sum()),
            base_size=len(subgraph.urls),
            links=int(subgraph.adjacency.nnz),
            intrinsic_dropped=subgraph.intrinsic_dropped,
            iterations=result.iterations,
            error=result.error,
            graph_version=versions[0],
            unknown_seeds=subgraph.unknown_seeds,
        )
        # Reads were not atomic: if the graph moved meanwhile, the answer may mix two
        # states, so it is returned but never cached.
        if use_cache and _versions(redis, prefix) == versions:
            try:
                redis.set(key, json.dumps(answer.to_dict()), ex=cache_ttl)
            except redis_py.RedisError as exc:
                # A read-only replica, an ACL without writes, Redis gone this instant:
                # the answer stands, only the next identical query pays again.
                log.warning("HITS answer not cached", extra={"fields": {
                    "error": f"{type(exc).__name__}: {exc}"}})
    timing["total"] = (time.perf_counter() - started) * 1000.0
    return replace(answer, timing_ms=timing)


def collect_subgraph(
    redis: Any, prefix: str, query: HitsQuery, *, timing: dict[str, float] | None = None
) -> BaseSubgraph:
    """Root set -> base set -> weighted base subgraph, read from Redis in pipelines.

    ``timing`` (if given) receives ``root`` and ``base`` (base set and subgraph) in ms.
    """
    timing = {} if timing is None else timing
    started = time.perf_counter()
    # stored_data: ids that are not integers, in a term set or P page:id
    what = f"building the HITS base set under {prefix!r}"
    with redis_errors(what), stored_data(what):
        roots, urls, unknown = _root_set(redis, prefix, query)
        timing["root"] = (time.perf_counter() - started) * 1000.0
        started = time.perf_counter()
        subgraph = base_subgraph(
            redis, prefix, roots, urls, max_in=query.max_in,
            drop_intrinsic=query.drop_intrinsic, host_weighting=query.host_weighting,
        )
        timing["base"] = (time.perf_counter() - started) * 1000.0
    subgraph.unknown_seeds = unknown
    return subgraph


def _top(urls: list[str], scores: np.ndarray, k: int, distance: float) -> list[ScoredPage]:
    # Stable sort on URL-ordered entries: equal scores come out in URL order, equal up
    # to rounding too (sums taken in another order differ by ~1e-16: a review found
    # 4,304 of 12,706 exact ties listed against URL order). A score
    # within the solver's distance from its limit may be what the iteration left of a
    # page whose limit is 0 (one in a weaker component: 1e-8 after a power iteration,
    # exactly 0 after the fallback): listing it would depend on which path answered.
    order = np.argsort(-scores, kind="stable")
    if order.size > 1:
        # A tie group is the pages within 1e-12 of the top score, or within twice the
        # distance from the limit, of the group's highest score, listed by URL
        # (rounding to a grid would split ties straddling a grid line). Scores that
        # close may have one limit: exactly tied pages came out ordered by what the
        # iteration left (1e-9 apart at tol 1e-8, a review). Measured from the head,
        # not neighbour to neighbour: a chain of small steps joined pages 0.06 apart.
        ranked = scores[order]
        width = max(1e-12 * float(ranked[0]), 2.0 * distance)
        group = np.empty(ranked.size, dtype=np.int64)
        head, current = float(ranked[0]), 0
        for i, value in enumerate(ranked.tolist()):
            if head - value > width:
                head, current = value, current + 1
            group[i] = current
        order = order[np.lexsort((order, group))]
    order = order[:k]
    return [ScoredPage(urls[i], float(scores[i])) for i in order
            if scores[i] > distance and scores[i] > 0.0]


# --- root set ------------------------------------------------------------------------


def _root_set(
    redis: Any, prefix: str, query: HitsQuery
) -> tuple[list[int], dict[int, str], list[str]]:
    """Root page ids (best first), their URLs, and the seeds not in the graph.

    A removed page keeps its id (``P page:id``) but is no longer in the graph, so a
    seed naming one is reported as unknown, as a text query leaves it out.
    """
    if query.text is not None:
        found = match(redis, prefix, query_terms(query.text), query.root_size)
        return [m.page_id for m in found], {m.page_id: m.url for m in found}, []
    seeds = query.canonical_seeds()
    ids = redis.hmget(f"{prefix}page:id", seeds)
    known = [int(raw) for raw in ids if raw is not None]
    removed: set[int] = set()
    if known:
        gone = redis.smismember(f"{prefix}page:removed", known)
        removed = {page_id for page_id, flag in zip(known, gone, strict=True) if flag}
    roots: list[int] = []
    urls: dict[int, str] = {}
    unknown: list[str] = []
    for seed, raw in zip(seeds, ids, strict=True):
        if raw is None or int(raw) in removed:
            unknown.append(seed)
        elif len(roots) < query.root_size and int(raw) not in urls:
            roots.append(int(raw))
            urls[int(raw)] = seed
    # Sorted: a cached answer serves every order of the same seeds (normal_form).
    return roots, urls, sorted(unknown)


# --- cache and versions -------------------------------------------------------------


def _versions(redis: Any, prefix: str) -> tuple[int, str]:
    """The graph version and the id of the PageRank publication the answer depends on
    (not the meta's version: a publication without new events keeps that one)."""
    pipe = redis.pipeline(transaction=False)
    pipe.hget(f"{prefix}graph", "version")
    pipe.hget(f"{prefix}meta:{_SCORE_ALGORITHM}", "publication")
    graph_version, publication = pipe.execute()
    if isinstance(publication, bytes):  # a client with decode_responses gives str
        publication = publication.decode("utf-8", "replace")
    return _as_int(graph_version), publication or ""


def _as_int(raw: bytes | None) -> int:
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def _cached_answer(raw: bytes | str | None) -> HitsAnswer | None:
    if raw is None:
        return None
    try:
        return HitsAnswer.from_dict(json.loads(raw))
    except (ValueError, TypeError, KeyError, RecursionError):
        return None  # written by another version of rankstream (or not at all): recompute


def _cache_key(prefix: str, normal: dict[str, Any], versions: tuple[int, str]) -> str:
    payload = json.dumps(
        {"format": _CACHE_FORMAT, "query": normal, "versions": versions}, sort_keys=True
    )
    return f"{prefix}hits:cache:{hashlib.sha256(payload.encode()).hexdigest()[:32]}"


def check_cache_ttl(seconds: int, name: str = "--cache-ttl") -> None:
    """InputError unless ``seconds`` is a cache lifetime we can set (1 s .. a day)."""
    _check_range(name, seconds, 1, MAX_CACHE_TTL)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"must be an integer in [{low}, {high}], got {value!r}", where=name)
