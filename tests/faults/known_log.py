"""The fault scenarios' known event log: seeded synthetic events (with titles and
anchor texts) plus odd URLs, re-delivered (duplicate) and stale ``page`` events, and
invalid messages.

Built here, replayed and audited by :mod:`tests.faults.harness`, which computes the
graph it defines offline with the same event semantics as the consumer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from producer.schema import decode_event, event_key
from producer.synthetic import synthetic_event_dicts


@dataclass(frozen=True)
class Message:
    """One Kafka message of the log: the exact bytes, keyed like the producer keys them."""

    value: bytes
    key: bytes


ODD_URLS = (
    "https://bücher.example/straße/ü?q=ä ö",
    "https://pct.example/a%2Fb/%20x?y=%3D&z=%E2%82%AC",
    "https://space.example/with space/and 'quotes' \"too\"",
    "https://emoji.example/🙂/?",
    "http://[::1]:8080/ipv6/path;params",
    "file:///home/user/docs/index.html",
    "https://long.example/search?" + "&".join(f"k{i}=v%20{i}" for i in range(600)),
)

BAD_MESSAGES = (
    b'{"type": "page", "url": ',
    b'{"type": "page", "url": "https://x.example/\xff", "links": []}',
    json.dumps({"type": "page", "url": "https://x.example/", "links": 5}).encode(),
    json.dumps({"type": "page", "links": []}).encode(),
    json.dumps({"type": "crawl", "url": "https://x.example/"}).encode(),
    json.dumps({"type": "link_added", "src": "ftp://x.example/", "dst": "https://y/"}).encode(),
    json.dumps({"type": "page", "url": "relative/path", "links": []}).encode(),
    json.dumps([1, 2, 3]).encode(),
    b"NaN",
)


def encode(event: dict[str, Any]) -> Message:
    raw = json.dumps(event, ensure_ascii=False).encode()
    return Message(raw, event_key(decode_event(raw)))


# Titles and anchor texts given to the log's page events: few words, so that pages
# share terms and a term often has several sources (the term index counts them).
TEXT_WORDS = ("python", "tutorial", "reference", "library", "guide", "the", "Über")


def _with_texts(event: dict[str, Any], pick: random.Random) -> dict[str, Any]:
    """A page event given a title half the time and anchor text on 30% of its links."""
    if event["type"] != "page":
        return event
    event = {**event, "links": [{"url": link, "text": " ".join(pick.sample(TEXT_WORDS, 2))}
                                if pick.random() < 0.3 else link for link in event["links"]]}
    if pick.random() < 0.5:
        event["title"] = " ".join(pick.sample(TEXT_WORDS, 2))
    return event


def build_log(count: int, *, seed: int, removals: bool = False, duplicates: float = 0.03,
              stale: float = 0.02, invalid: float = 0.01, odd_urls: bool = True) -> list[Message]:
    """A seeded log of about ``count`` messages.

    ``removals=False`` leaves out ``page_removed``: only removals make the final
    graph depend on how a multi-partition topic interleaves its partitions.
    ``duplicates`` re-sends an earlier event unchanged, ``stale`` re-sends an
    earlier ``page`` event with a ts older than the page's newest one, ``invalid``
    inserts a message that must land in the DLQ (fractions of ``count``).
    """
    pick, words = random.Random(seed), random.Random(seed + 1)
    events = [_with_texts(e, words)
              for e in synthetic_event_dicts(count, seed=seed, edit_fraction=0.3)
              if removals or e["type"] != "page_removed"]
    if odd_urls:
        base_ts = events[-1]["ts"] if events else 0
        for i, url in enumerate(ODD_URLS):
            others = [u for u in ODD_URLS if u != url][: 3 + i % 3]
            target = events[pick.randrange(len(events))]
            hub = target.get("url") or target.get("src")
            spot = pick.randrange(len(events) + 1)
            events.insert(spot, {"type": "page", "url": url, "links": [*others, hub],
                                 "title": f"odd {i}", "ts": base_ts + i})
    out: list[Message] = []
    pages_seen: list[dict[str, Any]] = []
    for event in events:
        out.append(encode(event))
        if event["type"] == "page":
            pages_seen.append(event)
        roll = pick.random()
        if roll < duplicates and out:
            out.append(out[pick.randrange(len(out))])  # a re-delivery, byte for byte
        elif roll < duplicates + stale and pages_seen:
            old = dict(pages_seen[pick.randrange(len(pages_seen))])
            old["ts"] = int(old.get("ts", 1)) - 1 - pick.randrange(1000)
            old["links"] = [*list(old["links"])[:2], "https://stale.example/never"]
            out.append(encode(old))
        elif roll < duplicates + stale + invalid:
            out.append(Message(BAD_MESSAGES[pick.randrange(len(BAD_MESSAGES))], b"bad"))
    return out
