"""WPR's re-weigh of a large batch, paid over the scaled residual instead of a full pull.

A link change moves the degrees of its ends, so every column ``m`` linking to one
of them (``B(u) + B(v)``) is re-weighed: its out-row stays, its scale
``1 / (SI[m] * SO[m])`` changes. On the 1M-page cyclic graph a 1k-link batch
re-weighs 176k columns holding 1.7M links. Column by column in the plain residual
(:func:`ranker._column_kernels.wpr_reweigh_columns`: two random reads per link and
a queue) that cost ~55 ns per link, so such batches recomputed the whole residual
instead: one pull along all 8M links, 23 ms on two threads, 45 on one.

Over the scaled residual ``s = r / F`` (:mod:`ranker._scaled_sweep`) a column whose
scale changes by ``delta`` while its targets keep their factors adds
``d * y[m] * delta`` to each target's ``s``: one add per link, as in a sweep's push.
So the absorb only notes each such column's old scale (``pending``, kept by
:func:`ranker._column_kernels.shift_sums` as it moves the sums), and leaves the
batch's ends their old factors and its sources their retracted columns. A refresh
that starts with uncapped sweeps then
(:meth:`ranker.residual.ResidualEngine.prepare_owed`) rescales each end's residual
by ``F_new / F_old`` (:func:`rescale_ends`: every column reaching it still counts at
its old scale, so its factor is all that changed), adds the sources' new columns,
sums the few ends whose kind changed (their first out-link, or their last gone)
again from their in-links (:func:`pull_pages`), and pays the owed scales in one pass
over the scaled residual (:func:`settle_scaled`, 1.7M links in 13-14 ms on two
threads). Sweeps then push exactly what they pushed after the full pull.

Until then the stored ``r`` lacks the owed part, so nothing else may read it: a
refresh that does not start with uncapped sweeps (the consumer's capped ones), a
second batch absorbed first, or a drift check recomputes ``r`` in full instead
(:meth:`ranker.residual.ResidualEngine.recompute`), which also clears ``pending``.
A column whose mode flips (its targets all lose, or one of them gains, out-links)
would push to the other residual array: such a batch is recomputed in full too.
"""

from __future__ import annotations

import numba
import numpy as np

from ranker._column_kernels import signed_factor
from ranker._kernels import (
    KIND_WPR,
    _column_scale,
    _edge_factor,
    compensated_add,
    njit,
    residual_rounding,
)


@njit(cache=True)
def rescale_ends(pages, in_len, out_len, factor, base, y, r):
    """New factors for ``pages``, their residual rescaled to them; returns the pages
    whose kind changed (sign of the factor), left for :func:`pull_pages`.

    ``r[n] = b - y[n] + |F| * A``, where ``A`` sums the columns reaching ``n``, so the
    new factor makes it ``b - y[n] + (F_new / F_old) * (r[n] - b + y[n])``.
    """
    flipped = np.empty(pages.size, dtype=pages.dtype)
    k = 0
    for j in range(pages.size):
        n = pages[j]
        old = factor[n]
        new = signed_factor(n, in_len, out_len)
        if (old < 0.0) == (new < 0.0):
            inflow = r[n] - base[n] + y[n]
            r[n] = base[n] - y[n] + (new / old) * inflow
        else:
            flipped[k] = n
            k += 1
        factor[n] = new
    return flipped[:k]


@njit(cache=True, inline="always")
def _owed_scale(m, out_len, si, so, pending):
    """The scale column ``m`` counts at in the stored ``r``: its old one if owed."""
    if pending[m] != 0.0:
        return pending[m], 1 if so[m] > 0.0 else 2
    return _column_scale(KIND_WPR, m, out_len, si, so)


@njit(cache=True)
def pull_pages(pages, damping, y, r, base, in_start, in_len, in_nbr, out_len, si, so, pending):
    """``r`` of ``pages`` from their in-links, each owed column at its old scale;
    returns the bound on the new entries' rounding (``sum |r - r_exact|`` over them).

    :func:`ranker._kernels.full_residual_pull` restricted to ``pages``: a page with
    out-links sums its mode-1 columns, one without its mode-2 columns (the other
    mode gives it factor 0), times its own factor; compensated, as there.
    """
    rounding = 0.0
    for k in range(pages.size):
        n = pages[k]
        kind = 1 if out_len[n] > 0 else 2
        acc = 0.0
        carry = 0.0
        magnitude = 0.0
        start = in_start[n]
        for i in range(in_len[n]):
            m = in_nbr[start + i]
            scale, mode = _owed_scale(m, out_len, si, so, pending)
            if mode == kind:
                x = y[m] * scale
                acc, carry = compensated_add(acc, carry, x)
                magnitude += abs(x)
        factor = damping * _edge_factor(kind, n, in_len, out_len)
        r[n] = base[n] - y[n] + (acc + carry) * factor
        rounding += residual_rounding(base[n], y[n], magnitude * abs(factor), in_len[n])
    return rounding


@njit(cache=True, parallel=True)
def settle_scaled(parts, num_nodes, damping, y, r, r_dangling, out_start, out_len, out_nbr, si,
                  so, pending):
    """Pay every owed re-weigh into the scaled residual and clear ``pending``;
    returns the link visits.

    Split by target into ``parts`` (the kernel threads: ``numba.get_num_threads()``
    read inside would keep numba from caching the kernel): each part reads every
    owed column and adds only to the targets in its own range of ids, so no two
    threads write the same entry (1M pages, 1.7M links: 13-14 ms on two threads
    against 18-19 on one, each reading every link).
    """
    for part in numba.prange(parts):
        lo = num_nodes * part // parts
        hi = num_nodes * (part + 1) // parts
        for m in range(num_nodes):
            old = pending[m]
            if old == 0.0:
                continue
            scale, mode = _column_scale(KIND_WPR, m, out_len, si, so)
            c = damping * y[m] * (scale - old)
            base = out_start[m]
            if mode == 1:
                for i in range(out_len[m]):
                    n = out_nbr[base + i]
                    if lo <= n < hi:
                        r[n] += c
            else:
                for i in range(out_len[m]):
                    n = out_nbr[base + i]
                    if lo <= n < hi:
                        r_dangling[n] += c
    work = 0
    for m in numba.prange(num_nodes):
        if pending[m] != 0.0:
            work += out_len[m]
            pending[m] = 0.0
    return work
