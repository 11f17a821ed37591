"""Compiled kernels behind :mod:`ranker.linkgraph` and the incremental engines.

Everything here is a tight scalar loop over flat arrays (numba, ``cache=True`` so
the compile cost is paid once per machine, not once per process).

Adjacency layout (one such set per direction, "out" and "in"): row ``v`` lives in
``nbr[start[v] : start[v] + length[v]]`` of a shared int32 pool, with room for
``cap[v]`` entries. ``twin`` is parallel to ``nbr``: for the out-entry of link
``u -> v`` it holds the entry's index *within* ``v``'s in-row, and vice versa. The
index is relative to the row start, so moving a row (growth, compaction) never
invalidates a twin, and deleting a link is O(1) after finding it once.

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


def njit(*, cache: bool = True, inline: Literal["never", "always"] = "never"
         ) -> Callable[[F], F]:
    """``numba.njit`` that keeps the Python signature visible to type checkers."""

    def wrap(func: F) -> F:
        return cast(F, numba.njit(cache=cache, inline=inline)(func))

    return wrap

KIND_PAGERANK = 0
KIND_WPR = 1

# Queue state slots (a small int64 array so kernels can update it in place).
Q_HEAD = 0
Q_SIZE = 1
T_COUNT = 2
QSTATE_SLOTS = 3


# --------------------------------------------------------------------------- graph


@njit(cache=True)
def find_link(u, v, out_start, out_len, out_nbr, out_twin, in_start, in_len, in_nbr, in_twin):
    """Index of ``v`` in ``u``'s out-row and of ``u`` in ``v``'s in-row, or (-1, -1).

    Scans the shorter of the two rows: hubs have huge in-rows, crawled pages with
    thousands of links have huge out-rows.
    """
    if out_len[u] <= in_len[v]:
        base = out_start[u]
        for i in range(out_len[u]):
            if out_nbr[base + i] == v:
                return i, out_twin[base + i]
    else:
        base = in_start[v]
        for j in range(in_len[v]):
            if in_nbr[base + j] == u:
                return in_twin[base + j], j
    return -1, -1


@njit(cache=True)
def links_exist(src, dst, out_start, out_len, out_nbr, out_twin, in_start, in_len, in_nbr,
                in_twin):
    """Vectorised membership test for the pairs ``src[k] -> dst[k]``."""
    found = np.zeros(src.size, dtype=np.bool_)
    n = out_len.size
    for k in range(src.size):
        u = src[k]
        v = dst[k]
        if u == v or u < 0 or v < 0 or u >= n or v >= n:
            continue
        i, _ = find_link(u, v, out_start, out_len, out_nbr, out_twin,
                         in_start, in_len, in_nbr, in_twin)
        found[k] = i >= 0
    return found


@njit(cache=True)
def _unlink(u, i, v, j, out_start, out_len, out_nbr, out_twin, in_start, in_len, in_nbr,
            in_twin):
    """Remove link ``u -> v`` found at out-index ``i`` / in-index ``j`` (swap-remove)."""
    ob = out_start[u]
    last = out_len[u] - 1
    if i != last:
        w = out_nbr[ob + last]
        out_nbr[ob + i] = w
        out_twin[ob + i] = out_twin[ob + last]
        # The moved link u -> w now sits at index i: tell w's in-row.
        in_twin[in_start[w] + out_twin[ob + i]] = i
    out_len[u] = last
    ib = in_start[v]
    last = in_len[v] - 1
    if j != last:
        x = in_nbr[ib + last]
        in_nbr[ib + j] = x
        in_twin[ib + j] = in_twin[ib + last]
        out_twin[out_start[x] + in_twin[ib + j]] = j
    in_len[v] = last


@njit(cache=True)
def delete_links(src, dst, out_start, out_len, out_nbr, out_twin, in_start, in_len, in_nbr,
                 in_twin):
    """Delete each present link ``src[k] -> dst[k]``; returns which ones were present."""
    done = np.zeros(src.size, dtype=np.bool_)
    for k in range(src.size):
        u = src[k]
        v = dst[k]
        if u == v:
            continue
        i, j = find_link(u, v, out_start, out_len, out_nbr, out_twin,
                         in_start, in_len, in_nbr, in_twin)
        if i < 0:
            continue
        _unlink(u, i, v, j, out_start, out_len, out_nbr, out_twin,
                in_start, in_len, in_nbr, in_twin)
        done[k] = True
    return done


@njit(cache=True)
def insert_links(src, dst, out_start, out_len, out_nbr, out_twin, in_start, in_len, in_nbr,
                 in_twin):
    """Insert each absent link; rows must already have the capacity (see reserve)."""
    done = np.zeros(src.size, dtype=np.bool_)
    for k in range(src.size):
        u = src[k]
        v = dst[k]
        if u == v:
            continue
        i, _ = find_link(u, v, out_start, out_len, out_nbr, out_twin,
                         in_start, in_len, in_nbr, in_twin)
        if i >= 0:
            continue
        i = out_len[u]
        j = in_len[v]
        out_nbr[out_start[u] + i] = v
        out_twin[out_start[u] + i] = j
        in_nbr[in_start[v] + j] = u
        in_twin[in_start[v] + j] = i
        out_len[u] = i + 1
        in_len[v] = j + 1
        done[k] = True
    return done


@njit(cache=True)
def remove_pages(pages, out_start, out_len, out_nbr, out_twin, in_start, in_len, in_nbr,
                 in_twin, del_src, del_dst):
    """Remove every link touching ``pages``; write them to ``del_src/del_dst``.

    The output arrays must hold the sum of the pages' degrees. Returns the count.
    """
    count = 0
    for k in range(pages.size):
        x = pages[k]
        while out_len[x] > 0:
            i = out_len[x] - 1
            v = out_nbr[out_start[x] + i]
            j = out_twin[out_start[x] + i]
            _unlink(x, i, v, j, out_start, out_len, out_nbr, out_twin,
                    in_start, in_len, in_nbr, in_twin)
            del_src[count] = x
            del_dst[count] = v
            count += 1
        while in_len[x] > 0:
            j = in_len[x] - 1
            u = in_nbr[in_start[x] + j]
            i = in_twin[in_start[x] + j]
            _unlink(u, i, x, j, out_start, out_len, out_nbr, out_twin,
                    in_start, in_len, in_nbr, in_twin)
            del_src[count] = u
            del_dst[count] = x
            count += 1
    return count


@njit(cache=True)
def relocate_rows(rows, new_caps, start, length, cap, nbr, twin, pool_end):
    """Move each row to the pool tail with a larger capacity; returns the new tail."""
    for k in range(rows.size):
        v = rows[k]
        old = start[v]
        for i in range(length[v]):
            nbr[pool_end + i] = nbr[old + i]
            twin[pool_end + i] = twin[old + i]
        start[v] = pool_end
        cap[v] = new_caps[k]
        pool_end += new_caps[k]
    return pool_end


@njit(cache=True)
def pack_rows(start, length, cap, nbr, twin, new_nbr, new_twin, num_nodes):
    """Copy rows back to back (capacity = length) into fresh pools; returns the tail."""
    pos = 0
    for v in range(num_nodes):
        old = start[v]
        for i in range(length[v]):
            new_nbr[pos + i] = nbr[old + i]
            new_twin[pos + i] = twin[old + i]
        start[v] = pos
        cap[v] = length[v]
        pos += length[v]
    return pos


@njit(cache=True)
def gather_rows(nodes, start, length, nbr):
    """Concatenate the rows of ``nodes`` (with repeats) into one int32 array."""
    total = 0
    for k in range(nodes.size):
        total += length[nodes[k]]
    out = np.empty(total, dtype=np.int32)
    pos = 0
    for k in range(nodes.size):
        v = nodes[k]
        base = start[v]
        for i in range(length[v]):
            out[pos] = nbr[base + i]
            pos += 1
    return out


@njit(cache=True)
def union_with_rows(pages, rows_of, start, length, nbr, mark):
    """Distinct ids among ``pages`` and the rows of ``rows_of`` (e.g. their in-links).

    ``mark`` is a scratch bool array, all False on entry and on return; this avoids
    sorting what can be millions of repeated ids (the in-neighbours of hubs).
    """
    total = pages.size
    for k in range(rows_of.size):
        total += length[rows_of[k]]
    out = np.empty(total, dtype=np.int32)
    count = 0
    for k in range(pages.size):
        v = pages[k]
        if not mark[v]:
            mark[v] = True
            out[count] = v
            count += 1
    for k in range(rows_of.size):
        v = rows_of[k]
        base = start[v]
        for i in range(length[v]):
            u = nbr[base + i]
            if not mark[u]:
                mark[u] = True
                out[count] = u
                count += 1
    for k in range(count):
        mark[out[k]] = False
    return out[:count]


@njit(cache=True)
def rows_flat(start, length, nbr, num_nodes, indptr):
    """CSR indices of rows ``0..num_nodes-1`` given their ``indptr``."""
    out = np.empty(indptr[num_nodes], dtype=np.int32)
    for v in range(num_nodes):
        base = start[v]
        pos = indptr[v]
        for i in range(length[v]):
            out[pos + i] = nbr[base + i]
    return out


@njit(cache=True)
def bucket_positions(keys, bucket_start):
    """Stable counting sort: the position of item k once grouped by ``keys[k]``."""
    fill = bucket_start.copy()
    pos = np.empty(keys.size, dtype=np.int64)
    for k in range(keys.size):
        b = keys[k]
        pos[k] = fill[b]
        fill[b] += 1
    return pos


@njit(cache=True)
def copy_links(degree, offsets, prototype, is_random, random_target, targets):
    """Copying model (ranker.synthetic): resolve slots in arrival order; a copied
    slot reads its prototype's slot, which is resolved already."""
    for t in range(degree.size):
        p = prototype[t]
        base = offsets[t]
        for j in range(degree[t]):
            k = base + j
            if is_random[k] or p < 0 or j >= degree[p]:
                targets[k] = random_target[k]
            else:
                targets[k] = targets[offsets[p] + j]


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
def _enqueue(v, queue, qstate, inq):
    if not inq[v]:
        inq[v] = True
        queue[(qstate[Q_HEAD] + qstate[Q_SIZE]) & (queue.size - 1)] = v
        qstate[Q_SIZE] += 1


@njit(cache=True)
def add_columns(kind, cols, sign, damping, y, r, out_start, out_len, out_nbr, in_len, si, so,
                queue, qstate, inq):
    """``r += sign * d * M[:, cols] @ y[cols]``; enqueue every entry it touches.

    ``queue`` is a ring buffer whose size is a power of two larger than the page
    count. Returns ``(work, change of sum |r|)``, work = link entries visited.
    """
    work = 0
    dl1 = 0.0
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
            r[n] = old + c * _edge_factor(mode, n, in_len, out_len)
            dl1 += abs(r[n]) - abs(old)
            _enqueue(n, queue, qstate, inq)
        work += deg
    return work, dl1


@njit(cache=True)
def enqueue_pages(pages, queue, qstate, inq):
    for k in range(pages.size):
        _enqueue(pages[k], queue, qstate, inq)


@njit(cache=True)
def update_sums(cols, out_start, out_len, out_nbr, in_len, si, so):
    """Recompute ``SI[m]`` and ``SO[m]`` for ``cols`` from the current graph."""
    for k in range(cols.size):
        m = cols[k]
        base = out_start[m]
        s_in = 0.0
        s_out = 0.0
        for i in range(out_len[m]):
            n = out_nbr[base + i]
            s_in += in_len[n]
            s_out += out_len[n]
        si[m] = s_in
        so[m] = s_out


@njit(cache=True)
def all_sums(num_nodes, out_start, out_len, out_nbr, in_len, si, so):
    """``SI`` and ``SO`` of every page."""
    update_sums(np.arange(num_nodes, dtype=np.int32), out_start, out_len, out_nbr, in_len, si, so)


@njit(cache=True, inline="always")
def _touch(m, touched, qstate, is_touched):
    if not is_touched[m]:
        is_touched[m] = True
        touched[qstate[T_COUNT]] = m
        qstate[T_COUNT] += 1


@njit(cache=True)
def touch_pages(pages, touched, qstate, is_touched):
    for k in range(pages.size):
        _touch(pages[k], touched, qstate, is_touched)


@njit(cache=True)
def push_queue(kind, damping, eps, max_work, stop_l1, l1, y, r, out_start, out_len, out_nbr,
               in_len, si, so, queue, qstate, inq, touched, is_touched):
    """FIFO frontier push of queued pages with ``|r[m]| > eps``.

    A push at m moves ``r[m]`` into ``y[m]`` and ``d * M[n, m] * r[m]`` into each
    ``r[n]``: the invariant ``r = b + d*M*y - y`` holds after every push. Stops when
    the queue is empty, when ``max_work`` link visits are spent, or when the running
    ``||r||_1`` (``l1``, kept up to date per entry) drops to ``stop_l1``; the queue
    keeps what is left. Pages whose ``y`` changed are recorded once in ``touched``.
    Returns ``(pushes, work, l1)``.
    """
    mask = queue.size - 1
    pushes = 0
    work = 0
    while qstate[Q_SIZE] > 0 and work <= max_work and l1 > stop_l1:
        m = queue[qstate[Q_HEAD]]
        qstate[Q_HEAD] = (qstate[Q_HEAD] + 1) & mask
        qstate[Q_SIZE] -= 1
        inq[m] = False
        mass = r[m]
        if abs(mass) <= eps:
            continue
        y[m] += mass
        r[m] = 0.0
        l1 -= abs(mass)
        _touch(m, touched, qstate, is_touched)
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
            rn = old + c * _edge_factor(mode, n, in_len, out_len)
            r[n] = rn
            l1 += abs(rn) - abs(old)
            if abs(rn) > eps and not inq[n]:
                inq[n] = True
                queue[(qstate[Q_HEAD] + qstate[Q_SIZE]) & mask] = n
                qstate[Q_SIZE] += 1
    return pushes, work, l1


@njit(cache=True)
def enqueue_above(num_nodes, eps, r, queue, qstate, inq):
    """Queue every page with ``|r| > eps``; returns how many are queued now."""
    for v in range(num_nodes):
        if abs(r[v]) > eps:
            _enqueue(v, queue, qstate, inq)
    return qstate[Q_SIZE]


@njit(cache=True)
def clear_queue(queue, qstate, inq):
    mask = queue.size - 1
    while qstate[Q_SIZE] > 0:
        inq[queue[qstate[Q_HEAD]]] = False
        qstate[Q_HEAD] = (qstate[Q_HEAD] + 1) & mask
        qstate[Q_SIZE] -= 1


@njit(cache=True)
def sweep(kind, damping, eps, num_nodes, y, r, out_start, out_len, out_nbr, in_len, si, so,
          touched, qstate, is_touched):
    """One Gauss-Seidel (Southwell) sweep: push, in id order, every page with ``|r| > eps``.

    Returns ``(pushes, work, sum |r|, max |r|)``, the last two computed exactly in
    a second pass over ``r``.
    """
    pushes = 0
    work = 0
    for m in range(num_nodes):
        mass = r[m]
        if abs(mass) <= eps:
            continue
        y[m] += mass
        r[m] = 0.0
        pushes += 1
        _touch(m, touched, qstate, is_touched)
        scale, mode = _column_scale(kind, m, out_len, si, so)
        if scale == 0.0:
            continue
        c = damping * mass * scale
        base = out_start[m]
        deg = out_len[m]
        work += deg
        for i in range(deg):
            n = out_nbr[base + i]
            r[n] += c * _edge_factor(mode, n, in_len, out_len)
    total, peak = abs_stats(r, num_nodes)
    return pushes, work, total, peak


@njit(cache=True)
def full_residual(kind, damping, num_nodes, live, y, r, out_start, out_len, out_nbr, in_len,
                  si, so):
    """``r = b + d*M*y - y`` from scratch (``b = 1 - d`` on live pages).

    Returns ``(sum |r|, max |r|)``.
    """
    base_value = 1.0 - damping
    for v in range(num_nodes):
        r[v] = (base_value if live[v] else 0.0) - y[v]
    for m in range(num_nodes):
        if y[m] == 0.0:
            continue
        scale, mode = _column_scale(kind, m, out_len, si, so)
        if scale == 0.0:
            continue
        c = damping * y[m] * scale
        base = out_start[m]
        for i in range(out_len[m]):
            n = out_nbr[base + i]
            r[n] += c * _edge_factor(mode, n, in_len, out_len)
    return abs_stats(r, num_nodes)


@njit(cache=True)
def abs_stats(values, count):
    """``(sum |v|, max |v|)`` of the first ``count`` entries."""
    total = 0.0
    peak = 0.0
    for v in range(count):
        a = abs(values[v])
        total += a
        if a > peak:
            peak = a
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


@njit(cache=True)
def collect_moved(touched, qstate, is_touched, live, y, published, threshold):
    """Pages touched since the last call whose ``y`` moved more than ``threshold``.

    Updates ``published`` for them, clears the touched set; dead pages are skipped
    (their removal is published separately).
    """
    count = qstate[T_COUNT]
    moved = np.empty(count, dtype=np.int32)
    k = 0
    for i in range(count):
        m = touched[i]
        is_touched[m] = False
        if live[m] and abs(y[m] - published[m]) > threshold:
            published[m] = y[m]
            moved[k] = m
            k += 1
    qstate[T_COUNT] = 0
    return moved[:k]
