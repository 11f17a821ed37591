"""WPR's global sweeps over a residual scaled by each page's factor.

A WPR push from column ``m`` adds ``c * factor(n)`` to ``r[n]`` for each out-link
``m -> n`` (:mod:`ranker._kernels`): two random reads per link, ``r[n]`` and the
factor of ``n``, where PageRank's push has one. Dividing each page's residual by its
own factor removes the second: over ``s[n] = r[n] / F[n]`` the push adds the same
``c`` to every target, and only the page being pushed needs its ``F`` (in order, as
the sweep walks the ids). On the 1M-page cyclic graph a sweep pushing every page
took 49 instead of 70 ms, one pushing 6% of them 18 instead of 23 ms, and a
1k-link batch's global refresh 108-113 instead of 117-127 ms (same pushes, same
``y`` to rounding; docs/benchmark-history.md, session 18).

A mode-1 column (``so > 0``) gives a target without out-links nothing, so the
scaled residual needs two arrays. Pages with out-links keep theirs in ``r``; pages
without keep theirs in ``r_dangling``, where only mode-2 columns (whose targets all
lack out-links) push. Mode-1 pushes still land in ``r`` at those pages, where
nothing reads them, and :func:`from_scaled` overwrites them. ``factor`` (signed and
never 0, see :func:`ranker._column_kernels.set_factors`) gives both: ``F > 0``
scales ``r``, ``F < 0`` scales ``r_dangling`` by ``-F``.

The refresh converts once before its first sweep and back once after its last
(1-2.5 ms each on 1M pages), so every other kernel keeps reading the plain ``r``.
"""

from __future__ import annotations

import numba

from ranker._kernels import T_COUNT, _touch, njit


# The conversions and statistics are elementwise passes over 1M pages: without a
# branch on the sign of ``factor`` (20% of pages lack out-links, in no order, so it
# mispredicts) and split across the kernel threads they took 0.6, 0.5 and 0.8 ms
# instead of 3.9, 1.0 and 4.2 ms (2 cores; one thread: about 1.6 ms each).
# ``max(f, 0)`` and ``min(f, 0)`` pick the array without a branch, so every entry of
# both arrays must stay finite: ``to_scaled`` zeroes ``r_dangling`` where it is unused.
@njit(cache=True, parallel=True)
def to_scaled(num_nodes, r, r_dangling, factor):
    """``r`` in place and ``r_dangling`` from the plain residual ``r``."""
    for v in numba.prange(num_nodes):
        f = factor[v]
        scaled = r[v] / abs(f)
        dangling = f < 0.0
        r_dangling[v] = scaled if dangling else 0.0
        r[v] = 0.0 if dangling else scaled


@njit(cache=True, parallel=True)
def from_scaled(num_nodes, r, r_dangling, factor):
    """The plain residual back into ``r`` (inverse of :func:`to_scaled`)."""
    for v in numba.prange(num_nodes):
        f = factor[v]
        r[v] = r[v] * max(f, 0.0) - r_dangling[v] * min(f, 0.0)


@njit(cache=True)
def sweep_scaled(damping, eps, omega, num_nodes, y, r, r_dangling, out_start, out_len,
                 out_nbr, factor, si, so, touched, qstate, is_touched, max_work):
    """:func:`ranker._kernels.sweep` for WPR over the scaled residual, without a
    deflation (WPR has no dominant mode to remove). Pages whose plain residual
    exceeds ``eps`` push, in id order, until ``max_work`` links are visited.

    Returns ``(pushes, work, sum |r|, max |r|, sum y, max y)``, the last four
    computed exactly in a second pass (``r`` the plain residual).
    """
    pushes = 0
    work = 0
    count = qstate[T_COUNT]
    for m in range(num_nodes):
        if work >= max_work:
            break
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
        count = _touch(m, touched, count, is_touched)
        deg = out_len[m]
        if deg == 0:
            continue
        base = out_start[m]
        work += deg
        if so[m] > 0.0:
            c = damping * step / (si[m] * so[m])
            for i in range(deg):
                r[out_nbr[base + i]] += c
        else:  # every target lacks out-links: weight I[n] / (SI[m] * deg)
            c = damping * step / (si[m] * deg)
            for i in range(deg):
                r_dangling[out_nbr[base + i]] += c
    qstate[T_COUNT] = count
    total, peak, y_sum, y_max = scaled_stats(num_nodes, r, r_dangling, factor, y)
    return pushes, work, total, peak, y_sum, y_max


@njit(cache=True, parallel=True)
def scaled_stats(num_nodes, r, r_dangling, factor, y, cross=None, cross_dangling=None):
    """``(sum |r|, max |r|, sum y, max y)`` of the plain residual, from the scaled one.
    ``cross`` and ``cross_dangling``, if given, are first added into ``r`` and
    ``r_dangling`` and zeroed (:mod:`ranker._split_sweep`)."""
    total = 0.0
    peak = 0.0
    y_sum = 0.0
    y_max = 0.0
    for v in numba.prange(num_nodes):
        if cross is not None and cross_dangling is not None:
            r[v] += cross[v]
            cross[v] = 0.0
            r_dangling[v] += cross_dangling[v]
            cross_dangling[v] = 0.0
        f = factor[v]
        a = abs(r[v] * max(f, 0.0)) + abs(r_dangling[v] * min(f, 0.0))
        total += a
        peak = max(peak, a)
        y_sum += y[v]
        y_max = max(y_max, y[v])
    return total, peak, y_sum, y_max
