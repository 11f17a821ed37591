"""Compiled kernels of the incremental engines' refresh (:mod:`ranker.refresh`).

Everything here is a tight scalar loop over flat arrays (numba, ``cache=True`` so
the compile cost is paid once per machine, not once per process). The graph's own
kernels are in :mod:`ranker._graph_kernels`; the adjacency layout is described there.
A batch's column updates, and WPR's per-page sums, are in :mod:`ranker._column_kernels`.
The kernels release the GIL (``nogil``): a service's I/O threads, such as the
consumer's Redis writers, keep running while an engine sweeps for hundreds of ms.

Engine "kind": 0 = PageRank (``M[n, m] = 1 / O[m]``), 1 = Weighted PageRank
(``M[n, m] = I[n] * O[n] / (SI[m] * SO[m])``, or ``I[n] / (SI[m] * |R(m)|)``
when ``SO[m] == 0``), with ``SI[m] = sum_{p in R(m)} I[p]`` and
``SO[m] = sum_{p in R(m)} O[p]``. One kernel serves both so the push, sweep and
residual code exist once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import numba
import numpy as np

F = TypeVar("F", bound=Callable[..., Any])


def njit(*, cache: bool = True, inline: Literal["never", "always"] = "never",
         parallel: bool = False) -> Callable[[F], F]:
    """``numba.njit`` (GIL released) that keeps the Python signature visible to type
    checkers. ``parallel``: ``numba.prange`` loops run on numba's thread pool."""

    def wrap(func: F) -> F:
        return cast(F, numba.njit(cache=cache, inline=inline, nogil=True,
                                  parallel=parallel)(func))

    return wrap


def set_kernel_threads(count: int) -> int:
    """Run the parallel kernels called from THIS thread on at most ``count`` threads.

    numba's limit is per calling thread, so a service can keep one thread's kernels
    serial (the consumer's ranker thread, see ``Settings.ranker_threads``) while
    another's (loading, ``rankstream rank``) use every core. Returns the limit set,
    clamped to 1..``NUMBA_NUM_THREADS``.
    """
    most = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
    limit = max(1, min(int(count), most))
    numba.set_num_threads(limit)
    return limit


KIND_PAGERANK = 0
KIND_WPR = 1

# Queue state slots (a small int64 array so kernels can update it in place).
Q_HEAD = 0
Q_SIZE = 1
T_COUNT = 2
QSTATE_SLOTS = 3


# --------------------------------------------------------------------------- engines


@njit(cache=True, inline="always")
def _column_scale(kind, m, out_len, si, so):
    """(scale, mode) of column m: weight of m -> n is scale * factor(mode, n)."""
    deg = out_len[m]
    if deg == 0:
        return 0.0, 0
    if kind == KIND_PAGERANK:
        return 1.0 / deg, 0
    if so[m] > 0.0:
        return 1.0 / (si[m] * so[m]), 1
    return 1.0 / (si[m] * deg), 2


@njit(cache=True, inline="always")
def _edge_factor(mode, n, in_len, out_len):
    if mode == 0:
        return 1.0
    if mode == 1:
        return float(in_len[n]) * float(out_len[n])
    return float(in_len[n])


@njit(cache=True, inline="always")
def _signed_edge_factor(mode, n, factor):
    """:func:`_edge_factor` from ``factor[n]`` as
    :func:`ranker._column_kernels.set_factors` keeps it: one random read per link
    instead of two in the push kernels (a dense WPR sweep on 1M pages: 88-90 -> 72-75
    ms). PageRank's mode 0 never reads ``factor``."""
    if mode == 0:
        return 1.0
    if mode == 1:
        return max(factor[n], 0.0)
    return max(-factor[n], 0.0)


# The helpers that record a page (``_enqueue``, ``_touch``) take the ring's size or
# the touched count as a scalar and return the new one; the kernel stores it back in
# ``qstate``. Written as helpers that update ``qstate`` themselves (or return
# nothing), each use cost 20-25 ns on numba 0.68, a third of a 1M-page PageRank push
# sweep: 68-73 ms -> 42-45 ms per sweep, 103-106 -> 67-69 ms per 8M-visit frontier
# push, 23 -> 2 ms to queue 1M pages.
@njit(cache=True, inline="always")
def _enqueue(v, queue, head, size, inq):
    """Queue ``v`` unless queued; returns the new size."""
    if inq[v]:
        return size
    inq[v] = True
    queue[(head + size) & (queue.size - 1)] = v
    return size + 1


@njit(cache=True, inline="always")
def _touch(m, touched, count, is_touched):
    """Record ``m`` in ``touched`` unless recorded; returns the new count."""
    if is_touched[m]:
        return count
    is_touched[m] = True
    touched[count] = m
    return count + 1


@njit(cache=True)
def touch_pages(pages, touched, qstate, is_touched):
    count = qstate[T_COUNT]
    for k in range(pages.size):
        count = _touch(pages[k], touched, count, is_touched)
    qstate[T_COUNT] = count


@njit(cache=True)
def push_queue(kind, damping, eps, max_work, stop_l1, l1, y, r, out_start, out_len, out_nbr,
               factor, si, so, queue, qstate, inq, touched, is_touched):
    """FIFO frontier push of queued pages with ``|r[m]| > eps``.

    A push at m moves ``r[m]`` into ``y[m]`` and ``d * M[n, m] * r[m]`` into each
    ``r[n]``: the invariant ``r = b + d*M*y - y`` holds after every push. Stops when
    the queue is empty, when ``max_work`` link visits are spent, or when the running
    ``||r||_1`` (``l1``, kept up to date per entry) drops to ``stop_l1``; the queue
    keeps what is left. Pages whose ``y`` changed are recorded once in ``touched``.
    Returns ``(pushes, work, l1, y_mass)``, ``y_mass`` the sum of ``|y[m]|`` after each
    push (what :func:`ranker.bounds.rounding_drift` needs).
    """
    mask = queue.size - 1
    pushes = 0
    work = 0
    y_mass = 0.0
    count = qstate[T_COUNT]
    while qstate[Q_SIZE] > 0 and work <= max_work and l1 > stop_l1:
        m = queue[qstate[Q_HEAD]]
        qstate[Q_HEAD] = (qstate[Q_HEAD] + 1) & mask
        qstate[Q_SIZE] -= 1
        inq[m] = False
        mass = r[m]
        if abs(mass) <= eps:
            continue
        y[m] += mass
        y_mass += abs(y[m])
        r[m] = 0.0
        l1 -= abs(mass)
        count = _touch(m, touched, count, is_touched)
        pushes += 1
        scale, mode = _column_scale(kind, m, out_len, si, so)
        if scale == 0.0:
            continue
        c = damping * mass * scale
        base = out_start[m]
        deg = out_len[m]
        work += deg
        for i in range(deg):
            n = out_nbr[base + i]
            old = r[n]
            rn = old + c * _signed_edge_factor(mode, n, factor)
            r[n] = rn
            l1 += abs(rn) - abs(old)
            if abs(rn) > eps:
                qstate[Q_SIZE] = _enqueue(n, queue, qstate[Q_HEAD], qstate[Q_SIZE], inq)
    qstate[T_COUNT] = count
    return pushes, work, l1, y_mass


@njit(cache=True)
def enqueue_above(num_nodes, eps, r, queue, qstate, inq):
    """Queue every page with ``|r| > eps``; returns how many are queued now."""
    head, size = qstate[Q_HEAD], qstate[Q_SIZE]
    for v in range(num_nodes):
        if abs(r[v]) > eps:
            size = _enqueue(v, queue, head, size, inq)
    qstate[Q_SIZE] = size
    return size


@njit(cache=True)
def clear_queue(queue, qstate, inq):
    mask = queue.size - 1
    while qstate[Q_SIZE] > 0:
        inq[queue[qstate[Q_HEAD]]] = False
        qstate[Q_HEAD] = (qstate[Q_HEAD] + 1) & mask
        qstate[Q_SIZE] -= 1


@njit(cache=True)
def sweep(kind, damping, eps, omega, num_nodes, y, r, out_start, out_len, out_nbr, factor,
          si, so, touched, qstate, is_touched, max_work, shift, w):
    """One (over-relaxed) Gauss-Seidel sweep: every page with ``|r[m]| > eps``, in id
    order (sequential memory access), moves ``omega * r[m]`` into ``y[m]`` (and
    ``d * M[n, m] * omega * r[m]`` into each ``r[n]``), leaving ``(1 - omega) * r[m]``:
    the invariant ``r = b + d*M*y - y`` holds for any ``omega`` (1: plain sweeps).

    ``shift`` != 0 also adds ``shift * w`` to ``r``, each page's share as the sweep
    reaches it (no pass of its own): with ``w = d*M*v - v`` that is the residual of
    ``y + shift * v``, and the caller moves ``shift * v`` into ``y`` once its
    refresh is over (a deflation, :mod:`ranker.dominant_mode`). The sweep stops
    pushing once it has visited ``max_work`` links (the rest only get their share).
    Returns ``(pushes, work, sum |r|, max |r|, sum r*w, sum y, max y)``, the last five
    computed exactly in a second pass (``sum r*w`` is 0 when ``w`` is empty).
    """
    pushes = 0
    work = 0
    count = qstate[T_COUNT]
    for m in range(num_nodes):
        if shift != 0.0:
            r[m] += shift * w[m]
        if work >= max_work:
            if shift == 0.0:
                break
            continue
        mass = r[m]
        if abs(mass) <= eps:
            continue
        step = omega * mass
        y[m] += step
        r[m] = mass - step
        pushes += 1
        count = _touch(m, touched, count, is_touched)
        scale, mode = _column_scale(kind, m, out_len, si, so)
        if scale == 0.0:
            continue
        c = damping * step * scale
        base = out_start[m]
        deg = out_len[m]
        work += deg
        for i in range(deg):
            n = out_nbr[base + i]
            r[n] += c * _signed_edge_factor(mode, n, factor)
    qstate[T_COUNT] = count
    total, peak, along, y_sum, y_max = stats_along(r, num_nodes, w, y)
    return pushes, work, total, peak, along, y_sum, y_max


# A residual computed from scratch sums each page's in-link terms in blocks of
# SUM_BLOCK, plainly within a block and compensated (Neumaier) across blocks: a plain
# sum's error grows with the number of terms, and a hub has hundreds of thousands;
# compensating every term cost 40% more time on the 1M-page graph, blocks of 16 cost
# almost nothing (most pages have fewer in-links). Its rounding, per page, with unit
# roundoff U = EPS/2: each term d*y[m]*scale within 3U of exact, a block's plain sum
# within 15U of its terms' magnitude, the compensated sum of the blocks within 2U of
# theirs plus 2k*U^2 (Higham, "Accuracy and Stability of Numerical Algorithms", 4.3),
# WPR's factor and the final b - y + acc a few U more: RESIDUAL_ROUNDING (32U)
# covers them with room to spare.
SUM_BLOCK = 16
UNIT_ROUNDOFF = float(np.finfo(np.float64).eps) / 2.0
RESIDUAL_ROUNDING = 32.0 * UNIT_ROUNDOFF


@njit(cache=True, inline="always")
def compensated_add(acc, carry, x):
    """One step of Neumaier's summation: ``(acc + x, carry)`` with what the addition
    rounded away added to ``carry`` (the sum is ``acc + carry``)."""
    t = acc + x
    if abs(acc) >= abs(x):
        carry += (acc - t) + x
    else:
        carry += (x - t) + acc
    return t, carry


@njit(cache=True, inline="always")
def residual_rounding(base, y, magnitude, terms):
    """How far a residual ``base - y + (sum of terms)`` computed with
    :func:`compensated_add` may be from the exact one (``magnitude``: the terms'
    absolute sum)."""
    return (RESIDUAL_ROUNDING * (base + abs(y) + magnitude)
            + 2.0 * terms * UNIT_ROUNDOFF * UNIT_ROUNDOFF * magnitude)


@njit(cache=True, inline="always")
def _blocked_sum(values, index, start, count):
    """``(sum, sum of |.|)`` of ``values[index[start:start + count]]``: plain within
    blocks of :data:`SUM_BLOCK`, compensated across them. The first block is summed
    alone, as most pages have no more in-links (1M pages: 16 ms against 14 for a
    plain sum; 22 with every block alike, or with this not inlined)."""
    stop = start + count
    first = min(stop, start + SUM_BLOCK)
    total = 0.0
    magnitude = 0.0
    for i in range(start, first):
        x = values[index[i]]
        total += x
        magnitude += abs(x)
    if count > SUM_BLOCK:
        carry = 0.0
        for block in range(first, stop, SUM_BLOCK):
            part = 0.0
            for i in range(block, min(block + SUM_BLOCK, stop)):
                x = values[index[i]]
                part += x
                magnitude += abs(x)
            total, carry = compensated_add(total, carry, part)
        total += carry
    return total, magnitude


@njit(cache=True, parallel=True)
def full_residual_pull(kind, damping, num_nodes, live, y, r, in_start, in_len, in_nbr,
                       out_len, si, so):
    """``r = b + d*M*y - y`` from scratch (``b = 1 - d`` on live pages); returns
    ``(sum |r|, max |r|, rounding)``, ``rounding`` bounding ``sum |r - r_exact|``.

    Every page sums its own in-links, so threads never write the same entry: the
    drift guard and WPR's full-pass absorb (a full residual every batch of a
    growing graph) use the machine's second core when it is free.

    The sums are compensated: a hub's thousands of in-link terms, added one by one
    into a large total, rounded the same way every time, and the residual of a
    converged vector came out exactly 0 where the exact one was 1e-9 (a star of 5,000
    pages into a hub in a 2-cycle, d = 0.93: called fresh at the smallest tolerance
    with a true error 1.3x over it; session 27's review). A plain sum's error grows
    with the in-degree, which no tolerance floor can follow; a compensated one's
    does not, and ``rounding`` certifies what is left.

    One random read per in-link: given its column's mode, a weight is the column's
    scale times a factor of the target alone (``_edge_factor``), so the factor is
    applied once per page. WPR's mode-2 columns (``so == 0``) point only to pages
    without out-links, and those pages get factor ``I * 0 = 0`` from mode-1 columns:
    a page with out-links sums the mode 0/1 values, a page without sums the mode-2
    values. (1M pages, one thread: 95 -> 79 ms for WPR, 80 -> 40 ms for PageRank,
    against reading each column's mode beside its value.)
    """
    column = np.empty(num_nodes, dtype=np.float64)  # modes 0 and 1
    column2 = np.empty(num_nodes, dtype=np.float64)  # mode 2
    for m in numba.prange(num_nodes):
        scale, mode = _column_scale(kind, m, out_len, si, so)
        value = damping * y[m] * scale
        column[m] = 0.0 if mode == 2 else value
        column2[m] = value if mode == 2 else 0.0
    base_value = 1.0 - damping
    rounding = 0.0
    for n in numba.prange(num_nodes):
        if kind == KIND_PAGERANK or out_len[n] > 0:
            pulled, magnitude = _blocked_sum(column, in_nbr, in_start[n], in_len[n])
        else:
            pulled, magnitude = _blocked_sum(column2, in_nbr, in_start[n], in_len[n])
        if kind != KIND_PAGERANK:
            factor = _edge_factor(1 if out_len[n] > 0 else 2, n, in_len, out_len)
            pulled *= factor
            magnitude *= abs(factor)
        base = base_value if live[n] else 0.0
        r[n] = base - y[n] + pulled
        rounding += residual_rounding(base, y[n], magnitude, in_len[n])
    total, peak = abs_stats(r, num_nodes)
    return total, peak, rounding


@njit(cache=True, parallel=True)
def stats_along(values, count, w, y, cross=None):
    """``(sum |v|, max |v|, sum v*w, sum y, max y)`` of the first ``count`` entries
    (``sum v*w`` is 0 when ``w`` is empty, the last two when ``y`` is). ``cross``, if
    given, is first added into ``values`` and zeroed (:mod:`ranker._split_sweep`).

    One pass split across the kernel threads (each sum is a chain of dependent adds,
    so up to four of them cost about what one does): 1M pages, 0.6-0.8 ms on 2 cores
    against 1.7-2.2 ms on one. A PageRank refresh runs one per sweep, a dozen or more.
    """
    total = 0.0
    peak = 0.0
    along = 0.0
    y_sum = 0.0
    y_max = 0.0
    weighted = w.size > 0
    scores = y.size > 0
    for v in numba.prange(count):
        if cross is not None:
            values[v] += cross[v]
            cross[v] = 0.0
        a = abs(values[v])
        total += a
        peak = max(peak, a)
        if weighted:
            along += values[v] * w[v]
        if scores:
            y_sum += y[v]
            y_max = max(y_max, y[v])
    return total, peak, along, y_sum, y_max


@njit(cache=True)
def abs_stats(values, count):
    """``(sum |v|, max |v|)`` of the first ``count`` entries."""
    total, peak, _, _, _ = stats_along(values, count, values[:0], values[:0])
    return total, peak


@njit(cache=True)
def sum_max(values, count):
    """``(sum, max)`` of the first ``count`` entries (0, 0 when empty)."""
    total = 0.0
    peak = 0.0
    for v in range(count):
        total += values[v]
        if values[v] > peak:
            peak = values[v]
    return total, peak


@njit(cache=True, parallel=True)
def collect_moved(parts, touched, qstate, is_touched, live, y, published, threshold):
    """Pages touched since the last call whose ``y`` moved more than ``threshold``.

    Updates ``published`` for them, clears the touched set; dead pages are skipped
    (their removal is published separately). The touched list is split into
    ``parts`` (the kernel threads; a global refresh touches most pages: 466k of 1M,
    3.9 -> 2.4 ms on two threads), each compacting its moved pages in place.
    """
    count = qstate[T_COUNT]
    moved = np.empty(count, dtype=np.int32)
    found = np.zeros(parts, dtype=np.int64)
    for part in numba.prange(parts):
        lo = count * part // parts
        hi = count * (part + 1) // parts
        k = lo
        for i in range(lo, hi):
            m = touched[i]
            is_touched[m] = False
            if live[m] and abs(y[m] - published[m]) > threshold:
                published[m] = y[m]
                moved[k] = m
                k += 1
        found[part] = k - lo
    total = 0
    for part in range(parts):
        lo = count * part // parts
        for k in range(found[part]):  # forward: total <= lo
            moved[total + k] = moved[lo + k]
        total += found[part]
    qstate[T_COUNT] = 0
    return moved[:total]
