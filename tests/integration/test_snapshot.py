"""Restart snapshots against the real services: same mirror as Redis, or not used at all."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from consumer.keys import Keys
from consumer.mirror import Mirror
from consumer.redis_store import connect_redis
from consumer.snapshot import snapshot_path
from producer.synthetic import synthetic_event_dicts
from rankstream.services.testing import Isolated
from rankstream.settings import Settings
from tests.integration.test_consumer_pipeline import consume, publish


def _loads(caplog: pytest.LogCaptureFixture, message: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == message]


def _assert_same_mirror(a: Mirror, b: Mirror) -> None:
    ga, gb = a.graph, b.graph
    assert ga.num_ids == gb.num_ids
    assert [ga.key_of(p) for p in range(ga.num_ids)] == [gb.key_of(p) for p in range(gb.num_ids)]
    for x, y in zip(ga.edges(), gb.edges(), strict=True):
        assert np.array_equal(x, y)
    assert np.array_equal(ga.live_mask(), gb.live_mask())
    assert np.array_equal(a.removed_flag, b.removed_flag)
    assert np.array_equal(a.applier.last_ts, b.applier.last_ts)
    assert np.array_equal(a.applier.crawled, b.applier.crawled)
    assert a.crawled_unwritten == b.crawled_unwritten
    assert a.counters == b.counters and a.offsets == b.offsets
    assert a.published.keys() == b.published.keys() and a.published
    for algorithm, values in a.published.items():
        assert np.array_equal(values, b.published[algorithm], equal_nan=True)
        assert np.allclose(a.ranks.scores(algorithm), b.ranks.scores(algorithm), atol=1e-9)


@pytest.fixture
def snapshots(isolated: Isolated, tmp_path: Any) -> Settings:
    """The test's settings with a snapshot directory of its own, and a stream consumed."""
    settings = isolated.settings.model_copy(update={"snapshot_dir": tmp_path})
    # Re-crawls, link edits and page removals, so removed and revived pages and
    # recorded ts values are all part of what a snapshot must carry.
    publish(settings, list(synthetic_event_dicts(600, seed=5, edit_fraction=0.4)))
    consume(settings)
    return settings


def test_a_clean_stop_leaves_a_snapshot_that_loads_the_mirror_redis_holds(snapshots, caplog):
    settings = snapshots
    path = snapshot_path(settings)
    assert path is not None and path.exists()
    client, keys = connect_redis(settings), Keys(settings.key_prefix)
    with caplog.at_level(logging.INFO, logger="rankstream.consumer"):
        from_redis = Mirror.load(client, keys, settings)
        from_snapshot = Mirror.load(client, keys, settings, snapshot=path)
    sources = [fields["from"] for fields in _loads(caplog, "mirror loaded")]
    assert sources == ["redis", f"snapshot {path}"]
    assert from_redis.graph.num_ids > 300 and from_redis.removed_flag.any()
    _assert_same_mirror(from_redis, from_snapshot)


def test_a_snapshot_is_ignored_once_redis_moved_on_or_when_unreadable(snapshots, caplog):
    settings = snapshots
    path = snapshot_path(settings)
    assert path is not None and path.exists()
    kept = path.read_bytes()
    # Another consumer (without snapshots) applies more events: the file is out of date.
    publish(settings, list(synthetic_event_dicts(650, seed=5, edit_fraction=0.4))[600:])
    consume(settings.model_copy(update={"snapshot_dir": None}))
    path.write_bytes(kept)
    client, keys = connect_redis(settings), Keys(settings.key_prefix)
    with caplog.at_level(logging.INFO, logger="rankstream.consumer"):
        stale = Mirror.load(client, keys, settings, snapshot=path)
        path.write_bytes(kept[: len(kept) // 2])
        torn = Mirror.load(client, keys, settings, snapshot=path)
        from_redis = Mirror.load(client, keys, settings)
    reasons = [fields["reason"] for fields in _loads(caplog, "snapshot not used")]
    assert reasons[0] == "Redis has changed since it was written"
    assert reasons[1].startswith("unreadable")
    assert [f["from"] for f in _loads(caplog, "mirror loaded")] == ["redis"] * 3
    assert stale.counters.version == from_redis.counters.version > 600
    _assert_same_mirror(from_redis, stale)
    _assert_same_mirror(from_redis, torn)


def test_a_restarted_consumer_resumes_from_the_snapshot(snapshots, caplog):
    settings = snapshots
    publish(settings, list(synthetic_event_dicts(700, seed=5, edit_fraction=0.4))[600:])
    with caplog.at_level(logging.INFO, logger="rankstream.consumer"):
        service = consume(settings)
    assert [f["from"] for f in _loads(caplog, "mirror loaded")] == [
        f"snapshot {snapshot_path(settings)}"]
    assert service.mirror is not None and service.mirror.counters.version == 700
    # What it wrote equals a fresh load from Redis, and its new snapshot matches it.
    client, keys = connect_redis(settings), Keys(settings.key_prefix)
    _assert_same_mirror(Mirror.load(client, keys, settings),
                        Mirror.load(client, keys, settings, snapshot=snapshot_path(settings)))


def test_another_topics_offsets_under_the_prefix_do_not_stop_snapshots(snapshots, caplog):
    """A topic change on the same prefix leaves the old topic's fields in P offsets:
    every clean stop then said "the stored offsets are not the mirror's"."""
    settings = snapshots
    path = snapshot_path(settings)
    assert path is not None
    client, keys = connect_redis(settings), Keys(settings.key_prefix)
    client.hset(keys.offsets, "an.older.topic:0", 41)
    path.unlink()
    with caplog.at_level(logging.INFO, logger="rankstream.consumer"):
        consume(settings)
    assert not _loads(caplog, "snapshot not written"), _loads(caplog, "snapshot not written")
    assert path.exists()
    _assert_same_mirror(Mirror.load(client, keys, settings),
                        Mirror.load(client, keys, settings, snapshot=path))


def test_foreign_bytes_in_the_identity_do_not_stop_a_start_with_snapshots(snapshots, caplog):
    """Bytes that are not UTF-8 where Redis alone tolerates them (another topic's
    offsets, a hand-edited meta's publication id) crashed every start with snapshots
    on, file or no file, with a UnicodeDecodeError traceback (a review, session 29)."""
    settings = snapshots
    path = snapshot_path(settings)
    assert path is not None and path.exists()
    client, keys = connect_redis(settings), Keys(settings.key_prefix)
    from_redis = Mirror.load(client, keys, settings)
    client.hset(keys.offsets, "an.older.topic:0", b"\xff")
    client.hset(keys.meta("wpr"), "publication", b"\xc3\x28")
    with caplog.at_level(logging.INFO, logger="rankstream.consumer"):
        with_file = Mirror.load(client, keys, settings, snapshot=path)
        path.unlink()
        without = Mirror.load(client, keys, settings, snapshot=path)
    assert [f["reason"] for f in _loads(caplog, "snapshot not used")] == [
        "Redis has changed since it was written"]
    assert [f["from"] for f in _loads(caplog, "mirror loaded")] == ["redis"] * 2
    assert with_file.counters == without.counters == from_redis.counters


def test_data_without_crawled_flags_gets_them_with_every_page_counted_crawled(isolated):
    """Redis data of a version before the orphan rule has no ``page:crawled`` bitmap:
    every live page then counts as crawled, and the next batch writes the bitmap.
    (Without snapshots: that version's are of an older format, never used.)"""
    settings = isolated.settings.model_copy(update={"snapshot_dir": None})
    events = list(synthetic_event_dicts(500, seed=9, edit_fraction=0.4))
    publish(settings, events[:350])
    consume(settings)
    client, keys = connect_redis(settings), Keys(settings.key_prefix)
    client.delete(keys.page_crawled)
    old = Mirror.load(client, keys, settings)
    live_then = old.graph.live_mask()
    assert old.crawled_unwritten and np.array_equal(old.applier.crawled, live_then)
    assert old.stored_state().crawled is None  # a snapshot must not invent the bitmap

    publish(settings, events[350:])
    consume(settings)
    new = Mirror.load(client, keys, settings)
    assert not new.crawled_unwritten
    graph, crawled = new.graph, new.applier.crawled
    removed_since = {graph.id_of(e["url"]) for e in events[350:] if e["type"] == "page_removed"}
    kept = [p for p in np.flatnonzero(live_then).tolist() if p not in removed_since]
    assert kept and crawled[kept].all()
    # The orphan rule's invariant: every live page is crawled or linked to.
    live = graph.live_mask()
    assert not (live & ~crawled & (graph.in_len[: graph.num_ids] == 0)).any()


def test_a_snapshot_is_ignored_once_another_publication_landed(snapshots, caplog):
    """Same graph, same offsets, but another consumer published since (an idle
    refresh): the snapshot's score vectors are not what the ZSETs hold."""
    import logging

    import numpy as np

    from consumer.mirror import Mirror
    from consumer.snapshot import snapshot_path

    settings = snapshots
    path = snapshot_path(settings)
    assert path is not None and path.exists()
    client, keys = connect_redis(settings), Keys(settings.key_prefix)
    member = client.zrange(keys.scores("pagerank"), 0, 0)[0]
    client.zincrby(keys.scores("pagerank"), 1.0, member)
    client.hset(keys.meta("pagerank"), "publication", "another-consumers")
    with caplog.at_level(logging.INFO, logger="rankstream.consumer"):
        loaded = Mirror.load(client, keys, settings, snapshot=path)
        from_redis = Mirror.load(client, keys, settings)
    assert [f["from"] for f in _loads(caplog, "mirror loaded")] == ["redis"] * 2
    assert np.array_equal(loaded.published["pagerank"], from_redis.published["pagerank"],
                          equal_nan=True)
