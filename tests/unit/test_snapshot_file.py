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

    path = tmp_path / f"{'a' * 24}.npz"  # named as snapshot_path names them
    np.savez(path, format=np.array([], dtype=np.int64))  # an empty format array
    assert read_snapshot(path, _identity(), "t") is None  # not an IndexError at start
    left = tmp_path / f"{'a' * 24}.npz.4242.tmp"  # a writer killed mid-write
    left.write_bytes(b"x" * 10)
    recent = tmp_path / f"{'b' * 24}.npz.4243.tmp"  # one being written now
    recent.write_bytes(b"x")
    theirs = tmp_path / "embeddings.npz"  # a user's own file in a shared directory
    theirs.write_bytes(b"x")
    old_snapshot = tmp_path / f"{'c' * 24}.npz"
    old_snapshot.write_bytes(b"x")
    hour_ago, weeks_ago = time.time() - 3700, time.time() - 30 * 86400
    os.utime(left, (hour_ago, hour_ago))
    os.utime(theirs, (weeks_ago, weeks_ago))
    os.utime(old_snapshot, (weeks_ago, weeks_ago))
    write_snapshot(path, _identity(), _state(), {"pagerank": np.ones(3), "wpr": np.ones(3)})
    assert not left.exists() and recent.exists()
    assert theirs.exists() and not old_snapshot.exists()


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


# --- files that pass their CRCs but are not a graph (session 27's review) ------------


def _rewritten(tmp_path, **changes):
    """A snapshot whose members are the written ones with ``changes`` (None drops one),
    saved again by numpy, so that every CRC holds."""
    import zipfile

    path = tmp_path / "s.npz"
    write_snapshot(path, _identity(), _state(), {"pagerank": np.ones(3), "wpr": np.ones(3)})
    with np.load(path) as data:
        members = {name: data[name] for name in data.files}
    for name, value in changes.items():
        if value is None:
            members.pop(name)
        else:
            members[name] = value
    compress = members.pop("_compressed", None) is not None
    (np.savez_compressed if compress else np.savez)(path, **members)
    assert zipfile.ZipFile(path).testzip() is None
    return path


def test_a_snapshot_that_is_not_the_graph_its_counters_describe_is_not_used(tmp_path):
    cases = {
        "an edge id out of range": {"edge_src": np.array([0, 3], dtype=np.int32)},
        "a negative edge id": {"edge_dst": np.array([1, -1], dtype=np.int32)},
        "edge ids as floats": {"edge_src": np.array([0.0, 1.0])},
        "a negative timestamp id (landed on another page)": {
            "ts_ids": np.array([0, -1], dtype=np.int64)},
        "a timestamp id out of range": {"ts_ids": np.array([0, 3], dtype=np.int64)},
        # Integers, but past int64: the mirror's stamp array overflowed on every start.
        "timestamps as uint64": {"ts_values": np.array([2**63 + 5, 1], dtype=np.uint64)},
        "a removed id as a float": {"removed": np.array([2.0])},
        # A removed page has no links, so only the live-page count tells it missing:
        # the mirror took it as live (session 37's review).
        "a removed page missing": {"removed": np.array([], dtype=np.int32)},
        "a removed page twice": {"removed": np.array([2, 2], dtype=np.int32)},
        "a page removed too many": {"removed": np.array([1, 2], dtype=np.int32)},
        "published scores as strings": {"published_wpr": np.array(["1", "2", "3"])},
        "published scores of another shape": {"published_wpr": np.ones((3, 1))},
        "a duplicate URL": {"urls": np.frombuffer(b"https://a.example/\nhttps://a.example/"
                                                  b"\nfile:///c", dtype=np.uint8)},
        # A flipped comment length hid the last members: the file loaded without them.
        "a published vector missing": {"published_wpr": None},
        "an extra member": {"published_foo": np.ones(3)},
        # A small file could hold a member that inflates to gigabytes.
        "compressed members": {"_compressed": np.ones(1)},
    }
    for case, changes in cases.items():
        path = _rewritten(tmp_path, **changes)
        assert read_snapshot(path, _identity(), "t") is None, case


def test_a_snapshot_graph_with_fewer_links_than_its_counters_is_not_used(tmp_path):
    """Duplicates, self links and links of removed pages pass every check of the file
    itself; the mirror finds them as fewer links than the counters say."""
    from consumer.mirror import _snapshot_graph

    assert _snapshot_graph(_state(), None) is not None
    for src, dst in (([0, 0], [1, 1]), ([0, 1], [0, 0]), ([0, 2], [1, 0])):
        state = _state()
        state = StoredState(**{**state.__dict__, "edge_src": np.array(src, dtype=np.int32),
                               "edge_dst": np.array(dst, dtype=np.int32)})
        assert _snapshot_graph(state, None) is None, (src, dst)


def test_what_is_not_a_regular_file_is_not_read_nor_waited_for(tmp_path):
    """A FIFO in the snapshot's place hung the start (zipfile opened it and waited
    for a writer); a symlink loop was taken for no snapshot without a word."""
    import os

    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    assert read_snapshot(fifo, _identity(), "t") is None
    loop = tmp_path / "loop.npz"
    loop.symlink_to(loop)
    assert read_snapshot(loop, _identity(), "t") is None
    assert read_snapshot(tmp_path, _identity(), "t") is None  # a directory
