"""rankstream.batching.chunks: the lists every bounded writer and `rank --events` cut."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankstream.batching import chunks


@given(st.lists(st.integers()), st.integers(1, 10))
def test_chunks_keep_the_order_and_bound_each_list(items: list[int], size: int) -> None:
    parts = list(chunks(iter(items), size))  # any iterable, consumed once
    assert [x for part in parts for x in part] == items
    assert all(1 <= len(part) <= size for part in parts)
    assert all(len(part) == size for part in parts[:-1])


def test_a_chunk_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        next(chunks([1], 0))
