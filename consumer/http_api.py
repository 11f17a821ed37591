"""The HTTP query API (FastAPI): ``GET /hits``, ``/top``, ``/score``, ``/status``,
``/metrics``.

``rankstream serve`` runs :func:`create_app` on uvicorn; the OpenAPI schema is at
``/openapi.json`` (interactive docs at ``/docs``). Every input is bounded by a
pydantic ``Query`` constraint, so an oversized request is a 422 with the field
named, never work for the server. Every error's body is ``{"detail": "<one line>"}``,
and errors map to status codes as follows:

=====  =============================================================
400    a bad value the schema cannot express (bad URL, no query terms,
       both or neither of ``q`` and ``seed``), a parameter the endpoint
       does not take, or a single-valued parameter given twice
404    ``/score``: the URL has no published score
422    a request outside the schema's limits; HITS did not converge
502    Redis answered with an error
503    Redis is unreachable
=====  =============================================================

The endpoints are thin: HITS is :func:`consumer.hits_query.run_hits`; ``/top``,
``/score`` and ``/status`` are :mod:`consumer.readers` (what ``rankstream top``,
``score`` and ``status`` print); ``/metrics`` is ``/status`` in Prometheus' text
format (:mod:`consumer.metrics`). Non-finite numbers (an unpublished bound is
infinite) are sent as ``null``: JSON has no infinity.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import uvicorn
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, StringConstraints

from consumer import readers
from consumer.hits_query import (
    DEFAULT_CACHE_TTL,
    MAX_IN,
    MAX_ITER,
    MAX_K,
    MAX_QUERY_CHARS,
    MAX_ROOT_SIZE,
    MAX_SEEDS,
    HitsAnswer,
    HitsQuery,
    ScoredPage,
    run_hits,
)
from consumer.keys import Keys
from consumer.metrics import CONTENT_TYPE, render_metrics
from consumer.redis_store import check_layout
from producer.urls import canonicalize_url
from rankstream.errors import (
    ConfigError,
    ConvergenceError,
    InputError,
    RankstreamError,
    ServiceError,
    ServiceUnavailable,
)

__all__ = ["MAX_REQUEST_LINE_BYTES", "MAX_SCORE_URL_CHARS", "MAX_URL_CHARS", "create_app",
           "server_config"]

# A URL parameter may be this long (characters, before percent-encoding). Together
# with MAX_SEEDS and MAX_QUERY_CHARS it bounds the request line: 50 seeds of 4096
# four-byte characters percent-encode to 2.4 MB, under MAX_REQUEST_LINE_BYTES, so
# every request the schema allows reaches the app and gets a proper status code.
MAX_URL_CHARS = 4096
# GET /score looks up ONE stored URL, so it takes any URL the consumer accepts with
# its default limit (RANKSTREAM_MAX_URL_LENGTH, 8 KiB): a stored URL must round-trip
# (tests/faults/test_input_limits.py). Percent-encoded it stays far below the
# request-line limit.
MAX_SCORE_URL_CHARS = 8192
MAX_REQUEST_LINE_BYTES = 4 * 1024 * 1024
# Open connections (and requests in flight) before uvicorn answers 503: at most
# ~256 MiB of request buffers, and far more than the readers' Redis pool needs.
MAX_CONNECTIONS = 64
Algorithm = Literal["pagerank", "wpr"]
Scale = Literal["paper", "probability"]
Url = Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL_CHARS)]
ScoreUrl = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SCORE_URL_CHARS)]


# GET /hits answers with consumer.hits_query.HitsAnswer itself (a dataclass FastAPI
# documents as it is), so the CLI's JSON, the cache's and the API's cannot drift apart.


class MetaModel(BaseModel):
    """One algorithm's published-scores meta (see docs/redis-keys.md); unknown = null."""

    algorithm: str
    published: bool
    total: float | None
    bound: float | None
    relative_bound: float | None  # bound / total: what tolerance is compared with
    tolerance: float | None
    fresh: bool
    version: int
    refreshed_at: str
    offsets: dict[str, int]
    damping: float | None
    scale: str
    pages: int


class TopResponse(BaseModel):
    algorithm: str
    scale: str
    entries: list[ScoredPage]
    meta: MetaModel


class ScoreResponse(BaseModel):
    url: str
    algorithm: str
    scale: str
    score: float
    fresh: bool
    relative_bound: float | None  # null: no certified bound yet
    version: int
    refreshed_at: str


class StatusResponse(BaseModel):
    """What ``rankstream status`` shows: consumer health, graph counters, score meta."""

    prefix: str
    consumer: dict[str, Any]
    running: bool
    lock: Any
    graph: dict[str, int]
    offsets: dict[str, int]
    algorithms: dict[str, MetaModel]


class ErrorResponse(BaseModel):
    detail: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 502, 503)
}


def create_app(redis: Any, prefix: str, *, cache_ttl: int = DEFAULT_CACHE_TTL) -> FastAPI:
    """The API over the graph and scores under ``prefix``, read through client ``redis``."""
    keys = Keys(prefix)

    def check_layout_now() -> None:
        # Every request, not only at start: a server left up across an upgrade of the
        # consumer would otherwise answer from a layout it misreads (one HGET).
        try:
            check_layout(redis, keys)
        except ConfigError as exc:
            raise ServiceError(str(exc)) from exc

    app = FastAPI(
        title="rankstream",
        summary="Live PageRank / Weighted PageRank scores and on-demand HITS",
        version="1",
        dependencies=[Depends(_check_parameter_names), Depends(check_layout_now)],
    )
    _add_error_handlers(app)

    @app.get("/hits", response_model=HitsAnswer, responses=_ERRORS)
    def get_hits(
        q: Annotated[str | None, Query(min_length=1, max_length=MAX_QUERY_CHARS,
                                       description="text query (title and anchor terms)")] = None,
        seed: Annotated[list[Url] | None, Query(max_length=MAX_SEEDS,
                                                description="seed URLs, instead of q")] = None,
        k: Annotated[int, Query(ge=1, le=MAX_K)] = 10,
        root_size: Annotated[int, Query(ge=1, le=MAX_ROOT_SIZE)] = 200,
        max_in: Annotated[int, Query(ge=0, le=MAX_IN)] = 50,
        keep_intrinsic: Annotated[bool, Query(description="keep same-host links")] = False,
        host_weighting: Annotated[bool, Query(description="Bharat-Henzinger weights")] = False,
        normalize: Annotated[Literal["l2", "sum"], Query()] = "l2",
        max_iter: Annotated[int, Query(ge=1, le=MAX_ITER)] = 1000,
        nocache: Annotated[bool, Query(description="bypass the answer cache")] = False,
    ) -> dict[str, Any]:
        """Hubs and authorities of the base set of a text query or of seed URLs."""
        query = HitsQuery(
            text=q, seeds=tuple(seed or ()), k=k, root_size=root_size, max_in=max_in,
            drop_intrinsic=not keep_intrinsic, host_weighting=host_weighting,
            normalize=normalize, max_iter=max_iter,
        )
        answer = run_hits(redis, prefix, query, cache_ttl=cache_ttl, use_cache=not nocache)
        return answer.to_dict()

    @app.get("/top", response_model=TopResponse, responses=_ERRORS)
    def get_top(
        algorithm: Annotated[Algorithm, Query()] = "pagerank",
        k: Annotated[int, Query(ge=1, le=MAX_K)] = 10,
        scale: Annotated[Scale, Query(description="paper y, or y / sum(y)")] = "paper",
    ) -> dict[str, Any]:
        """The k best pages of a live ranking and its meta (freshness, bound)."""
        entries, info = readers.top_with_meta(redis, prefix, algorithm, k, scale)
        meta = info.as_dict()
        return readers.json_safe({
            "algorithm": algorithm, "scale": scale, "meta": meta,
            "entries": [{"url": url, "score": value} for url, value in entries],
        })

    @app.get("/score", response_model=ScoreResponse,
             responses={**_ERRORS, 404: {"model": ErrorResponse}})
    def get_score(
        url: Annotated[ScoreUrl, Query(description="page URL (canonicalised before lookup)")],
        algorithm: Annotated[Algorithm, Query()] = "pagerank",
        scale: Annotated[Scale, Query(description="paper y, or y / sum(y)")] = "paper",
    ) -> Any:
        """One page's live score, with the freshness of the publication it is from."""
        value, info = readers.score_with_meta(redis, prefix, url, algorithm, scale)
        if value is None:
            return JSONResponse({"detail": "no score for this URL"}, status_code=404)
        canonical = canonicalize_url(url)  # readers.score accepted it, so it is valid
        return readers.json_safe({
            "url": canonical, "algorithm": algorithm, "scale": scale, "score": value,
            "fresh": info.fresh, "relative_bound": info.relative_bound,
            "version": info.version, "refreshed_at": info.refreshed_at})

    @app.get("/status", response_model=StatusResponse, responses=_ERRORS)
    def get_status() -> dict[str, Any]:
        """Consumer health, graph counters and each algorithm's meta."""
        return readers.json_safe(readers.status(redis, prefix))

    @app.get("/metrics", response_class=PlainTextResponse, responses=_ERRORS)
    def get_metrics() -> Response:
        """``/status`` for Prometheus: consumer health, graph counters, score freshness."""
        body = render_metrics(readers.status(redis, prefix))
        return Response(body, media_type=CONTENT_TYPE)

    # HEAD wherever GET is, as HTTP asks of a general-purpose server (health checks use
    # it); the server sends the headers without the body. Left out of the schema: one
    # operation per path.
    for route in list(app.routes):
        if isinstance(route, APIRoute) and "GET" in (route.methods or ()):
            app.add_api_route(route.path, route.endpoint, methods=["HEAD"],
                              response_model=route.response_model,
                              responses=route.responses, include_in_schema=False)
    return app


def server_config(
    app: FastAPI, *, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info"
) -> uvicorn.Config:
    """The uvicorn configuration ``rankstream serve`` (and the HTTP tests) run the app with.

    h11's default 16 KiB limit on an incomplete request would cut off long but valid
    seed lists with a connection reset instead of an answer; we raise it to
    :data:`MAX_REQUEST_LINE_BYTES`. That buffer is per connection, and uvicorn has no
    timeout for reading a request's head, so :data:`MAX_CONNECTIONS` bounds what slow
    or idle clients can hold (about 4 MiB each); past it uvicorn answers 503. Exposed
    beyond loopback, the server belongs behind a proxy with header timeouts.
    """
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level,
        h11_max_incomplete_event_size=MAX_REQUEST_LINE_BYTES,
        limit_concurrency=MAX_CONNECTIONS,
    )


# Parameters a client may repeat: every other one is single-valued.
REPEATABLE_PARAMETERS = frozenset({"seed"})


def _check_parameter_names(request: Request) -> None:
    """Refuse a parameter the endpoint does not take, or a single-valued one given twice.

    Why: FastAPI silently ignores unknown parameters and keeps the LAST of repeated
    ones, so a typo (``?algoritm=wpr``) or a duplicate (``?k=5&k=500``) would answer a
    question the client did not ask, with a 200.
    """
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:  # not one of our endpoints (e.g. /docs): nothing to check
        return
    known = {param.alias for param in dependant.query_params}
    seen: set[str] = set()
    for name, _value in request.query_params.multi_items():
        if name not in known:
            takes = f"takes {', '.join(sorted(known))}" if known else "takes no parameters"
            shown = name if len(name) <= 64 else f"{name[:64]}..."  # not a 1 MB echo
            raise InputError(f"unknown parameter {shown!r}: this endpoint {takes}")
        if name in seen and name not in REPEATABLE_PARAMETERS:
            raise InputError(f"parameter {name!r} given more than once")
        seen.add(name)


def _add_error_handlers(app: FastAPI) -> None:
    statuses: list[tuple[type[RankstreamError], int]] = [
        (InputError, 400),
        (ConvergenceError, 422),
        (ServiceUnavailable, 503),
        (ServiceError, 502),
    ]
    for error_type, status in statuses:

        def handler(_request: Request, exc: Exception, status: int = status) -> JSONResponse:
            return JSONResponse({"detail": str(exc)}, status_code=status)

        app.add_exception_handler(error_type, handler)
    app.add_exception_handler(RequestValidationError, _validation_failed)


def _validation_failed(_request: Request, exc: Exception) -> JSONResponse:
    """A 422 in the one-line form of the other errors. FastAPI's own body is a list
    that echoes each bad value whole: 200,000 seeds came back as a 3.2 MB answer."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    reasons = [f"{'.'.join(str(part) for part in error.get('loc', ())[1:]) or 'request'}: "
               f"{error.get('msg', 'invalid')}" for error in errors[:3]]
    if len(errors) > 3:
        reasons.append(f"and {len(errors) - 3} more")
    return JSONResponse({"detail": "; ".join(reasons) or "invalid request"}, status_code=422)


