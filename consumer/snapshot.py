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
    return Identity(decoded_hash(graph), decoded_hash(offsets),
                    {a: (p or b"").decode() for a, p in zip(ALGORITHMS, publications,
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


def _prune(kept: Path) -> None:
    # Temporary files are left only by a writer killed mid-write (one can be 100 MB);
    # one still being written is seconds old.
    now = time.time()
    for pattern, age in (("*.npz", KEEP_DAYS * 86400.0), ("*.npz.*.tmp", 3600.0)):
        for old in kept.parent.glob(pattern):
            try:
                if old != kept and old.stat().st_mtime < now - age:
                    old.unlink()
            except OSError:
                continue  # another consumer's file, gone or busy: not ours to insist on


def read_snapshot(path: Path, identity: Identity, topic: str
                  ) -> tuple[StoredState, dict[str, np.ndarray]] | None:
    """The snapshot's state and published vectors if it matches ``identity``, else None."""
    started = time.perf_counter()
    if not path.exists():
        return None
    counters = GraphCounters.from_redis({k.encode(): v.encode()
                                         for k, v in identity.graph.items()})
    try:
        # zipfile checks a member's CRC only when it is read to its end, and np.load
        # stops where the member's header says: a corrupted shape read short and was
        # trusted. Every CRC first (100 MB: ~0.1 s, against ~10 s of Redis reads).
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        if bad is not None:
            _unused(path, f"unreadable: member {bad} fails its CRC")
            return None
        with np.load(path, allow_pickle=False) as data:
            if int(data["format"][0]) != FORMAT:
                _unused(path, "written by another version")
                return None
            if bytes(data["identity"]).decode() != identity.to_json():
                _unused(path, "Redis has changed since it was written")
                return None
            text = bytes(data["urls"]).decode()
            urls = text.split("\n") if text else []
            last_ts = dict(zip(data["ts_ids"].tolist(), data["ts_values"].tolist(),
                               strict=True))
            published = {name.removeprefix("published_"): data[name]
                         for name in data.files if name.startswith("published_")}
            removed, edge_src, edge_dst = data["removed"], data["edge_src"], data["edge_dst"]
            crawled = (crawled_flags(bytes(data["crawled"]), counters.ids, "crawled")
                       if bool(data["crawled_known"][0]) else None)
    except Exception as exc:  # a cache we cannot read (numpy's header parser alone
        # raises SyntaxError and tokenize errors): Redis decides
        _unused(path, f"unreadable: {type(exc).__name__}: {exc}")
        return None
    sizes = {"urls": len(urls), "edge_src": edge_src.size, "edge_dst": edge_dst.size,
             **{f"published_{a}": v.size for a, v in published.items()}}
    expected = {"urls": counters.ids, "edge_src": counters.links, "edge_dst": counters.links,
                **{f"published_{a}": counters.ids for a in published}}
    if sizes != expected:
        _unused(path, f"its arrays do not fit the stored counters: {sizes} != {expected}")
        return None
    if removed.size and (int(removed.min()) < 0 or int(removed.max()) >= counters.ids):
        _unused(path, "a removed page id is out of range")
        return None
    stored = StoredState(urls=urls, removed=removed, edge_src=edge_src, edge_dst=edge_dst,
                         last_ts=last_ts, offsets=topic_offsets(identity.offsets, topic),
                         counters=counters, seconds=time.perf_counter() - started,
                         crawled=crawled)
    return stored, published


def _unused(path: Path, why: str) -> None:
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
