"""Fuzzing event decoding: any bytes in, an event or an InputError out, nothing evaluated.

``producer.schema.decode_event`` is the only way message bytes become events, so
it is the whole attack surface of the consumer's input. Hypothesis throws raw
bytes, arbitrary JSON, event-shaped objects with hostile field values and
mutations of valid messages at it, with a bounded number of examples (a few
seconds each in CI). Properties:

* it returns an event, or raises ``InputError`` whose message starts with one of
  the documented categories (docs/events.md), never any other exception;
* a decoded event respects the limits and survives ``encode_event`` -> decode
  unchanged;
* nothing is ever evaluated: payloads that would create a file if anything ran
  them as code leave no file, and no module on the input path calls
  ``eval``/``exec``/``compile``/``pickle``/``marshal``/``yaml`` (checked on the AST).

The last test streams a few hundred garbage messages through a live consumer: it
must dead-letter every one of them and apply the valid events between them.
"""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer.schema import Limits, PageEvent, decode_event, encode_event
from rankstream.errors import InputError
from tests.faults.harness import audit, replay
from tests.faults.known_log import Message, build_log
from tests.faults.stack import FaultStack, consumers
from tests.faults.summary import record

ROOT = Path(__file__).resolve().parents[2]
CANARY = Path("/tmp/rankstream-fuzz-canary")
CATEGORIES = ("empty message", "message too large", "not UTF-8", "malformed JSON",
              "not a JSON object", "missing field", "unknown type", "unsupported version",
              "wrong type",
              "bad url", "url too long", "disallowed scheme", "too many links", "bad ts",
              "bad text")
LIMITS = Limits(max_url_length=120, max_links_per_page=12, max_message_bytes=4096)


def fuzz(examples: int) -> Any:
    """Bounded: a fixed number of examples (a few seconds each on our 2-core CI box)."""
    return settings(max_examples=examples, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Strings that do something if anything evaluates them (Python, shell, templates).
PAYLOADS = [
    f"__import__('os').system('touch {CANARY}')",
    f"{{{{ ''.__class__.__mro__[1].__subclasses__() }}}}$(touch {CANARY})`touch {CANARY}`",
    f"!!python/object/apply:os.system ['touch {CANARY}']",
    f"https://x.example/$(touch {CANARY})",
    f"javascript:eval('touch {CANARY}')",
    "https://x.example/%00%0a%0d",
    "https://x.example/" + "\u202e" + "gnp.exe",
]


def check(raw: bytes, limits: Limits = LIMITS) -> None:
    try:
        event = decode_event(raw, limits)
    except InputError as exc:
        assert str(exc).startswith(CATEGORIES), str(exc)
        return
    assert event == decode_event(encode_event(event), limits)
    urls = [event.url, *event.links] if isinstance(event, PageEvent) else [
        getattr(event, name) for name in ("url", "src", "dst") if hasattr(event, name)]
    for url in urls:
        assert len(url) <= limits.max_url_length and url.split(":")[0] in limits.allowed_schemes
    if isinstance(event, PageEvent):
        assert len(event.links) <= limits.max_links_per_page


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=6),
    max_leaves=30)
urlish = st.one_of(
    st.sampled_from(PAYLOADS),
    st.sampled_from(["https://a.example/", "http://B.example:80/x#f", "file:///x",
                     "ftp://a/", "https://", "//a/b", "HTTPS://a.example", "mailto:x@y"]),
    st.builds(lambda s, p: f"{s}://{p}", st.sampled_from(["http", "https", "file", "gopher"]),
              st.text(max_size=60)),
    st.text(max_size=130),
    json_values,
)
plausible_urls = st.builds(
    lambda scheme, host, path: f"{scheme}://{host}/{path}",
    st.sampled_from(["http", "https", "HTTPS", "file", "ftp"]),
    st.text(st.characters(codec="utf-8", exclude_characters="/?#"), min_size=1, max_size=12),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), max_size=40))
urls = st.one_of(plausible_urls, plausible_urls, urlish)
link_items = st.one_of(urls, st.fixed_dictionaries({"url": urls},
                                                   optional={"text": st.text() | json_values}))
optional = {"title": st.text(max_size=20) | json_values,
            "ts": st.integers(-10, 2**64) | st.sampled_from(["2026-01-01", "yesterday",
                                                             "2026-01-01T00:00:00+01:00"])
            | json_values,
            "v": st.sampled_from([1, 1, 1, 2, 0, "1", 1.0, True]),
            "extra": json_values}
events = st.one_of(
    st.fixed_dictionaries({"type": st.just("page"), "url": urls,
                           "links": st.lists(link_items, max_size=16)}, optional=optional),
    st.fixed_dictionaries({"type": st.sampled_from(["link_added", "link_removed"]),
                           "src": urls, "dst": urls}, optional=optional),
    st.fixed_dictionaries({"type": st.just("page_removed"), "url": urls}, optional=optional),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["page", "link_added", "page_removed", "crawl"]) | json_values},
        optional={"url": urlish, "src": urlish, "dst": urlish, "links": json_values,
                  **optional}),
)


def as_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@fuzz(3000)
@given(st.binary(max_size=600))
def test_any_bytes(raw: bytes) -> None:
    check(raw)


@fuzz(1000)
@given(json_values)
def test_any_json(value: Any) -> None:
    check(as_bytes(value))


@fuzz(600)
@given(events)
def test_event_shaped_objects(event: dict[str, Any]) -> None:
    check(as_bytes(event))
    check(json.dumps(event).encode())  # ASCII-escaped: lone surrogates arrive as \ud800


VALID = [
    b'{"type":"page","url":"https://a.example/","links":["https://b.example/",'
    b'{"url":"https://c.example/x y","text":"C"}],"title":"A","ts":1767225600000}',
    b'{"type":"link_added","src":"https://a.example/","dst":"file:///d","ts":"2026-01-01"}',
    b'{"type":"page_removed","url":"http://a.example:8080/p?q=1"}',
]


@fuzz(1000)
@given(st.sampled_from(VALID), st.lists(st.tuples(st.integers(0, 200), st.binary(max_size=4),
                                                  st.integers(0, 3)), max_size=4))
def test_mutated_valid_messages(base: bytes, edits: list[tuple[int, bytes, int]]) -> None:
    raw = bytearray(base)
    for position, insert, delete in edits:
        at = position % (len(raw) + 1)
        raw[at:at + delete] = insert
    check(bytes(raw))


def test_nothing_was_evaluated() -> None:
    for payload in PAYLOADS:
        for event in ({"type": "page", "url": payload, "links": [payload]},
                      {"type": "page", "url": "https://a.example/", "links": [payload],
                       "title": payload}):
            check(as_bytes(event), Limits())
    assert not CANARY.exists()


FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_MODULES = {"pickle", "marshal", "shelve", "yaml", "dill"}


def test_the_input_path_has_no_evaluating_calls() -> None:
    for package in ("producer", "consumer", "rankstream"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    assert node.func.id not in FORBIDDEN_CALLS, f"{path}:{node.lineno}"
                if isinstance(node, ast.Import | ast.ImportFrom):
                    names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                    assert not FORBIDDEN_MODULES & {n.split(".")[0] for n in names}, \
                        f"{path}:{node.lineno}"


def garbage(pick: random.Random, valid: list[Message]) -> bytes:
    kind = pick.randrange(4)
    if kind == 0:
        return pick.randbytes(pick.randrange(1, 300))
    base = bytearray(valid[pick.randrange(len(valid))].value)
    if kind == 1:
        return bytes(base[: pick.randrange(1, len(base))])  # truncated
    if kind == 2:
        for _ in range(3):
            base[pick.randrange(len(base))] = pick.randrange(256)
        return bytes(base)
    return json.dumps(pick.choice([[], {}, None, 1.5, "page", {"type": None}])).encode()


@pytest.mark.timeout(300)
def test_garbage_stream_never_stops_the_consumer(fault_stack: FaultStack, tmp_path: Path) -> None:
    pick = random.Random(99)
    valid = build_log(300, seed=99, invalid=0.0, odd_urls=False)
    log: list[Message] = []
    for message in valid:
        log.append(message)
        if pick.random() < 0.8:
            log.append(Message(garbage(pick, valid), b"garbage"))
    settings_ = fault_stack.scenario("garbage")
    replay(settings_, log)
    with consumers(settings_, tmp_path) as spawn:
        proc = spawn("--until-caught-up")
        assert proc.wait(timeout=180) == 0, proc.output()[-3000:]
    client = fault_stack.client()
    result = audit(client, settings_, log)
    client.close()
    # Faults are the messages that do not decode: a corruption can leave a valid event.
    record("Garbage stream (fuzzed bytes)", faults=result.dlq_expected, result=result,
           note=f"{result.dlq_expected} dead letters, every one with its reason")
    result.check()
