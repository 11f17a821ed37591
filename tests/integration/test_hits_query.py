"""HITS on demand against the real redis-server: root set, base set, options, cache.

Each test writes a hand-made graph straight into Redis in the public layout
(docs/redis-keys.md) under its own key prefix, wiped afterwards.
"""

from __future__ import annotations

import random
from typing import Any

import networkx as nx
import numpy as np
import pytest

from consumer import hits_base
from consumer.hits_base import url_hosts
from consumer.hits_query import HitsQuery, collect_subgraph, run_hits, url_host
from rankstream.errors import InputError
from rankstream.services.testing import delete_keys
from rankstream.settings import Settings
from tests.integration.conftest import HandGraph


def base_urls(graph: HandGraph, query: HitsQuery) -> list[str]:
    return collect_subgraph(graph.client, graph.prefix, query).urls


# --- base set ----------------------------------------------------------------------


def _star(graph: HandGraph) -> None:
    """Root r.org links to o1, o2; ten pages i0..i9 link to r.org; noise around them."""
    links = [("https://r.org/", "https://o1.org/"), ("https://r.org/", "https://o2.org/")]
    links += [(f"https://i{i}.org/", "https://r.org/") for i in range(10)]
    # Pages one hop further out must NOT enter the base set.
    links += [("https://o1.org/", "https://far.org/"), ("https://far2.org/", "https://o1.org/")]
    links += [("https://i0.org/", "https://o2.org/")]
    scores = [5, 1, 9, 3, 7, 3, 2, 8, 3, 0]
    pagerank = {f"https://i{i}.org/": float(s) for i, s in enumerate(scores)}
    graph.write(links, pagerank=pagerank)


def test_base_set_is_root_plus_out_links_plus_best_in_links(graph: HandGraph) -> None:
    _star(graph)
    query = HitsQuery(seeds=("https://r.org",), max_in=4, drop_intrinsic=False)
    # i2 (9), i7 (8), i4 (7), i0 (5); everything reachable in one hop from r.org.
    assert base_urls(graph, query) == sorted(
        ["https://r.org/", "https://o1.org/", "https://o2.org/",
         "https://i2.org/", "https://i7.org/", "https://i4.org/", "https://i0.org/"]
    )


def test_in_link_cap_breaks_pagerank_ties_by_url(graph: HandGraph) -> None:
    _star(graph)
    # Scores 9, 8, 7, 5, then three pages tie at 3: i3 < i5 < i8 by URL.
    six = base_urls(graph, HitsQuery(seeds=("https://r.org/",), max_in=6))
    assert {u for u in six if u.startswith("https://i")} == {
        f"https://i{i}.org/" for i in (2, 7, 4, 0, 3, 5)
    }


def test_all_in_links_when_under_the_cap_and_none_with_zero(graph: HandGraph) -> None:
    _star(graph)
    everything = base_urls(graph, HitsQuery(seeds=("https://r.org/",), max_in=50))
    assert len(everything) == 3 + 10
    nothing = base_urls(graph, HitsQuery(seeds=("https://r.org/",), max_in=0))
    assert nothing == ["https://o1.org/", "https://o2.org/", "https://r.org/"]


def test_base_set_is_deterministic_across_insertion_orders(
    graph: HandGraph, services: Settings
) -> None:
    _star(graph)
    query = HitsQuery(seeds=("https://r.org/",), max_in=5)
    first = collect_subgraph(graph.client, graph.prefix, query)
    # The same graph written in another order (other ids, other set layouts).
    other = HandGraph(graph.client, f"{graph.prefix}shuffled:")
    try:
        rng = random.Random(7)
        for url in rng.sample(sorted(graph.ids), len(graph.ids)):
            other.page(url)
        _star(other)
        second = collect_subgraph(other.client, other.prefix, query)
    finally:
        delete_keys(services, other.prefix)
    assert first.urls == second.urls
    assert (first.adjacency != second.adjacency).nnz == 0


def test_in_candidate_cap_keeps_lowest_ids(graph: HandGraph, monkeypatch: Any) -> None:
    _star(graph)
    monkeypatch.setattr(hits_base, "MAX_IN_CANDIDATES", 3)
    urls = base_urls(graph, HitsQuery(seeds=("https://r.org/",), max_in=2))
    # i0..i2 got the lowest ids; of those, i2 (9) and i0 (5) score best.
    assert {u for u in urls if u.startswith("https://i")} == {"https://i2.org/", "https://i0.org/"}


def test_a_base_set_past_the_cap_is_refused_not_cut_short(
    graph: HandGraph, monkeypatch: Any
) -> None:
    _star(graph)  # r.org, its 2 out-links and 10 in-linkers
    monkeypatch.setattr(hits_base, "MAX_CANDIDATES", 12)
    with pytest.raises(InputError, match=r"would look up 13 pages, more than 12: ask for "
                                         r"fewer root pages \(root_size\), or for no "
                                         r"in-linkers \(max_in=0"):
        base_urls(graph, HitsQuery(seeds=("https://r.org/",), max_in=2))
    # With max_in=0 the in-linkers are not candidates at all.
    assert len(base_urls(graph, HitsQuery(seeds=("https://r.org/",), max_in=0))) == 3


def test_unknown_and_duplicate_seeds(graph: HandGraph) -> None:
    _star(graph)
    answer = run_hits(graph.client, graph.prefix, HitsQuery(
        seeds=("https://R.org:443/#top", "https://r.org/", "https://nowhere.org/"),
        max_in=0, drop_intrinsic=False))
    assert answer.root_size == 1
    assert answer.unknown_seeds == ["https://nowhere.org/"]
    # A removed page keeps its id but is not in the graph: unknown, never a root.
    graph.client.sadd(f"{graph.prefix}page:removed", graph.ids["https://r.org/"])
    answer = run_hits(graph.client, graph.prefix, HitsQuery(
        seeds=("https://r.org/", "https://nowhere.org/"), max_in=0, drop_intrinsic=False),
        use_cache=False)
    assert answer.root_size == 0
    # Sorted, not in the order given: a cached answer serves every order of the seeds.
    assert answer.unknown_seeds == ["https://nowhere.org/", "https://r.org/"]
    with pytest.raises(InputError, match="seed"):
        HitsQuery(seeds=("not a url",)).normal_form()


def test_hosts_of_odd_urls() -> None:
    urls = {
        "https://a.org/x": "a.org", "https://a.org:8443/?q": "a.org",
        "https://user:pw@b.org:81/p@q?r=s://t": "b.org", "http://[::1]:8080/x": "[::1]",
        "https://bücher.example/straße": "bücher.example", "file:///tmp/x": "",
        "mailto:someone@example.org": "", "urn:isbn://123": "", "ftp://c.net": "c.net",
        "https://u@v@h2.example/at": "h2.example",  # the user part ends at the LAST @
    }
    assert [url_host(u) for u in urls] == list(urls.values())
    assert url_hosts(list(urls)) == list(urls.values())


# --- text root set --------------------------------------------------------------------


def test_text_root_set_ranks_by_matching_terms_then_pagerank(graph: HandGraph) -> None:
    titles = {
        "https://a.org/": "The Python Tutorial",
        "https://b.org/": "Python",
        "https://c.org/": "A tutorial on snakes",
        "https://d.org/": "Python",
        "https://e.org/": "Unrelated",
    }
    anchors = [("https://e.org/", "https://c.org/", "python basics")]
    graph.write(titles=titles, anchors=anchors,
                pagerank={"https://b.org/": 2.0, "https://d.org/": 3.0, "https://c.org/": 0.5})
    query = HitsQuery(text="the PYTHON tutorials tutorial", root_size=3, max_in=0,
                      drop_intrinsic=False)
    sub = collect_subgraph(graph.client, graph.prefix, query)
    roots = sorted(u for u, r in zip(sub.urls, sub.is_root, strict=True) if r)
    # a and c match two terms; then d (pagerank 3) beats b (2); root_size 3 cuts b.
    assert roots == ["https://a.org/", "https://c.org/", "https://d.org/"]
    with pytest.raises(InputError, match="no searchable terms"):
        run_hits(graph.client, graph.prefix, HitsQuery(text="the of and"))


def test_text_root_set_fills_up_past_removed_pages(graph: HandGraph) -> None:
    """Removed pages are filtered before the count groups are cut, not after: the best
    group holding only a removed page must not leave the root set empty."""
    titles = {"https://a.org/": "zebra quokka", "https://b.org/": "zebra",
              "https://c.org/": "zebra"}
    graph.write(titles=titles)
    graph.client.sadd(f"{graph.prefix}page:removed", graph.ids["https://a.org/"])
    query = HitsQuery(text="zebra quokka", root_size=1, max_in=0, drop_intrinsic=False)
    sub = collect_subgraph(graph.client, graph.prefix, query)
    assert [u for u, r in zip(sub.urls, sub.is_root, strict=True) if r] == ["https://b.org/"]
    query = HitsQuery(text="zebra quokka", root_size=5, max_in=0, drop_intrinsic=False)
    assert int(collect_subgraph(graph.client, graph.prefix, query).is_root.sum()) == 2


# --- options -----------------------------------------------------------------------------


def test_the_tie_group_cap_counts_live_pages_only(graph: HandGraph, monkeypatch: Any) -> None:
    """A tie group over the cap was cut to its lowest ids BEFORE removed pages were
    dropped, and the oldest ids are the likeliest removed: the root set came back
    short, or from a worse group, though live pages matched every term."""
    from consumer import text_index

    monkeypatch.setattr(text_index, "MAX_MATCH_CANDIDATES", 3)
    titles = {f"https://p{i}.org/": "red apple" for i in range(6)}
    titles |= {f"https://q{i}.org/": "apple" for i in range(3)}
    graph.write(titles=titles)
    for i in range(3):
        graph.client.sadd(f"{graph.prefix}page:removed", graph.ids[f"https://p{i}.org/"])
    for root_size, expected in [(2, 2), (3, 3), (5, 5)]:
        query = HitsQuery(text="red apple", root_size=root_size, max_in=0,
                          drop_intrinsic=False)
        sub = collect_subgraph(graph.client, graph.prefix, query)
        roots = [u for u, r in zip(sub.urls, sub.is_root, strict=True) if r]
        assert len(roots) == expected
        both = {f"https://p{i}.org/" for i in range(3, 6)}  # the live pages matching both
        assert len(both & set(roots)) == min(root_size, 3)


def test_intrinsic_links_are_dropped_by_default(graph: HandGraph) -> None:
    graph.write([
        ("https://a.com/1", "https://a.com/2"),
        ("https://a.com:8080/3", "https://a.com/1"),  # same host, other port: intrinsic
        ("https://a.com/1", "https://b.com/1"),
        ("https://b.com/1", "https://a.com/2"),
    ])
    seeds = ("https://a.com/1",)
    dropped = run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds, k=10))
    kept = run_hits(graph.client, graph.prefix,
                    HitsQuery(seeds=seeds, k=10, drop_intrinsic=False))
    assert (dropped.links, dropped.intrinsic_dropped) == (2, 2)
    assert (kept.links, kept.intrinsic_dropped) == (4, 0)
    assert dropped.base_size == kept.base_size == 4
    assert {p.url for p in dropped.authorities} == {"https://b.com/1", "https://a.com/2"}
    assert {p.url for p in dropped.hubs} == {"https://a.com/1", "https://b.com/1"}


def mutual_reinforcement(graph: HandGraph) -> list[str]:
    """Three independent hubs on three hosts cite three authorities on three hosts;
    five pages of spam.com all cite both pages of target.com (a 5x2 block that beats
    the 3x3 block on page count alone)."""
    good_hubs = ["https://h1.com/", "https://h2.org/", "https://h3.net/"]
    good = ["https://good1.org/", "https://good2.org/", "https://good3.org/"]
    spam = [f"https://spam.com/p{i}" for i in range(5)]
    target = ["https://target.com/t1", "https://target.com/t2"]
    links = [(h, a) for h in good_hubs for a in good] + [(s, t) for s in spam for t in target]
    graph.write(links)
    return good_hubs + good + spam + target


def test_host_weighting_demotes_a_mutually_reinforcing_host(graph: HandGraph) -> None:
    seeds = tuple(mutual_reinforcement(graph))
    plain = run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds, k=3))
    weighted = run_hits(graph.client, graph.prefix,
                        HitsQuery(seeds=seeds, k=3, host_weighting=True))
    assert {url_host(p.url) for p in plain.authorities[:2]} == {"target.com"}
    assert {url_host(p.url) for p in plain.hubs} == {"spam.com"}
    assert [p.url for p in weighted.authorities] == [
        "https://good1.org/", "https://good2.org/", "https://good3.org/"]
    assert {url_host(p.url) for p in weighted.hubs} == {"h1.com", "h2.org", "h3.net"}


def test_host_weights_are_the_product_of_both_rules(graph: HandGraph) -> None:
    seeds = tuple(mutual_reinforcement(graph))
    sub = collect_subgraph(graph.client, graph.prefix, HitsQuery(seeds=seeds, host_weighting=True))
    weights = {
        (sub.urls[i], sub.urls[j]): w
        for i, j, w in zip(*sub.adjacency.nonzero(), sub.adjacency.data, strict=True)
    }
    assert weights[("https://spam.com/p0", "https://target.com/t1")] == pytest.approx(1 / 10)
    assert weights[("https://h1.com/", "https://good1.org/")] == 1.0


# --- equality with networkx -----------------------------------------------------------


def _random_web(graph: HandGraph, seed: int) -> list[str]:
    rng = random.Random(seed)
    urls = [f"https://host{rng.randrange(8)}.example/p{i}" for i in range(60)]
    links = {(rng.choice(urls), rng.choice(urls)) for _ in range(240)}
    graph.write([(s, d) for s, d in links if s != d], pages=urls,
                pagerank={u: rng.random() for u in urls})
    return urls


@pytest.mark.parametrize(
    ("normalize", "drop_intrinsic", "host_weighting"),
    [("sum", False, False), ("l2", True, False), ("sum", True, True)],
)
def test_equals_networkx_hits_on_the_same_base_subgraph(
    graph: HandGraph, normalize: Any, drop_intrinsic: bool, host_weighting: bool
) -> None:
    urls = _random_web(graph, seed=11)
    query = HitsQuery(seeds=tuple(urls[:6]), max_in=5, k=1000, normalize=normalize,
                      drop_intrinsic=drop_intrinsic, host_weighting=host_weighting, tol=1e-12)
    answer = run_hits(graph.client, graph.prefix, query, use_cache=False)
    sub = collect_subgraph(graph.client, graph.prefix, query)
    assert answer.base_size == len(sub.urls) > 10 and answer.links == sub.adjacency.nnz > 10

    nx_graph = nx.DiGraph()
    nx_graph.add_nodes_from(sub.urls)
    coo = sub.adjacency.tocoo()
    for i, j, w in zip(coo.row, coo.col, coo.data, strict=True):
        nx_graph.add_edge(sub.urls[i], sub.urls[j], weight=float(w))
    nx_hubs, nx_auth = nx.hits(nx_graph, max_iter=10_000, tol=1e-14)
    for ours, theirs in ((answer.hubs, nx_hubs), (answer.authorities, nx_auth)):
        expected = np.array([theirs[u] for u in sub.urls])
        if normalize == "l2":
            expected /= np.linalg.norm(expected)
        got = dict.fromkeys(sub.urls, 0.0) | {p.url: p.score for p in ours}
        np.testing.assert_allclose([got[u] for u in sub.urls], expected, atol=1e-9)


@pytest.mark.parametrize("strong, weak", [(3, 1), (10, 8)])
def test_a_page_whose_limit_is_zero_is_not_listed(graph: HandGraph, strong: int,
                                                  weak: int) -> None:
    """Hubs on a.org (eigenvalue ``strong``) and on d.org (``weak``): d.org's authority
    tends to 0, and the power iteration stops with some of it left, 1e-8 and more at
    10 against 8 (the fallback gives exactly 0)."""
    links = [(f"https://h{i}.org/", "https://a.org/") for i in range(strong)]
    links += [(f"https://x{i}.org/", "https://d.org/") for i in range(weak)]
    graph.write(links)
    seeds = tuple(sorted({u for link in links for u in link}))
    answer = run_hits(graph.client, graph.prefix, HitsQuery(seeds=seeds, k=50),
                      use_cache=False)
    assert [page.url for page in answer.authorities] == ["https://a.org/"]
    assert {page.url for page in answer.hubs} == {f"https://h{i}.org/" for i in range(strong)}


def test_a_large_tie_group_is_ranked_whole_up_to_its_cap(graph: HandGraph,
                                                         monkeypatch: Any) -> None:
    """The group's reading stopped at the first chunk that filled root_size: only its
    lowest ids were ranked by PageRank, not the MAX_MATCH_CANDIDATES documented."""
    from consumer import text_index
    from consumer.text_index import match

    monkeypatch.setattr(text_index, "MAX_MATCH_CANDIDATES", 10)
    urls = [f"https://p{i:02d}.org/" for i in range(30)]
    graph.write(titles={u: "python" for u in urls},
                pagerank={u: 9.0 if u == urls[22] else 1.0 for u in urls})
    gone = [*range(0, 8), *range(10, 15)]
    graph.client.sadd(f"{graph.prefix}page:removed", *gone)
    found = match(graph.client, graph.prefix, ["python"], 3)
    # The cap keeps the 10 lowest live ids, 8, 9, 15-22: p22 leads on PageRank.
    assert [m.url for m in found] == [urls[22], urls[8], urls[9]]


def test_terms_too_common_to_unite_are_counted_over_a_bounded_candidate_set(
        graph: HandGraph, monkeypatch: Any) -> None:
    """ZUNION of two terms of 500k pages each held Redis for 1.5 s: past MAX_UNION the
    rare term's pages and the best pages by PageRank are counted instead."""
    from consumer import text_index
    from consumer.text_index import match

    common = [f"https://p{i:02d}.org/" for i in range(12)]
    rare = ["https://z0.org/", "https://z1.org/"]
    scores = {u: 1.0 for u in common} | {common[5]: 9.0, common[7]: 8.0}
    graph.write(titles={**dict.fromkeys(common, "apple"), **dict.fromkeys(rare, "apple zebra")},
                pagerank=scores | dict.fromkeys(rare, 0.5))
    exact = [m.url for m in match(graph.client, graph.prefix, ["apple", "zebra"], 4)]
    assert exact == [*rare, common[5], common[7]]

    monkeypatch.setattr(text_index, "MAX_UNION", 5)  # 14 + 2 pages: too many to unite
    monkeypatch.setattr(text_index, "MAX_MATCH_CANDIDATES", 3)

    unions = []
    united = graph.client.zunion

    def counted_union(*args: Any, **kwargs: Any) -> Any:
        unions.append(args)
        return united(*args, **kwargs)

    monkeypatch.setattr(graph.client, "zunion", counted_union)
    bounded = match(graph.client, graph.prefix, ["apple", "zebra"], 4)
    assert [m.url for m in bounded] == exact and not unions
    assert [m.matched_terms for m in bounded] == [2, 2, 1, 1]
    # Before the first publication there is no best-by-PageRank list to count over:
    # the union is built (a review found the bounded count returning nothing).
    graph.client.delete(f"{graph.prefix}scores:pagerank")
    unscored = match(graph.client, graph.prefix, ["apple", "zebra"], 3)
    assert [m.url for m in unscored] == [*rare, common[0]] and len(unions) == 1


def test_equal_authorities_are_listed_by_url_whatever_the_rounding() -> None:
    """Scores equal but for the order their sums were taken in (~1e-16 apart) were
    listed by that noise."""
    from consumer.hits_query import _top

    urls = ["https://a.org/", "https://b.org/", "https://c.org/"]
    scores = np.array([0.4654394692228809, 0.46543946922288104, 0.1])
    assert [p.url for p in _top(urls, scores, 3, 0.0)] == urls
    # Either side of a rounding grid line, one tie all the same.
    straddle = np.array([0.3000000000005, np.nextafter(0.3000000000005, 1.0), 1.0])
    assert [p.url for p in _top(urls, straddle, 3, 0.0)] == [urls[2], urls[0], urls[1]]
    # Equal limits that the iteration left 2.4e-9 apart, within its distance of 5e-9
    # from them (a review's case, listed p29 before p21).
    left = np.array([0.408248289648314, 0.408248292094962, 0.1])
    assert [p.url for p in _top(urls, left, 3, 5e-9)] == urls
    assert [p.url for p in _top(urls, left, 3, 1e-10)] == [urls[1], urls[0], urls[2]]
    # A chain of steps each within 2 * distance is not one tie (a review: groups of
    # 387 pages, inversions of 0.06 in a top 50).
    # Here b ties c (1.5e-8 below it), a does not (3e-8), though it is within 2e-8 of b.
    chain = np.array([0.49999997, 0.499999985, 0.5])
    assert [p.url for p in _top(urls, chain, 3, 1e-8)] == [urls[1], urls[2], urls[0]]


def test_max_in_zero_reads_no_in_link_sets(graph: HandGraph, monkeypatch: Any) -> None:
    """The remedy the refusal suggests still read every root's in-set whole."""
    links = [(f"https://i{i}.org/", "https://r.org/") for i in range(50)]
    graph.write([*links, ("https://r.org/", "https://o.org/")])
    read: list[str] = []
    original = hits_base.read_sets

    def spy(redis: Any, keys: list[str]) -> Any:
        read.extend(keys)
        return original(redis, keys)

    monkeypatch.setattr(hits_base, "read_sets", spy)
    query = HitsQuery(seeds=("https://r.org/",), max_in=0, drop_intrinsic=False)
    assert sorted(base_urls(graph, query)) == ["https://o.org/", "https://r.org/"]
    assert not [k for k in read if ":in:" in k]
