"""One batch's graph write: planned from the mirror, sent as one fenced MULTI/EXEC.

Exactly-once rests on two facts:

1. Everything a batch changes (page-id maps, both adjacency directions, page
   ts/titles/removal marks/crawled flags, text-index postings, counters) *and* the
   next Kafka offset of every partition in the batch go into ONE MULTI/EXEC
   (:func:`commit_graph`). Redis applies all of it or none of it, so the stored
   offsets always describe exactly the events the stored graph contains.
2. Every write is idempotent: set semantics (SADD/SREM), absolute values (HSET of
   counters computed from the mirror, never HINCRBY), and the term index's script
   diffs against what Redis holds (run twice, the second finds nothing to change,
   :mod:`consumer.text_postings`). Re-sending the same
   transaction after a connection error whose first attempt did commit changes
   nothing, so the retry loop simply repeats it.

The adjacency is the bulk of the bytes: with random link targets nearly every
link is its own ``SADD P in:{dst}``, and encoding 100k small commands costs the
Python client more than Redis needs to run them. So the adjacency is grouped by key
with numpy, encoded as RESP by a compiled loop (:func:`consumer.resp.set_commands`)
and the whole transaction is sent raw (:func:`consumer.resp.transaction`); why not
a server-side script is measured in :mod:`consumer.resp`. ``bulk=False`` only
changes the id maps of new pages (plain ``HSET`` instead of one ``EVAL``) and the
term index (its diff read before the transaction instead of run in it,
:func:`consumer.text_postings.plain_commands`), for deployments whose ACL forbids
scripting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from consumer.keys import LAYOUT_FIELD, LAYOUT_VERSION, Keys, check_layout_value
from consumer.resp import command, pooled_connection, set_commands, transaction
from consumer.text_postings import index_commands
from ranker.edge_batches import pair_keys, sorted_unique, split_pair_keys
from rankstream.batching import chunks
from rankstream.errors import ServiceError
from rankstream.text_changes import TextChanges

HSET_CHUNK = 1000  # field/value pairs per HSET
BITFIELD_CHUNK = 1000  # bits set per BITFIELD
MEMBER_CHUNK = 4000  # members per SADD/SREM: no single command holds Redis long

_EMPTY = np.zeros(0, dtype=np.int32)

# ARGV: the page:id key, the page:url key, ids (int32 LE), URLs joined by "\n" (canonical
# URLs never contain control characters). HSETs both maps in chunks.
NEW_PAGES_SCRIPT = r"""
local id_key, url_key, ids, urls = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local by_url, by_id = {}, {}
local pos = 1
for i = 1, #ids / 4 do
  local id = struct.unpack('<i4', ids, 4 * i - 3)
  local stop = string.find(urls, '\n', pos, true)
  local url
  if stop then
    url = string.sub(urls, pos, stop - 1)
    pos = stop + 1
  else
    url = string.sub(urls, pos)
  end
  by_url[#by_url + 1] = url
  by_url[#by_url + 1] = id
  by_id[#by_id + 1] = id
  by_id[#by_id + 1] = url
  if #by_url >= 2000 then
    redis.call('HSET', id_key, unpack(by_url))
    redis.call('HSET', url_key, unpack(by_id))
    by_url, by_id = {}, {}
  end
end
if #by_url > 0 then
  redis.call('HSET', id_key, unpack(by_url))
  redis.call('HSET', url_key, unpack(by_id))
end
return #ids / 4
"""


def joinable(urls: Sequence[str]) -> bool:
    """True when ``urls`` can travel joined by newlines (no URL contains one)."""
    return not any("\n" in url for url in urls)


@dataclass
class GraphCounters:
    """The ``P graph`` hash: absolute values, kept in memory and written per batch."""

    version: int = 0  # events applied (valid, not stale)
    links: int = 0
    pages: int = 0  # live pages
    ids: int = 0  # ids assigned (dense 0..ids-1, never reused)
    stale_ignored: int = 0
    dlq: int = 0

    def as_mapping(self) -> dict[str, int]:
        return {"version": self.version, "links": self.links, "pages": self.pages,
                "ids": self.ids, "stale_ignored": self.stale_ignored, "dlq": self.dlq}

    @property
    def progress(self) -> int:
        """Messages the graph has taken account of: applied, stale or dead-lettered.
        Grows with every batch that holds any (the version alone stands still over a
        batch of dead letters, so a Redis that lost only such batches looked intact)."""
        return self.version + self.stale_ignored + self.dlq

    @classmethod
    def from_redis(cls, raw: Mapping[bytes, bytes]) -> GraphCounters:
        known = cls().as_mapping()
        values = {k.decode(): int(v) for k, v in raw.items() if k.decode() in known}
        return cls(**values)


@dataclass
class GraphWrite:
    """Everything one batch writes to Redis, in page ids.

    ``delete_*`` already include the links of ``removed_ids`` (an emptied SET
    disappears in Redis, so a removed page leaves no ``out:``/``in:`` key).
    """

    new_pages: Sequence[tuple[int, str]] = ()
    removed_ids: Sequence[int] = ()
    revived_ids: Sequence[int] = ()
    delete_src: np.ndarray = field(default_factory=lambda: _EMPTY)
    delete_dst: np.ndarray = field(default_factory=lambda: _EMPTY)
    insert_src: np.ndarray = field(default_factory=lambda: _EMPTY)
    insert_dst: np.ndarray = field(default_factory=lambda: _EMPTY)
    ts_updates: Mapping[int, int] = field(default_factory=dict)
    titles: Mapping[int, str] = field(default_factory=dict)
    anchors: TextChanges = field(default_factory=TextChanges)
    crawled_changes: Mapping[int, bool] = field(default_factory=dict)
    crawled_bitmap: bytes | None = None
    """The whole ``page:crawled`` bitmap, written before ``crawled_changes``: once, by
    the first batch after a load from Redis that had none (data of an older version)."""
    counters: GraphCounters = field(default_factory=GraphCounters)
    offsets: Mapping[str, int] = field(default_factory=dict)

    @property
    def link_changes(self) -> int:
        return int(self.delete_src.size + self.insert_src.size)


@dataclass(frozen=True)
class PlannedLinks:
    """Exact net link changes of a batch against the mirror (before it is applied)."""

    delete_src: np.ndarray
    delete_dst: np.ndarray
    insert_src: np.ndarray
    insert_dst: np.ndarray
    removed_ids: np.ndarray  # live pages this batch removes
    links_after: int


def plan_links(graph: Any, batch: Any) -> PlannedLinks:
    """What ``graph.apply(batch)`` will change, computed without changing the graph.

    ``graph`` is a :class:`ranker.LinkGraph` (after the batch's URLs were interned),
    ``batch`` an :class:`ranker.EdgeBatch`. Removal of a page deletes all its links;
    deleting an absent link and inserting a present one are no-ops.
    (``sorted_unique``, not ``np.unique``: numpy 2's is ~5x slower on these arrays.)
    """
    live = graph.live_mask()
    removed = sorted_unique(batch.removed_pages)
    removed = removed[live[removed]] if removed.size else _EMPTY
    if removed.size:
        out_deg = graph.out_len[removed].astype(np.int64)
        in_deg = graph.in_len[removed].astype(np.int64)
        rem_keys = sorted_unique(np.concatenate([
            pair_keys(np.repeat(removed, out_deg), graph.gather_out(removed)),
            pair_keys(graph.gather_in(removed), np.repeat(removed, in_deg)),
        ]))
    else:
        rem_keys = np.zeros(0, dtype=np.int64)
    del_keys = np.zeros(0, dtype=np.int64)
    if batch.delete_src.size:
        present = graph.links_exist(batch.delete_src, batch.delete_dst)
        del_keys = sorted_unique(pair_keys(batch.delete_src[present], batch.delete_dst[present]))
        del_keys = np.setdiff1d(del_keys, rem_keys, assume_unique=True)
    all_del = sorted_unique(np.concatenate([rem_keys, del_keys]))
    ins_keys = np.zeros(0, dtype=np.int64)
    if batch.insert_src.size:
        keep = batch.insert_src != batch.insert_dst
        src, dst = batch.insert_src[keep], batch.insert_dst[keep]
        present = graph.links_exist(src, dst)
        keys = pair_keys(src, dst)
        still_there = present & ~np.isin(keys, all_del)
        ins_keys = sorted_unique(keys[~still_there])
    # A link deleted and re-inserted in one batch is no change at all.
    back = np.intersect1d(ins_keys, all_del, assume_unique=True)
    if back.size:
        ins_keys = np.setdiff1d(ins_keys, back, assume_unique=True)
        all_del = np.setdiff1d(all_del, back, assume_unique=True)
    del_src, del_dst = split_pair_keys(all_del)
    ins_src, ins_dst = split_pair_keys(ins_keys)
    return PlannedLinks(del_src, del_dst, ins_src, ins_dst, removed.astype(np.int32),
                        int(graph.num_links) - int(all_del.size) + int(ins_keys.size))


# -- command building (pure) ---------------------------------------------------------

Command = tuple[Any, ...]


def hset_commands(key: str, mapping: Mapping[Any, Any]) -> Iterator[Command]:
    """HSETs of ``mapping`` into ``key``, :data:`HSET_CHUNK` fields each (none if empty)."""
    flat = [item for pair in mapping.items() for item in pair]
    for chunk in chunks(flat, 2 * HSET_CHUNK):
        yield ("HSET", key, *chunk)


def group_members(owners: np.ndarray, members: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort by owner; return (owner per group, member count per group, members).

    Groups larger than :data:`MEMBER_CHUNK` are split (the owner repeats).
    """
    if owners.size == 0:
        return _EMPTY, _EMPTY, _EMPTY
    order = np.argsort(owners, kind="stable")
    owners_sorted = owners[order]
    starts = np.flatnonzero(np.r_[True, owners_sorted[1:] != owners_sorted[:-1]])
    # Split long runs: a new group also starts every MEMBER_CHUNK members into a run.
    run_id = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, owners_sorted.size]))
    offset_in_run = np.arange(owners_sorted.size) - starts[run_id]
    boundary = (offset_in_run % MEMBER_CHUNK) == 0
    group_starts = np.flatnonzero(boundary)
    counts = np.diff(np.r_[group_starts, owners_sorted.size])
    return (owners_sorted[group_starts].astype(np.int32), counts.astype(np.int32),
            members[order].astype(np.int32))


def _grouped_commands(verb: str, key_of: Any, owners: np.ndarray,
                      members: np.ndarray) -> Iterator[Command]:
    group_owner, counts, ordered = group_members(owners, members)
    members_list = ordered.tolist()
    pos = 0
    for owner, count in zip(group_owner.tolist(), counts.tolist(), strict=True):
        yield (verb, key_of(owner), *members_list[pos:pos + count])
        pos += count


def adjacency_commands(keys: Keys, write: GraphWrite) -> list[Command]:
    """Plain grouped SREM/SADD commands for both directions (deletions first)."""
    return [
        *_grouped_commands("SREM", keys.out_links, write.delete_src, write.delete_dst),
        *_grouped_commands("SREM", keys.in_links, write.delete_dst, write.delete_src),
        *_grouped_commands("SADD", keys.out_links, write.insert_src, write.insert_dst),
        *_grouped_commands("SADD", keys.in_links, write.insert_dst, write.insert_src),
    ]


def set_payloads(verb: str, head: str, owners: np.ndarray, members: np.ndarray, *,
                 sets_per_payload: int | None = None) -> Iterator[tuple[bytes, int]]:
    """``verb head+owner member...`` per owner (:func:`group_members`) as raw RESP
    (:func:`consumer.resp.set_commands`): ``(payload, commands in it)``, each payload
    at most ``sets_per_payload`` commands (all in one if None)."""
    group_owner, counts, ordered = group_members(owners, members)
    step = sets_per_payload or max(int(group_owner.size), 1)
    ends = np.cumsum(counts, dtype=np.int64)
    for first in range(0, group_owner.size, step):
        last = min(first + step, group_owner.size)
        start = int(ends[first] - counts[first])
        yield (set_commands(verb, head, group_owner[first:last], counts[first:last],
                            ordered[start:int(ends[last - 1])]), last - first)


def adjacency_payload(keys: Keys, write: GraphWrite) -> tuple[list[bytes], int]:
    """:func:`adjacency_commands` as RESP bytes, and how many commands they are."""
    payload: list[bytes] = []
    commands = 0
    for verb, head, owners, members in (("SREM", keys.out_head, write.delete_src, write.delete_dst),
                                        ("SREM", keys.in_head, write.delete_dst, write.delete_src),
                                        ("SADD", keys.out_head, write.insert_src, write.insert_dst),
                                        ("SADD", keys.in_head, write.insert_dst, write.insert_src)):
        for part, count in set_payloads(verb, head, owners, members):
            payload.append(part)
            commands += count
    return payload, commands


def new_pages_commands(keys: Keys, new_pages: Sequence[tuple[int, str]], *,
                       bulk: bool) -> list[Command]:
    """HSETs of both id maps; with ``bulk`` one EVAL of :data:`NEW_PAGES_SCRIPT`."""
    if not new_pages:
        return []
    urls = [url for _, url in new_pages]
    if bulk and joinable(urls):
        ids = np.fromiter((pid for pid, _ in new_pages), dtype="<i4", count=len(new_pages))
        return [("EVAL", NEW_PAGES_SCRIPT, 0, keys.page_id, keys.page_url, ids.tobytes(),
                 "\n".join(urls))]
    return [*hset_commands(keys.page_id, {url: pid for pid, url in new_pages}),
            *hset_commands(keys.page_url, dict(new_pages))]


def bookkeeping_commands(keys: Keys, write: GraphWrite, *, bulk: bool = False
                         ) -> list[Command]:
    """Everything but the adjacency: id maps, removal marks, ts, crawled flags, titles,
    counters, offsets."""
    cmds: list[Command] = new_pages_commands(keys, write.new_pages, bulk=bulk)
    if write.revived_ids:
        cmds.extend(("SREM", keys.page_removed, *c)
                    for c in chunks(list(write.revived_ids), MEMBER_CHUNK))
    if write.removed_ids:
        cmds.extend(("SADD", keys.page_removed, *c)
                    for c in chunks(list(write.removed_ids), MEMBER_CHUNK))
    if write.ts_updates:
        cmds.extend(hset_commands(keys.page_ts, write.ts_updates))
    if write.crawled_bitmap is not None:
        cmds.append(("SET", keys.page_crawled, write.crawled_bitmap))
    if write.crawled_changes:
        ops = [x for page, flag in sorted(write.crawled_changes.items())
               for x in ("SET", "u1", page, int(flag))]
        cmds.extend(("BITFIELD", keys.page_crawled, *c)
                    for c in chunks(ops, 4 * BITFIELD_CHUNK))
    if write.titles:
        cmds.extend(hset_commands(keys.page_title, write.titles))
    cmds.append(("HSET", keys.graph, *[x for kv in write.counters.as_mapping().items()
                                       for x in kv], LAYOUT_FIELD, LAYOUT_VERSION))
    if write.offsets:
        cmds.append(("HSET", keys.offsets, *[x for kv in write.offsets.items() for x in kv]))
    return cmds


# -- execution -----------------------------------------------------------------------

class GraphMoved(ServiceError):
    """Redis holds another graph (its counters' progress, see
    :attr:`GraphCounters.progress`) than the last transaction we committed.

    Older: it lost acknowledged writes (a failover to a replica that lagged, a
    restore from a backup). Committing on top would lose those batches for good and
    hand out page ids Redis never saw (a fault test: ``page:url`` no longer dense).
    Newer: someone else wrote. Either way the caller rebuilds from Redis and reads
    Kafka again from the offsets stored there."""

    def __init__(self, stored: int, expected: int) -> None:
        what = ("it lost acknowledged writes" if stored < expected
                else "another writer moved it on")
        super().__init__(f"Redis holds a graph of {stored} messages where {expected} "
                         f"were committed: {what}")
        self.stored = stored
        self.expected = expected


def commit_graph(client: redis.Redis, keys: Keys, write: GraphWrite, *,
                 fence: Any | None = None, bulk: bool = True,
                 after: GraphCounters | None = None) -> int:
    """Run the batch's MULTI/EXEC; return the number of commands in it.

    ``fence`` is a :class:`consumer.lock.ConsumerLock`: the lease is WATCHed and
    checked before MULTI, so EXEC aborts (``redis.WatchError``) if it changed.
    ``after``: the counters of the last transaction committed before this one.
    ``P graph`` is WATCHed too and must hold their progress (or this write's own: a
    re-send after a connection error whose first attempt committed), else
    :class:`GraphMoved`: a valid lease alone does not show that Redis kept our
    writes. Connection errors propagate untranslated (the caller retries the
    identical write); an error reply raises :class:`consumer.resp.TransactionFailed`.
    """
    payload, count = adjacency_payload(keys, write)
    others = bookkeeping_commands(keys, write, bulk=bulk)
    others[:0] = index_commands(client, keys, write.titles, write.anchors, scripted=bulk)
    payload.extend(command(*cmd) for cmd in others)
    count += len(others)
    with contextlib.ExitStack() as stack:
        if fence is not None:
            stack.enter_context(fence.fenced())
        conn = stack.enter_context(pooled_connection(client))
        if fence is not None:
            fence.check_on(conn)
        if after is not None:
            conn.send_packed_command([command("WATCH", keys.graph), command(
                "HMGET", keys.graph, *PROGRESS_FIELDS, LAYOUT_FIELD)])
            conn.read_response()
            *progress, layout = conn.read_response()
            # Another release may have written here meanwhile (its consumer held the
            # lease while ours lapsed): never stamp its data with our layout.
            check_layout_value(keys, layout)
            stored = stored_progress(keys, progress)
            if stored not in (after.progress, write.counters.progress):
                raise GraphMoved(stored, after.progress)
        transaction(conn, payload, count)
    return count


PROGRESS_FIELDS = ("version", "stale_ignored", "dlq")  # GraphCounters.progress


def stored_progress(keys: Keys, values: Sequence[Any]) -> int:
    """:attr:`GraphCounters.progress` from an ``HMGET`` of :data:`PROGRESS_FIELDS`."""
    try:
        return sum(int(value or 0) for value in values)
    except ValueError as exc:
        raise ServiceError(f"{keys.graph} counters are not numbers: {values!r}") from exc
