"""The result table of bench_ranker: one ``Row`` per (graph, algorithm, batch size), printed.

Kept apart from the timing code: the column header, the row and detail-line formats,
the legend explaining them and the crossover summary all read finished ``Row``s and
measure nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Row:
    """One (graph, algorithm, batch size) line of the table."""

    graph: str
    algorithm: str
    batch: int
    inc: list[float] = field(default_factory=list)
    inc_c: list[float] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    modes_c: list[str] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    errors_c: list[float] = field(default_factory=list)
    certified: list[float] = field(default_factory=list)
    fresh_c: list[bool] = field(default_factory=list)  # incr-c's reports said fresh
    pushes: list[int] = field(default_factory=list)
    # Timed batches (incr, incr-c) during which the engine's ThreadGuard found the
    # second core taken and ran its kernels on one thread (ranker._thread_guard).
    contended: list[bool] = field(default_factory=list)
    contended_c: list[bool] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    setting: float = float("nan")
    sweep: float = float("nan")
    accuracy: float = 1e-6
    pages: int = 0
    cold: float = float("nan")
    cold_certified: float = float("nan")
    igraph: float = float("nan")
    networkx: float = float("nan")


HEADER = (f"{'graph':<11} {'alg':<8} {'batch':>6} {'mode':<7} {'incr ms':>8} {'incr-c':>8} "
          f"{'cold ms':>8} {'cold-c':>8} {'igraph':>8} {'nx ms':>7} {'x ig':>6} {'x cold':>6} "
          f"{'x ig-c':>6} {'xcold-c':>7} {'err':>7} {'err-c':>7} {'over?':>6}")
LEGEND = """incr: incremental refresh (graph update + residual columns + push/sweeps), median
(one batch at 100k links and more), on two kernel threads (our cold solve runs on one,
igraph on the faster of one or two), with
max_error CALIBRATED like cold: the loosest setting whose MEASURED max-abs error stayed within
half the accuracy on untimed warm-up batches of the same size (err: largest measured error of the
timed batches; over? says 'OVER' if any of incr's exceeded the accuracy, 'OVER-c' if any of
incr-c's (err-c), 'OVER+c' if both; any of them makes the run exit with status 1);
incr-c: the same engine CERTIFYING the accuracy (max_error = accuracy);
cold: our cold solve at the loosest tolerance whose MEASURED max-abs error is within the
accuracy; cold-c: our cold solve CERTIFYING it; x ...: competitor time / incremental time.
Detail lines: setting = calibrated max_error; moved = pages whose exact y moved by more than
the accuracy (median over the timed batches); sweep = ONE Gauss-Seidel sweep over the whole
graph (a lower bound once most pages must move, as in PageRank's batches; not for WPR's,
where a few percent move); ceiling = igraph (PR) or cold (WPR) / sweep;
SECOND CORE TAKEN = timed batches during which another process held the second core, so the
engine ran its kernels on one thread (its times are then not the engine's, rerun when quiet;
the competitors' and the sweep's timings are not watched so: a busy box skews them too)."""


def _ms(seconds: float) -> str:
    return "-" if np.isnan(seconds) else f"{seconds * 1e3:.1f}"


def _ratio(other: float, mine: float) -> str:
    return "-" if np.isnan(other) else f"{other / mine:.1f}"


def _modes(modes: list[str]) -> str:
    return "/".join(sorted(set(modes)))


def over_accuracy(row: Row) -> list[str]:
    """The variants ("incr", "incr-c") whose measured error on a timed batch of ``row``
    exceeded its accuracy."""
    return [variant for variant, errors in (("incr", row.errors), ("incr-c", row.errors_c))
            if errors and max(errors) > row.accuracy]


def uncertified(row: Row) -> bool:
    """Whether an incr-c refresh of ``row`` ended without certifying the accuracy:
    not fresh, or a per-page bound over it. Its timing would not be a certified one."""
    return not all(row.fresh_c) or (bool(row.certified) and max(row.certified) > row.accuracy)


def format_row(row: Row) -> str:
    inc = statistics.median(row.inc)
    inc_c = statistics.median(row.inc_c)
    over = {(): "ok", ("incr",): "OVER", ("incr-c",): "OVER-c",
            ("incr", "incr-c"): "OVER+c"}[tuple(over_accuracy(row))]
    return (f"{row.graph:<11} {row.algorithm:<8} {row.batch:>6} {_modes(row.modes):<7} "
            f"{_ms(inc):>8} {_ms(inc_c):>8} {_ms(row.cold):>8} {_ms(row.cold_certified):>8} "
            f"{_ms(row.igraph):>8} {_ms(row.networkx):>7} {_ratio(row.igraph, inc):>6} "
            f"{_ratio(row.cold, inc):>6} {_ratio(row.igraph, inc_c):>6} "
            f"{_ratio(row.cold, inc_c):>7} {max(row.errors):>7.1e} {max(row.errors_c):>7.1e} "
            f"{over:>6}")


def row_details(row: Row) -> str:
    ceiling_of = row.igraph if row.algorithm == "pagerank" else row.cold
    moved = int(statistics.median(row.moved))
    return (f"setting max_error {row.setting:.0e}; incr-c mode {_modes(row.modes_c)}, certified "
            f"max-abs {max(row.certified):.1e}; moved > accuracy {moved:,}"
            f" of {row.pages:,} pages; incr pushes {int(statistics.median(row.pushes)):,}; "
            f"one sweep {_ms(row.sweep)} ms, ceiling {_ratio(ceiling_of, row.sweep)}x"
            f"{_contention(row)}")


def _contention(row: Row) -> str:
    """Says when a timed batch lost the second core (its kernels then ran on one)."""
    if not any(row.contended) and not any(row.contended_c):
        return ""
    return (f"; SECOND CORE TAKEN during {sum(row.contended)} of {len(row.contended)} incr "
            f"and {sum(row.contended_c)} of {len(row.contended_c)} incr-c batches "
            "(one kernel thread for a while after each)")


def crossover(rows: Sequence[Row], graph: str, algorithm: str) -> str:
    """Smallest batch at which the incremental refresh is not faster than a cold solve
    (whatever order the sizes were measured in)."""
    mine = sorted((r for r in rows if r.graph == graph and r.algorithm == algorithm),
                  key=lambda r: r.batch)
    for row in mine:
        if statistics.median(row.inc) >= row.cold:
            return f"{row.batch}"
    return f"none up to {mine[-1].batch}" if mine else "n/a"
