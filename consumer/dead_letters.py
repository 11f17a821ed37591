"""The dead-letter topic: invalid events, byte for byte, with why and where from.

Each dead letter keeps the original key and value and carries headers:

* ``error``: the decoder's reason (``InputError`` message, UTF-8);
* ``source_topic``, ``source_partition``, ``source_offset``: where it came from;
* ``truncated``: only when the original did not fit in a DLQ message; the value
  then holds the first bytes and this header the original length.

Delivery is confirmed (flush + every future checked) before the batch's offsets
are committed to Redis, so a crash can only re-send a dead letter (at-least-once
on the DLQ), never lose one. Readers can de-duplicate on partition+offset.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from consumer.kafka_source import Record, kafka_errors, kafka_options
from rankstream.errors import ServiceUnavailable
from rankstream.settings import Settings

log = logging.getLogger("rankstream.consumer.dlq")

FLUSH_TIMEOUT_S = 30.0
# The topics accept 2 x max_message_bytes + 64 KiB (rankstream.services.stack.topic_specs),
# so anything the consumer read fits again with our headers, bar this allowance.
TOPIC_SLACK = 64 * 1024
HEADER_ALLOWANCE = 4 * 1024


@dataclass(frozen=True)
class DeadLetter:
    """An invalid message and the reason it was rejected."""

    record: Record
    reason: str


def dead_letter_headers(letter: DeadLetter, source_topic: str) -> list[tuple[str, bytes]]:
    """The headers of one dead letter (pure; see the module docstring)."""
    return [
        ("error", letter.reason.encode("utf-8", "replace")),
        ("source_topic", source_topic.encode()),
        ("source_partition", str(letter.record.partition).encode()),
        ("source_offset", str(letter.record.offset).encode()),
    ]


class DeadLetterSender:
    """A confirmed-delivery producer for the dead-letter topic."""

    def __init__(self, settings: Settings) -> None:
        from kafka import KafkaProducer

        self.topic = settings.dlq_topic
        self.source_topic = settings.topic
        # An oversized event (the reason it is here) must still fit a DLQ message.
        max_request = 2 * settings.max_message_bytes + TOPIC_SLACK
        self.max_value_bytes = max_request - HEADER_ALLOWANCE
        with kafka_errors("connecting the dead-letter producer"):
            self._producer = KafkaProducer(
                client_id="rankstream-consumer-dlq",
                acks="all",
                retries=5,
                linger_ms=5,
                max_request_size=max_request,
                **kafka_options(settings),
            )

    def send(self, letters: Sequence[DeadLetter]) -> None:
        """Send and confirm every letter; raise ServiceUnavailable if any failed."""
        if not letters:
            return
        from kafka.errors import KafkaError

        futures: list[tuple[DeadLetter, Any]] = []
        with kafka_errors("sending dead letters"):
            for letter in letters:
                futures.append((letter, self._send_one(letter)))
            self._producer.flush(timeout=FLUSH_TIMEOUT_S)
        for letter, future in futures:
            try:
                future.get(timeout=0)
            except KafkaError as exc:
                raise ServiceUnavailable(
                    f"dead letter for {self.source_topic}:{letter.record.partition}@"
                    f"{letter.record.offset} not delivered: {exc!r}") from exc
        log.info("dead letters sent", extra={"fields": {"count": len(letters),
                                                         "topic": self.topic}})

    def _send_one(self, letter: DeadLetter) -> Any:
        headers = dead_letter_headers(letter, self.source_topic)
        value = letter.record.value
        if len(value) > self.max_value_bytes:
            headers.append(("truncated", str(len(value)).encode()))
            value = value[: self.max_value_bytes]
        return self._producer.send(self.topic, value=value, key=letter.record.key,
                                   headers=headers)

    def close(self) -> None:
        try:
            self._producer.close(timeout=10)
        except Exception as exc:  # closing must not mask the reason we are stopping
            log.warning("closing the dead-letter producer failed",
                        extra={"fields": {"error": repr(exc)}})
