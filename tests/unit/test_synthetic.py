"""The seeded web-like graph generator and the random edit batches."""

from __future__ import annotations

import numpy as np

from ranker.synthetic import (
    SyntheticGraph,
    copying_model_graph,
    page_url,
    random_edit_batch,
    sample_links,
    synthetic_keys,
)


def test_same_seed_same_graph_other_seed_other_graph() -> None:
    a = copying_model_graph(2000, seed=11)
    b = copying_model_graph(2000, seed=11)
    c = copying_model_graph(2000, seed=12)
    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)
    assert not (a.src.size == c.src.size and np.array_equal(a.dst, c.dst))


def check_links_and_frontier(g: SyntheticGraph) -> tuple[np.ndarray, np.ndarray]:
    """No self or duplicate links, a fifth of the pages uncrawled; (out, in) degrees."""
    assert g.src.dtype == np.int32 and g.dst.dtype == np.int32
    assert (g.src != g.dst).all()
    keys = (g.src.astype(np.int64) << 32) | g.dst
    assert np.unique(keys).size == keys.size
    out_degree = np.bincount(g.src, minlength=g.num_pages)
    in_degree = np.bincount(g.dst, minlength=g.num_pages)
    # About a fifth of the pages are the uncrawled frontier: no out-links.
    assert 0.17 < (out_degree == 0).mean() < 0.23
    return out_degree, in_degree


def test_web_like_shape() -> None:
    g = copying_model_graph(20_000, 10.0, seed=1)
    _, in_degree = check_links_and_frontier(g)
    assert 7.0 < g.num_links / g.num_pages < 9.5
    # Heavy-tailed in-degrees: hubs far above the mean, a straight-ish log-log tail.
    assert in_degree.max() > 50 * in_degree.mean()
    tail = [(in_degree >= k).mean() for k in (10, 100)]
    assert 0.001 < tail[1] < tail[0] / 10


def test_keys_are_distinct_urls() -> None:
    keys = synthetic_keys(3000)
    assert len(set(keys)) == 3000
    assert keys[1234] == page_url(1234) and keys[0].startswith("https://")


def test_edit_batch_is_half_real_deletions_half_new_links() -> None:
    graph = copying_model_graph(3000, seed=2).to_linkgraph()
    rng = np.random.default_rng(0)
    batch = random_edit_batch(graph, 101, rng)
    assert batch.delete_src.size == 50 and batch.insert_src.size == 51
    assert graph.links_exist(batch.delete_src, batch.delete_dst).all()
    assert not graph.links_exist(batch.insert_src, batch.insert_dst).any()
    assert (batch.insert_src != batch.insert_dst).all()
    inserted = (batch.insert_src.astype(np.int64) << 32) | batch.insert_dst
    deleted = (batch.delete_src.astype(np.int64) << 32) | batch.delete_dst
    assert np.unique(inserted).size == inserted.size
    assert np.unique(deleted).size == deleted.size
    before = graph.num_links
    applied = graph.apply(batch)
    assert applied.inserted_src.size == 51 and applied.deleted_src.size == 50
    assert graph.num_links == before + 1


def test_sample_links_returns_present_distinct_links() -> None:
    graph = copying_model_graph(500, seed=3).to_linkgraph()
    src, dst = sample_links(graph, 200, np.random.default_rng(1))
    assert src.size == 200
    assert graph.links_exist(src, dst).all()
    keys = (src.astype(np.int64) << 32) | dst
    assert np.unique(keys).size == 200


def test_acyclic_option_is_kumar_original_model_a_dag() -> None:
    g = copying_model_graph(20_000, 10.0, seed=1, acyclic=True)
    out_degree, in_degree = check_links_and_frontier(g)
    assert in_degree.max() > 50 * in_degree.mean()
    # A DAG: Kahn's algorithm removes every page.
    indeg = in_degree.copy()
    order = np.argsort(g.src, kind="stable")
    starts = np.concatenate([[0], np.cumsum(out_degree)])
    dst_by_src = g.dst[order]
    ready = list(np.flatnonzero(indeg == 0))
    seen = 0
    while ready:
        page = ready.pop()
        seen += 1
        for target in dst_by_src[starts[page]:starts[page + 1]]:
            indeg[target] -= 1
            if indeg[target] == 0:
                ready.append(target)
    assert seen == g.num_pages
    # The default keeps its cycles and its exact output (seed-stable).
    cyclic = copying_model_graph(20_000, 10.0, seed=1)
    assert cyclic.num_links != g.num_links or not np.array_equal(cyclic.dst, g.dst)
    assert np.array_equal(copying_model_graph(2000, seed=11).dst,
                          copying_model_graph(2000, seed=11, acyclic=False).dst)
