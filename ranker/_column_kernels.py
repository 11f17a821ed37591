"""Compiled kernels of a batch's column updates (:meth:`ranker.residual.ResidualEngine.absorb`).

When links change, the residual changes only in the columns of ``M`` whose weights
change: :func:`add_columns` adds or subtracts whole columns (a changed source's
out-row), :func:`wpr_reweigh_columns` re-weighs WPR columns whose out-row stayed but
whose sums moved. WPR's per-page sums ``SI``/``SO`` and its signed per-target factors
are kept here too. ``M``, the engine kinds and the queue are described in
:mod:`ranker._kernels`, which holds the refresh's kernels.
"""

from __future__ import annotations

import numba
import numpy as np

from ranker._kernels import (
    KIND_WPR,
    Q_HEAD,
    Q_SIZE,
    _column_scale,
    _enqueue,
    _signed_edge_factor,
    njit,
)
from ranker.bounds import EPS


@njit(cache=True)
def set_factors(pages, in_len, out_len, factor):
    """WPR's per-target factor, signed: ``I * O`` for a page with out-links, ``-I``
    for one without. A mode-1 column (``so > 0``) weighs a target by ``I * O``, 0 when
    it has no out-links; a mode-2 column (``so == 0``) links only to pages without
    out-links and weighs them by ``I``. So ``max(f, 0)`` and ``max(-f, 0)`` give both.

    A page without in-links is no column's target, so its factor is only its scale
    in :mod:`ranker._scaled_sweep`: ``I`` counts as 1 there, which keeps every
    factor non-zero and its sign the page's kind (no branch per page in a sweep)."""
    for k in range(pages.size):
        m = pages[k]
        factor[m] = signed_factor(m, in_len, out_len)


# The rounding of one column update ``r[n] = old + step``, as :func:`add_columns` and
# :func:`wpr_reweigh_columns` count it: up to EPS/2 of ``|r[n]|`` for the addition,
# and of ``|step|`` for each of the roundings ``step`` was computed with (``d * y[m]``,
# the column's scale, the target's factor, their products, the difference of a
# re-weigh's new and old terms: at most 6, each EPS/2, so 3 EPS). The kept residual's
# other additions shrink with it as a refresh converges; these do not: removing and
# re-adding the thousands of columns into one hub rounds the same way each time, and
# a review measured the kept residual 3.4x further from the exact one than the
# rounding the bound then counted (a hub with 1,999 in-links, removed and revived).
ROUNDED_PRODUCTS = 3.0


@njit(cache=True, inline="always")
def signed_factor(m, in_len, out_len):
    """Page ``m``'s factor as :func:`set_factors` keeps it."""
    deg = float(out_len[m])
    weight = float(max(in_len[m], 1))
    return weight * deg if deg > 0.0 else -weight


@njit(cache=True)
def add_columns(kind, cols, sign, damping, y, r, out_start, out_len, out_nbr, factor, si, so,
                queue, qstate, inq):
    """``r += sign * d * M[:, cols] @ y[cols]``; enqueue every entry it touches.

    ``queue`` is a ring buffer whose size is a power of two larger than the page
    count. Returns ``(work, change of sum |r|, rounding)``, work = link entries
    visited, rounding a bound on ``sum |r - r_exact|`` the updates added
    (:data:`ROUNDED_PRODUCTS`).
    """
    work = 0
    dl1 = 0.0
    rounding = 0.0
    head, size = qstate[Q_HEAD], qstate[Q_SIZE]
    for k in range(cols.size):
        m = cols[k]
        if y[m] == 0.0:
            continue
        scale, mode = _column_scale(kind, m, out_len, si, so)
        if scale == 0.0:
            continue
        c = sign * damping * y[m] * scale
        base = out_start[m]
        deg = out_len[m]
        for i in range(deg):
            n = out_nbr[base + i]
            old = r[n]
            step = c * _signed_edge_factor(mode, n, factor)
            r[n] = old + step
            dl1 += abs(r[n]) - abs(old)
            rounding += abs(r[n]) + ROUNDED_PRODUCTS * abs(step)
            size = _enqueue(n, queue, head, size, inq)
        work += deg
    qstate[Q_SIZE] = size
    return work, dl1, EPS * rounding


@njit(cache=True)
def wpr_reweigh_columns(cols, is_source, changed, prev_in, prev_out, has_prev, damping, y, r,
                        out_start, out_len, out_nbr, in_start, in_len, in_nbr, factor, si, so,
                        queue, qstate, inq):
    """WPR columns whose out-row did not change but whose weights did, in ONE pass.

    Call after the graph changed. ``cols`` are WPR's changed columns; those with
    ``is_source`` set (new out-rows) are handled by :func:`add_columns`, not here.
    For the others ``R(m)`` is unchanged, so ``SI[m]``/``SO[m]`` move only by the
    degree changes of the ``changed`` pages (``prev_in``/``prev_out`` hold their
    degrees before the change, ``has_prev`` marks them), applied through those
    pages' in-rows instead of re-summing every out-row; then ``r[n]`` gets
    ``d * y[m] * (M_new[n, m] - M_old[n, m])`` directly, instead of a retract pass
    and an absorb pass. Returns ``(work, change of sum |r|, rounding)`` as
    :func:`add_columns` does.
    """
    old_scale = np.zeros(cols.size)
    old_mode = np.zeros(cols.size, dtype=np.int64)
    head, size = qstate[Q_HEAD], qstate[Q_SIZE]
    for k in range(cols.size):
        m = cols[k]
        if not is_source[m]:
            old_scale[k], old_mode[k] = _column_scale(KIND_WPR, m, out_len, si, so)
    shift_sums(changed, is_source, prev_in, prev_out, in_start, in_len, in_nbr, out_len, si, so,
               si[:0])
    work = 0
    dl1 = 0.0
    rounding = 0.0
    for k in range(cols.size):
        m = cols[k]
        if is_source[m] or y[m] == 0.0:
            continue
        scale, mode = _column_scale(KIND_WPR, m, out_len, si, so)
        c_new = damping * y[m] * scale
        c_old = damping * y[m] * old_scale[k]
        mode_old = old_mode[k]
        base = out_start[m]
        deg = out_len[m]
        for i in range(deg):
            n = out_nbr[base + i]
            new = c_new * _signed_edge_factor(mode, n, factor)
            if has_prev[n]:
                if mode_old == 1:
                    old = c_old * float(prev_in[n]) * float(prev_out[n])
                elif mode_old == 2:
                    old = c_old * float(prev_in[n])
                else:
                    old = c_old
            else:  # n's degrees, hence its factor, did not change
                old = c_old * _signed_edge_factor(mode_old, n, factor)
            if new != old:
                before = r[n]
                r[n] = before + (new - old)
                dl1 += abs(r[n]) - abs(before)
                rounding += abs(r[n]) + ROUNDED_PRODUCTS * (abs(new) + abs(old))
                size = _enqueue(n, queue, head, size, inq)
        work += deg
    qstate[Q_SIZE] = size
    return work, dl1, EPS * rounding


@njit(cache=True)
def shift_sums(changed, is_source, prev_in, prev_out, in_start, in_len, in_nbr, out_len, si,
               so, pending):
    """Bring ``SI``/``SO`` of the pages whose out-row did NOT change up to date.

    Call after the graph changed. Such a page ``m`` keeps ``R(m)``, so its sums move
    only by the degree changes of the ``changed`` pages it links to: each changed
    page ``p`` adds its change to every ``m`` in ``B(p)`` (``prev_in``/``prev_out``
    hold the degrees before the change). That visits the in-rows of the changed
    pages, not the out-rows of every page that links to one of them (on 1M pages, a
    batch of 40k new links: 1.1M in-links against 6.3M out-links). Pages with
    ``is_source`` set have new out-rows and are re-summed by :func:`update_sums`.

    A non-empty ``pending`` (all 0 on entry) gets each shifted column's scale before
    the shift, for :mod:`ranker._deferred_reweigh`; returns whether some column may
    have changed mode (its ``SO`` crossed 0), which that cannot handle.
    """
    return _shift_sums_of(0, si.size, changed, is_source, prev_in, prev_out, in_start,
                          in_len, in_nbr, out_len, si, so, pending)


@njit(cache=True, parallel=True)
def shift_sums_split(parts, changed, is_source, prev_in, prev_out, in_start, in_len, in_nbr,
                     out_len, si, so, pending):
    """:func:`shift_sums` split into ``parts`` (the kernel threads) by column id: each
    reads every in-row and shifts only its own columns, so no two threads write the
    same entry (1M pages, a 1k-link batch's 176k in-links: 6 -> 3.6-4.0 ms on two)."""
    crossed = np.zeros(parts, dtype=np.bool_)
    for part in numba.prange(parts):
        lo = si.size * part // parts
        hi = si.size * (part + 1) // parts
        crossed[part] = _shift_sums_of(lo, hi, changed, is_source, prev_in, prev_out,
                                       in_start, in_len, in_nbr, out_len, si, so, pending)
    return crossed.any()


@njit(cache=True)
def _shift_sums_of(lo, hi, changed, is_source, prev_in, prev_out, in_start, in_len, in_nbr,
                   out_len, si, so, pending):
    """:func:`shift_sums` of the columns ``lo <= m < hi``."""
    record = pending.size > 0
    crossed = False
    for k in range(changed.size):
        p = changed[k]
        d_in = float(in_len[p] - prev_in[p])
        d_out = float(out_len[p] - prev_out[p])
        if d_in == 0.0 and d_out == 0.0:
            continue
        base = in_start[p]
        for i in range(in_len[p]):
            m = in_nbr[base + i]
            if m < lo or m >= hi or is_source[m]:
                continue
            before = so[m]
            if record and pending[m] == 0.0:  # scales are > 0: first visit
                pending[m], _ = _column_scale(KIND_WPR, m, out_len, si, so)
            si[m] += d_in
            so[m] = before + d_out
            crossed |= (before > 0.0) != (so[m] > 0.0)
    return crossed


@njit(cache=True)
def enqueue_pages(pages, queue, qstate, inq):
    head, size = qstate[Q_HEAD], qstate[Q_SIZE]
    for k in range(pages.size):
        size = _enqueue(pages[k], queue, head, size, inq)
    qstate[Q_SIZE] = size


@njit(cache=True, inline="always")
def _page_sums(m, out_start, out_len, out_nbr, in_len):
    """``(SI[m], SO[m])`` from the current graph."""
    base = out_start[m]
    s_in = 0.0
    s_out = 0.0
    for i in range(out_len[m]):
        n = out_nbr[base + i]
        s_in += in_len[n]
        s_out += out_len[n]
    return s_in, s_out


@njit(cache=True)
def update_sums(cols, out_start, out_len, out_nbr, in_len, si, so):
    """Recompute ``SI[m]`` and ``SO[m]`` for ``cols`` from the current graph."""
    for k in range(cols.size):
        m = cols[k]
        si[m], so[m] = _page_sums(m, out_start, out_len, out_nbr, in_len)


@njit(cache=True, parallel=True)
def all_sums(num_nodes, out_start, out_len, out_nbr, in_len, si, so):
    """``SI`` and ``SO`` of every page (each page's own gather: split across threads)."""
    for m in numba.prange(num_nodes):
        si[m], so[m] = _page_sums(m, out_start, out_len, out_nbr, in_len)
