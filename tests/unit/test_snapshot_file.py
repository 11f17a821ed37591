"""The snapshot file on its own: a lossless round trip, used only under its identity."""

from __future__ import annotations

import numpy as np

from consumer.graph_write import GraphCounters
from consumer.redis_store import StoredState
from consumer.snapshot import Identity, read_snapshot, snapshot_path, write_snapshot
from rankstream.settings import Settings


def _state() -> StoredState:
    return StoredState(
        urls=["https://a.example/", "https://b.example/x?q=é", "file:///c"],
        removed=np.array([2], dtype=np.int32),
        edge_src=np.array([0, 1], dtype=np.int32), edge_dst=np.array([1, 0], dtype=np.int32),
        last_ts={0: 17, 2: 1_767_225_600_000}, offsets={0: 12},
        counters=GraphCounters(version=12, links=2, pages=2, ids=3))


def _identity(version: str = "12", publication: str = "p1") -> Identity:
    return Identity(graph={"version": version, "links": "2", "pages": "2", "ids": "3"},
                    offsets={"t:0": "12"}, publications={"pagerank": publication, "wpr": "p1"})


def test_round_trip_under_the_same_identity(tmp_path):
    path = tmp_path / "s.npz"
    published = {"pagerank": np.array([0.5, 1.25, 0.0]), "wpr": np.array([1.0, 2.0, 0.0])}
    write_snapshot(path, _identity(), _state(), published)
    found = read_snapshot(path, _identity(), "t")
    assert found is not None
    stored, vectors = found
    expected = _state()
    assert stored.urls == expected.urls and stored.last_ts == expected.last_ts
    assert stored.offsets == {0: 12} and stored.counters == expected.counters
    for name in ("removed", "edge_src", "edge_dst"):
        assert np.array_equal(getattr(stored, name), getattr(expected, name))
    assert vectors.keys() == published.keys()
    assert all(np.array_equal(vectors[a], published[a]) for a in published)


def test_any_other_identity_or_a_damaged_file_is_not_used(tmp_path):
    path = tmp_path / "s.npz"
    write_snapshot(path, _identity(), _state(), {"pagerank": np.ones(3), "wpr": np.ones(3)})
    assert read_snapshot(path, _identity(version="13"), "t") is None
    assert read_snapshot(path, _identity(publication="p2"), "t") is None
    assert read_snapshot(tmp_path / "missing.npz", _identity(), "t") is None
    path.write_bytes(path.read_bytes()[:100])
    assert read_snapshot(path, _identity(), "t") is None


def test_a_file_with_odd_arrays_is_not_used_and_old_temporaries_go(tmp_path):
    import os
    import time

    path = tmp_path / "s.npz"
    np.savez(path, format=np.array([], dtype=np.int64))  # an empty format array
    assert read_snapshot(path, _identity(), "t") is None  # not an IndexError at start
    left = tmp_path / "s.npz.4242.tmp"  # a writer killed mid-write
    left.write_bytes(b"x" * 10)
    recent = tmp_path / "t.npz.4243.tmp"  # one being written now
    recent.write_bytes(b"x")
    hour_ago = time.time() - 3700
    os.utime(left, (hour_ago, hour_ago))
    write_snapshot(path, _identity(), _state(), {"pagerank": np.ones(3), "wpr": np.ones(3)})
    assert not left.exists() and recent.exists()


def test_one_file_per_redis_prefix_and_topic_and_none_when_disabled(tmp_path):
    base = Settings(snapshot_dir=tmp_path)
    paths = {snapshot_path(base.model_copy(update=change)) for change in (
        {}, {"key_prefix": "other:"}, {"topic": "other"}, {"redis_url": "redis://h:1/0"})}
    assert len(paths) == 4 and all(p is not None and p.parent == tmp_path for p in paths)
    assert snapshot_path(Settings(snapshot_dir="")) is None


def test_a_corrupted_byte_anywhere_is_never_trusted_nor_raised(tmp_path):
    """One flipped byte: a shape in an npy header read short was trusted (zipfile checks
    a CRC only at a member's end), and numpy's header parser raised SyntaxError and
    tokenize errors through to a crash on every start."""
    path = tmp_path / "s.npz"
    published = {"pagerank": np.arange(3.0), "wpr": np.ones(3)}
    write_snapshot(path, _identity(), _state(), published)
    good = path.read_bytes()
    expected = read_snapshot(path, _identity(), "t")
    assert expected is not None
    for at in range(0, len(good), 3):
        path.write_bytes(good[:at] + bytes([good[at] ^ 0x5A]) + good[at + 1:])
        found = read_snapshot(path, _identity(), "t")  # never raises
        if found is not None:  # e.g. a byte of the zip's comments or padding
            stored, vectors = found
            assert stored.urls == expected[0].urls
            for name in ("removed", "edge_src", "edge_dst"):
                assert np.array_equal(getattr(stored, name), getattr(expected[0], name))
            assert all(np.array_equal(vectors[a], published[a]) for a in vectors)


def test_arrays_that_do_not_fit_the_stored_counters_are_not_used(tmp_path):
    path = tmp_path / "s.npz"
    short = {"pagerank": np.ones(2), "wpr": np.ones(3)}
    write_snapshot(path, _identity(), _state(), short)
    assert read_snapshot(path, _identity(), "t") is None
    state = _state()
    state.removed = np.array([3], dtype=np.int32)
    write_snapshot(path, _identity(), state, {"wpr": np.ones(3)})
    assert read_snapshot(path, _identity(), "t") is None


def test_a_shape_shrunk_in_a_large_members_header_is_caught_by_its_crc(tmp_path):
    """zipfile checks a member's CRC only once it is read to its end; np.load stops
    where the header's shape says. Small members are read to the end anyway."""
    n = 300_000
    state = StoredState(
        urls=[f"https://x.example/{i}" for i in range(n)],
        removed=np.arange(200_000, dtype=np.int32),
        edge_src=np.array([250_000], dtype=np.int32), edge_dst=np.array([250_001], dtype=np.int32),
        last_ts={}, offsets={0: 1},
        counters=GraphCounters(version=1, links=1, pages=n - 200_000, ids=n))
    identity = Identity(graph={"version": "1", "links": "1", "pages": str(n - 200_000),
                               "ids": str(n)},
                        offsets={"t:0": "1"}, publications={"pagerank": "p", "wpr": "p"})
    path = tmp_path / "s.npz"
    write_snapshot(path, identity, state, {"pagerank": np.ones(n), "wpr": np.ones(n)})
    raw = bytearray(path.read_bytes())
    at = raw.index(b"'shape': (200000,)", raw.index(b"removed.npy"))
    raw[at:at + 18] = b"'shape': (100000,)"
    path.write_bytes(bytes(raw))
    assert read_snapshot(path, identity, "t") is None
