"""``rankstream rank``: rank an edge list offline, optionally replaying an event log.

No services are involved. PageRank and WPR go through the same incremental engine
the consumer uses (events are absorbed in batches of ``--batch-size``), so this
command doubles as the reference the streaming pipeline is tested against;
``--verify`` cross-checks the result against a cold solve.

``--teleport FILE`` ranks topic-sensitive PageRank (Haveliwala): random jumps land on
the pages listed, in proportion to their weights, instead of on every page alike.
The incremental engine teleports uniformly (as the consumer does), so those scores
come from a cold solve of the graph after any events, to the same relative
tolerance; a page listed but not in the graph is named in a warning and gets no
weight.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from rankstream.batching import chunks
from rankstream.edgelist import read_edges, read_teleport
from rankstream.errors import ConvergenceError, InputError, RankstreamError
from rankstream.input_files import input_path, same_input
from rankstream.settings import Settings

if TYPE_CHECKING:
    import scipy.sparse as sp

    from producer.schema import Limits
    from ranker import EdgeBatch, LinkGraph
    from ranker.results import RankResult

ALGORITHMS = ("pagerank", "wpr", "hits")
# The cold check's L1 bound per live page at d <= 0.85, a tenth of the tolerance floor.
# Both certificates are L1 bounds computed in float64: slack for the rounding of the
# residual sums themselves, relative to sum(y).
VERIFY_ROUNDING = 64 * float(np.finfo(np.float64).eps)
MAX_BATCH_SIZE = 10**9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--edges", type=input_path,
                        help="src<TAB>dst lines, optionally gzipped, '-' for stdin; keys are "
                        "taken verbatim, while event URLs are canonicalised; blank lines and "
                        "lines starting with '#' are skipped")
    parser.add_argument("--events", type=input_path,
                        help="JSON-lines event log applied on top ('-' for stdin)")
    parser.add_argument("--batch-size", type=int, default=1000, help="events per refresh")
    parser.add_argument("--algorithm", default="pagerank", help="pagerank | wpr | hits")
    parser.add_argument("--damping", type=float, default=None, help="default: settings")
    parser.add_argument(
        "--tolerance", type=float, default=None,
        help="PageRank/WPR: certified relative error bound to reach (default: the tightest "
        "certifiable, 1e-12 up to damping 0.85); HITS: the estimated L1 distance to the "
        "iteration's limit, or the fallback's relative residual (default 1e-12)",
    )
    parser.add_argument("--scale", default="paper", help="paper | probability (PageRank)")
    parser.add_argument(
        "--teleport", type=input_path,
        help="PageRank only: topic-sensitive PageRank, random jumps land on the pages "
        "of FILE ('key' or 'key<TAB>weight' lines, weight 1 by default) in proportion to "
        "their weights; ranked by a cold solve after any events")
    parser.add_argument("--top", type=int, default=None, help="print only the first K rows")
    parser.add_argument(
        "--verify", action="store_true",
        help="also cold-solve; print max |diff| to stderr; exit 1 if the certified "
        "bounds do not cover it",
    )


def _check(args: argparse.Namespace) -> None:
    if args.algorithm not in ALGORITHMS:
        raise InputError(f"unknown algorithm {args.algorithm!r}; choose one of {ALGORITHMS}")
    if args.scale not in ("paper", "probability"):
        raise InputError(f"unknown scale {args.scale!r}; choose paper or probability")
    if args.scale == "probability" and args.algorithm != "pagerank":
        raise InputError("--scale probability applies to PageRank only")
    if args.teleport is not None and args.algorithm != "pagerank":
        raise InputError("--teleport applies to PageRank only")
    if args.edges is None and args.events is None:
        raise InputError("give --edges FILE, --events FILE, or both")
    if not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise InputError(f"--batch-size must be between 1 and {MAX_BATCH_SIZE:,}")
    if args.edges is not None and args.events is not None and same_input(args.edges,
                                                                          args.events):
        # Whichever is read first would take the whole stream, and the other nothing.
        raise InputError("--edges and --events name the same input")
    if args.teleport is not None and any(
            other is not None and same_input(args.teleport, other)
            for other in (args.edges, args.events)):
        raise InputError("--teleport names the same input as --edges or --events")
    if args.top is not None and args.top < 1:
        raise InputError("--top must be at least 1")
    if args.tolerance is not None and not 0.0 < args.tolerance < 1.0:
        raise InputError(f"--tolerance must lie strictly between 0 and 1, got {args.tolerance:g}")
    if args.damping is not None and not 0.0 < args.damping < 1.0:
        raise InputError("--damping must lie strictly between 0 and 1")


def run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here so `rankstream --help` stays fast and numba compiles only when used.
    from producer.schema import Limits
    from ranker import LinkGraph, LiveRanks, hits, pagerank, weighted_pagerank
    from ranker.bounds import MIN_TOLERANCE, static_tolerance, tolerance_floor
    from ranker.incremental import check_tolerance

    _check(args)
    limits = Limits.from_settings(settings)
    damping = settings.damping if args.damping is None else args.damping
    if args.algorithm != "hits" and not tolerance_floor(damping) < 1.0:
        # Else the default tolerance (the floor) was refused as "must be below 1",
        # a tolerance the user never gave.
        raise InputError(f"damping {damping!r} is too close to 1: float64 cannot certify "
                         "any relative tolerance below 1 there")
    tolerance = args.tolerance
    if tolerance is None:
        tolerance = MIN_TOLERANCE if args.algorithm == "hits" else tolerance_floor(damping)
    elif args.algorithm == "hits" and tolerance < MIN_TOLERANCE:
        # (PageRank and WPR: LiveRanks refuses theirs, at the floor of their damping.)
        raise InputError(f"--tolerance must be at least {MIN_TOLERANCE:g} for HITS "
                         "(below it the change between steps is float64 rounding noise)")
    tally = {"applied": 0, "stale": 0}
    sources, targets = read_edges(args.edges) if args.edges else ([], [])
    graph = LinkGraph.from_edges(sources, targets)
    # The edge list's sources are the crawled pages (the orphan rule of
    # rankstream.graph_updates), a source of nothing but a self link included.
    crawled = np.zeros(graph.num_ids, dtype=bool)
    crawled[[page for page in map(graph.id_of, set(sources)) if page is not None]] = True

    if args.algorithm == "hits":
        _apply_events(graph, crawled, args, limits, tally)
        result = hits(graph.to_csr(), tol=tolerance, max_iter=settings.max_iter)
        if args.verify:
            # Said rather than skipped silently: there is no incremental HITS, so the
            # scores printed are the cold solve itself.
            sys.stderr.write("verify: HITS has no incremental path; the scores are a cold "
                             f"solve (tolerance {tolerance:g})\n")
        alive = graph.live_mask()
        with _output_errors():
            _print_hits(graph, result.hubs, result.authorities, alive, args.top)
        return 0

    if args.teleport is not None:
        check_tolerance(tolerance, damping)  # before the events: the plain path's floor
        _apply_events(graph, crawled, args, limits, tally)
        return _rank_with_teleport(graph, args, damping=damping, tolerance=tolerance,
                                   max_iter=settings.max_iter)

    ranks = LiveRanks(
        graph,
        algorithms=(args.algorithm,),
        damping=damping,
        tolerance=tolerance,
        publish_threshold=0.0,
        max_iter=settings.max_iter,
    )
    report = ranks.cold_start()[args.algorithm]
    for batch in _edge_batches(graph, crawled, args, limits, tally):
        report = ranks.apply(batch)[args.algorithm]
    _report_events(args, tally)
    if not report.fresh:
        # The scores printed are the last refresh's: never print them as converged.
        raise ConvergenceError(
            f"{args.algorithm} did not reach --tolerance {tolerance:g} within "
            f"{settings.max_iter} sweeps (relative bound {report.relative_bound:.3g}); "
            f"raise RANKSTREAM_MAX_ITER or the tolerance",
            iterations=report.sweeps, error=report.bound)

    scores = ranks.scores(args.algorithm)
    alive = graph.live_mask()
    if args.verify:
        solve = pagerank if args.algorithm == "pagerank" else weighted_pagerank
        # Absolute, so it grows with the graph and with 1 / (1 - d) above 0.85
        # (at d = 0.9999 a fixed 1e-13 stalled the cold solve: a review).
        cold_tol = static_tolerance(max(int(alive.sum()), 10), damping)
        try:
            exact = solve(graph.to_csr(), damping=damping, tol=cold_tol,
                          max_iter=_cold_sweeps(settings.max_iter, cold_tol, alive, damping),
                          alive=alive)
        except ConvergenceError as exc:
            # Not a wrong certificate (exit 1 below), nor the ranking's own failure:
            # the check asked for could not be made.
            raise ConvergenceError(f"verify: the cold solve did not converge: {exc}",
                                   iterations=exc.iterations, error=exc.error) from exc
        diff = float(np.max(np.abs(exact.scores - scores), initial=0.0))
        bound = ranks.bound(args.algorithm)
        sys.stderr.write(
            f"verify: max |incremental - cold| = {diff:.3e} (paper scale), "
            f"certified bound {bound:.3e}, cold solve's {exact.bound:.3e}\n"
        )
        # max-abs <= L1, so the two certificates together bound the difference: more
        # means a certificate is wrong, which is what --verify is there to catch.
        limit = bound + exact.bound + VERIFY_ROUNDING * max(exact.total, 1.0)
        if not diff <= limit:
            sys.stderr.write(f"rankstream rank: verify FAILED: the difference exceeds the "
                             f"sum of the certified bounds ({limit:.3e})\n")
            return 1
    if args.scale == "probability":
        total = ranks.total(args.algorithm)
        scores = scores / total if total > 0 else scores
    with _output_errors():
        _print_scores(graph, scores, alive, args.top)
    return 0


def _rank_with_teleport(graph: LinkGraph, args: argparse.Namespace, *, damping: float,
                        tolerance: float, max_iter: int) -> int:
    """Topic-sensitive PageRank of ``graph`` by a cold solve (see the module's doc)."""
    alive = graph.live_mask()
    teleport = np.zeros(graph.num_ids)
    missing: list[tuple[int, str]] = []
    for key, (weight, line_no) in read_teleport(args.teleport).items():
        page = graph.id_of(key)
        if page is None or not alive[page]:
            missing.append((line_no, key))
        else:
            teleport[page] = weight
    absent = ""
    if missing:
        line_no, key = missing[0]
        absent = (f"{len(missing)} page(s) listed are not in the graph and get no weight "
                  f"(the first: {key[:80]!r}, line {line_no})")
    if not teleport.any():
        raise InputError("no page of the graph has a positive weight"
                         + (f"; {absent}" if absent else ""), where=str(args.teleport))
    if absent:
        sys.stderr.write(f"teleport: {absent}\n")
    result = _teleport_solve(graph.to_csr(), teleport, alive, damping=damping,
                             tolerance=tolerance, max_iter=max_iter)
    if args.verify:
        # Said rather than skipped: there is no incremental path to check against.
        sys.stderr.write("verify: --teleport has no incremental path; the scores are a cold "
                         f"solve (certified L1 bound {result.bound:.3e}, "
                         f"{result.bound / result.total:.1e} of sum(y))\n")
    scores = result.scores
    if args.scale == "probability" and result.total > 0:
        scores = scores / result.total
    with _output_errors():
        _print_scores(graph, scores, alive, args.top)
    return 0


def _teleport_solve(matrix: sp.csr_array, teleport: np.ndarray, alive: np.ndarray, *,
                    damping: float, tolerance: float, max_iter: int) -> RankResult:
    """A static solve whose certified bound is at most ``tolerance * sum(y)``
    (``tolerance`` at least the floor: :func:`ranker.incremental.check_tolerance`).

    The static solver takes an absolute bound, and a topic's ``sum(y)`` is only known
    to lie between ``sum(b) = (1 - d) * live pages`` and ``live pages``. Aiming at the
    low end from the start asked near d = 1 for less than float64 certifies for a
    relative tolerance LiveRanks reaches (a review), so: first a target float64 can
    certify for any ``sum(y)`` (:func:`ranker.bounds.static_tolerance`), then, if
    the bound is not yet within ``tolerance`` of the sum found, once more from there
    to ``tolerance * (sum - 2 * bound)``, which the second sum cannot fall below.
    """
    from ranker import pagerank
    from ranker.bounds import static_tolerance

    live = int(alive.sum())
    tol = max(tolerance * (1.0 - damping) * live, static_tolerance(live, damping))
    result = pagerank(matrix, damping=damping, tol=tol, teleport=teleport, alive=alive,
                      max_iter=_cold_sweeps(max_iter, tol, alive, damping))
    if result.bound <= tolerance * result.total:
        return result
    tol = tolerance * (result.total - 2.0 * result.bound)
    return pagerank(matrix, damping=damping, tol=tol, teleport=teleport, alive=alive,
                    start=result.scores, max_iter=_cold_sweeps(max_iter, tol, alive, damping))


def _cold_sweeps(max_iter: int, tol: float, alive: np.ndarray, damping: float) -> int:
    """Sweeps for a cold solve (--verify's, --teleport's): twice what contracting an
    error of at most ``2 * sum(y)`` (any start) by ``d`` a sweep takes to reach
    ``tol``, and at least ``max_iter`` and 10,000. A fixed 10,000 fell short at
    d = 0.999 (24k needed)."""
    start_error = 2.0 * max(int(alive.sum()), 1)
    needed = math.log(tol / start_error) / math.log(damping)
    return max(max_iter, 10_000, math.ceil(2.0 * needed))


@contextlib.contextmanager
def _output_errors() -> Iterator[None]:
    """A failed write of the ranking (a full disk under ``> out.tsv``) is one line."""
    try:
        yield
    except BrokenPipeError:
        raise  # `| head`: the command line ends quietly
    except OSError as exc:
        raise RankstreamError(f"cannot write the output: {exc.strerror or exc}") from exc


def _edge_batches(
    graph: LinkGraph, crawled: np.ndarray, args: argparse.Namespace, limits: Limits,
    tally: dict[str, int]
) -> Iterator[EdgeBatch]:
    """The event log, ``--batch-size`` events at a time, as net edge batches; counts
    the events applied and the stale ones ignored into ``tally``."""
    if args.events is None:
        return
    from producer.schema import iter_events
    from rankstream.graph_updates import EventApplier

    applier = EventApplier(graph, crawled=crawled)
    events = (event for _, event in iter_events(args.events, limits))
    for chunk in chunks(events, args.batch_size):
        applied = applier.apply(chunk)
        tally["applied"] += applied.applied
        tally["stale"] += applied.stale_ignored
        yield applied.batch


def _apply_events(graph: LinkGraph, crawled: np.ndarray, args: argparse.Namespace,
                  limits: Limits, tally: dict[str, int]) -> None:
    """The event log applied to the graph alone (no engine: HITS, --teleport)."""
    for batch in _edge_batches(graph, crawled, args, limits, tally):
        graph.apply(batch)
    _report_events(args, tally)


def _report_events(args: argparse.Namespace, tally: dict[str, int]) -> None:
    # The stale rule ignores events silently otherwise (the consumer counts them in
    # `rankstream status`).
    if args.events is not None:
        sys.stderr.write(f"events: {tally['applied']} applied, {tally['stale']} stale "
                         "ignored (an older ts than the page's last)\n")


def _order(keys: Sequence[str], scores: np.ndarray) -> list[int]:
    # Highest score first; ties broken by key so the output is deterministic.
    return sorted(range(len(keys)), key=lambda i: (-scores[i], keys[i]))


def _print_scores(graph: LinkGraph, scores: np.ndarray, alive: np.ndarray, top: int | None) -> None:
    ids = np.flatnonzero(alive)
    keys = [graph.key_of(int(i)) for i in ids]
    values = scores[ids]
    out = sys.stdout
    for rank, i in enumerate(_order(keys, values)):
        if top is not None and rank >= top:
            break
        out.write(f"{keys[i]}\t{values[i]:.12g}\n")


def _print_hits(
    graph: LinkGraph, hubs: np.ndarray, auths: np.ndarray, alive: np.ndarray, top: int | None
) -> None:
    ids = np.flatnonzero(alive)
    keys = [graph.key_of(int(i)) for i in ids]
    out = sys.stdout
    for rank, i in enumerate(_order(keys, auths[ids])):
        if top is not None and rank >= top:
            break
        out.write(f"{keys[i]}\t{hubs[ids[i]]:.12g}\t{auths[ids[i]]:.12g}\n")
