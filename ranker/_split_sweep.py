"""Gauss-Seidel sweeps on two threads: each owns half the pages, in phases.

A sweep's pushes write ``r`` at random targets, so two threads sweeping at once
would lose each other's updates. Here thread 0 owns the pages ``[0, n/2)`` and
thread 1 the rest. A thread pushes only its own pages. A push into its own half goes
straight into ``r``; a push into the other half goes into ``cross`` instead, so each
entry of ``cross`` has one writer, the thread that does not own that page. ``r +
cross`` is the exact residual throughout, and the sweep's closing statistics pass
folds ``cross`` into ``r``, so every other kernel sees the plain residual.

Gauss-Seidel's pull in one sweep comes from pushes into pages the sweep has not
reached yet. Two plain halves would lose that for everything thread 0 sends to
thread 1's half (one more sweep of four for WPR after a 1k batch). So each half is
walked in ``SPLIT_PHASES`` slices, both threads on their slice ``j`` at once, and
``cross`` is folded into both slices ``j + 1`` between phases: what either thread
pushed into pages not reached yet is there when they are, much as in one thread.
With 8 phases the pushes match one thread's to 1% (16 phases: no closer).

Measured on the 1M-page cyclic graph, 2 cores (docs/benchmark-history.md, session
20): a sweep pushing every page 41 -> 27 ms for PageRank, 45 -> 29 ms for WPR; a
1k-link batch's refresh 334 -> 236 ms for PageRank, 115 -> 97 ms for WPR.

Two threads whatever the machine has (the one this was measured on has two cores):
with more, each half's ``cross`` would have several writers, so every thread would
need a buffer of its own and every fold would read them all.

Both kernels serve uncapped global refreshes only (no work cap: a capped pass stops
part way, which two threads could not agree on) and keep the one-thread kernels'
results exactly in form: the same ``(pushes, work, stats...)`` and the touched
list. The buffers (``cross``; ``cross_dangling`` for WPR; ``scratch`` for thread
1's touched pages) belong to the engine (``ResidualEngine.split_buffers``) and are
all zero between sweeps.
"""

from __future__ import annotations

import numba
import numpy as np

from ranker._kernels import T_COUNT, _touch, njit, stats_along
from ranker._scaled_sweep import scaled_stats

# Slices per half (above). Each phase costs one parallel region and its fold.
SPLIT_PHASES = 8
# Below this many pages one thread sweeps. PageRank sweeps pushing every page, one
# thread against two: 5k pages 0.09 against 0.11 ms (the 2 * SPLIT_PHASES parallel
# regions cost more than they share out), 20k 0.36 against 0.31, 65k 1.2 against
# 1.06, 200k 4.4 against 3.9, 1M 41 against 27 (r no longer in a core's cache).
SPLIT_MIN_PAGES = 1 << 16


def wanted(num_pages: int) -> bool:
    """Whether an uncapped refresh over ``num_pages`` pages sweeps on two threads:
    a graph that large, and this thread's kernels may use two (numba's limit is per
    calling thread; the consumer's ranker thread keeps one, ``ranker_threads``, and
    :class:`ranker._thread_guard.ThreadGuard` sets one while the second core is taken)."""
    return num_pages >= SPLIT_MIN_PAGES and numba.get_num_threads() >= 2


@njit(cache=True, inline="always")
def _slice(k, j, phases, num_nodes):
    """``(own_lo, own_hi, lo, hi)``: thread ``k``'s half and its slice in phase ``j``."""
    half = num_nodes // 2
    own_lo = 0 if k == 0 else half
    own_hi = half if k == 0 else num_nodes
    span = own_hi - own_lo
    return own_lo, own_hi, own_lo + span * j // phases, own_lo + span * (j + 1) // phases


@njit(cache=True, inline="always")
def _fold(lo, hi, r, cross):
    for v in range(lo, hi):
        r[v] += cross[v]
        cross[v] = 0.0


@njit(cache=True, inline="always")
def _append(touched, count, scratch, found):
    """Thread 1's newly touched pages after thread 0's; returns the new count."""
    for i in range(found):
        touched[count + i] = scratch[i]
    return count + found


# Each kernel writes out its page's step as the one-thread kernels do
# (ranker._kernels.sweep, ranker._scaled_sweep.sweep_scaled) instead of sharing a
# helper with them: as an inlined helper taking the arrays, the step made a one-thread
# sweep's scan ten times slower (1M pages with nothing to push: 1.6-2.3 -> 20-26 ms),
# numba counting references to those arrays once per page.
@njit(cache=True, parallel=True)
def split_sweep(damping, eps, omega, num_nodes, y, r, out_start, out_len, out_nbr, touched,
                qstate, is_touched, shift, w, cross, scratch):
    """:func:`ranker._kernels.sweep` for PageRank on two threads (no work cap); the
    same arguments and result, plus the buffers."""
    count = qstate[T_COUNT]
    # Per thread: pushes, work, and where its next touched page goes (thread 0 in
    # ``touched`` after the pages already there, thread 1 in ``scratch``).
    done = np.zeros((2, 3), dtype=np.int64)
    done[0, 2] = count
    for j in range(SPLIT_PHASES):
        for k in numba.prange(2):
            own_lo, own_hi, lo, hi = _slice(k, j, SPLIT_PHASES, num_nodes)
            mine = touched if k == 0 else scratch
            found = done[k, 2]
            pushes = 0
            work = 0
            for m in range(lo, hi):
                if shift != 0.0:
                    r[m] += shift * w[m]
                mass = r[m]
                if abs(mass) <= eps:
                    continue
                step = omega * mass
                y[m] += step
                r[m] = mass - step
                pushes += 1
                found = _touch(m, mine, found, is_touched)
                deg = out_len[m]
                if deg == 0:
                    continue
                base = out_start[m]
                work += deg
                c = damping * step / deg
                for i in range(deg):
                    n = out_nbr[base + i]
                    if own_lo <= n < own_hi:
                        r[n] += c
                    else:
                        cross[n] += c
            done[k, 0] += pushes
            done[k, 1] += work
            done[k, 2] = found
        if j + 1 < SPLIT_PHASES:
            for k in numba.prange(2):
                _, _, lo, hi = _slice(k, j + 1, SPLIT_PHASES, num_nodes)
                _fold(lo, hi, r, cross)
    qstate[T_COUNT] = _append(touched, done[0, 2], scratch, done[1, 2])
    total, peak, along, y_sum, y_max = stats_along(r, num_nodes, w, y, cross)
    return done[0, 0] + done[1, 0], done[0, 1] + done[1, 1], total, peak, along, y_sum, y_max


@njit(cache=True, parallel=True)
def split_sweep_scaled(damping, eps, omega, num_nodes, y, r, r_dangling, out_start, out_len,
                       out_nbr, factor, si, so, touched, qstate, is_touched, cross,
                       cross_dangling, scratch):
    """:func:`ranker._scaled_sweep.sweep_scaled` on two threads (no work cap); the
    same arguments and result, plus the buffers."""
    count = qstate[T_COUNT]
    done = np.zeros((2, 3), dtype=np.int64)  # as in split_sweep
    done[0, 2] = count
    for j in range(SPLIT_PHASES):
        for k in numba.prange(2):
            own_lo, own_hi, lo, hi = _slice(k, j, SPLIT_PHASES, num_nodes)
            mine = touched if k == 0 else scratch
            found = done[k, 2]
            pushes = 0
            work = 0
            for m in range(lo, hi):
                f = factor[m]
                scaled = r_dangling[m] if f < 0.0 else r[m]
                mass = scaled * abs(f)
                if abs(mass) <= eps:
                    continue
                step = omega * mass
                y[m] += step
                left = scaled - omega * scaled
                if f < 0.0:
                    r_dangling[m] = left
                else:
                    r[m] = left
                pushes += 1
                found = _touch(m, mine, found, is_touched)
                deg = out_len[m]
                if deg == 0:
                    continue
                base = out_start[m]
                work += deg
                if so[m] > 0.0:
                    c = damping * step / (si[m] * so[m])
                    for i in range(deg):
                        n = out_nbr[base + i]
                        if own_lo <= n < own_hi:
                            r[n] += c
                        else:
                            cross[n] += c
                else:  # every target lacks out-links (ranker._scaled_sweep)
                    c = damping * step / (si[m] * deg)
                    for i in range(deg):
                        n = out_nbr[base + i]
                        if own_lo <= n < own_hi:
                            r_dangling[n] += c
                        else:
                            cross_dangling[n] += c
            done[k, 0] += pushes
            done[k, 1] += work
            done[k, 2] = found
        if j + 1 < SPLIT_PHASES:
            for k in numba.prange(2):
                _, _, lo, hi = _slice(k, j + 1, SPLIT_PHASES, num_nodes)
                _fold(lo, hi, r, cross)
                _fold(lo, hi, r_dangling, cross_dangling)
    qstate[T_COUNT] = _append(touched, done[0, 2], scratch, done[1, 2])
    total, peak, y_sum, y_max = scaled_stats(num_nodes, r, r_dangling, factor, y, cross,
                                             cross_dangling)
    return done[0, 0] + done[1, 0], done[0, 1] + done[1, 1], total, peak, y_sum, y_max
