"""The dead-letter topic: invalid events, byte for byte, with why and where from.

Each dead letter keeps the original key and value and carries headers:

* ``error``: the decoder's reason (``InputError`` message, UTF-8);
* ``source_topic``, ``source_partition``, ``source_offset``: where it came from;
* ``truncated``: only when the original did not fit in a DLQ message; the value
  then holds the first bytes and this header the original length;
* ``key_truncated``: the same for a key longer than :data:`KEY_LIMIT` (the broker
  only bounds the compressed size, so a key can decompress to megabytes);
* ``tombstone``: ``1`` when the original had a null value (a tombstone); the dead
  letter's value is then empty, as kafka-python cannot send a record with neither
  key nor value.

The value's room is what the topic accepts minus the key and the headers. If the
broker still refuses a letter as too large (a dead-letter topic created elsewhere
with a smaller limit), a stub is sent instead: the headers, the first bytes of
the key and no value (``truncated`` = the original length); the original stays
in the source topic at ``source_partition``/``source_offset``. Without that, one
such message would stop the consumer for good: the batch could never commit.

Delivery is confirmed (flush + every future checked) before the batch's offsets
are committed to Redis, so a crash can only re-send a dead letter (at-least-once
on the DLQ), never lose one. Readers can de-duplicate on partition+offset. A retry
after a partial failure sends only the letters not yet confirmed: re-sending the
whole batch added a copy of every good letter per retry while one DLQ partition
was down. A letter still queued when the flush timed out (its partition has no
leader) is waited for again by the retry, not queued a second time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from consumer.kafka_source import Record, kafka_errors, kafka_options
from rankstream.errors import ServiceUnavailable
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer.dlq")

FLUSH_TIMEOUT_S = 10.0
# How long one send may block for the topic's metadata (kafka-python's default, 60 s,
# held a stop request that long past its 30 s grace: a review). The retry loop around
# each attempt covers a longer outage, and checks for a stop between attempts.
MAX_BLOCK_MS = 5_000
# The topics accept 2 x max_message_bytes + 64 KiB (rankstream.services.stack.topic_specs),
# so anything the consumer read fits again with our headers, bar this allowance.
TOPIC_SLACK = 64 * 1024
HEADER_ALLOWANCE = 4 * 1024  # the record's own framing, with room to spare
KEY_LIMIT = 16 * 1024  # keys are source URLs: at most max_url_length (8 KiB) in practice
REASON_LIMIT = 1024  # bytes of the error header
STUB_KEY_BYTES = 512


@dataclass(frozen=True)
class DeadLetter:
    """An invalid message and the reason it was rejected."""

    record: Record
    reason: str


def dead_letter_headers(letter: DeadLetter, source_topic: str) -> list[tuple[str, bytes]]:
    """The headers of one dead letter (pure; see the module docstring)."""
    reason = letter.reason.encode("utf-8", "replace")
    if len(reason) > REASON_LIMIT:
        reason = reason[:REASON_LIMIT].decode("utf-8", "ignore").encode() + b"..."
    return [
        ("error", reason),
        ("source_topic", source_topic.encode()),
        ("source_partition", str(letter.record.partition).encode()),
        ("source_offset", str(letter.record.offset).encode()),
    ]


def _where(letter: DeadLetter) -> tuple[int, int]:
    return letter.record.partition, letter.record.offset


class DeadLetterSender:
    """A confirmed-delivery producer for the dead-letter topic."""

    def __init__(self, settings: Settings) -> None:
        from kafka import KafkaProducer

        self.topic = settings.dlq_topic
        self.source_topic = settings.topic
        # An oversized event (the reason it is here) must still fit a DLQ message.
        max_request = 2 * settings.max_message_bytes + TOPIC_SLACK
        self.max_value_bytes = max_request - HEADER_ALLOWANCE
        # (partition, offset) of letters confirmed while a send is being retried.
        self._delivered: set[tuple[int, int]] = set()
        # Futures of letters (False) or stubs (True) by (partition, offset) that an
        # attempt left queued in the producer when its flush timed out.
        self._in_flight: dict[tuple[bool, int, int], Any] = {}
        with kafka_errors("connecting the dead-letter producer"):
            self._producer = KafkaProducer(
                client_id="rankstream-consumer-dlq",
                acks="all",
                retries=5,
                linger_ms=5,
                max_request_size=max_request,
                max_block_ms=MAX_BLOCK_MS,
                **kafka_options(settings),
            )

    def send(self, letters: Sequence[DeadLetter]) -> None:
        """Send and confirm every letter; raise ServiceUnavailable if any failed."""
        pending = [letter for letter in letters if _where(letter) not in self._delivered]
        if not pending:
            self._delivered.clear()
            return
        too_large = self._confirm(pending, stubs=False)
        self._confirm(too_large, stubs=True)
        self._delivered.clear()
        self._in_flight.clear()
        log.info("dead letters sent", extra={"fields": {"count": len(pending),
                                                         "stubs": len(too_large),
                                                         "topic": self.topic}})

    def _confirm(self, letters: Sequence[DeadLetter], *, stubs: bool) -> list[DeadLetter]:
        """Send ``letters`` (or their stubs) and confirm each; return those refused as
        too large (letters only), raise ServiceUnavailable for any other failure."""
        from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

        if not letters:
            return []
        send = self._send_stub if stubs else self._send_one
        with kafka_errors("sending dead letters"):
            futures = []
            for letter in letters:
                # One still queued from an attempt that timed out is waited for again,
                # not queued once more: a copy per retry went out once it could. Each
                # is recorded as it is sent, so a send that raises loses none of them.
                key = (stubs, *_where(letter))
                future = self._in_flight.get(key)
                if future is None:
                    future = self._in_flight[key] = send(letter)
                futures.append((letter, key, future))
            # A partition without a leader keeps its letters queued (up to the
            # producer's delivery timeout): the futures say which others went.
            with contextlib.suppress(KafkaTimeoutError):
                self._producer.flush(timeout=FLUSH_TIMEOUT_S)
        refused: list[DeadLetter] = []
        failed: tuple[DeadLetter, Exception] | None = None
        for letter, key, future in futures:  # every future: the delivered are not resent
            if not future.is_done:
                if failed is None:
                    failed = (letter, KafkaTimeoutError(
                        f"still queued after {FLUSH_TIMEOUT_S:.0f} s"))
                continue
            del self._in_flight[key]
            try:
                future.get(timeout=0)
                self._delivered.add(_where(letter))
            except KafkaError as exc:
                if not stubs and isinstance(exc, MessageSizeTooLargeError):
                    refused.append(letter)
                elif failed is None:
                    failed = (letter, exc)
        if failed is not None:
            where, error = failed
            raise ServiceUnavailable(
                f"dead letter for {self.source_topic}:{where.record.partition}@"
                f"{where.record.offset} not delivered: {error!r}") from error
        return refused

    def _send_one(self, letter: DeadLetter) -> Any:
        headers = dead_letter_headers(letter, self.source_topic)
        key = letter.record.key
        if key is not None and len(key) > KEY_LIMIT:
            headers.append(("key_truncated", str(len(key)).encode()))
            key = key[:KEY_LIMIT]
        room = self.max_value_bytes - len(key or b"") - sum(
            len(name) + len(value) for name, value in headers)
        value = letter.record.value
        if value is None:
            # A tombstone: kafka-python refuses to send one without a key (an
            # AssertionError that stopped the consumer at it on every start).
            headers.append(("tombstone", b"1"))
            value = b""
        if len(value) > room:
            headers.append(("truncated", str(len(value)).encode()))
            value = value[:max(room - 64, 0)]  # the header just added
        return self._producer.send(self.topic, value=value, key=key, headers=headers)

    def _send_stub(self, letter: DeadLetter) -> Any:
        headers = dead_letter_headers(letter, self.source_topic)
        headers.append(("truncated", str(len(letter.record.value or b"")).encode()))
        key = letter.record.key
        if key is not None and len(key) > STUB_KEY_BYTES:
            headers.append(("key_truncated", str(len(key)).encode()))
            key = key[:STUB_KEY_BYTES]
        log.warning("dead letter refused as too large; sending a stub", extra={"fields": {
            "partition": letter.record.partition, "offset": letter.record.offset}})
        return self._producer.send(self.topic, value=b"", key=key, headers=headers)

    def close(self) -> None:
        try:
            self._producer.close(timeout=10)
        except Exception as exc:  # closing must not mask the reason we are stopping
            log.warning("closing the dead-letter producer failed",
                        extra={"fields": {"error": repr(exc)}})
