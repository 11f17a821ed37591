"""Score publications on the wire: ZADD/ZREM commands encoded by numpy, sent raw.

A publication on a graph that changes everywhere writes about every page, twice
(two algorithms). Two measured costs decided this module (2-core box, AOF on):

* through redis-py every argument costs ~1 us of Python, i.e. seconds of a thread
  that competes with the engines for the GIL on every publication;
* a Lua script unpacking packed arrays costs Redis ~5.2 us per member where a plain
  pipelined ZADD costs ~3.7 us.

So the commands are built here as RESP bytes, with no Python work per member:

* members: a page URL is framed once (``$len\\r\\nurl\\r\\n``) into the append-only
  :class:`UrlTable` when its id first appears; a chunk's members are one numpy gather;
* scores: C99 hexadecimal floats (``+0x1.91eb851eb851fp-0003``) formatted from the
  IEEE bits by numpy, fixed width and exact (Redis parses ZADD scores with strtod,
  which reads them back to the same double).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from consumer.resp import bulk

SCORE_TOKEN = 31  # "$24\r\n" + 24 characters + "\r\n"
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_POWERS = np.array([1000, 100, 10, 1], dtype=np.int64)


def score_tokens(values: np.ndarray) -> np.ndarray:
    """RESP bulk strings of ``values`` as exact hex floats, one 31-byte row each.

    ``sign 0x lead . 13 hex digits p sign 4 exponent digits``: normal numbers have
    lead 1 and exponent e - 1023, zero and subnormals lead 0 and exponent -1022.
    """
    v = np.ascontiguousarray(values, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError("scores must be finite")
    bits = v.view(np.uint64)
    biased = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    mantissa = bits & np.uint64((1 << 52) - 1)
    exponent = np.where(biased == 0, -1022, biased - 1023)
    out = np.empty((v.size, SCORE_TOKEN), dtype=np.uint8)
    out[:, 0:5] = np.frombuffer(b"$24\r\n", np.uint8)
    out[:, 5] = np.where(bits >> np.uint64(63), ord("-"), ord("+"))
    out[:, 6:8] = np.frombuffer(b"0x", np.uint8)
    out[:, 8] = np.where(biased == 0, ord("0"), ord("1"))
    out[:, 9] = ord(".")
    shifts = np.arange(48, -1, -4, dtype=np.uint64)
    out[:, 10:23] = _HEX[((mantissa[:, None] >> shifts) & np.uint64(0xF)).astype(np.intp)]
    out[:, 23] = ord("p")
    out[:, 24] = np.where(exponent < 0, ord("-"), ord("+"))
    out[:, 25:29] = ord("0") + (np.abs(exponent)[:, None] // _POWERS) % 10
    out[:, 29:31] = np.frombuffer(b"\r\n", np.uint8)
    return out


class UrlTable:
    """Every page URL as a framed RESP bulk string, by id, kept in step with the graph.

    Append-only: bytes already handed out in a :class:`UrlSlice` are never
    overwritten, so a publication being sent may keep reading its view.
    """

    def __init__(self) -> None:
        self._buffer = np.zeros(1 << 16, dtype=np.uint8)
        self._size = 0
        self._offsets = np.zeros(1024, dtype=np.int64)
        self.count = 0

    def sync(self, key_of: Any, num_ids: int) -> None:
        """Append the URLs of ids ``count .. num_ids - 1`` (``key_of(id) -> str``)."""
        if num_ids <= self.count:
            return
        framed = [bulk(key_of(pid)) for pid in range(self.count, num_ids)]
        joined = b"".join(framed)
        lengths = np.fromiter(map(len, framed), dtype=np.int64, count=len(framed))
        if self._size + len(joined) > self._buffer.size:
            grown = np.zeros(max(self._size + len(joined), 2 * self._buffer.size), np.uint8)
            grown[: self._size] = self._buffer[: self._size]
            self._buffer = grown
        if num_ids + 1 > self._offsets.size:
            offsets = np.zeros(max(num_ids + 1, 2 * self._offsets.size), dtype=np.int64)
            offsets[: self.count + 1] = self._offsets[: self.count + 1]
            self._offsets = offsets
        self._buffer[self._size: self._size + len(joined)] = np.frombuffer(joined, np.uint8)
        self._offsets[self.count + 1: num_ids + 1] = self._size + np.cumsum(lengths)
        self._size += len(joined)
        self.count = num_ids

    def view(self) -> UrlSlice:
        """An immutable view of the table as of now."""
        return UrlSlice(self._buffer[: self._size], self._offsets[: self.count + 1])


@dataclass(frozen=True)
class UrlSlice:
    """The framed URLs of ids ``0 .. len(offsets) - 2``."""

    buffer: np.ndarray
    offsets: np.ndarray

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token lengths, the framed tokens of ``ids`` concatenated, as uint8)."""
        starts = self.offsets[ids]
        lengths = self.offsets[ids + 1] - starts
        # Byte positions of every token: each token's start, then +1 per byte.
        shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        return lengths, self.buffer[shift + np.arange(shift.size)]

    def url(self, pid: int) -> str:
        token = self.buffer[self.offsets[pid]: self.offsets[pid + 1]].tobytes()
        return token[token.index(b"\r\n") + 2: -2].decode("utf-8")


def zadd_command(key: str, ids: np.ndarray, values: np.ndarray, urls: UrlSlice) -> bytes:
    """``ZADD key score member ...`` for ``ids`` with ``values``, as RESP bytes."""
    lengths, members = urls.gather(ids)
    scores = score_tokens(values)
    record = SCORE_TOKEN + lengths
    starts = np.cumsum(record) - record
    out = np.empty(int(record.sum()), dtype=np.uint8)
    out[(starts[:, None] + np.arange(SCORE_TOKEN)).ravel()] = scores.ravel()
    member_starts = starts + SCORE_TOKEN - (np.cumsum(lengths) - lengths)
    out[np.repeat(member_starts, lengths) + np.arange(members.size)] = members
    head = b"*%d\r\n" % (2 + 2 * ids.size) + bulk(b"ZADD") + bulk(key)
    return head + out.tobytes()


def zrem_command(key: str, ids: np.ndarray, urls: UrlSlice) -> bytes:
    """``ZREM key member ...`` for ``ids``, as RESP bytes."""
    _, members = urls.gather(ids)
    return b"*%d\r\n" % (2 + ids.size) + bulk(b"ZREM") + bulk(key) + members.tobytes()
