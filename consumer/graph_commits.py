"""The graph transactions: one batch's at a time, on a writer thread, in batch order.

A batch's transaction (:func:`consumer.graph_write.commit_graph`, fenced by the
lease) runs while the engines absorb the same batch and the next one is planned. It
is settled (waited for) before the next batch's is submitted, so the mirror is at
most two batches ahead of Redis, and a publication covering it waits for it too
(``after=``:attr:`GraphCommits.in_flight`, :mod:`consumer.publishing`). What a batch
counts, and its offsets for Kafka's consumer group (lag tools only), are recorded
once its transaction committed: a batch whose commit a rebuild voids is polled and
processed again, and was counted twice.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import redis

from consumer.graph_write import commit_graph
from consumer.keys import Keys
from consumer.lock import ConsumerLock
from consumer.mirror import PlannedBatch
from consumer.recovery import Recovery
from consumer.stats import ConsumerStats


class GraphCommits:
    """The graph transaction in flight, if any, and what it commits."""

    def __init__(self, client: redis.Redis, keys: Keys, lock: ConsumerLock,
                 recovery: Recovery, stats: ConsumerStats, *, bulk: bool) -> None:
        self._client = client
        self._keys = keys
        self._lock = lock
        self._recovery = recovery
        self._stats = stats
        self._bulk = bulk
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graph-writer")
        self.in_flight: Future[None] | None = None
        self._offsets: dict[int, int] = {}  # the next offsets of the batch in flight
        self._counts = (0, 0)  # (messages, link changes) of that batch

    def submit(self, planned: PlannedBatch, *, next_offsets: dict[int, int],
               messages: int) -> None:
        """Start ``planned``'s transaction (after :meth:`settle` of the one before)."""
        assert self.in_flight is None, "settle the transaction in flight first"
        self.in_flight = self._writer.submit(self._commit, planned)
        self._offsets = next_offsets
        self._counts = (messages, planned.write.link_changes)

    def settle(self, commit_offsets: Callable[[dict[int, int]], None]) -> None:
        """Wait for the transaction in flight, if any (raises what it raised); once it
        committed, count its batch and hand its offsets to ``commit_offsets``."""
        commit, self.in_flight = self.in_flight, None
        if commit is not None:
            commit.result()
            self._stats.record_batch(*self._counts)
            commit_offsets(self._offsets)

    def close(self) -> None:
        """Wait for the transaction in flight and stop the writer thread."""
        self._writer.shutdown(wait=True)

    def _commit(self, planned: PlannedBatch) -> None:
        recovery = self._recovery
        after = recovery.committed[0]
        recovery.fenced("committing the graph", lambda: commit_graph(
            self._client, self._keys, planned.write, fence=self._lock, bulk=self._bulk,
            after=after))
        # Runs on the single writer thread, in batch order.
        recovery.committed = (planned.write.counters,
                              {**recovery.committed[1], **planned.write.offsets})
