"""``rankstream rekey NEW_PREFIX``: copy the graph to a new key prefix with dense ids,
leaving out what nothing needs any more.

Page ids are never reused (``docs/redis-keys.md``), so every URL ever seen keeps an
id: its id maps, and in the consumer its slots in every per-page array, which each
batch's passes scan. Most such ids belong to link targets that were never crawled
and went when their last in-link went (the orphan rule, ``docs/events.md``): nothing
about them matters any more. A page that was crawled and then removed is different:
its ``ts`` is what the stale rule needs to ignore an older ``page`` event, and its
title is kept for the page's return.

So the copy keeps every live page and every removed page that has a ``ts`` or a
title, numbers them densely in their old order, and writes the graph, the text
index, the offsets, the counters and the published scores (ZSETs and meta, keyed by
URL, copied as they are) under ``NEW_PREFIX``. The consumer, pointed at the new
prefix (``RANKSTREAM_KEY_PREFIX``), carries on from the same Kafka offsets.

A left-out URL is as if never seen: should it come back (a new link to it), it is a
new page (a ``page_removed`` of it with a ts followed by an older crawl is then
applied, not ignored, where the old prefix would have recorded that ts). That is the
price of forgetting it. (The anchors into it went with its in-links before it could
be left out: the term index holds only anchors of live links.)

Safety: both leases (``P lock`` of the old and the new prefix) are held while it
runs, so no consumer writes either meanwhile (one running on the old prefix makes
the command refuse), and the copy checks at its end that the old prefix did not move
(its ``P graph`` and ``P offsets`` as read at the start, both leases still ours). The
new prefix must hold no key at all. Its first write marks ``P graph`` unfinished,
which every reader and consumer refuses (:func:`consumer.redis_store.check_layout`);
one transaction at the end writes the offsets and the counters and lifts the mark,
so a copy cut short leaves a prefix nobody uses, to delete and redo. Only commands
the least-privilege user of docs/reliability.md may run (``COPY``, not
``DUMP``/``RESTORE``). The old prefix is left untouched: delete it once the consumer
runs on the new one, and keep any consumer of the old prefix stopped until then.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from consumer.graph_write import MEMBER_CHUNK, hset_commands, set_payloads
from consumer.keys import ALGORITHMS, LAYOUT_FIELD, LAYOUT_VERSION, UNFINISHED_FIELD, Keys
from consumer.lock import ConsumerLock
from consumer.redis_store import (
    StoredState,
    check_layout,
    crawled_bitmap,
    load_stored,
    redis_errors,
    stored_data,
)
from consumer.resp import send_commands
from consumer.text_postings import termcount_key
from rankstream.batching import chunks
from rankstream.errors import ConfigError, ServiceError

log = logging.getLogger("rankstream.rekey")

WRITE_CHUNK = 5_000  # commands per pipeline round trip
READ_CHUNK = 1_000  # index keys (or page contributions) read per round trip
SCAN_COUNT = 1_000  # SCAN's COUNT hint: keys of the whole db visited per call
SETS_PER_PAYLOAD = 10_000  # link sets per raw RESP payload (about 1 MB)


@dataclass
class RekeyReport:
    """What the copy kept and left out."""

    ids_before: int
    ids_after: int
    pages: int
    links: int
    terms: int


def check_prefixes(old: str, new: str) -> None:
    """ConfigError unless the two prefixes name disjoint key spaces."""
    if old.startswith(new) or new.startswith(old):
        raise ConfigError(f"the new prefix {new!r} and the current {old!r} must not be "
                          "one the start of the other (their keys would mix)")


def rekey(client: redis.Redis, old_prefix: str, new_prefix: str, topic: str, *,
          lock_ttl_ms: int = 30_000) -> RekeyReport:
    """Copy the graph under ``old_prefix`` to ``new_prefix`` (see the module's doc)."""
    check_prefixes(old_prefix, new_prefix)
    old, new = Keys(old_prefix), Keys(new_prefix)
    check_layout(client, old)
    leases = [ConsumerLock(client, keys.lock, ttl_ms=lock_ttl_ms) for keys in (old, new)]
    taken: list[ConsumerLock] = []
    try:
        for lease in leases:
            lease.acquire()  # LockHeld: a consumer runs there
            taken.append(lease)
            lease.start_renewal()
        _check_empty(client, new_prefix, new.lock)
        return _copy(client, old, new, topic, leases)
    finally:
        for lease in reversed(taken):
            lease.release()


def _check_empty(client: redis.Redis, prefix: str, own_lock: str) -> None:
    with redis_errors("checking the new prefix"):
        for key in client.scan_iter(match=f"{_glob_escaped(prefix)}*", count=SCAN_COUNT):
            if key.decode() != own_lock:
                raise ConfigError(f"the new prefix {prefix!r} already holds data "
                                  f"({key.decode()!r}); delete it first")


def _glob_escaped(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _copy(client: redis.Redis, old: Keys, new: Keys, topic: str,
          leases: Sequence[ConsumerLock]) -> RekeyReport:
    with redis_errors("reading the graph"):
        graph_hash: Any = client.hgetall(old.graph)
        offsets_hash: Any = client.hgetall(old.offsets)
    if not graph_hash:
        raise ConfigError(f"nothing to copy: no graph under {old.prefix!r} "
                          f"({old.graph} is absent)")
    with redis_errors("writing the new prefix"):
        client.hset(new.graph, mapping={UNFINISHED_FIELD: 1, LAYOUT_FIELD: LAYOUT_VERSION})
    state = load_stored(client, old, topic)
    num_ids = len(state.urls)
    with redis_errors("reading the titles"), stored_data("reading the titles"):
        raw_titles: Any = client.hgetall(old.page_title)
        titles: dict[int, bytes] = {int(k): v for k, v in raw_titles.items()}
    live = np.ones(num_ids, dtype=bool)
    live[state.removed] = False
    keep = live.copy()
    remembered = [page for page in (*state.last_ts, *titles) if 0 <= page < num_ids]
    keep[remembered] = True
    new_id = np.full(num_ids, -1, dtype=np.int64)
    new_id[keep] = np.arange(int(keep.sum()))
    if (new_id[state.edge_src] < 0).any() or (new_id[state.edge_dst] < 0).any():
        raise ServiceError(f"{old.prefix}out:* links a removed page: not written by rankstream")
    kept = np.flatnonzero(keep)
    counters = state.counters
    report = RekeyReport(ids_before=num_ids, ids_after=int(kept.size),
                         pages=int(live.sum()), links=int(state.edge_src.size), terms=0)
    with redis_errors("writing the new prefix"):
        _write_graph(client, new, state, kept, new_id, titles)
        report.terms = _copy_terms(client, old, new, new_id)
        for name in (f(a) for a in ALGORITHMS for f in (old.scores, old.meta)):
            # Scores are keyed by URL: as they are. COPY, not DUMP/RESTORE, which the
            # least-privilege user may not run (@dangerous).
            client.copy(name, new.prefix + name[len(old.prefix):])
        after = (client.hgetall(old.graph), client.hgetall(old.offsets))
        if after != (graph_hash, offsets_hash) or any(lease.lost.is_set() for lease in leases):
            raise ServiceError(f"the graph under {old.prefix!r} changed during the copy "
                               "(a consumer wrote it, or a lease expired): delete the keys "
                               f"under {new.prefix!r} and run rekey again")
        fields = {**counters.as_mapping(), "ids": report.ids_after,
                  LAYOUT_FIELD: LAYOUT_VERSION}
        with client.pipeline(transaction=True) as pipe:  # the last write, all at once
            if offsets_hash:
                pipe.hset(new.offsets, mapping=offsets_hash)
            pipe.hset(new.graph, mapping=fields)  # type: ignore[arg-type]
            pipe.hdel(new.graph, UNFINISHED_FIELD)
            pipe.execute()
    log.info("rekeyed", extra={"fields": vars(report)})
    return report


def _write_graph(client: redis.Redis, new: Keys, state: StoredState, kept: np.ndarray,
                 new_id: np.ndarray, titles: dict[int, bytes]) -> None:
    """The pages (id maps, ts, titles, tombstones, crawled flags), then the link sets.

    The link sets, two per page, go as raw RESP (:func:`consumer.resp.set_commands`,
    what the consumer's own graph writes use): through redis-py's pipeline they took
    about half of a 374k-page copy's time, packing and parsing one SADD at a time."""
    ids = new_id[kept].tolist()
    urls = [state.urls[page] for page in kept.tolist()]
    tombstones = new_id[state.removed]
    commands = [*hset_commands(new.page_id, dict(zip(urls, ids, strict=True))),
                *hset_commands(new.page_url, dict(zip(ids, urls, strict=True))),
                *hset_commands(new.page_ts, _renumbered_keys(state.last_ts, new_id)),
                *hset_commands(new.page_title, _renumbered_keys(titles, new_id)),
                *(("SADD", new.page_removed, *chunk) for chunk in chunks(
                    tombstones[tombstones >= 0].tolist(), MEMBER_CHUNK))]
    if state.crawled is not None and kept.size:
        commands.append(("SET", new.page_crawled, crawled_bitmap(state.crawled[kept])))
    _write(client, commands)
    src, dst = new_id[state.edge_src], new_id[state.edge_dst]
    parts = [part for head, owners, members in ((new.out_head, src, dst), (new.in_head, dst, src))
             for part in set_payloads("SADD", head, owners, members,
                                      sets_per_payload=SETS_PER_PAYLOAD)]
    payloads, counts = [payload for payload, _ in parts], [count for _, count in parts]
    failures = [reply for reply in send_commands(client, payloads, counts)
                if isinstance(reply, Exception)]
    if failures:
        raise failures[0]  # redis_errors() translates it


def _write(client: redis.Redis, commands: Iterable[tuple[Any, ...]]) -> None:
    """Send ``commands`` pipelined, :data:`WRITE_CHUNK` per round trip."""
    for chunk in chunks(commands, WRITE_CHUNK):
        pipe = client.pipeline(transaction=False)
        for command in chunk:
            pipe.execute_command(*command)
        pipe.execute()


def _copy_terms(client: redis.Redis, old: Keys, new: Keys, new_id: np.ndarray) -> int:
    """The text index with its ids renumbered (postings, their extra-source counts and
    each page's contributions, consumer/text_postings.py); left-out pages dropped.

    Read and written a chunk of keys per round trip: with four round trips a term, a
    copy of 374k pages and 189k terms took 2m11s, most of it waiting on the socket."""
    head = f"{old.prefix}term:"
    copied = 0
    keys = client.scan_iter(match=f"{_glob_escaped(head)}*", count=SCAN_COUNT)
    for chunk in chunks(keys, READ_CHUNK):
        terms = [key.decode()[len(head):] for key in chunk]
        pipe = client.pipeline(transaction=False)
        for term, key in zip(terms, chunk, strict=True):
            pipe.smembers(key)
            pipe.hgetall(termcount_key(old.prefix, term))
        replies = pipe.execute()
        writes: list[tuple[Any, ...]] = []
        for term, members, raw_counts in zip(terms, replies[::2], replies[1::2], strict=True):
            ids = _renumbered_all(members, new_id)
            if not ids:
                continue
            writes.extend(("SADD", f"{new.prefix}term:{term}", *part)
                          for part in chunks(ids, MEMBER_CHUNK))
            writes.extend(hset_commands(termcount_key(new.prefix, term), {
                page: extra for counted, extra in raw_counts.items()
                if (page := _renumbered(counted, new_id)) is not None}))
            copied += 1
        _write(client, writes)
    contributions = client.hscan_iter(old.page_terms, count=SCAN_COUNT)
    for chunk in chunks(contributions, READ_CHUNK):
        _write(client, hset_commands(new.page_terms, {
            giver: lines for source, text in chunk
            if (giver := _renumbered(source, new_id)) is not None
            and (lines := _renumbered_lines(text, new_id))}))
    return copied


def _renumbered_lines(text: bytes, new_id: np.ndarray) -> bytes:
    """A page's stored contributions with the targets renumbered and left-out ones
    dropped (the title's line kept as it is)."""
    lines: list[bytes] = []
    for line in text.split(b"\n"):
        target, terms = line.split(b" ", 1)
        if target == b"t":  # the title's terms
            lines.append(line)
        elif (new_target := _renumbered(target, new_id)) is not None:
            lines.append(b"%d %s" % (new_target, terms))
    return b"\n".join(lines)


def _renumbered_all(members: Iterable[bytes], new_id: np.ndarray) -> list[int]:
    """The new ids of the stored ids ``members`` that are kept."""
    old = np.array([int(m) for m in members], dtype=np.int64)
    old = old[(old >= 0) & (old < new_id.size)]
    ids = new_id[old]
    return ids[ids >= 0].tolist()


def _renumbered_keys(values: Mapping[int, Any], new_id: np.ndarray) -> dict[int, Any]:
    """``values`` of the kept pages, by their new ids."""
    return {int(new_id[old]): value for old, value in values.items()
            if 0 <= old < new_id.size and new_id[old] >= 0}


def _renumbered(page: bytes, new_id: np.ndarray) -> int | None:
    """The new id of the stored id ``page``, or None if that page is left out."""
    old = int(page)
    if not 0 <= old < new_id.size or new_id[old] < 0:
        return None
    return int(new_id[old])
