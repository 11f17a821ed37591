"""Compiled kernels of :mod:`ranker.linkgraph` (and the synthetic graph generator).

Adjacency layout (one such set per direction, "out" and "in"): row ``v`` lives in
``nbr[start[v] : start[v] + length[v]]`` of a shared int32 pool, with room for
``cap[v]`` entries. ``twin`` is parallel to ``nbr``: for the out-entry of link
``u -> v`` it holds the entry's index *within* ``v``'s in-row, and vice versa. The
index is relative to the row start, so moving a row (growth, compaction) never
invalidates a twin, and deleting a link is O(1) after finding it once.
"""

from __future__ import annotations

import numpy as np

from ranker._kernels import njit


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
def pack_rows(start, length, cap, nbr, twin, new_nbr, new_twin, num_nodes, spare_shift):
    """Copy rows back to back into fresh pools, each with capacity
    ``length + (length >> spare_shift)``; returns the tail."""
    pos = 0
    for v in range(num_nodes):
        old = start[v]
        for i in range(length[v]):
            new_nbr[pos + i] = nbr[old + i]
            new_twin[pos + i] = twin[old + i]
        start[v] = pos
        cap[v] = length[v] + (length[v] >> spare_shift)
        pos += cap[v]
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
