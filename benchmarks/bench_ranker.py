"""Benchmark: absorbing a batch of link changes, incremental vs full recomputes.

    python -m benchmarks.bench_ranker [--pages 1000000] [--quick] [--data-dir DIR]
                                      [--accuracy 1e-6] [--batch-sizes 10,100,...]
                                      [--model cyclic|dag|both]

Graphs: the seeded copying-model web graph of :mod:`ranker.synthetic` (``--pages``
pages, ~8 links per page, 20% uncrawled; "cyc": random links to any page, so
cycles, the default; "dag": Kumar et al.'s original model, random links to earlier
pages only) and the real Python docs graph (``DIR/python-docs-links.tsv.gz``, DIR
defaulting to the repository's ``data``, which holds a copy of ``../shared/data``'s).

Operation: absorb a batch of random link changes (half deletions of present links,
half new links), restoring a max-abs error of at most ``--accuracy`` (paper scale)
against an exact solve (computed untimed after every batch). The incremental
engine (:class:`ranker.LiveRanks`) runs twice on identical graphs, fed the same
batches: "incr" is calibrated the way our cold solve is (the loosest ``max_error``
of a ladder whose MEASURED error stays within the accuracy, found on untimed
warm-up batches of the same size; the measured error of every timed batch is
printed and flagged if over), "incr-c" certifies the accuracy itself
(``max_error=accuracy``). A timed batch of either over the accuracy makes the run
exit with status 1, naming the rows on its last line.

Competitors, timed in the same run on the same graph state:
- our cold solve (``ranker.pagerank`` / ``ranker.weighted_pagerank``) at the
  loosest tolerance of a ladder whose measured max-abs error is within
  ``--accuracy`` (calibrated untimed on the initial graph, generous to it);
- igraph's PRPACK full recompute (PageRank only);
- networkx ``pagerank`` (docs graph; the 1M graph only with ``--networkx-large``).

Printed: times (median of ``--repeats`` batches per size; one batch from 100k links
up), speedup ratios
(competitor time / incremental time) and the crossover batch size where the
incremental refresh stops beating our cold solve.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import networkx as nx
import numpy as np

from benchmarks.arguments import at_least, bench_parser
from benchmarks.ranker_competitors import (
    DAMPING,
    best_of,
    calibrate_cold,
    calibrate_networkx,
    exact,
    networkx_of,
    runs_for,
    time_cold,
    time_igraph,
    timed,
)
from benchmarks.ranker_table import (
    HEADER,
    LEGEND,
    Row,
    crossover,
    format_row,
    over_accuracy,
    row_details,
    uncertified,
)
from ranker import _kernels as K
from ranker import _scaled_sweep as SK
from ranker import _split_sweep as SS
from ranker.dominant_mode import NO_MODE
from ranker.edge_batches import EdgeBatch
from ranker.incremental import LiveRanks
from ranker.linkgraph import LinkGraph
from ranker.results import RefreshReport
from ranker.synthetic import copying_model_graph, random_edit_batch
from rankstream.edgelist import read_edges
from rankstream.errors import ConvergenceError

ALGORITHMS = ("pagerank", "wpr")
# max_error settings of the calibrated incremental engine, as multiples of the accuracy.
INC_LADDER = [1e3, 1e2, 1e1, 3.0, 1.0]
LOOSE_TOLERANCE = 1e-2  # relative L1 tolerance, loose so that max_error alone decides
# A warm-up error must stay within this share of the accuracy: a push engine's error
# varies from batch to batch (which hubs a batch hits), and a setting that only just
# passed its warm-ups overshot on timed batches. Cold solves need no margin: their
# error hardly depends on the batch.
CALIBRATION_MARGIN = 0.5
# Warm-ups of small batches cover at least this many links (at most MAX_WARMUPS
# batches): three 10-link batches are 30 links, too few to meet the hubs that decide a
# push engine's error. On the 100k-page graph WPR's 10-link batches passed three
# warm-ups at max_error 1e-4, then measured 1.3-1.5e-6 on the timed ones (the run
# failed); twenty warm-ups chose 1e-5, measured 5.7e-8.
WARMUP_LINKS = 200
MAX_WARMUPS = 20
# And at least this many batches, whatever their size: each ladder step restarts
# from the exact vector, so its first batches start with almost no error to carry.
# With three, the docs graph's 1k-link PageRank batches accepted max_error 3e-6 on
# errors of 3.0e-8, 4.1e-7 and 3.8e-7, then measured 1.06e-6 on the timed batch and
# `--quick` failed every run (session 37's review); five chose a setting within it.
MIN_WARMUPS = 5
# Graphs up to this many links are compared link by link (check_identical), larger
# ones by their counts only.
CHECKSUM_MAX_LINKS = 1_000_000
DOCS_FILE = "python-docs-links.tsv.gz"


@dataclass
class Setup:
    """A graph under test: ``build`` makes one identical LinkGraph per engine."""

    name: str
    build: Callable[[], LinkGraph]
    sizes: list[int]
    networkx: bool


def warm_up_kernels() -> None:
    """Load (or compile) every numba kernel before anything is timed."""
    graph = copying_model_graph(300, 6.0, seed=99).to_linkgraph()
    ranks = LiveRanks(graph, tolerance=1e-9, max_error=1e-9)
    ranks.cold_start()
    rng = np.random.default_rng(0)
    ranks.apply(random_edit_batch(graph, 20, rng))
    # The two-thread sweeps too, which a graph this small would not use.
    with mock.patch.object(SS, "SPLIT_MIN_PAGES", 0):
        ranks.apply(random_edit_batch(graph, 2000, rng))
        for algorithm in ALGORITHMS:
            time_one_sweep(ranks, algorithm)
    graph.compact()


def time_one_sweep(ranks: LiveRanks, algorithm: str) -> float:
    """Seconds of ONE Gauss-Seidel sweep pushing every page (on copies of the state).

    When most pages' exact ``y`` moves by more than the accuracy, every one of them
    must be pushed at least once, so a refresh cannot cost less than this. The sweep
    is the refresh's own: over WPR's scaled residual (ranker._scaled_sweep), and on two
    threads where the refresh's would be (ranker._split_sweep).
    """
    engine = ranks.engines[algorithm]
    graph = ranks.graph
    n = graph.num_ids
    split = SS.wanted(n)
    best = np.inf
    for _ in range(2):
        y, r = engine.y.copy(), engine.r.copy()
        r[:n] += 1.0  # every page pushes
        touched = np.zeros_like(engine.touched)
        is_touched = np.zeros_like(engine.is_touched)
        qstate = np.zeros_like(engine.qstate)
        cross, cross_dangling = np.zeros_like(r), np.zeros_like(r)
        scratch = np.zeros_like(engine.touched)
        if engine.kind == K.KIND_WPR:
            r_dangling = np.zeros_like(r)
            SK.to_scaled(n, r, r_dangling, engine.factor)
            arrays = (DAMPING, 0.0, 1.0, n, y, r, r_dangling, graph.out_start, graph.out_len,
                      graph.out_nbr, engine.factor, engine.si, engine.so, touched, qstate,
                      is_touched)
            started = time.perf_counter()
            if split:
                SS.split_sweep_scaled(*arrays, cross, cross_dangling, scratch)
            else:
                SK.sweep_scaled(*arrays, 2**62)
        elif split:
            started = time.perf_counter()
            SS.split_sweep(DAMPING, 0.0, 1.0, n, y, r, graph.out_start, graph.out_len,
                           graph.out_nbr, touched, qstate, is_touched, 0.0, NO_MODE, cross,
                           scratch)
        else:
            started = time.perf_counter()
            K.sweep(engine.kind, DAMPING, 0.0, 1.0, n, y, r, *engine.arrays(), touched,
                    qstate, is_touched, 2**62, 0.0, NO_MODE)
        best = min(best, time.perf_counter() - started)
    return best


def new_ranks(graph: LinkGraph, algorithm: str, max_error: float) -> LiveRanks:
    """An engine whose only accuracy knob is ``max_error`` (the L1 tolerance is loose)."""
    return LiveRanks(graph, algorithms=(algorithm,), damping=DAMPING, max_error=max_error,
                     tolerance=LOOSE_TOLERANCE)


def max_abs(ranks: LiveRanks, algorithm: str, reference: np.ndarray) -> float:
    return float(np.abs(ranks.scores(algorithm) - reference).max())


@dataclass
class Lane:
    """One algorithm's engines (one graph each, all fed the same batches) and reference."""

    algorithm: str
    calibrated: LiveRanks
    certified: LiveRanks
    reference: np.ndarray
    exact_tol: float
    setting: float = float("nan")
    contended: dict[str, bool] = field(default_factory=dict)

    def feed(self, batch: EdgeBatch, *, timed_variant: str | None = None) -> tuple[
            dict[str, float], dict[str, RefreshReport], np.ndarray]:
        """Apply ``batch`` to both engines, then advance the exact reference (untimed).

        Returns (seconds by variant, reports by variant, |reference move| by page).
        :attr:`contended` says which variants found the second core taken meanwhile.
        """
        seconds: dict[str, float] = {}
        reports: dict[str, RefreshReport] = {}
        self.contended = {}
        for variant, ranks in (("incr", self.calibrated), ("incr-c", self.certified)):
            copy = _copy(batch)
            guard = ranks.thread_guard
            taken, paused = guard.taken_count, guard.paused()
            started = time.perf_counter()
            reports[variant] = ranks.apply(copy)[self.algorithm]
            seconds[variant] = time.perf_counter() - started
            self.contended[variant] = paused or guard.taken_count > taken
        old = self.reference
        self.reference = exact(self.calibrated.graph, self.algorithm, old, self.exact_tol)
        moved = np.abs(self.reference - _padded(old, self.reference.size))
        return seconds, reports, moved


def _padded(vector: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size)
    out[: min(size, vector.size)] = vector[:size]
    return out


def calibrate_incremental(lanes: Sequence[Lane], probe: LinkGraph, size: int,
                          accuracy: float, rng: np.random.Generator, warmups: int) -> None:
    """Each lane's loosest ``max_error`` of the ladder whose MEASURED error stays within
    ``accuracy``.

    (Within ``CALIBRATION_MARGIN * accuracy`` on the warm-ups, to leave room for
    the batch-to-batch variance of the timed ones.)

    Every lane tries the ladder loosest first, on ``warmups`` fresh batches of
    ``size`` each (untimed); a setting that overshoots once is rejected and that
    engine restarts from the exact vector. The lanes calibrate side by side, and
    every warm-up batch goes to EVERY lane's engines, calibrating or done, so all
    graphs stay identical to ``probe`` (which the batches are drawn from). An engine
    keeps the state its chosen setting left (done lanes keep absorbing at their
    setting): the timed batches start from that setting's own steady state, as a
    live stream would.
    """
    ladders = {lane.algorithm: iter(INC_LADDER) for lane in lanes}
    passed = dict.fromkeys(ladders, 0)

    def next_setting(lane: Lane) -> bool:
        """Move ``lane`` to its next ladder step; False when the ladder is used up."""
        a = lane.algorithm
        factor = next(ladders[a], None)
        if factor is None:
            lane.setting = accuracy  # the certified setting (cannot exceed, but is checked)
            lane.calibrated.engines[a].max_error = accuracy
            return False
        lane.setting = accuracy * factor
        # Same engine, new setting: what it learnt about the graph (when to go global
        # at once, whether sweeps over-relax) carries over, as in a live stream.
        lane.calibrated.engines[a].max_error = lane.setting
        lane.calibrated.cold_start(warm={a: lane.reference})
        passed[a] = 0
        return True

    calibrating = [lane for lane in lanes if next_setting(lane) and warmups > 0]
    while calibrating:
        batch = random_edit_batch(probe, size, rng)
        for lane in lanes:
            lane.feed(batch)
        still = []
        for lane in calibrating:
            a = lane.algorithm
            if max_abs(lane.calibrated, a, lane.reference) > CALIBRATION_MARGIN * accuracy:
                if next_setting(lane):
                    still.append(lane)
            else:
                passed[a] += 1
                if passed[a] < warmups:
                    still.append(lane)
        calibrating = still


def check_identical(graphs: Sequence[LinkGraph]) -> None:
    """Fail unless every graph under test holds the same pages and links (every batch
    went to each of them). Counts always; the edges' digest up to CHECKSUM_MAX_LINKS."""
    shapes = {(g.num_ids, g.num_live, g.num_links) for g in graphs}
    if len(shapes) != 1:
        raise AssertionError(f"the graphs under test drifted apart: (ids, live, links) "
                             f"{sorted(shapes)}")
    if graphs[0].num_links <= CHECKSUM_MAX_LINKS:
        digests = {_edge_digest(g) for g in graphs}
        if len(digests) != 1:
            raise AssertionError("the graphs under test drifted apart: same counts, "
                                 "different links")


def _edge_digest(graph: LinkGraph) -> str:
    """Digest of the live mask and the links (CSR: grouped by source, sorted)."""
    matrix = graph.to_csr()
    digest = hashlib.sha256(graph.live_mask().tobytes())
    digest.update(np.asarray(matrix.indptr, dtype=np.int64).tobytes())
    digest.update(np.asarray(matrix.indices, dtype=np.int64).tobytes())
    return digest.hexdigest()


def run_graph(setup: Setup, accuracy: float, repeats: int, seed: int, warmups: int
              ) -> list[Row]:
    print(f"\n== {setup.name} ==", flush=True)
    build_s, built = timed(setup.build)
    assert isinstance(built, LinkGraph)
    probe = built  # batches are drawn from it; every other graph stays identical to it
    graphs = {("pagerank", "incr"): built}
    for a in ALGORITHMS:
        for variant in ("incr", "incr-c"):
            if (a, variant) not in graphs:
                graphs[(a, variant)] = setup.build()
    print(f"graph: {probe.num_ids:,} pages, {probe.num_links:,} links, built in {build_s:.1f}s; "
          f"LinkGraph memory {probe.memory_bytes() / probe.num_links:.1f} bytes/link "
          f"(URL strings excluded; the key table "
          f"{probe.key_table_bytes() / probe.num_links:.1f} of it)", flush=True)
    exact_tol = accuracy * 1e-2  # certified L1 bound, so max-abs error <= 1% of accuracy
    try:
        reference = {a: exact(probe, a, None, exact_tol) for a in ALGORITHMS}
    except ConvergenceError as exc:  # an --accuracy below what float64 can certify
        raise SystemExit(f"bench_ranker: --accuracy {accuracy:g} is too tight to judge on "
                         f"{setup.name}: {exc}") from exc
    cold_tol = {a: calibrate_cold(probe, a, reference[a], accuracy) for a in ALGORITHMS}
    print("cold tolerance (certified L1, paper scale) reaching the accuracy: "
          + ", ".join(f"{a} {t:g}" for a, t in cold_tol.items())
          + "; y max " + ", ".join(f"{a} {reference[a].max():.4g}" for a in ALGORITHMS),
          flush=True)
    nx_graph = networkx_of(probe) if setup.networkx else None
    nx_tol = calibrate_networkx(nx_graph, reference["pagerank"], accuracy) if nx_graph else 0.0

    lanes = {}
    for a in ALGORITHMS:
        certified = LiveRanks(graphs[(a, "incr-c")], algorithms=(a,), damping=DAMPING,
                              max_error=accuracy)
        certified.cold_start(warm={a: reference[a]})
        calibrated = new_ranks(graphs[(a, "incr")], a, accuracy)
        calibrated.cold_start(warm={a: reference[a]})
        lanes[a] = Lane(a, calibrated, certified, reference[a], exact_tol)
    rng = np.random.default_rng(seed)
    rows: list[Row] = []
    for size in setup.sizes:
        if size // 2 > probe.num_links:
            print(f"batch {size}: skipped (more deletions than links)")
            continue
        batch_rows = {a: Row(setup.name, a, size, accuracy=accuracy, pages=probe.num_live)
                      for a in ALGORITHMS}
        tries = max(warmups, min(MAX_WARMUPS, -(-WARMUP_LINKS // size)))
        calibrate_incremental(list(lanes.values()), probe, size, accuracy, rng, tries)
        for a in ALGORITHMS:
            batch_rows[a].setting = lanes[a].setting
        check_identical(list(graphs.values()))
        for _ in range(repeats if size < 100_000 else 1):
            batch = random_edit_batch(probe, size, rng)
            for a in ALGORITHMS:
                lane = lanes[a]
                seconds, reports, moved = lane.feed(batch)
                row = batch_rows[a]
                row.inc.append(seconds["incr"])
                row.inc_c.append(seconds["incr-c"])
                row.modes.append(reports["incr"].mode)
                row.modes_c.append(reports["incr-c"].mode)
                row.errors.append(max_abs(lane.calibrated, a, lane.reference))
                row.errors_c.append(max_abs(lane.certified, a, lane.reference))
                row.certified.append(reports["incr-c"].max_abs_bound)
                row.fresh_c.append(reports["incr-c"].fresh)
                row.pushes.append(reports["incr"].pushes)
                row.contended.append(lane.contended["incr"])
                row.contended_c.append(lane.contended["incr-c"])
                row.moved.append(int((moved > accuracy).sum()))
        check_identical(list(graphs.values()))  # probe is what the competitors time
        for a in ALGORITHMS:
            batch_rows[a].cold = time_cold(probe, a, cold_tol[a])
            batch_rows[a].cold_certified = time_cold(probe, a, accuracy)
            batch_rows[a].sweep = time_one_sweep(lanes[a].calibrated, a)
        ig_seconds, ig_error, ig_threads = time_igraph(probe, lanes["pagerank"].reference)
        batch_rows["pagerank"].igraph = ig_seconds
        if nx_graph is not None:
            current = networkx_of(probe)

            def nx_solve(g: nx.DiGraph = current) -> object:
                return nx.pagerank(g, alpha=DAMPING, tol=nx_tol, max_iter=10_000)

            batch_rows["pagerank"].networkx = best_of(nx_solve, runs_for(probe))
        for a in ALGORITHMS:
            print(format_row(batch_rows[a]), flush=True)
            print("   " + row_details(batch_rows[a]), flush=True)
        print(f"   (igraph max-abs error {ig_error:.2g}, faster at {ig_threads} OpenMP "
              f"thread(s))" if ig_threads else f"   (igraph max-abs error {ig_error:.2g})",
              flush=True)
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


def _batch_sizes(text: str) -> list[int]:
    """Sorted, so that rows and the crossover read smallest first."""
    sizes = [at_least(2)(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("no batch sizes")
    return sorted(set(sizes))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    repo = Path(__file__).resolve().parent.parent
    parser = bench_parser("python -m benchmarks.bench_ranker", __doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=at_least(1_000), default=1_000_000)
    parser.add_argument("--quick", action="store_true",
                        help="100k pages, batches up to 10k, one repeat")
    parser.add_argument("--data-dir", type=Path, default=repo / "data")
    parser.add_argument("--accuracy", type=float, default=1e-6,
                        help="max-abs error to restore, paper scale")
    parser.add_argument("--batch-sizes", type=_batch_sizes, default="10,100,1000,10000,100000",
                        help="comma-separated link counts, each at least 2 (half "
                             "insertions, half deletions)")
    parser.add_argument("--repeats", type=at_least(1), default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", choices=("cyclic", "dag", "both"), default="cyclic",
                        help="synthetic graph: copying model with random links to any page "
                             "(cyclic, default) and/or Kumar et al.'s original one with random "
                             "links to earlier pages only (dag)")
    parser.add_argument("--warmups", type=at_least(1), default=MIN_WARMUPS,
                        help="untimed warm-up batches per ladder step when calibrating incr "
                             f"(more for small batches: {WARMUP_LINKS} links' worth, at most "
                             f"{MAX_WARMUPS})")
    parser.add_argument("--networkx-large", action="store_true",
                        help="also time networkx on the synthetic graph (slow, GBs of RAM)")
    parser.add_argument("--skip-docs", action="store_true")
    parser.add_argument("--skip-synthetic", action="store_true")
    args = parser.parse_args(argv)
    if not 0.0 < args.accuracy < 1.0:  # also refuses NaN
        parser.error(f"argument --accuracy: must be in (0, 1), got {args.accuracy:g}")
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
        models = ("cyclic", "dag") if args.model == "both" else (args.model,)
        for model in models:
            synthetic = copying_model_graph(args.pages, 10.0, seed=args.seed,
                                            acyclic=model == "dag")
            label = "cyc" if model == "cyclic" else "dag"
            setups.append(Setup(f"{label}{args.pages // 1000}k", synthetic.to_linkgraph,
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
        rows.extend(run_graph(setup, args.accuracy, args.repeats, args.seed, args.warmups))
    print("\n" + LEGEND)
    print(HEADER)
    for row in rows:
        print(format_row(row))
    print()
    for row in rows:
        print(f"{row.graph} {row.algorithm} {row.batch}: {row_details(row)}")
    print()
    for setup in setups:
        for algorithm in ALGORITHMS:
            print(f"crossover {setup.name} {algorithm}: incremental stops beating our cold "
                  f"solve at batch {crossover(rows, setup.name, algorithm)}")
    over = [f"{row.graph} {row.algorithm} {row.batch} ({variant} "
            f"{max(row.errors if variant == 'incr' else row.errors_c):.2g})"
            for row in rows for variant in over_accuracy(row)]
    if over:
        print(f"FAILED: measured max-abs error over the accuracy {args.accuracy:g} in "
              f"{len(over)} timed row(s): {'; '.join(over)}")
        return 1
    unsure = [f"{row.graph} {row.algorithm} {row.batch}" for row in rows if uncertified(row)]
    if unsure:
        print(f"FAILED: incr-c did not certify the accuracy {args.accuracy:g} (not fresh, "
              f"or a bound over it) in {len(unsure)} row(s): {'; '.join(unsure)}")
        return 1
    print(f"every timed batch's measured error (incr and incr-c) is within the accuracy "
          f"{args.accuracy:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
