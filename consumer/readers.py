"""Reading published scores and consumer health straight from Redis.

These functions are what `rankstream top/score/status` and the HTTP API call.
They only read, never need the consumer to be running, and use the public key
layout of docs/redis-keys.md (the same one a ``redis-cli`` user sees).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis

from consumer.keys import ALGORITHMS, Keys
from consumer.publication import relative_bound
from consumer.redis_store import decoded, decoded_hash, redis_errors, stored_data
from rankstream.errors import InputError, ServiceError, ServiceUnavailable

Scale = Literal["paper", "probability"]
SCALES: tuple[str, ...] = ("paper", "probability")
MAX_TOP_K = 10_000
TOP_READ_ATTEMPTS = 5  # a publication lands every ~0.5 s at the most


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise InputError(f"unknown algorithm {algorithm!r} (choose from {', '.join(ALGORITHMS)})",
                         where="algorithm")


def _not_nan(value: Any, name: str) -> float:
    """A stored bound: inf means nothing certified yet, NaN is never written."""
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{name} is nan")
    return number


def _finite(value: Any, name: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} is {number}")
    return number


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None: JSON has no inf or nan (an
    unpublished bound is inf)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _offsets(raw: str | None) -> dict[str, int]:
    offsets = json.loads(raw) if raw else {}
    if not (isinstance(offsets, dict)
            and all(type(v) is int for v in offsets.values())):
        raise ValueError(f"offsets is not a JSON object of offsets: {(raw or '')[:80]!r}")
    return offsets


@dataclass(frozen=True)
class Meta:
    """``P meta:{algorithm}``, typed. ``published`` is False before the first publication."""

    algorithm: str
    published: bool
    total: float = 0.0
    bound: float = float("inf")
    tolerance: float = 0.0
    fresh: bool = False
    version: int = 0
    refreshed_at: str = ""
    offsets: Mapping[str, int] | None = None
    damping: float = 0.0
    scale: str = "paper"
    pages: int = 0
    stored_relative: float | None = None  # the hash's relative_bound, as published

    @classmethod
    def from_hash(cls, algorithm: str, raw: Mapping[str, str]) -> Meta:
        """Raises ValueError (or TypeError) for values rankstream never writes; see
        :func:`stored_data`."""
        if not raw:
            return cls(algorithm, published=False)
        bound = _not_nan(raw.get("bound", "inf"), "bound")
        return cls(
            algorithm=algorithm,
            published=True,
            total=_finite(raw.get("total", 0.0), "total"),
            bound=bound,  # inf: nothing certified yet
            tolerance=_finite(raw.get("tolerance", 0.0), "tolerance"),
            fresh=raw.get("fresh") == "1",
            version=int(raw.get("version", 0)),
            refreshed_at=raw.get("refreshed_at", ""),
            offsets=_offsets(raw.get("offsets")),
            damping=_finite(raw.get("damping", 0.0), "damping"),
            scale=raw.get("scale", "paper"),
            pages=int(raw.get("pages", 0)),
            stored_relative=(_not_nan(raw["relative_bound"], "relative_bound")
                             if "relative_bound" in raw else None),
        )

    @property
    def relative_bound(self) -> float:
        """The bound as a share of sum(y): what ``tolerance`` is compared with. On the
        probability scale (x = y / total) the L1 error is at most TWICE this: the
        published total is off from the exact sum by up to the bound too. The
        publisher's own figure (:func:`consumer.publication.meta_fields`) when the hash
        has one."""
        if self.stored_relative is not None:
            return self.stored_relative
        return relative_bound(self.bound, self.total)

    def describe(self, scale: str = "paper") -> str:
        """One line on freshness: the absolute bound beside a relative tolerance made an
        honest fresh publication look ``total`` times over it. ``scale``: that of the
        scores printed beside it."""
        return describe_bound(self.fresh, self.bound, self.relative_bound, self.tolerance,
                              scale=scale)

    def as_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm, "published": self.published, "total": self.total,
            "bound": self.bound, "relative_bound": self.relative_bound,
            "tolerance": self.tolerance, "fresh": self.fresh,
            "version": self.version, "refreshed_at": self.refreshed_at,
            "offsets": dict(self.offsets or {}), "damping": self.damping, "scale": self.scale,
            "pages": self.pages,
        }


def describe_bound(fresh: bool, bound: float, relative: float, tolerance: float, *,
                   scale: str = "paper") -> str:
    """``fresh, certified L1 bound 2.1e-04 = 3.9e-07 of sum(y) (tolerance 1e-06 of sum(y))``.

    On the probability scale the bound is that of the scores as printed: at most twice
    the relative bound (:attr:`Meta.relative_bound`), not the paper-scale figure, which
    is ``total`` times larger than the scores themselves.
    """
    state = "fresh" if fresh else "NOT fresh"
    if not math.isfinite(bound):
        return f"{state}, no certified bound yet (tolerance {tolerance:.1e} of sum(y))"
    if scale == "probability":
        return (f"{state}, certified L1 bound {2.0 * relative:.1e} on the probability "
                f"scale (tolerance {tolerance:.1e} of sum(y))")
    return (f"{state}, certified L1 bound {bound:.2e} = {relative:.1e} of sum(y) "
            f"(tolerance {tolerance:.1e} of sum(y))")


def meta(client: redis.Redis, prefix: str, algorithm: str) -> Meta:
    """The meta hash of one algorithm."""
    _check_algorithm(algorithm)
    with redis_errors("reading the score meta"):
        raw = client.hgetall(Keys(prefix).meta(algorithm))
    with stored_data(f"reading the {algorithm} meta"):
        return Meta.from_hash(algorithm, decoded_hash(raw))


def top(client: redis.Redis, prefix: str, algorithm: str = "pagerank", k: int = 10,
        scale: Scale = "paper") -> list[tuple[str, float]]:
    """The ``k`` best pages as ``(url, score)``, best first.

    ``scale="probability"`` divides by the published ``total`` (sum of y), so the
    scores of all pages add up to 1.
    """
    return top_with_meta(client, prefix, algorithm, k, scale)[0]


def top_with_meta(client: redis.Redis, prefix: str, algorithm: str = "pagerank", k: int = 10,
                  scale: Scale = "paper") -> tuple[list[tuple[str, float]], Meta]:
    """:func:`top` and the :class:`Meta` of the publication those rows belong to."""
    _check_algorithm(algorithm)
    if not 1 <= k <= MAX_TOP_K:
        raise InputError(f"must be between 1 and {MAX_TOP_K}", where="k")
    if scale not in SCALES:
        raise InputError(f"unknown scale {scale!r} (paper or probability)", where="scale")
    keys = Keys(prefix)
    with redis_errors("reading the top pages"), stored_data(f"reading the {algorithm} top pages"):
        rows, meta = _top_rows(client, keys, algorithm, k)
        info = Meta.from_hash(algorithm, meta)
        divisor = 1.0
        if scale == "probability" and rows:
            divisor = _probability_divisor(algorithm, info.total)
        return [(url, _finite(value, "a score") / divisor) for url, value in rows], info


def _top_rows(client: redis.Redis, keys: Keys, algorithm: str, k: int
              ) -> tuple[list[tuple[str, float]], dict[str, str]]:
    """The ``k`` best rows, ties by URL ascending as ``rank`` and HITS order them, and
    the meta of their publication.

    ZREVRANGE orders equal scores by member *descending*, so where ``k`` cut a group
    of tied pages (exact ties are common: pages alike in the graph get bit-identical
    scores) the members at the cut are read again in ascending order. That second
    read must see the same publication as the first; a publication between the two
    (the ``publication`` meta field changed) means reading again.
    """
    scores, meta_key = keys.scores(algorithm), keys.meta(algorithm)
    for _ in range(TOP_READ_ATTEMPTS):
        with client.pipeline(transaction=True) as pipe:
            # MULTI so the rows, the total they are divided by and the freshness and
            # bound shown beside them all come from the same publication.
            pipe.zrevrange(scores, 0, k - 1, withscores=True)
            pipe.hgetall(meta_key)
            raw_rows, meta_raw = pipe.execute()
        meta = decoded_hash(meta_raw)
        rows = sorted(((decoded(url), float(value)) for url, value in raw_rows),
                      key=lambda row: (-row[1], row[0]))
        if len(rows) < k:
            return rows, meta
        last = rows[-1][1]
        above = [row for row in rows if row[1] > last]
        with client.pipeline(transaction=True) as pipe:
            pipe.zrange(scores, last, last, byscore=True, offset=0, num=k - len(above))
            pipe.hget(meta_key, "publication")
            tied, publication = pipe.execute()
        if (None if publication is None else decoded(publication)) == meta.get("publication"):
            return above + [(decoded(url), last) for url in tied], meta
    raise ServiceUnavailable(f"the {algorithm} scores were republished during each of "
                             f"{TOP_READ_ATTEMPTS} reads; try again")


def score(client: redis.Redis, prefix: str, url: str, algorithm: str = "pagerank",
          scale: Scale = "paper") -> float | None:
    """One URL's score (canonicalised first); None if the page has no published score."""
    return score_with_meta(client, prefix, url, algorithm, scale)[0]


def score_with_meta(client: redis.Redis, prefix: str, url: str, algorithm: str = "pagerank",
                    scale: Scale = "paper") -> tuple[float | None, Meta]:
    """:func:`score` and the :class:`Meta` (freshness, bound) of its publication."""
    from producer.urls import UrlError, canonicalize_url

    _check_algorithm(algorithm)
    try:
        canonical = canonicalize_url(url)
    except UrlError as exc:
        raise InputError(f"bad URL: {exc}", where="url") from exc
    keys = Keys(prefix)
    with redis_errors("reading a score"), client.pipeline(transaction=True) as pipe:
        pipe.zscore(keys.scores(algorithm), canonical)
        pipe.hgetall(keys.meta(algorithm))
        value, meta_raw = pipe.execute()
    with stored_data(f"reading a {algorithm} score"):
        info = Meta.from_hash(algorithm, decoded_hash(meta_raw))
        if value is None:
            return None, info
        divisor = _probability_divisor(algorithm, info.total) if scale == "probability" else 1.0
        return _finite(value, "the score") / divisor, info


def _probability_divisor(algorithm: str, total: float) -> float:
    """``sum(y)`` to divide by for the probability scale. Scores without a positive
    total (no meta, or one written by something else) are an error, not paper-scale
    values labelled probabilities."""
    if not (math.isfinite(total) and total > 0.0):
        raise ServiceError(f"the {algorithm} meta has no positive total, which the "
                           "probability scale divides by")
    return total


def status(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """Consumer health, graph counters and per-algorithm meta, as one JSON-able dict."""
    keys = Keys(prefix)
    # One MULTI: a graph transaction and a publication landing between the reads could
    # otherwise show a meta version ahead of the graph's.
    with redis_errors("reading the status"), client.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.status)
        pipe.hgetall(keys.graph)
        pipe.hgetall(keys.offsets)
        pipe.get(keys.lock)
        for algorithm in ALGORITHMS:
            pipe.hgetall(keys.meta(algorithm))
        replies = pipe.execute()
    with stored_data("reading the status"):
        return _status_dict(prefix, replies)


def _status_dict(prefix: str, replies: list[Any]) -> dict[str, Any]:
    consumer = decoded_hash(replies[0])
    for name in ("lag", "bound", "fresh"):
        if name in consumer:
            with contextlib.suppress(ValueError, RecursionError):  # shown as stored
                consumer[name] = json.loads(consumer[name])
    lock_raw = replies[3]
    lock: Any = None
    if lock_raw is not None:
        try:
            lock = json.loads(lock_raw)
        except (ValueError, RecursionError):
            lock = None
        if isinstance(lock, dict):
            lock.pop("token", None)
        else:  # not the lease's JSON object: shown as it is
            lock = {"raw": decoded(lock_raw)}
    return {
        "prefix": prefix,
        "consumer": consumer,
        "running": lock is not None,
        "lock": lock,
        "graph": {k: int(v) for k, v in decoded_hash(replies[1]).items()},
        "offsets": {k: int(v) for k, v in decoded_hash(replies[2]).items()},
        "algorithms": {
            algorithm: Meta.from_hash(algorithm, decoded_hash(raw)).as_dict()
            for algorithm, raw in zip(ALGORITHMS, replies[4:], strict=True)
        },
    }
