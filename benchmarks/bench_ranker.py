"""Benchmark: absorbing a batch of link changes, incremental vs full recomputes.

    python -m benchmarks.bench_ranker [--pages 1000000] [--quick] [--data-dir DIR]
                                      [--accuracy 1e-6] [--batch-sizes 10,100,...]

Graphs: the seeded copying-model web graph of :mod:`ranker.synthetic` (``--pages``
pages, ~8 links per page, 20% uncrawled) and the real Python docs graph
(``DIR/python-docs-links.tsv.gz``, DIR defaulting to ``../shared/data`` beside the
repository).

Operation: absorb a batch of random link changes (half deletions of present links,
half new links), restoring a max-abs error of at most ``--accuracy`` (paper scale)
against an exact solve. The incremental engine (:class:`ranker.LiveRanks`, with
``max_error=accuracy``) certifies that bound itself; the measured error against an
exact solve (computed untimed for every measured state) is printed beside it.

Competitors, timed in the same run on the same graph state:
- our cold solve (``ranker.pagerank`` / ``ranker.weighted_pagerank``) at the
  loosest tolerance of a ladder whose measured max-abs error is within
  ``--accuracy`` (calibrated untimed on the initial graph, generous to it);
- igraph's PRPACK full recompute (PageRank only);
- networkx ``pagerank`` (docs graph; the 1M graph only with ``--networkx-large``).

Printed: times (median of ``--repeats`` batches per size), speedup ratios
(competitor time / incremental time) and the crossover batch size where the
incremental refresh stops beating our cold solve.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import igraph
import networkx as nx
import numpy as np

from ranker.incremental import LiveRanks
from ranker.linkgraph import EdgeBatch, LinkGraph
from ranker.pagerank import pagerank
from ranker.results import RankResult
from ranker.synthetic import copying_model_graph, random_edit_batch
from ranker.weighted_pagerank import weighted_pagerank
from rankstream.edgelist import read_edges
from rankstream.errors import ConvergenceError

DAMPING = 0.85
ALGORITHMS = ("pagerank", "wpr")
SOLVERS: dict[str, Callable[..., RankResult]] = {"pagerank": pagerank, "wpr": weighted_pagerank}
COLD_LADDER = [10.0**k for k in range(3, -9, -1)]
NX_LADDER = [10.0**k for k in range(-4, -15, -1)]
DOCS_FILE = "python-docs-links.tsv.gz"


@dataclass
class Row:
    """One (graph, algorithm, batch size) line of the table."""

    graph: str
    algorithm: str
    batch: int
    inc: list[float] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    certified: list[float] = field(default_factory=list)
    l1_bounds: list[float] = field(default_factory=list)
    pushes: list[int] = field(default_factory=list)
    cold: float = float("nan")
    cold_certified: float = float("nan")
    igraph: float = float("nan")
    networkx: float = float("nan")


@dataclass
class Setup:
    """A graph under test: two identical LinkGraphs (one per engine) and its edges."""

    name: str
    build: Callable[[], LinkGraph]
    sizes: list[int]
    networkx: bool


def timed(func: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = func()
    return time.perf_counter() - start, value


def best_of(func: Callable[[], object], runs: int) -> float:
    """Fastest of ``runs`` timings (small graphs: one run is mostly timer noise)."""
    return min(timed(func)[0] for _ in range(runs))


def exact(graph: LinkGraph, algorithm: str, start: np.ndarray | None, tol: float) -> np.ndarray:
    """A tight cold solve (the reference every error is measured against)."""
    warm = None if start is None else start[: graph.num_ids]
    result = SOLVERS[algorithm](graph.to_csr(), damping=DAMPING, tol=tol, max_iter=5000,
                                start=warm, alive=graph.live_mask())
    return result.scores


def calibrate_cold(graph: LinkGraph, algorithm: str, reference: np.ndarray,
                   accuracy: float) -> float:
    """Loosest tolerance of COLD_LADDER whose cold solve is within ``accuracy``."""
    matrix, live = graph.to_csr(), graph.live_mask()
    for tol in COLD_LADDER:
        try:
            scores = SOLVERS[algorithm](matrix, damping=DAMPING, tol=tol, alive=live).scores
        except ConvergenceError:
            continue
        if np.abs(scores - reference).max() <= accuracy:
            return tol
    return COLD_LADDER[-1]


def runs_for(graph: LinkGraph) -> int:
    return 1 if graph.num_links > 1_000_000 else 5


def time_cold(graph: LinkGraph, algorithm: str, tol: float) -> float:
    matrix, live = graph.to_csr(), graph.live_mask()
    return best_of(lambda: SOLVERS[algorithm](matrix, damping=DAMPING, tol=tol, alive=live),
                   runs_for(graph))


def igraph_of(graph: LinkGraph) -> igraph.Graph:
    src, dst = graph.edges()
    return igraph.Graph(n=graph.num_ids, edges=np.column_stack([src, dst]).tolist(),
                        directed=True)


def time_igraph(graph: LinkGraph, reference: np.ndarray) -> tuple[float, float]:
    """(seconds, max-abs error on the paper scale) of igraph's PRPACK PageRank."""
    ig = igraph_of(graph)
    seconds = best_of(lambda: ig.pagerank(damping=DAMPING, implementation="prpack"),
                      runs_for(graph))
    ranks = ig.pagerank(damping=DAMPING, implementation="prpack")
    # Uniform teleport and uniform dangling redistribution: x is exactly y / sum(y).
    paper = np.asarray(ranks) * float(reference.sum())
    return seconds, float(np.abs(paper - reference).max())


def networkx_of(graph: LinkGraph) -> nx.DiGraph:
    src, dst = graph.edges()
    digraph = nx.DiGraph()
    digraph.add_nodes_from(range(graph.num_ids))
    digraph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    return digraph


def networkx_error(digraph: nx.DiGraph, tol: float, reference: np.ndarray) -> float:
    ranks = nx.pagerank(digraph, alpha=DAMPING, tol=tol, max_iter=10_000)
    paper = np.array([ranks[i] for i in range(len(reference))]) * float(reference.sum())
    return float(np.abs(paper - reference).max())


def calibrate_networkx(digraph: nx.DiGraph, reference: np.ndarray, accuracy: float) -> float:
    for tol in NX_LADDER:
        if networkx_error(digraph, tol, reference) <= accuracy:
            return tol
    return NX_LADDER[-1]


def warm_up_kernels() -> None:
    """Load (or compile) every numba kernel before anything is timed."""
    graph = copying_model_graph(300, 6.0, seed=99).to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-9, max_error=1e-9)
    ranks.cold_start()
    rng = np.random.default_rng(0)
    ranks.apply(random_edit_batch(graph, 20, rng))
    ranks.apply(random_edit_batch(graph, 2000, rng))
    graph.compact()


def run_graph(setup: Setup, accuracy: float, repeats: int, seed: int) -> list[Row]:
    print(f"\n== {setup.name} ==", flush=True)
    build_s, built = timed(setup.build)
    assert isinstance(built, LinkGraph)
    graphs = {"pagerank": built, "wpr": setup.build()}
    probe = graphs["pagerank"]
    print(f"graph: {probe.num_ids:,} pages, {probe.num_links:,} links, built in {build_s:.1f}s; "
          f"LinkGraph memory {probe.memory_bytes() / probe.num_links:.1f} bytes/link "
          f"(URL strings excluded)", flush=True)
    exact_tol = accuracy * 1e-2  # certified L1 bound, so max-abs error <= 1% of accuracy
    reference = {a: exact(graphs[a], a, None, exact_tol) for a in ALGORITHMS}
    cold_tol = {a: calibrate_cold(graphs[a], a, reference[a], accuracy) for a in ALGORITHMS}
    print("cold tolerance (certified L1, paper scale) reaching the accuracy: "
          + ", ".join(f"{a} {t:g}" for a, t in cold_tol.items()), flush=True)
    nx_graph = networkx_of(probe) if setup.networkx else None
    nx_tol = calibrate_networkx(nx_graph, reference["pagerank"], accuracy) if nx_graph else 0.0

    ranks = {a: LiveRanks(graphs[a], algorithms=(a,), damping=DAMPING, max_error=accuracy)
             for a in ALGORITHMS}
    for a in ALGORITHMS:
        ranks[a].cold_start(warm={a: reference[a]})
    rng = np.random.default_rng(seed)
    rows: list[Row] = []
    for size in setup.sizes:
        if size // 2 > probe.num_links:
            print(f"batch {size}: skipped (more deletions than links)")
            continue
        batch_rows = {a: Row(setup.name, a, size) for a in ALGORITHMS}
        for _ in range(repeats if size < 100_000 else 1):
            batch = random_edit_batch(probe, size, rng)
            for a in ALGORITHMS:
                copy = _copy(batch)
                started = time.perf_counter()
                report = ranks[a].apply(copy)[a]
                seconds = time.perf_counter() - started
                reference[a] = exact(graphs[a], a, reference[a], exact_tol)
                row = batch_rows[a]
                row.inc.append(seconds)
                row.modes.append(report.mode)
                row.errors.append(float(np.abs(ranks[a].scores(a) - reference[a]).max()))
                row.certified.append(report.max_abs_bound)
                row.l1_bounds.append(report.bound)
                row.pushes.append(report.pushes)
        for a in ALGORITHMS:
            batch_rows[a].cold = time_cold(graphs[a], a, cold_tol[a])
            batch_rows[a].cold_certified = time_cold(graphs[a], a, accuracy)
        ig_seconds, ig_error = time_igraph(probe, reference["pagerank"])
        batch_rows["pagerank"].igraph = ig_seconds
        if nx_graph is not None:
            current = networkx_of(probe)

            def nx_solve(g: nx.DiGraph = current) -> object:
                return nx.pagerank(g, alpha=DAMPING, tol=nx_tol, max_iter=10_000)

            batch_rows["pagerank"].networkx = best_of(nx_solve, runs_for(probe))
        for a in ALGORITHMS:
            print(_format(batch_rows[a]), flush=True)
        print(f"   (igraph max-abs error {ig_error:.2g})", flush=True)
        rows.extend(batch_rows.values())
    print(f"after the edits: {probe.num_links:,} links, LinkGraph memory "
          f"{probe.memory_bytes() / probe.num_links:.1f} bytes/link; compacted "
          f"{_compacted_bytes(probe):.1f} bytes/link", flush=True)
    return rows


def _compacted_bytes(graph: LinkGraph) -> float:
    graph.compact()
    return graph.memory_bytes() / graph.num_links


def _copy(batch: EdgeBatch) -> EdgeBatch:
    return EdgeBatch(batch.insert_src.copy(), batch.insert_dst.copy(), batch.delete_src.copy(),
                     batch.delete_dst.copy(), batch.removed_pages.copy())


HEADER = (f"{'graph':<10} {'alg':<8} {'batch':>7} {'mode':<7} {'incr ms':>9} {'cold ms':>9} "
          f"{'cold-c ms':>9} {'igraph ms':>9} {'nx ms':>8} {'x igraph':>8} {'x cold':>7} "
          f"{'x cold-c':>8} {'max err':>8} {'cert.max':>8} {'L1 bound':>8} {'pushes':>10}")
LEGEND = """incr: incremental refresh (graph update + residual columns + push/sweeps), median;
cold: our cold solve at the loosest tolerance whose MEASURED max-abs error is within the
accuracy; cold-c: our cold solve CERTIFYING it (L1 bound <= accuracy); x ...: speedup of
incr over that competitor; max err: measured max-abs error of incr vs an exact solve;
cert.max: incr's certified max-abs bound; L1 bound: incr's certified ||y_exact - y||_1."""


def _ms(seconds: float) -> str:
    return "-" if np.isnan(seconds) else f"{seconds * 1e3:.1f}"


def _ratio(other: float, mine: float) -> str:
    return "-" if np.isnan(other) else f"{other / mine:.1f}"


def _format(row: Row) -> str:
    inc = statistics.median(row.inc)
    mode = "/".join(sorted(set(row.modes)))
    return (f"{row.graph:<10} {row.algorithm:<8} {row.batch:>7} {mode:<7} {_ms(inc):>9} "
            f"{_ms(row.cold):>9} {_ms(row.cold_certified):>9} {_ms(row.igraph):>9} "
            f"{_ms(row.networkx):>8} {_ratio(row.igraph, inc):>8} {_ratio(row.cold, inc):>7} "
            f"{_ratio(row.cold_certified, inc):>8} {max(row.errors):>8.1e} "
            f"{max(row.certified):>8.1e} {max(row.l1_bounds):>8.1e} "
            f"{int(statistics.median(row.pushes)):>10}")


def crossover(rows: Sequence[Row], graph: str, algorithm: str) -> str:
    """Smallest batch at which the incremental refresh is not faster than a cold solve."""
    mine = [r for r in rows if r.graph == graph and r.algorithm == algorithm]
    for row in mine:
        if statistics.median(row.inc) >= row.cold:
            return f"{row.batch}"
    return f"none up to {mine[-1].batch}" if mine else "n/a"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_ranker",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true",
                        help="100k pages, batches up to 10k, one repeat")
    parser.add_argument("--data-dir", type=Path, default=repo.parent / "shared" / "data")
    parser.add_argument("--accuracy", type=float, default=1e-6,
                        help="max-abs error to restore, paper scale")
    parser.add_argument("--batch-sizes", default="10,100,1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--networkx-large", action="store_true",
                        help="also time networkx on the synthetic graph (slow, GBs of RAM)")
    parser.add_argument("--skip-docs", action="store_true")
    parser.add_argument("--skip-synthetic", action="store_true")
    args = parser.parse_args(argv)
    args.batch_sizes = [int(s) for s in args.batch_sizes.split(",") if s]
    if args.quick:
        args.pages = min(args.pages, 100_000)
        args.batch_sizes = [s for s in args.batch_sizes if s <= 10_000]
        args.repeats = 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warm_up_kernels()
    setups = []
    if not args.skip_synthetic:
        synthetic = copying_model_graph(args.pages, 10.0, seed=args.seed)
        setups.append(Setup(f"synth{args.pages // 1000}k", synthetic.to_linkgraph,
                            args.batch_sizes, args.networkx_large))
    docs = args.data_dir / DOCS_FILE
    if not args.skip_docs:
        if docs.exists():
            src, dst = read_edges(docs)
            setups.append(Setup("pydocs", lambda: LinkGraph.from_edges(src, dst),
                                args.batch_sizes, True))
        else:
            print(f"docs graph not found at {docs}; skipped", file=sys.stderr)
    print(f"accuracy: max-abs error <= {args.accuracy:g} (paper scale); damping {DAMPING}")
    print(HEADER)
    rows: list[Row] = []
    for setup in setups:
        if not setup.networkx:
            print("(networkx skipped on this graph: pass --networkx-large)")
        rows.extend(run_graph(setup, args.accuracy, args.repeats, args.seed))
    print("\n" + LEGEND)
    print(HEADER)
    for row in rows:
        print(_format(row))
    print()
    for setup in setups:
        for algorithm in ALGORITHMS:
            print(f"crossover {setup.name} {algorithm}: incremental stops beating our cold "
                  f"solve at batch {crossover(rows, setup.name, algorithm)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
