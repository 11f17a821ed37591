"""The event schema: decoding, stable error reasons, limits, encoding, JSON-lines files."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer.field_checks import links_at_once, links_one_by_one
from producer.schema import (
    DEFAULT_LIMITS,
    Limits,
    LinkAddedEvent,
    LinkRemovedEvent,
    PageEvent,
    PageRemovedEvent,
    decode_event,
    encode_event,
    event_key,
    iter_events,
    make_event,
)
from producer.urls import canonicalize_url
from rankstream.errors import InputError
from rankstream.settings import Settings


def raw(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


def reason(data: bytes, limits: Limits = DEFAULT_LIMITS) -> str:
    with pytest.raises(InputError) as info:
        decode_event(data, limits)
    return str(info.value)


PAGE = {"type": "page", "url": "https://example.org/", "links": ["https://example.org/a"]}


# --- the four event types ------------------------------------------------------------


def test_page_event_canonicalises_dedups_and_drops_self_links() -> None:
    event = decode_event(raw({
        "type": "page", "url": "HTTPS://Example.org:443/#top", "title": "Home", "ts": 5,
        "links": ["https://example.org/a", "https://EXAMPLE.org/a#x", "https://example.org/",
                  {"url": "https://example.org/b", "text": "Bee"}, "https://example.org/c",
                  {"url": "https://example.org/c", "text": "late anchor"}],
    }))
    assert isinstance(event, PageEvent)
    assert event.url == "https://example.org/"
    assert event.links == ("https://example.org/a", "https://example.org/b",
                           "https://example.org/c")
    assert event.anchors == (("https://example.org/b", "Bee"),
                             ("https://example.org/c", "late anchor"))
    assert (event.title, event.ts, event.v) == ("Home", 5, 1)
    assert event_key(event) == b"https://example.org/"


def test_link_and_removal_events() -> None:
    added = decode_event(raw({"type": "link_added", "src": "http://A.org", "dst": "http://b.org"}))
    assert isinstance(added, LinkAddedEvent)
    assert (added.src, added.dst) == ("http://a.org/", "http://b.org/")
    assert event_key(added) == b"http://a.org/"
    gone = decode_event(raw({"type": "link_removed", "src": "http://a.org/", "dst": "http://b/"}))
    assert isinstance(gone, LinkRemovedEvent)
    page_gone = decode_event(raw({"type": "page_removed", "url": "http://a.org/x", "ts": 1}))
    assert isinstance(page_gone, PageRemovedEvent) and event_key(page_gone) == b"http://a.org/x"


def test_empty_link_list_is_a_page_without_links() -> None:
    event = decode_event(raw({"type": "page", "url": "http://a.org/", "links": []}))
    assert isinstance(event, PageEvent) and event.links == ()


def test_unknown_extra_fields_are_ignored_and_models_are_frozen() -> None:
    event = decode_event(raw({**PAGE, "crawler": "v9", "anchors": "forged", "v": 1}))
    assert isinstance(event, PageEvent) and event.anchors == ()
    with pytest.raises(pydantic.ValidationError):
        event.url = "http://other/"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("ts", "millis"),
    [
        (0, 0),
        (1_700_000_000_123, 1_700_000_000_123),
        ("2026-01-01T00:00:00Z", 1_767_225_600_000),
        ("2026-01-01T01:00:00+01:00", 1_767_225_600_000),
        ("2026-01-01T00:00:00.250", 1_767_225_600_250),  # naive means UTC
        ("2026-01-01", 1_767_225_600_000),
        # RFC 3339 forms Python 3.11's fromisoformat refuses:
        ("2026-01-01t00:00:00z", 1_767_225_600_000),
        ("2016-12-31T23:59:60Z", 1_483_228_800_000),  # a leap second: the next, as POSIX
        ("2016-12-31T23:59:60.500Z", 1_483_228_800_500),
        ("2025-12-31T24:00:00Z", 1_767_225_600_000),  # the end of a day
    ],
)
def test_ts_forms(ts: int | str, millis: int) -> None:
    assert decode_event(raw({**PAGE, "ts": ts})).ts == millis


# --- error reasons: "<category>: <detail>", stable -------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "empty message: no bytes"),
        (None, "empty message: a tombstone (null value)"),
        (b'\xef\xbb\xbf{"type": "page_removed", "url": "http://a/"}',
         "malformed JSON: starts with a UTF-8 byte order mark"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": ' + b"9" * 5000 + b"}",
         "bad ts: integer out of range (epoch milliseconds expected)"),
        (b'{"type": "page",', "malformed JSON: Expecting property name enclosed in double "
                             "quotes at char 16"),
        (b"\xff\xfe{}", "not UTF-8: invalid start byte at byte 0"),
        (b"[1, 2]", "not a JSON object: got array"),
        (b'"page"', "not a JSON object: got string"),
        (b"{}", "missing field: type"),
        (b'{"type": "crawl"}', "unknown type: \"crawl\" (expected one of page, link_added, "
                              "link_removed, page_removed)"),
        (b'{"type": "page", "links": []}', "missing field: url"),
        (b'{"type": "page", "url": "http://a/"}', "missing field: links"),
        (b'{"type": "link_added", "src": "http://a/"}', "missing field: dst"),
        (b'{"type": "page", "url": 7, "links": []}', "wrong type: url: expected string, "
                                                     "got integer"),
        (b'{"type": "page", "url": "http://a/", "links": "http://b/"}',
         "wrong type: links: expected array, got string"),
        (b'{"type": "page", "url": "http://a/", "links": [null]}',
         "wrong type: links[0]: expected URL string or {url, text} object, got null"),
        (b'{"type": "page", "url": "http://a/", "links": [{"text": "x"}]}',
         "missing field: links[0].url"),
        (b'{"type": "page", "url": "http://a/", "links": [{"url": "http://b/", "text": 1}]}',
         "wrong type: links[0].text: expected string, got integer"),
        # A self link is dropped, but its anchor text is checked like any other's.
        (b'{"type": "page", "url": "http://a/", "links": [{"url": "http://a/", "text": 5}]}',
         "wrong type: links[0].text: expected string, got integer"),
        (b'{"type": "page", "url": "http://a/", "links": [], "title": ["t"]}',
         "wrong type: title: expected string, got array"),
        (b'{"type": "link_added", "src": "http://a/", "dst": 1.5}',
         "wrong type: dst: expected string, got number"),
        (b'{"type": "page", "url": "http://a/", "links": ["/relative"]}',
         "bad url: links[0]: no scheme (absolute URL required)"),
        (b'{"type": "page_removed", "url": "ftp://a/"}',
         "disallowed scheme: url: 'ftp' (allowed: file, http, https)"),
        (b'{"type": "page_removed", "url": "javascript:alert(1)"}',
         "disallowed scheme: url: 'javascript' (allowed: file, http, https)"),
        (b'{"type": "page_removed", "url": "http://a/", "v": 2}',
         "unsupported version: 2 (supported: 1)"),
        (b'{"type": "page_removed", "url": "http://a/", "v": "1"}',
         "unsupported version: \"1\" (supported: 1)"),
        # A reason is one line of bounded length, in JSON spelling: the value given
        # used to be copied whole, newlines and terminal escapes included.
        (b'{"type": "x\\ny\\u001b[31m' + b"z" * 500 + b'"}',
         'unknown type: "x\\ny\\u001b[31m' + 'z' * 25 + '... (expected one of page, '
         'link_added, link_removed, page_removed)'),
        (b'{"type": null}', "unknown type: null (expected one of page, link_added, "
                            "link_removed, page_removed)"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": true}',
         "bad ts: expected epoch ms (int) or ISO 8601 string, got boolean"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": 1.5}',
         "bad ts: expected epoch ms (int) or ISO 8601 string, got number"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": -1}',
         "bad ts: -1 out of range (epoch milliseconds expected)"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": "yesterday"}',
         "bad ts: not ISO 8601: 'yesterday'"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": "9999-12-31T24:00:00Z"}',
         "bad ts: '9999-12-31T24:00:00Z' out of range (1970 to 9999 UTC)"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": "9999-12-31T23:59:59-14:00"}',
         "bad ts: '9999-12-31T23:59:59-14:00' out of range (1970 to 9999 UTC)"),
        (b'{"type": "page_removed", "url": "http://a/", "ts": NaN}',
         "malformed JSON: NaN is not valid JSON"),
        (b'{"type": "page_removed", "url": "http://a/\\ud800"}',
         "bad url: url: invalid unicode (lone surrogate)"),
        (b'{"type": "page", "url": "http://a/", "links": [], "title": "\\udfff"}',
         "bad text: title: invalid unicode (lone surrogate)"),
        (b"[" * 100_000, "malformed JSON: nested too deeply"),
        # Ambiguous: which type was meant? Refused rather than last-one-wins.
        (b'{"type": "link_added", "type": "page", "url": "http://a/", "links": []}',
         "malformed JSON: duplicate key 'type'"),
        (b'{"type": "page", "url": "http://a/", "links": [{"url": "http://b/", '
         b'"url": "http://c/"}]}', "malformed JSON: duplicate key 'url'"),
    ],
)
def test_error_reasons(data: bytes, expected: str) -> None:
    assert reason(data) == expected


@pytest.mark.parametrize("template", [b'{"type": %s}', b'{"v": %s, "type": "page"}'])
def test_a_wrong_value_nested_just_under_the_parser_limit_is_an_input_error(
        template: bytes) -> None:
    # The parser takes nesting to about the recursion limit; showing such a value in
    # the reason used to take the rest of it (RecursionError, a traceback).
    for depth in range(700, 1001):
        with pytest.raises(InputError):
            decode_event(template % (b"[" * depth + b"]" * depth))


def test_an_extra_field_holding_a_huge_integer_is_ignored_like_any_extra_field() -> None:
    # Python refuses to parse integers of more than 4,300 digits; before, that
    # ValueError rejected the event as "malformed JSON".
    data = b'{"type": "page_removed", "url": "http://a/", "extra": ' + b"7" * 5000 + b"}"
    assert decode_event(data) == PageRemovedEvent(url="http://a/")


def test_a_duplicate_key_among_many_is_found() -> None:
    # The check was quadratic in the number of keys (40k keys: 23 s).
    keys = ", ".join(f'"k{i}": 0' for i in range(50_000))
    data = f'{{"type": "page_removed", "url": "http://a/", {keys}, "k5": 1}}'.encode()
    assert reason(data) == "malformed JSON: duplicate key 'k5'"


def test_a_ts_more_than_a_day_ahead_is_refused_because_it_would_freeze_the_url() -> None:
    now_ms = int(time.time() * 1000)
    assert decode_event(raw({**PAGE, "ts": now_ms + 3_600_000})).ts == now_ms + 3_600_000
    assert reason(raw({**PAGE, "ts": now_ms + 2 * 86_400_000})).startswith(
        f"bad ts: {now_ms + 2 * 86_400_000} is in the future")
    assert reason(raw({**PAGE, "ts": "7000-01-01T00:00:00Z"})) == (
        "bad ts: '7000-01-01T00:00:00Z' is in the future (more than a day ahead of this clock)")


def test_not_bytes() -> None:
    with pytest.raises(InputError, match="not bytes"):
        decode_event("{}")  # type: ignore[arg-type]


# --- limits ----------------------------------------------------------------------------


def test_limits() -> None:
    limits = Limits(max_url_length=40, max_links_per_page=2, max_message_bytes=200,
                    allowed_schemes=frozenset({"HTTPS"}))
    long_url = "https://example.org/" + "x" * 30
    assert reason(raw({**PAGE, "url": long_url}), limits) == "url too long: url: 50 > 40"
    assert reason(raw({**PAGE, "links": ["https://a/", long_url]}), limits) == \
        "url too long: links[1]: 50 > 40"
    links = ["https://a/1", "https://a/2", "https://a/3"]
    assert reason(raw({**PAGE, "links": links}), limits) == "too many links: 3 > 2"
    assert reason(b" " * 201, limits) == "message too large: 201 > 200 bytes"
    assert reason(raw({**PAGE, "links": ["http://a/"]}), limits) == \
        "disallowed scheme: links[0]: 'http' (allowed: https)"
    assert decode_event(raw({**PAGE, "links": links[:2]}), limits)


def test_limits_from_settings() -> None:
    limits = Limits.from_settings(Settings(max_url_length=100, max_links_per_page=5,
                                           max_message_bytes=4096, allowed_schemes=("https",)))
    assert limits == Limits(100, 5, 4096, frozenset({"https"}))


def test_constructing_models_directly_validates_too() -> None:
    event = PageEvent(url="HTTP://A.org", links=["http://b.org", "http://a.org/"])  # type: ignore[arg-type]
    assert event.url == "http://a.org/" and event.links == ("http://b.org/",)
    with pytest.raises(pydantic.ValidationError):
        LinkAddedEvent(src="not a url", dst="http://b/")
    with pytest.raises(InputError, match="bad url: src"):
        make_event({"type": "link_added", "src": "not a url", "dst": "http://b/"})


# --- encoding --------------------------------------------------------------------------


def test_encoding_is_compact_and_round_trips_unusual_urls() -> None:
    weird = 'https://example.org/straße/a b/"quoted"/%2F?q=日本&x=' + "y" * 3000
    event = decode_event(raw({"type": "page", "url": weird, "ts": "2026-01-01T00:00:00Z",
                              "links": [{"url": weird + "&more", "text": "ünïcode"}]}))
    data = encode_event(event)
    assert data.startswith(b'{"type":"page","v":1,"url":"https://example.org/stra\xc3\x9fe/')
    assert decode_event(data) == event
    assert isinstance(event, PageEvent) and event.url == weird


urls = st.sampled_from(["http://a.org/", "https://b.org/x?y=1", "file:///tmp/f",
                        "https://c.org/ü", "http://d.org/a%20b"])
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
events = st.one_of(
    st.builds(lambda u, ls, t, ts: {"type": "page", "url": u, "links": ls, "title": t, "ts": ts},
              urls, st.lists(st.one_of(urls, st.builds(lambda u, x: {"url": u, "text": x},
                                                       urls, texts)), max_size=5),
              st.one_of(st.none(), texts), st.one_of(st.none(), st.integers(0, 1_700_000_000_000))),
    st.builds(lambda k, s, d: {"type": k, "src": s, "dst": d},
              st.sampled_from(["link_added", "link_removed"]), urls, urls),
    st.builds(lambda u: {"type": "page_removed", "url": u}, urls),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=events)
def test_encode_decode_round_trip(data: dict[str, Any]) -> None:
    event = make_event({k: v for k, v in data.items() if v is not None})
    assert decode_event(encode_event(event)) == event


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
fields = st.fixed_dictionaries(
    {"type": st.sampled_from(["page", "link_added", "link_removed", "page_removed", "x"])},
    optional={"url": st.one_of(urls, json_values), "src": urls, "dst": st.one_of(urls, json_values),
              "links": st.one_of(st.lists(st.one_of(urls, json_values), max_size=4), json_values),
              "ts": json_values, "v": json_values, "title": json_values},
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=200), fields.map(raw), json_values.map(raw)))
def test_fuzz_decode_only_ever_returns_an_event_or_raises_input_error(data: bytes) -> None:
    try:
        event = decode_event(data)
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert decode_event(encode_event(event)) == event


# --- JSON-lines files ------------------------------------------------------------------


def write_lines(path: Path, lines: list[bytes], gzipped: bool) -> Path:
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data) if gzipped else data)
    return path


@pytest.mark.parametrize("gzipped", [False, True])
def test_iter_events_plain_and_gzip(tmp_path: Path, gzipped: bool) -> None:
    path = write_lines(tmp_path / "log.jsonl", [raw(PAGE), b"", b"  ", raw(PAGE)], gzipped)
    assert [line for line, _ in iter_events(path)] == [1, 4]


def test_iter_events_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "log.jsonl.gz", [raw(PAGE), b"{oops", raw(PAGE)], True)
    seen = []
    with pytest.raises(InputError) as info:
        for line, _ in iter_events(path):
            seen.append(line)
    assert seen == [1]
    assert info.value.where == f"{path}:2"
    assert str(info.value) == f"{path}:2: malformed JSON: Expecting property name enclosed " \
                              "in double quotes at char 1"


def test_iter_events_unreadable(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        list(iter_events(tmp_path / "missing.jsonl"))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(raw(PAGE) + b"\n" * 10)[:-12])
    with pytest.raises(InputError, match="cannot read"):
        list(iter_events(broken))


def test_shipped_demo_data_is_valid() -> None:
    path = Path(__file__).resolve().parents[2] / "data" / "python-docs-pages.jsonl.gz"
    decoded = [event for _, event in iter_events(path)]
    assert len(decoded) == 530
    assert all(isinstance(event, PageEvent) for event in decoded)
    assert sum(len(event.links) for event in decoded if isinstance(event, PageEvent)) == 16014
    assert path.stat().st_size < 1_000_000


@pytest.mark.parametrize("value", ["a\u0085b\u2028c", "x\ud800", "a\u2029b"])
def test_a_shown_value_keeps_the_reason_on_one_line(value: str) -> None:
    data = json.dumps({"type": value}).encode()  # escaped on the wire, raw once decoded
    shown = reason(data)
    assert shown.isascii() and len(shown.splitlines()) == 1
    assert json.dumps(value) in shown


def _raw(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


_PAGE = {"type": "page", "url": "https://a.org/", "links": []}


def test_a_ts_up_to_a_day_ahead_is_taken():
    """The lead allowed a crawler's clock is a day: not an hour, not two."""
    now_ms = int(time.time() * 1000)
    ahead = now_ms + 23 * 3_600_000  # crawler clock 23 h fast: documented as accepted
    assert decode_event(_raw({**_PAGE, "ts": ahead})).ts == ahead
    with pytest.raises(InputError, match="is in the future"):
        decode_event(_raw({**_PAGE, "ts": now_ms + 25 * 3_600_000}))


def test_the_first_non_empty_anchor_text_of_a_duplicate_link_is_kept():
    """docs/events.md: a link listed twice keeps its first non-empty anchor text."""
    b = "https://a.org/b"
    event = decode_event(_raw({**_PAGE, "links": [{"url": b, "text": "first"},
                                                 {"url": b, "text": "second"}]}))
    assert event.links == (b,) and event.anchors == ((b, "first"),)
    event = decode_event(_raw({**_PAGE, "links": [{"url": b, "text": ""}, b,
                                                 {"url": b, "text": "second"}]}))
    assert event.anchors == ((b, "second"),)


@pytest.mark.parametrize("links", [["https://a.org/x\nhttps://b.org/"],
                                   ["https://c.org/", "https://a.org/x\nhttps://b.org/"]])
def test_a_link_holding_a_newline_is_refused_on_the_fast_path_too(links):
    """The fast path checks the links joined by newlines: one holding a newline looks
    like two canonical URLs there, and must be refused as the slow path does."""
    with pytest.raises(InputError, match=r"bad url: links\[\d\]: control character"):
        decode_event(_raw({**_PAGE, "links": links}))


# Canonical and non-canonical spellings, a self link, texts empty, absent, Unicode.
_LINK_URLS = st.sampled_from(["https://a.org/", "https://a.org/b", "HTTPS://A.org/b",
                              "https://a.org/c#top", "http://b.org/x?y=1", "file:///tmp/f",
                              "https://page.org/"])
_LINKS = st.lists(st.one_of(
    _LINK_URLS,
    st.builds(lambda url, text: {"url": url, "text": text}, _LINK_URLS,
              st.one_of(st.none(), st.sampled_from(["", "Bee", "über", "two words"]))),
    st.builds(lambda url: {"url": url}, _LINK_URLS),
), max_size=8)


@given(links=_LINKS)
@settings(max_examples=300)
def test_the_all_at_once_link_path_agrees_with_the_one_by_one_path(links: list[Any]) -> None:
    """links_at_once (one regex over all URLs) takes the usual page; whatever it takes,
    the link-by-link path must give the same links and anchors."""
    page = "https://page.org/"
    at_once = links_at_once(links, page, DEFAULT_LIMITS)
    if at_once is not None:
        assert at_once == links_one_by_one(links, page, DEFAULT_LIMITS)
    else:  # only a URL that needs canonicalising sends a page the long way
        assert any((link if isinstance(link, str) else link["url"]) != page
                   and canonicalize_url(link if isinstance(link, str) else link["url"])
                   != (link if isinstance(link, str) else link["url"]) for link in links)


def test_a_lone_surrogate_in_anchor_text_is_refused_on_the_fast_path_too() -> None:
    with pytest.raises(InputError, match=r"bad text: links\[1\]\.text: invalid unicode"):
        decode_event(b'{"type":"page","url":"https://p.org/","links":["https://a.org/",'
                     b'{"url":"https://b.org/","text":"x\\ud800"}]}')


@pytest.mark.parametrize("links", [{"javascript:alert(1)"}, frozenset({"http://a/"}),
                                   (u for u in ["javascript:x"]), "http://b/", 5])
def test_links_that_are_not_a_list_are_refused_before_their_urls_could_slip_past(
        links: Any) -> None:
    with pytest.raises(InputError, match=r"^wrong type: links: expected array, got "):
        make_event({"type": "page", "url": "http://p/", "links": links})


def test_a_page_event_from_attributes_is_refused_rather_than_left_unchecked() -> None:
    class Crawled:
        url, links, anchors = "http://p/", ["javascript:x"], 5

    with pytest.raises(pydantic.ValidationError, match="expected object"):
        PageEvent.model_validate(Crawled(), from_attributes=True)
    event = make_event({"type": "page", "url": "http://p/", "links": []})
    assert PageEvent.model_validate(event) == event
