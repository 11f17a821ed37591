"""Restart snapshots: what a cleanly stopped consumer leaves for a fast restart.

A restart rebuilds the mirror from Redis: every page URL, every out-link set and the
published ZSETs. On the 1M-page stream's graph (0.93M pages, 7.2M links) that read
took 5.4 s for the graph and 5.4 s for the two ZSETs (Redis formats every score
and the client parses it back), of a 15 s restart. A consumer that stops cleanly
(SIGTERM, ``--until-caught-up``, ``--max-seconds``) has all of that in memory,
identical to what Redis holds, so it writes it to one local file, and the next
start on the same machine reads that file instead when it still matches Redis.

Redis stays the source of truth. The file is used only when its **identity** equals
what Redis holds at that start, read in one round trip: the graph hash (counters,
whose ``version`` counts every applied event), the offsets hash, and the
``publication`` id in each algorithm's meta (a fresh id per publication, written in
the same atomic step as the ZSET it names). Every graph transaction changes the
first two and every publication the third, so a matching file describes exactly the
stored graph and the ZSETs as published; anything else (a crash, another consumer
ran since, a file from another prefix, an unreadable file) falls back to reading
Redis, which is always correct, and says why in the log. A snapshot is only ever a
shortcut; deleting the directory is always safe.

The file is an uncompressed ``.npz`` (no pickles; ~100 MB for the graph above),
written to a temporary name and renamed, named by a hash of the Redis URL, key
prefix and topic. Snapshots not rewritten for :data:`KEEP_DAYS` days are pruned
when a new one is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from consumer.graph_write import GraphCounters
from consumer.keys import ALGORITHMS, Keys
from consumer.redis_store import (
    StoredState,
    crawled_bitmap,
    crawled_flags,
    decoded,
    decoded_hash,
    redis_errors,
    topic_offsets,
)
from rankstream.errors import RankstreamError
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer.snapshot")

# 2: published vectors mark a member absent with NaN (1 used 0, which a live page
# published at 0 also is). 3: the crawled flags (the orphan rule).
FORMAT = 3
KEEP_DAYS = 7.0


@dataclass(frozen=True)
class Identity:
    """What Redis holds that a snapshot must match (raw field -> value strings)."""

    graph: dict[str, str]
    offsets: dict[str, str]
    publications: dict[str, str]  # algorithm -> id in its meta ("" if never published)

    def to_json(self) -> str:
        return json.dumps({"graph": self.graph, "offsets": self.offsets,
                           "publications": self.publications}, sort_keys=True)


def read_identity(client: Any, keys: Keys) -> Identity:
    """The stored identity, in one pipelined round trip."""
    with redis_errors("reading the stored identity"):
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(keys.graph)
        pipe.hgetall(keys.offsets)
        for algorithm in ALGORITHMS:
            pipe.hget(keys.meta(algorithm), "publication")
        graph, offsets, *publications = pipe.execute()
    # Foreign bytes that are not UTF-8 (another topic's offsets, a hand-edited meta)
    # must not crash a start that Redis alone would survive: kept as surrogates, they
    # compare unequal to any snapshot's identity, which Redis then stands in for.
    lenient = "surrogateescape"
    return Identity(decoded_hash(graph, lenient), decoded_hash(offsets, lenient),
                    {a: decoded(p or b"", lenient) for a, p in zip(ALGORITHMS, publications,
                                                                  strict=True)})


def snapshot_path(settings: Settings) -> Path | None:
    """The one snapshot file of this Redis database, prefix and topic (None: disabled)."""
    if settings.snapshot_dir is None:
        return None
    where = f"{settings.redis_url}\n{settings.key_prefix}\n{settings.topic}"
    return settings.snapshot_dir / f"{hashlib.sha256(where.encode()).hexdigest()[:24]}.npz"


def write_snapshot(path: Path, identity: Identity, stored: StoredState,
                   published: Mapping[str, np.ndarray]) -> float:
    """Write ``stored`` and the published vectors under ``identity``; returns seconds."""
    started = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    ts_ids = np.fromiter(stored.last_ts.keys(), dtype=np.int64, count=len(stored.last_ts))
    ts_values = np.fromiter(stored.last_ts.values(), dtype=np.int64, count=len(stored.last_ts))
    arrays: dict[str, np.ndarray] = {
        "format": np.array([FORMAT]),
        "identity": np.frombuffer(identity.to_json().encode(), dtype=np.uint8),
        # Canonical URLs never contain a newline (producer.urls rejects control
        # characters), so one joined string is the cheapest lossless form.
        "urls": np.frombuffer("\n".join(stored.urls).encode(), dtype=np.uint8),
        "removed": stored.removed, "edge_src": stored.edge_src, "edge_dst": stored.edge_dst,
        "ts_ids": ts_ids, "ts_values": ts_values,
        # Absent (Redis holds none yet, see StoredState.crawled) is an empty array
        # beside crawled_known = 0.
        "crawled_known": np.array([stored.crawled is not None]),
        "crawled": np.frombuffer(b"" if stored.crawled is None
                                 else crawled_bitmap(stored.crawled), dtype=np.uint8),
    }
    for algorithm, values in published.items():
        arrays[f"published_{algorithm}"] = np.asarray(values, dtype=np.float64)
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as out:
            np.savez(out, **arrays)  # type: ignore[arg-type]
            out.flush()
            os.fsync(out.fileno())  # else a power cut can leave the new name on no data
        os.replace(temporary, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        temporary.unlink(missing_ok=True)  # a full disk must not keep a half file
        raise
    _prune(path)
    return time.perf_counter() - started


# Snapshot files are named by snapshot_path: 24 hex digits. Only such names are
# pruned (the directory may be shared: a user's own old .npz files were deleted).
_NAME = "[0-9a-f]" * 24


def _prune(kept: Path) -> None:
    # Temporary files are left only by a writer killed mid-write (one can be 100 MB);
    # one still being written is seconds old.
    now = time.time()
    for pattern, age in ((f"{_NAME}.npz", KEEP_DAYS * 86400.0),
                         (f"{_NAME}.npz.*.tmp", 3600.0)):
        for old in kept.parent.glob(pattern):
            try:
                if old != kept and old.stat().st_mtime < now - age:
                    old.unlink()
            except OSError:
                continue  # another consumer's file, gone or busy: not ours to insist on


# Every member a snapshot has, no more and no fewer: zipfile trusts each central
# directory entry's lengths, so one flipped bit in a comment length hid the members
# after it (both published vectors), and the file loaded without them.
_MEMBERS = frozenset({"format", "identity", "urls", "removed", "edge_src", "edge_dst",
                      "ts_ids", "ts_values", "crawled_known", "crawled",
                      *(f"published_{a}" for a in ALGORITHMS)})
_ID_ARRAYS = ("removed", "edge_src", "edge_dst", "ts_ids")


def read_snapshot(path: Path, identity: Identity, topic: str
                  ) -> tuple[StoredState, dict[str, np.ndarray]] | None:
    """The snapshot's state and published vectors if it matches ``identity``, else None.

    Nothing in the file is trusted beyond its CRCs and what is checked here: a file
    that fails any check is logged and left for Redis to stand in for, so that a
    snapshot can make a start faster but never wrong, stuck or crashed.
    """
    started = time.perf_counter()
    try:
        arrays = _read_members(path)
    except FileNotFoundError:
        return None  # no snapshot: the usual first start
    except Exception as exc:  # a cache we cannot read (numpy's header parser alone
        # raises SyntaxError and tokenize errors; a directory we may not search, a
        # symlink loop): Redis decides
        unused_snapshot(path, f"unreadable: {type(exc).__name__}: {exc}")
        return None
    if isinstance(arrays, str):
        unused_snapshot(path, arrays)
        return None
    version = arrays["format"]
    if (version.shape != (1,) or not np.issubdtype(version.dtype, np.integer)
            or int(version[0]) != FORMAT):
        unused_snapshot(path, "written by another version")
        return None
    if bytes(arrays["identity"]).decode(errors="replace") != identity.to_json():
        unused_snapshot(path, "Redis has changed since it was written")
        return None
    try:
        counters = GraphCounters.from_redis({k.encode(errors="surrogateescape"):
                                             v.encode(errors="surrogateescape")
                                             for k, v in identity.graph.items()})
    except ValueError as exc:  # not UTF-8, not a number: reading Redis says so
        unused_snapshot(path, f"the stored graph counters are unreadable: {exc}")
        return None
    why = _malformed(arrays, counters)  # against the counters the identity holds
    if why is not None:
        unused_snapshot(path, why)
        return None
    try:
        text = bytes(arrays["urls"]).decode()
        urls = text.split("\n") if text else []
        crawled = (crawled_flags(bytes(arrays["crawled"]), counters.ids, "crawled")
                   if bool(arrays["crawled_known"][0]) else None)
    except (UnicodeDecodeError, RankstreamError) as exc:
        unused_snapshot(path, f"unreadable: {exc}")
        return None
    if len(urls) != counters.ids or len(set(urls)) != counters.ids:
        unused_snapshot(path, f"{len(urls)} URLs ({len(set(urls))} distinct) for "
                              f"{counters.ids} page ids")
        return None
    published = {a: arrays[f"published_{a}"] for a in ALGORITHMS}
    last_ts = dict(zip(arrays["ts_ids"].tolist(), arrays["ts_values"].tolist(), strict=True))
    stored = StoredState(urls=urls, removed=arrays["removed"], edge_src=arrays["edge_src"],
                         edge_dst=arrays["edge_dst"], last_ts=last_ts,
                         offsets=topic_offsets(identity.offsets, topic), counters=counters,
                         seconds=time.perf_counter() - started, crawled=crawled)
    return stored, published


def _read_members(path: Path) -> dict[str, np.ndarray] | str:
    """Every member of the file at ``path`` (or why not), each CRC checked first.

    Opened once, without blocking (a FIFO in its place hung the start), and only a
    regular file is read. Members must be stored uncompressed, as the writer stores
    them, so reading one never takes more memory than the file's size (a 1 MB file
    holding a compressed 1 GiB member took 2 GiB to refuse).
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        return "not a regular file"
    with os.fdopen(descriptor, "rb") as stream:
        with zipfile.ZipFile(stream) as archive:
            infos = archive.infolist()
            names = {info.filename.removesuffix(".npy") for info in infos}
            if len(infos) != len(_MEMBERS) or names != _MEMBERS:
                return f"its members are not a snapshot's: {sorted(names)[:20]}"
            if any(info.compress_type != zipfile.ZIP_STORED for info in infos):
                return "a member is compressed (snapshots never are)"
            # zipfile checks a member's CRC only when it is read to its end, and
            # np.load stops where the member's header says: a corrupted shape read
            # short and was trusted. Every CRC first (100 MB: ~0.1 s, against ~10 s of
            # Redis reads).
            bad = archive.testzip()
        if bad is not None:
            return f"unreadable: member {bad} fails its CRC"
        stream.seek(0)
        with np.load(stream, allow_pickle=False) as data:
            return {name: data[name] for name in _MEMBERS}


def _malformed(arrays: Mapping[str, np.ndarray], counters: GraphCounters) -> str | None:
    """Why the arrays cannot be the graph the counters describe, or None.

    CRCs only say the file is as written; these checks say it is a graph the mirror
    can load. A file that passed the CRCs but not these (a writer's bug, a tampered
    file) crashed every start in LinkGraph, or put a timestamp on the wrong page.
    Self links, duplicates and links of removed pages are left to the mirror, which
    finds them as a graph with fewer links than the counters, without a sort here.
    """
    ids, links = counters.ids, counters.links
    shapes = {"format": (1,), "crawled_known": (1,), "urls": None, "identity": None,
              "crawled": None, "edge_src": (links,), "edge_dst": (links,),
              "removed": None, "ts_ids": None, "ts_values": arrays["ts_ids"].shape,
              **{f"published_{a}": (ids,) for a in ALGORITHMS}}
    for name, shape in shapes.items():
        value = arrays[name]
        if value.ndim != 1 or (shape is not None and value.shape != shape):
            return f"{name} has shape {value.shape}, not {shape or '(n,)'}"
    for name in (*_ID_ARRAYS, "format"):
        if not np.issubdtype(arrays[name].dtype, np.integer):
            return f"{name} holds {arrays[name].dtype}, not integers"
    # Exactly as written: a uint64 stamp past 2**63 passed an integer check and then
    # overflowed the mirror's int64 array on every start.
    if arrays["ts_values"].dtype != np.int64:
        return f"ts_values holds {arrays['ts_values'].dtype}, not int64"
    for name in _ID_ARRAYS:
        value = arrays[name]
        if value.size and (int(value.min()) < 0 or int(value.max()) >= ids):
            return f"a page id in {name} is out of range 0..{ids - 1}"
    for name in ("identity", "urls", "crawled"):
        if arrays[name].dtype != np.uint8:
            return f"{name} holds {arrays[name].dtype}, not bytes"
    if arrays["crawled_known"].dtype != np.bool_:
        return f"crawled_known holds {arrays['crawled_known'].dtype}, not a flag"
    for algorithm in ALGORITHMS:
        vector = arrays[f"published_{algorithm}"]
        if vector.dtype != np.float64:
            return f"published_{algorithm} holds {vector.dtype}, not float64"
    # A removed page has no links, so the link count cannot tell one missing: the
    # mirror took the file's count of live pages, wrote it over the stored one, and
    # treated a removed page as live (session 37's review).
    removed = np.unique(arrays["removed"])
    if removed.size != arrays["removed"].size or ids - removed.size != counters.pages:
        return (f"removed holds {removed.size:,} distinct of {arrays['removed'].size:,} ids, "
                f"leaving {ids - removed.size:,} live pages, not the stored {counters.pages:,}")
    return None


def unused_snapshot(path: Path | None, why: str) -> None:
    """Log why the snapshot at ``path`` was not used (Redis was read instead)."""
    log.info("snapshot not used", extra={"fields": {"path": str(path), "reason": why}})


def leave_snapshot(client: Any, keys: Keys, path: Path | None, mirror: Any,
                   publisher: Any) -> None:
    """After a clean drain: write the snapshot if memory provably equals Redis.

    ``path`` None: snapshots are off. ``mirror``: the :class:`consumer.mirror.Mirror`;
    ``publisher``: the :class:`consumer.score_publisher.ScorePublisher` whose swaps
    made the ZSETs.
    Checked against Redis first: the graph version and offsets must be the mirror's
    (every batch committed) and each meta must name our own last publication. Any
    failure is logged, never raised: a missing snapshot only makes a restart slower.
    """
    if path is None or mirror is None:
        return
    try:
        identity = read_identity(client, keys)
        n = mirror.graph.num_ids
        published: dict[str, np.ndarray] = {}
        for algorithm in mirror.ranks.engines:
            record = publisher.live_record(algorithm)
            if record is None or record[0] != identity.publications.get(algorithm):
                _skipped(f"the {algorithm} ZSET is not our last publication")
                return
            published[algorithm] = record[1][:n]
        if int(identity.graph.get("version", "-1")) != mirror.counters.version:
            _skipped("the stored graph version is not the mirror's")
            return
        ours = {k: v for k, v in identity.offsets.items()
                if k.rpartition(":")[0] == mirror.topic}  # not another topic's
        if ours != {k: str(v) for k, v in mirror.offsets_fields().items()}:
            _skipped("the stored offsets are not the mirror's")
            return
        stored = mirror.stored_state()  # only once it is known to be worth writing
        seconds = write_snapshot(path, identity, stored, published)
    except (OSError, ValueError, RankstreamError) as exc:  # optional; the stop is not
        log.warning("snapshot not written", extra={"fields": {"error": repr(exc)[:300]}})
        return
    log.info("snapshot written", extra={"fields": {
        "path": str(path), "pages": len(stored.urls), "links": int(stored.edge_src.size),
        "seconds": round(seconds, 3), "bytes": path.stat().st_size}})


def _skipped(why: str) -> None:
    log.info("snapshot not written", extra={"fields": {"reason": why}})
