"""Cutting a stream of items into bounded lists (Python 3.11 has no ``itertools.batched``).

Shared by the writers that must bound what one command or round trip carries (the
consumer's graph writes, ``rekey``'s copy) and by ``rankstream rank``, which absorbs
an event log a batch at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in consecutive lists of ``size`` (the last one may be shorter)."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk
