"""Polling and decoding batches, ahead of the engines when they are busy.

Decoding is the consumer's largest Python cost and needs no shared state, so while
catching up the main thread polls and decodes the next batches while the engines
absorb or refresh the current one on the ranker thread
(:meth:`Prefetcher.decode_during`). Once caught up, a batch polled early would only
wait for the engines: the next poll is timed to them instead
(:meth:`consumer.pacing.Pacing.poll_delay`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from consumer.dead_letters import DeadLetter
from consumer.kafka_source import KafkaSource, Record
from consumer.recovery import Backoff
from rankstream.errors import InputError, ServiceUnavailable

log = logging.getLogger("rankstream.consumer")

# Batches decoded ahead while the engines refresh (bounded: 4 x batch_max_events
# decoded events in memory at most).
MAX_PREFETCH_BATCHES = 4
EXTRA_POLL_MS = 20
# kafka-python pipelines its fetches: a poll that finds a fetch response already in
# hand returns those records at once and sends the next fetch, whose answer the
# following poll returns the same way. Once caught up, that keeps every batch a
# whole cycle behind: it holds what arrived up to the *previous* poll (measured on
# the 1M-page stream's latency phase: a batch's newest event was 0.6 s old when
# polled, against 0.1 s when each poll waited for its own fetch). So a poll that
# returns less than a full batch is topped up by a second one that waits up to
# TOP_UP_POLL_MS for the fetch in flight: the batch then holds what arrived until now,
# and the consumer's fetches stay unpipelined until it falls behind again.
TOP_UP_POLL_MS = 20


@dataclass
class Fetched:
    """One polled and decoded batch."""

    records: list[Record]
    events: list[Any]
    letters: list[DeadLetter]
    next_offsets: dict[int, int]


def decode_records(records: list[Record], limits: Any) -> Fetched:
    """Validate every record: events in order, the invalid ones as dead letters.

    ``limits``: :class:`producer.schema.Limits`.
    """
    from producer.schema import decode_event

    events: list[Any] = []
    letters: list[DeadLetter] = []
    next_offsets: dict[int, int] = {}
    for record in records:
        try:
            events.append(decode_event(record.value, limits))
        except InputError as exc:
            letters.append(DeadLetter(record, str(exc)))
        except Exception as exc:  # a decoder bug must not stall the partition
            # Re-raising would fail the same record again on every restart. The record
            # goes to the dead-letter topic with the bug named, and the log has the trace.
            log.exception("event decoder failed", extra={"fields": {
                "partition": record.partition, "offset": record.offset}})
            letters.append(DeadLetter(record, f"internal error: {type(exc).__name__}: {exc}"[:500]))
        if record.offset + 1 > next_offsets.get(record.partition, -1):
            next_offsets[record.partition] = record.offset + 1
    return Fetched(records, events, letters, next_offsets)


class Prefetcher:
    """Polls and decodes batches; keeps the ones decoded ahead, oldest first.

    Args:
        source: the consumer's Kafka source (called when polling: it is connected
            after the consumer starts).
        limits: the input limits events are validated against.
        batch_max_events: the most records one poll returns.
        poll_timeout_ms: how long a poll with no batch in hand may wait.
        backoff: the pause after a failed poll.
        stop_event: set when the consumer should stop; no poll ahead after it.
    """

    def __init__(self, source: Callable[[], KafkaSource], limits: Any, *,
                 batch_max_events: int, poll_timeout_ms: int, backoff: Backoff,
                 stop_event: threading.Event) -> None:
        self._source = source
        self.limits = limits
        self.batch_max_events = batch_max_events
        self.poll_timeout_ms = poll_timeout_ms
        self.backoff = backoff
        self._failed_polls = 0  # in a row: the backoff grows with them
        self.stop_event = stop_event
        self.ahead: collections.deque[Fetched] = collections.deque()

    def next(self) -> Fetched | None:
        """The oldest batch decoded ahead, or a freshly polled one (None: nothing)."""
        return self.ahead.popleft() if self.ahead else self.fetch()

    def clear(self) -> None:
        """Forget the batches decoded ahead (Kafka is about to be re-positioned)."""
        self.ahead.clear()

    def fetch(self, timeout_ms: int | None = None, *, wait_on_failure: bool = True
              ) -> Fetched | None:
        """Poll one batch and decode it (no shared state: runs while Redis writes).

        ``timeout_ms``: how long the poll may wait for records (default: the
        ``poll_timeout_ms`` setting). ``wait_on_failure``: back off after a failed
        poll (not while batches in hand wait to be processed).
        """
        wait_ms = self.poll_timeout_ms if timeout_ms is None else timeout_ms
        try:
            records = self._source().poll(self.batch_max_events, wait_ms)
        except ServiceUnavailable as exc:
            # 0.1 s doubling to 5 s, like every retry (it stayed at 0.1 s: ten warnings
            # a second through a Kafka outage).
            self._failed_polls += 1
            log.warning("poll failed", extra={"fields": {"error": str(exc)[:300],
                                                         "attempt": self._failed_polls}})
            if wait_on_failure:  # a stop cuts the wait short
                self.stop_event.wait(self.backoff.delay(self._failed_polls - 1))
            return None
        self._failed_polls = 0
        if not records:
            return None
        if TOP_UP_POLL_MS and len(records) < self.batch_max_events:
            with contextlib.suppress(ServiceUnavailable):  # the next poll fails loudly
                records += self._source().poll(self.batch_max_events - len(records),
                                               TOP_UP_POLL_MS)
        return decode_records(records, self.limits)

    def decode_during(self, ranking: Future[Any], current: Fetched,
                      caught_up: Callable[[dict[int, int]], bool]) -> None:
        """Poll and decode the next batch, and more while the engines still work.

        ``ranking``: the engines' work on ``current``; ``caught_up(next_offsets)``:
        would a batch ending there reach the caught-up targets?

        A long refresh (about a second on a 1.4M-page graph) is used to decode up to
        :data:`MAX_PREFETCH_BATCHES` batches ahead. With no batch in hand the poll
        waits up to ``poll_timeout_ms`` as usual; the extra polls wait at most
        :data:`EXTRA_POLL_MS` each and stop as soon as the engines are done. No poll
        follows a batch that reaches the caught-up targets or a stop request, and
        none follows one that was not full, ``current`` included: once caught up, a
        batch polled now would hold only what arrived so far and then wait for this
        whole refresh before the engines take it. Polled by the next step instead,
        right after the engines took this batch, it holds everything that arrived
        meanwhile and is still planned while the engines refresh (1M-page stream,
        latency phase: p50/p99 2.00/2.72 s -> 1.67/2.29 s).
        """
        latest = self.ahead[-1] if self.ahead else current
        while (len(self.ahead) < MAX_PREFETCH_BATCHES
               and not caught_up(latest.next_offsets)
               and not self.stop_event.is_set()):
            in_hand = bool(self.ahead)
            if (len(latest.records) < self.batch_max_events
                    or (in_hand and ranking.done())):
                return
            fetched = self.fetch(timeout_ms=EXTRA_POLL_MS if in_hand else None,
                                 wait_on_failure=False)
            if fetched is None:
                if in_hand and not self._failed_polls:
                    continue  # the client had nothing buffered yet; the engines still work
                return  # (a failed poll: the batches in hand go first, no backoff)
            self.ahead.append(fetched)
            latest = fetched
