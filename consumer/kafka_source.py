"""Reading the event topic: manual assignment, seek to Redis offsets, batched polls.

The consumer never lets Kafka decide where to start: it assigns every partition
of the topic itself (no group rebalancing; one consumer per prefix is enforced by
the Redis lease) and seeks to the offsets stored in Redis with the graph. Kafka's
committed offsets for ``group_id`` are written after each batch purely so the
usual lag tooling (kafka-consumer-groups.sh) sees progress.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rankstream.errors import ServiceError, ServiceUnavailable
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer.kafka")

# Fetch big chunks: a batch of 5000 page events with 10 links is about 3 MB.
MAX_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
FETCH_MAX_BYTES = 32 * 1024 * 1024
# kafka-python refuses any response frame above this (default 1 MB, smaller than one
# fetch response), so it must exceed the fetch size.
RECEIVE_MAX_BYTES = FETCH_MAX_BYTES + 8 * 1024 * 1024


def receive_max_bytes(max_message_bytes: int) -> int:
    """The frame limit for a topic whose records may be ``max_message_bytes`` long.

    A broker returns a partition's first record batch whole even when it is larger
    than the fetch limits, and the topic takes batches up to ``2 * max + 64 KiB``
    (:func:`rankstream.services.stack.topic_specs`): with a large limit, one such
    batch on top of a full fetch overflowed the fixed frame limit, and kafka-python
    dropped the connection and retried the same fetch forever.
    """
    return max(RECEIVE_MAX_BYTES, FETCH_MAX_BYTES + 2 * max_message_bytes + 8 * 1024 * 1024)
RECONNECT_BACKOFF_MAX_MS = 1000
REQUEST_TIMEOUT_MS = 30_000
# How often the topic's partition count is looked at (and kafka-python's metadata
# refreshed, 5 minutes by default): partitions added to the topic are read after
# at most about this long, without a restart.
PARTITION_CHECK_S = 30.0


@contextlib.contextmanager
def kafka_errors(what: str) -> Iterator[None]:
    """Translate kafka-python errors; retriable ones become ServiceUnavailable."""
    from kafka.errors import KafkaError

    try:
        yield
    except KafkaError as exc:
        retriable = getattr(exc, "retriable", False) or isinstance(exc, OSError)
        cls = ServiceUnavailable if retriable else ServiceError
        raise cls(f"kafka error while {what}: {exc!r}{_remedy(exc)}") from exc
    except OSError as exc:
        raise ServiceUnavailable(f"kafka unreachable while {what}: {exc}") from exc


def _remedy(exc: Exception) -> str:
    """What an operator can do about an error no retry gets past."""
    from kafka.errors import CorruptRecordError

    if isinstance(exc, CorruptRecordError):
        return ("; a record kafka-python cannot read stops the consumer at its offset: "
                "docs/reliability.md, 'Compressed batches'")
    return ""


def kafka_options(settings: Settings) -> dict[str, Any]:
    """Connection and security options shared by our consumer and DLQ producer."""
    from rankstream.services.stack import kafka_client_options

    options = kafka_client_options(settings)
    options["bootstrap_servers"] = [s.strip() for s in settings.kafka_bootstrap.split(",")]
    # kafka-python backs reconnects off exponentially up to 30 s by default, so after a
    # broker restart the consumer sat idle for up to 13 s more (tests/faults). A 1 s
    # cap costs one connection attempt per second while the broker is down.
    options["reconnect_backoff_max_ms"] = RECONNECT_BACKOFF_MAX_MS
    return options


@dataclass(frozen=True)
class Record:
    """One consumed message, reduced to what the consumer uses."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None  # None: a tombstone (dead-lettered as such)
    timestamp_ms: int


class KafkaSource:
    """All partitions of one topic, manually assigned, positioned from Redis."""

    def __init__(self, settings: Settings, *, client_id: str = "rankstream-consumer") -> None:
        from kafka import KafkaConsumer

        self.topic = settings.topic
        with kafka_errors("connecting the consumer"):
            self._consumer = KafkaConsumer(
                client_id=client_id,
                group_id=settings.group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                # Events a transactional producer aborted never happened. The same as
                # read_uncommitted for other producers.
                isolation_level="read_committed",
                # Bounds the calls that wait on the broker outside a poll (offsets looked
                # up on a gap, at seek, for catching up): kafka-python's 305 s default
                # would hold the main thread for five minutes if the broker went away.
                request_timeout_ms=REQUEST_TIMEOUT_MS,
                max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
                fetch_max_bytes=FETCH_MAX_BYTES,
                receive_message_max_bytes=receive_max_bytes(settings.max_message_bytes),
                fetch_max_wait_ms=min(settings.poll_timeout_ms, 100),
                receive_buffer_bytes=4 * 1024 * 1024,
                max_poll_records=settings.batch_max_events,
                metadata_max_age_ms=int(PARTITION_CHECK_S * 1000),
                **kafka_options(settings),
            )
        self._partitions: list[Any] = []
        self._log_starts: dict[int, int] = {}  # per partition, as of the last seek
        self._known_ends: dict[int, int] = {}  # log ends read from the broker, per partition
        # Per partition: (stale stored offset, log start) where seek() started over.
        self._rewound: dict[int, tuple[int, int]] = {}
        self._expected: dict[int, int] = {}  # the next offset each partition should give
        self._next_partition_check = time.monotonic() + PARTITION_CHECK_S

    @property
    def partitions(self) -> list[int]:
        return [tp.partition for tp in self._partitions]

    def assign(self, offsets: Mapping[int, int], *, wait_s: float = 30.0) -> list[int]:
        """Assign every partition; seek each to ``offsets[p]`` or the beginning."""
        from kafka import TopicPartition

        deadline = time.monotonic() + wait_s
        with kafka_errors(f"reading the partitions of {self.topic}"):
            while True:
                found = self._consumer.partitions_for_topic(self.topic)
                if found:
                    break
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(f"topic {self.topic} has no partitions "
                                             f"(does it exist?) after {wait_s:.0f} s")
                time.sleep(0.5)
            self._partitions = [TopicPartition(self.topic, p) for p in sorted(found)]
            self._consumer.assign(self._partitions)
        self.seek(offsets)
        return self.partitions

    def seek(self, offsets: Mapping[int, int]) -> None:
        """Position every assigned partition at the Redis offset (log start if none).

        A stored offset below the partition's log start means retention (or
        DeleteRecords) removed events before this consumer read them: they are
        gone, so reading resumes at the log start, with a warning that counts them.
        One past the log end means the topic was deleted and recreated (or the broker
        lost its log): everything in it is unread, so reading starts over at the log
        start, with an error in the log, rather than waiting for an offset that may
        never come.
        """
        with kafka_errors("seeking"):
            starts = self._consumer.beginning_offsets(self._partitions)
            ends = self._consumer.end_offsets(self._partitions)
            self._log_starts = {tp.partition: int(start) for tp, start in starts.items()}
            self._known_ends = {tp.partition: int(end) for tp, end in ends.items()}
            self._rewound = {}
            for tp in self._partitions:
                start, end = self._log_starts[tp.partition], int(ends[tp])
                stored = offsets.get(tp.partition)
                if stored is not None and stored < start:
                    log.warning("events deleted before they were consumed", extra={"fields": {
                        "partition": tp.partition, "stored_offset": stored,
                        "log_start": start, "lost": start - stored}})
                if stored is not None and stored > end:
                    log.error("stored offset past the log end (topic recreated?): reading "
                              "the partition from its start", extra={"fields": {
                                  "partition": tp.partition, "stored_offset": stored,
                                  "log_start": start, "log_end": end}})
                    self._rewound[tp.partition] = (stored, start)
                    stored = start
                position = start if stored is None else max(stored, start)
                self._consumer.seek(tp, position)
                self._expected[tp.partition] = position

    def positions(self, offsets: Mapping[int, int]) -> dict[int, int]:
        """``offsets`` (next offset per partition, as committed) raised to each
        partition's log start: what is left to read, for catching up and lag. A
        partition whose records were all deleted gets no record that would move
        its committed offset, and would otherwise never count as caught up; one
        read over from its start (:meth:`seek`) counts from there until its first
        batch commits (:meth:`commit_for_monitoring`)."""
        out = dict(offsets)
        for partition, start in self._log_starts.items():
            out[partition] = max(out.get(partition, 0), start)
        for partition, (stale, start) in list(self._rewound.items()):  # other threads
            if out.get(partition) == stale:
                out[partition] = start
        for tp in list(self._partitions):
            # Once every record polled from a partition is in ``offsets``, Kafka's own
            # position counts: it moves past what is never handed out (a transactional
            # producer's commit markers, aborted transactions). Else the marker at
            # the end of such a log was never "read", and --until-caught-up never ended.
            handed_out = self._expected.get(tp.partition)
            if handed_out is not None and out.get(tp.partition) == handed_out:
                try:  # never waits (an unknown position would: for ever)
                    position = int(self._consumer.position(tp, timeout_ms=0))
                except Exception:  # None, or status heartbeats on other threads while
                    continue  # a partition is being added: no raise then
                out[tp.partition] = max(handed_out, position)
        return out

    def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
        """Up to ``max_records`` messages, ordered by offset within each partition.

        A partition whose records start past where it was left skipped events:
        kafka-python moves a position that retention deleted under it to the log
        start by itself, logging that only at INFO. The gap is logged as a warning.
        """
        with kafka_errors("polling"):
            self._add_new_partitions()
            polled = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        records: list[Record] = []
        for tp, messages in polled.items():
            if not messages:
                continue
            expected = self._expected.get(tp.partition)
            if expected is not None and messages[0].offset > expected:
                self._gap(tp, expected, messages[0].offset)
            self._expected[tp.partition] = messages[-1].offset + 1
            records.extend(
                Record(tp.partition, m.offset, m.key, m.value, m.timestamp)
                for m in messages
            )
        return records

    def _add_new_partitions(self) -> None:
        """Assign partitions added to the topic since :meth:`assign`, from their start.

        Manual assignment gets no rebalance when the topic grows: without this, the
        keys hashed to new partitions were never read until a restart (and lag did
        not show them). Positions of the partitions already assigned are kept.
        """
        from kafka import TopicPartition

        now = time.monotonic()
        if now < self._next_partition_check or not self._partitions:
            return
        self._next_partition_check = now + PARTITION_CHECK_S
        found = self._consumer.partitions_for_topic(self.topic) or set()
        added = [TopicPartition(self.topic, p) for p in sorted(set(found) - set(self.partitions))]
        if not added:
            return
        self._partitions = [*self._partitions, *added]
        self._consumer.assign(self._partitions)
        starts = self._consumer.beginning_offsets(added)
        for tp in added:
            start = int(starts[tp])
            self._log_starts[tp.partition] = self._expected[tp.partition] = start
            self._consumer.seek(tp, start)
        log.warning("partitions added to the topic: reading them from their start",
                    extra={"fields": {"partitions": [tp.partition for tp in added]}})

    def _gap(self, tp: Any, expected: int, next_record: int) -> None:
        """Offsets skipped between two polls: deleted events, or nothing at all.

        Retention (or DeleteRecords) deleting unread events moves the log start past
        them. A transactional producer's commit markers and its aborted transactions
        (skipped: the consumer reads committed records only) leave gaps too, with no
        event in them.
        """
        from kafka.errors import KafkaError

        try:
            start: int | None = int(self._consumer.beginning_offsets([tp])[tp])
        except KafkaError:
            start = None  # cannot tell: say so, as before
        if start is not None and start <= expected:
            log.debug("offsets skipped (transaction markers or aborted transactions)",
                      extra={"fields": {"partition": tp.partition, "from": expected,
                                        "to": next_record}})
            return
        log.warning("events deleted before they were consumed", extra={"fields": {
            "partition": tp.partition, "expected_offset": expected,
            "next_record": next_record, "lost": next_record - expected}})

    def end_offsets(self) -> dict[int, int]:
        """The current log-end offset of every assigned partition (one round trip)."""
        with kafka_errors("reading end offsets"):
            ends = {tp.partition: int(off)
                    for tp, off in self._consumer.end_offsets(self._partitions).items()}
        self._known_ends.update(ends)
        return ends

    def highwaters(self) -> dict[int, int]:
        """Log-end offsets learnt from the last fetches (free), or for a partition not
        fetched yet the last one read from the broker (at :meth:`seek`; a lower bound,
        as logs only grow). kafka-python knows a partition's highwater only once it
        parsed a fetch of it: the others were left out of the lag, and a consumer
        started with 150k events waiting reported a lag of 0, then a third of it, to
        `status --check --max-lag` and /metrics (session 37's review)."""
        out: dict[int, int] = {}
        for tp in self._partitions:
            hw = self._consumer.highwater(tp)
            if hw is not None:
                out[tp.partition] = int(hw)
            elif tp.partition in self._known_ends:
                out[tp.partition] = self._known_ends[tp.partition]
        return out

    def commit_for_monitoring(self, offsets: Mapping[int, int]) -> None:
        """Commit ``offsets`` to the group asynchronously; failures only get logged.

        Called once a batch's transaction committed ``offsets`` to Redis: a partition
        read over from its start (:meth:`seek`) has a real offset there from now on,
        which :meth:`positions` must take as it is even if it equals the stale one.
        """
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        for partition in offsets:
            self._rewound.pop(partition, None)

        payload = {TopicPartition(self.topic, p): OffsetAndMetadata(off, "", -1)
                   for p, off in offsets.items()}
        try:
            self._consumer.commit_async(payload, callback=_log_commit_failure)
        except Exception as exc:  # lag monitoring must never stop the pipeline
            log.warning("kafka commit failed", extra={"fields": {"error": repr(exc)}})

    def close(self, final_offsets: Mapping[int, int] | None = None) -> None:
        """Close; commit ``final_offsets`` synchronously first (best effort, for lag tools)."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        if final_offsets:
            payload = {TopicPartition(self.topic, p): OffsetAndMetadata(off, "", -1)
                       for p, off in final_offsets.items()}
            try:
                self._consumer.commit(payload, timeout_ms=5000)
            except Exception as exc:  # monitoring only
                log.warning("final kafka commit failed", extra={"fields": {"error": repr(exc)}})
        with contextlib.suppress(Exception):
            self._consumer.close(autocommit=False)


def _log_commit_failure(_offsets: Any, response: Any) -> None:
    if isinstance(response, Exception):
        log.warning("kafka commit failed", extra={"fields": {"error": repr(response)}})
