"""Input limits (each violation in the DLQ with its reason) and URLs that must round-trip.

Limits are settings (``RANKSTREAM_MAX_URL_LENGTH``, ``..._MAX_LINKS_PER_PAGE``,
``..._MAX_MESSAGE_BYTES``, ``..._ALLOWED_SCHEMES``), so the consumer process gets
them from its environment, as in production. Each limit is checked on both sides
of its boundary: the event at the limit is applied, the one past it is a dead
letter whose ``error`` header names the limit, and the good events around them
are applied. URLs with unicode, percent-escapes, spaces, quotes and a very long
query string must come back byte for byte from Redis and from ``GET /score``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from consumer.http_api import create_app, server_config
from consumer.keys import Keys
from tests.faults.harness import audit, read_dead_letters, replay
from tests.faults.known_log import ODD_URLS, Message, encode
from tests.faults.stack import FaultStack, consumers
from tests.faults.summary import record


def page(url: str, links: list[Any], **extra: Any) -> dict[str, Any]:
    return {"type": "page", "url": url, "links": links, **extra}


def raw(event: dict[str, Any]) -> Message:
    """An event sent as is (the publisher would refuse to send an invalid one)."""
    return Message(json.dumps(event, ensure_ascii=False).encode(), b"raw")


def padded(event: dict[str, Any], size: int) -> Message:
    """``event`` with an ignored extra field making its JSON exactly ``size`` bytes."""
    bare = len(json.dumps({**event, "pad": ""}).encode())
    return raw({**event, "pad": "x" * (size - bare)})


def run_case(fault_stack: FaultStack, tmp_path: Path, name: str, log: list[Message],
             **limits: Any) -> tuple[Any, dict[bytes, str]]:
    settings = fault_stack.scenario(name, **limits)
    replay(settings, log)
    with consumers(settings, tmp_path) as spawn:
        proc = spawn("--until-caught-up")
        assert proc.wait(timeout=180) == 0, proc.output()[-3000:]
    client = fault_stack.client()
    result = audit(client, settings, log)
    client.close()
    letters = {value: headers["error"].decode() for value, headers in read_dead_letters(settings)}
    return result, letters


def expect_letters(letters: dict[bytes, str], rejected: dict[str, Message]) -> None:
    for reason, message in rejected.items():
        assert message.value in letters, f"{reason}: not in the DLQ"
        assert letters[message.value].startswith(reason), (reason, letters[message.value])
    assert len(letters) == len(rejected)


def test_configured_limits_send_each_violation_to_the_dlq(fault_stack: FaultStack,
                                                          tmp_path: Path) -> None:
    host = "https://limits.example/"
    at_limit_url = host + "u" * (200 - len(host))
    accepted = [
        encode(page(host, [at_limit_url])),  # a URL of exactly 200 characters
        encode(page(host + "links", [f"{host}{i}" for i in range(20)])),  # 20 links
        padded(page(host + "big", [host]), 4096),  # a message of exactly 4096 bytes
        encode(page("http://plain.example/", [host])),
    ]
    rejected = {
        "url too long": raw(page(host + "long", [at_limit_url + "x"])),
        "too many links": raw(page(host + "many", [f"{host}{i}" for i in range(21)])),
        "message too large": padded(page(host + "huge", [host]), 4097),
        "disallowed scheme": raw(page("file:///etc/hosts", [host])),
        "bad url": raw(page(host + "rel", ["../relative"])),
    }
    mixed = itertools.zip_longest(accepted, rejected.values())
    log = [m for pair in mixed for m in pair if m is not None]
    log.append(encode(page(host + "last", [host])))
    result, letters = run_case(fault_stack, tmp_path, "limits", log, max_url_length=200,
                               max_links_per_page=20, max_message_bytes=4096,
                               allowed_schemes=("http", "https"))
    expect_letters(letters, rejected)
    record("Input limits (configured)", faults=len(rejected), result=result,
           note="url 200 chars, 20 links, 4096-byte messages, http(s) only")
    result.check()


def test_default_limits(fault_stack: FaultStack, tmp_path: Path) -> None:
    host = "https://defaults.example/"
    url_8k = host + "q" * (8192 - len(host))
    accepted = [
        encode(page(host, [url_8k, "file:///srv/docs/index.html"])),
        encode(page(host + "hub", [f"{host}t/{i}" for i in range(10_000)])),
    ]
    rejected = {
        "url too long": raw(page(host + "long", [url_8k + "q"])),
        "too many links": raw(page(host + "many", [f"{host}t/{i}" for i in range(10_001)])),
        "message too large": padded(page(host + "huge", [host]), 1_048_577),
        "disallowed scheme": raw({"type": "link_added", "src": host, "dst": "ftp://x.example/"}),
    }
    log = [*accepted, *rejected.values(), encode(page(host + "end", [host]))]
    result, letters = run_case(fault_stack, tmp_path, "defaults", log)
    expect_letters(letters, rejected)
    assert result.links_expected == 10_003
    record("Input limits (defaults)", faults=len(rejected), result=result,
           note="8 KiB URL, 10,000 links, 1 MiB message, http/https/file")
    result.check()


@contextlib.contextmanager
def serving(client: Any, prefix: str) -> Iterator[str]:
    """The HTTP API over ``prefix`` on a free loopback port (uvicorn in a thread)."""
    server = uvicorn.Server(server_config(create_app(client, prefix), port=0,
                                          log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_unusual_urls_round_trip_through_redis_and_the_http_api(
        fault_stack: FaultStack, tmp_path: Path) -> None:
    hub = "https://hub.example/"
    log = [encode(page(url, [hub, *ODD_URLS], title=f"odd {i}"))
           for i, url in enumerate(ODD_URLS)]
    log.append(encode(page(hub, list(ODD_URLS))))
    settings = fault_stack.scenario("odd-urls")
    replay(settings, log)
    with consumers(settings, tmp_path) as spawn:
        assert spawn("--until-caught-up").wait(timeout=180) == 0
    client = fault_stack.client()
    keys = Keys(settings.key_prefix)
    with serving(client, settings.key_prefix) as base, \
            httpx.Client(base_url=base, timeout=30, trust_env=False) as http:
        for url in ODD_URLS:
            page_id = client.hget(keys.page_id, url.encode())
            assert page_id is not None, url
            assert client.hget(keys.page_url, page_id) == url.encode()
            stored = client.zscore(keys.scores("pagerank"), url.encode())
            assert stored is not None
            answer = http.get("/score", params={"url": url})
            assert answer.status_code == 200, (url[:80], answer.text[:300])
            assert answer.json()["url"] == url and answer.json()["score"] == stored
        top = http.get("/top", params={"k": 20}).json()
        assert {e["url"] for e in top["entries"]} == {*ODD_URLS, hub}
    result = audit(client, settings, log)
    client.close()
    record("Unusual URLs round-trip (Redis + HTTP)", faults=0, result=result,
           note=f"{len(ODD_URLS)} URLs: unicode, %-escapes, spaces, quotes, IPv6, file:, "
                f"a {max(map(len, ODD_URLS))}-char query")
    result.check()
