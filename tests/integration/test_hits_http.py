"""The HTTP API through a real server (uvicorn on loopback) and real clients.

httpx drives the hand-written checks; schemathesis reads the published
/openapi.json and throws generated requests at every operation, asserting that
none gets a 5xx. Both talk to the same uvicorn thread over TCP.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, settings
from prometheus_client.parser import text_string_to_metric_families
from schemathesis.checks import not_a_server_error

from consumer.hits_query import MAX_SEEDS
from consumer.http_api import create_app, server_config
from rankstream.services.testing import delete_keys, redis_client
from rankstream.settings import Settings
from tests.integration.conftest import HandGraph

# Canonical URLs with characters that must come back byte for byte.
ODD_URLS = [
    "https://bücher.example/straße/ü?q=ä ö",
    "https://pct.example/a%2Fb/%20x?y=%3D&z=%E2%82%AC",
    "https://space.example/with space/and 'quotes' \"too\"",
    "https://plus.example/a+b?c=d&e=f;g",
    "http://[::1]:8080/ipv6/path",
    "https://emoji.example/🙂/",
]


@pytest.fixture(scope="module")
def served(services: Settings) -> Iterator[tuple[str, HandGraph]]:
    """A uvicorn server on a free loopback port over a small graph; yields (base URL, graph)."""
    prefix = f"test:hits-http:{uuid.uuid4().hex[:10]}:"
    client = redis_client(services)
    graph = HandGraph(client, prefix)
    hubs = ["https://h1.com/", "https://h2.org/", "https://h3.net/", *ODD_URLS[:2]]
    authorities = ["https://good1.org/", "https://good2.org/", *ODD_URLS[2:]]
    graph.write(
        [(h, a) for h in hubs for a in authorities],
        titles={"https://good1.org/": "Python tutorial", "https://bücher.example/straße/ü?q=ä ö":
                "Bücher über Python"},
        anchors=[("https://h1.com/", "https://good2.org/", "the python docs")],
        pagerank={u: 1.0 + i / 10 for i, u in enumerate(hubs + authorities)},
    )
    client.hset(f"{prefix}meta:pagerank", mapping={"total": 12.5, "bound": 1e-7, "version": 1})
    client.hset(f"{prefix}status", mapping={"state": "running"})
    server = uvicorn.Server(server_config(create_app(client, prefix), port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", graph
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        client.close()
        delete_keys(services, prefix)


@pytest.fixture
def http(served: tuple[str, HandGraph]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0], timeout=30, trust_env=False) as client:
        yield client


def test_openapi_schema_is_published(http: httpx.Client) -> None:
    schema = http.get("/openapi.json").json()
    assert {"/hits", "/top", "/score", "/status", "/metrics"} <= set(schema["paths"])
    params = {p["name"]: p["schema"] for p in schema["paths"]["/hits"]["get"]["parameters"]}
    assert params["k"]["maximum"] == 1000 and params["seed"]["anyOf"][0]["maxItems"] == MAX_SEEDS


def test_hits_by_text_and_by_seed(http: httpx.Client) -> None:
    by_text = http.get("/hits", params={"q": "python", "k": 3})
    assert by_text.status_code == 200, by_text.text
    body = by_text.json()
    assert body["query"]["terms"] == ["python"] and body["root_size"] == 3
    assert body["base_size"] == 11 and body["links"] == 5 * 6
    assert len(body["authorities"]) == 3 and body["iterations"] >= 1

    # h1's out-links reach every authority; good1's in-links reach every hub.
    by_seed = http.get("/hits", params=[("seed", "https://h1.com/"), ("seed", "https://good1.org"),
                                        ("k", "100")])
    assert by_seed.status_code == 200, by_seed.text
    urls = {p["url"] for p in by_seed.json()["authorities"] + by_seed.json()["hubs"]}
    assert set(ODD_URLS) <= urls  # odd URLs come back unchanged


def test_hits_answers_come_from_the_cache_until_the_graph_changes(
    http: httpx.Client, served: tuple[str, HandGraph]
) -> None:
    params = {"q": "tutorial", "host_weighting": "true"}
    assert http.get("/hits", params=params).json()["cached"] is False
    assert http.get("/hits", params=params).json()["cached"] is True
    served[1].client.hincrby(f"{served[1].prefix}graph", "version", 1)
    assert http.get("/hits", params=params).json()["cached"] is False


@pytest.mark.parametrize(
    ("params", "status", "field"),
    [
        ({}, 400, "either"),
        ({"q": "python", "seed": "https://h1.com/"}, 400, "either"),
        ({"q": "the and of"}, 400, "no searchable terms"),
        ({"seed": "no scheme"}, 400, "bad seed URL"),
        ({"q": "x" * 513}, 422, "q"),
        ({"seed": ["https://a.org/"] * (MAX_SEEDS + 1)}, 422, "seed"),
        ({"q": "python", "k": 0}, 422, "k"),
        ({"q": "python", "k": 1001}, 422, "k"),
        ({"q": "python", "root_size": 1001}, 422, "root_size"),
        ({"q": "python", "max_in": 501}, 422, "max_in"),
        ({"q": "python", "normalize": "max"}, 422, "normalize"),
    ],
)
def test_bad_hits_requests_get_clear_4xx(
    http: httpx.Client, params: dict[str, Any], status: int, field: str
) -> None:
    response = http.get("/hits", params=params)
    assert response.status_code == status, response.text
    assert field in response.text
    detail = response.json()["detail"]  # one line, as every error: not a list echoing input
    assert isinstance(detail, str) and "\n" not in detail and len(detail) < 300


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/top?k=5&k=500", "parameter 'k' given more than once"),
        ("/hits?q=python&q=tutorial", "parameter 'q' given more than once"),
        ("/top?algoritm=wpr",
         "unknown parameter 'algoritm': this endpoint takes algorithm, k, scale"),
        ("/status?verbose=1", "unknown parameter 'verbose': this endpoint takes no parameters"),
    ],
)
def test_unknown_and_repeated_parameters_are_400_not_silently_dropped(
    http: httpx.Client, path: str, detail: str
) -> None:
    response = http.get(path)
    assert response.status_code == 400, response.text
    assert response.json() == {"detail": detail}


def test_seed_may_repeat(http: httpx.Client) -> None:
    response = http.get("/hits?seed=https://h1.com/&seed=https://h2.org/")
    assert response.status_code == 200, response.text


def test_top_and_score_round_trip_odd_urls(http: httpx.Client) -> None:
    top = http.get("/top", params={"k": 1000})
    assert top.status_code == 200
    entries = top.json()["entries"]
    assert [e["score"] for e in entries] == sorted((e["score"] for e in entries), reverse=True)
    assert set(ODD_URLS) <= {e["url"] for e in entries}
    assert top.json()["meta"]["total"] == 12.5 and top.json()["meta"]["published"]
    for url in ODD_URLS:
        response = http.get("/score", params={"url": url})
        assert response.status_code == 200, (url, response.text)
        assert response.json()["url"] == url
        assert response.json()["score"] == next(e["score"] for e in entries if e["url"] == url)
        # The freshness of the publication the score comes from, read in the same MULTI.
        meta = top.json()["meta"]
        assert {k: response.json()[k] for k in ("fresh", "version", "relative_bound")} == {
            k: meta[k] for k in ("fresh", "version", "relative_bound")}
    assert http.get("/score", params={"url": "https://unknown.example/"}).status_code == 404
    assert http.get("/score", params={"url": "nope"}).status_code == 400
    assert http.get("/score", params={"url": "https://a.org/", "algorithm": "x"}).status_code == 422


def test_status_and_an_unpublished_ranking(http: httpx.Client) -> None:
    body = http.get("/status").json()
    assert body["graph"]["version"] >= 1
    assert body["algorithms"]["pagerank"]["bound"] == 1e-7
    assert body["consumer"] == {"state": "running"}
    # wpr was never published: its bound is infinite, which JSON spells null.
    assert body["algorithms"]["wpr"]["published"] is False
    assert body["algorithms"]["wpr"]["bound"] is None
    wpr = http.get("/top", params={"algorithm": "wpr"}).json()
    assert wpr["entries"] == [] and wpr["meta"]["bound"] is None


def test_metrics_are_the_status_in_prometheus_text_format(http: httpx.Client) -> None:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(response.text)
               for sample in family.samples}
    status = http.get("/status").json()
    # The hand-made graph counts only its version; counters it lacks are left out.
    assert [name for name, _ in samples if name.startswith("rankstream_graph_")] == [
        "rankstream_graph_events_applied_total"]
    assert samples[("rankstream_graph_events_applied_total", ())] == status["graph"]["version"]
    pagerank, wpr = (("algorithm", "pagerank"),), (("algorithm", "wpr"),)
    assert samples[("rankstream_scores_bound", pagerank)] == 1e-7
    assert samples[("rankstream_scores_bound", wpr)] == math.inf  # never published
    assert samples[("rankstream_consumer_running", ())] == 0.0  # no lease in this fixture
    assert samples[("rankstream_consumer_info", (("host", ""), ("pid", ""),
                                                 ("state", "running"), ("topic", "")))] == 1
    assert http.get("/metrics", params={"name": "x"}).status_code == 400


def test_head_answers_wherever_get_does(http: httpx.Client) -> None:
    # HTTP asks it of every GET resource, and health checks use it.
    for path in ("/status", "/top", "/hits?q=python", "/metrics"):
        head, get = http.head(path), http.get(path)
        assert head.status_code == get.status_code == 200
        # (The length is that of the body a GET would get now: /status changes by itself.)
        assert head.content == b"" and int(head.headers["content-length"]) > 0
    assert http.head("/score", params={"url": "https://unknown.example/"}).status_code == 404


# The schema does not depend on Redis, so it is loaded at import from the app's own
# OpenAPI document (schemathesis' lazy from_fixture loader does not run on pytest 9);
# the requests still go over TCP to the uvicorn server of the `served` fixture.
schema = schemathesis.openapi.from_dict(create_app(None, "unused:").openapi())


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_never_get_a_server_error(
    case: Any, served: tuple[str, HandGraph]
) -> None:
    case.call_and_validate(base_url=served[0], checks=[not_a_server_error], timeout=30)


def test_partial_or_foreign_state_gives_json_errors_not_wrong_numbers(
    http: httpx.Client, served: tuple[str, HandGraph]
) -> None:
    """Scores without a meta total cannot be put on the probability scale (they used to
    come back as paper-scale values labelled probabilities); a lease key holding a
    JSON scalar used to make /status a plain-text 500."""
    client, prefix = served[1].client, served[1].prefix
    client.zadd(f"{prefix}scores:wpr", {"https://h1.com/": 1.5})
    client.set(f"{prefix}lock", "123")
    try:
        paper = http.get("/top", params={"algorithm": "wpr"})
        assert paper.status_code == 200 and paper.json()["entries"][0]["score"] == 1.5
        for path, params in (("/top", {"algorithm": "wpr", "scale": "probability"}),
                             ("/score", {"url": "https://h1.com/", "algorithm": "wpr",
                                         "scale": "probability"})):
            response = http.get(path, params=params)
            assert response.status_code == 502, response.text
            assert "no positive total" in response.json()["detail"]
        status = http.get("/status")
        assert status.status_code == 200 and status.json()["lock"] == {"raw": "123"}
    finally:
        client.delete(f"{prefix}scores:wpr", f"{prefix}lock")


@pytest.mark.parametrize(
    ("key", "write", "paths"),
    [
        # offsets that are not a JSON object of offsets: a TypeError inside the reader
        ("meta:pagerank", ("hset", "offsets", "5"), ("/top", "/status")),
        ("meta:pagerank", ("hset", "offsets", '{"a":"x"}'), ("/top", "/status")),
        ("meta:pagerank", ("hset", "total", "abc"), ("/top", "/status")),
        ("meta:pagerank", ("hset", "tolerance", "nan"), ("/top", "/status")),
        # a score no publication writes
        ("scores:pagerank", ("zadd", "inf", "https://h1.com/"), ("/top", "/score")),
        # ids that are not integers, in a term set and in P page:id
        ("term:zzgarb", ("sadd", "abc"), ("/hits?q=zzgarb",)),
        ("page:id", ("hset", "https://garb.example/", "x"), ("/hits?seed=https://garb.example/",)),
    ],
)
def test_values_rankstream_never_writes_are_502_with_the_reason(
    http: httpx.Client, served: tuple[str, HandGraph], key: str, write: tuple[str, ...],
    paths: tuple[str, ...],
) -> None:
    """Each used to be a 500 (and a traceback in the CLI readers)."""
    client, prefix = served[1].client, served[1].prefix
    full = f"{prefix}{key}"
    saved = client.dump(full)
    client.execute_command(write[0], full, *write[1:])
    try:
        for path in paths:
            params = {"url": "https://h1.com/"} if path == "/score" else None
            response = http.get(path, params=params)
            assert response.status_code == 502, (path, response.text)
            assert "unexpected data" in response.json()["detail"]
    finally:
        client.delete(full)
        if saved is not None:
            client.restore(full, 0, saved)


def test_data_of_another_key_layout_is_refused_with_every_request(
        http: httpx.Client, served: tuple[str, HandGraph]) -> None:
    """`serve` checked the layout only at its start: a server left up across an
    upgrade would answer from data it misreads. Now each request checks (502)."""
    graph = served[1]
    graph.client.hset(f"{graph.prefix}graph", "layout", 2)
    try:
        for path in ("/top", "/status", "/hits?q=python"):
            answer = http.get(path)
            assert answer.status_code == 502, (path, answer.text)
            assert "key layout 2" in answer.json()["detail"]
    finally:
        graph.client.hdel(f"{graph.prefix}graph", "layout")
    assert http.get("/top").status_code == 200
