"""The load side of bench_pipeline: the encoded event stream and the producers that publish it.

Kept apart from the measuring code: the pre-fill of phase 1 (``produce_all``) and
the paced, low-CPU load producer of the latency phase (``LoadProducer``) share the
stream encoding and the send-time ``ts`` stamping, and none of it measures anything.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Sequence
from typing import Any

from producer.synthetic import synthetic_event_dicts, with_text
from rankstream.services.stack import kafka_client_options
from rankstream.settings import Settings


def encode_stream(count: int, seed: int, *, texts: bool = False
                  ) -> list[tuple[bytes, bytes, int]]:
    """(key, JSON without ts, link count) per event; ts is stamped at send time.
    ``texts``: page events carry titles and anchor texts (:func:`with_text`)."""
    out = []
    pick = random.Random(seed)
    for event in synthetic_event_dicts(count, seed=seed, edit_fraction=0.0):
        if event["type"] != "page":  # the generator edits once every page is crawled
            continue
        if texts:
            event = with_text(event, pick)
        event.pop("ts", None)
        body = json.dumps(event, separators=(",", ":")).encode()
        out.append((event["url"].encode(), body, len(event["links"])))
    return out


def producer_for(settings: Settings) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks=1, linger_ms=5,
                         batch_size=512 * 1024, max_request_size=4 * 1024 * 1024,
                         **kafka_client_options(settings))


class LoadProducer:
    """The latency phase's event source; it records ``(ts_ms, partition, offset)`` per event.

    It runs on the box under test, so it uses librdkafka (confluent-kafka) when it
    is installed and the broker is plaintext: a kafka-python producer spent 0.45-0.6
    of a core on 5k events/s here, CPU the consumer, Kafka and Redis need. Keys go
    to the partitions kafka-python would choose (Java's murmur2 partitioner).
    """

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topic
        self.sent: list[tuple[int, int, int]] = []
        self.errors: list[str] = []
        self._futures: list[tuple[int, Any]] = []
        producer_class: Any = None
        with contextlib.suppress(ImportError):  # a dev dependency: fall back without it
            from confluent_kafka import Producer as producer_class
        if producer_class is not None and settings.kafka_security_protocol == "PLAINTEXT":
            self.kind = "confluent-kafka"
            self._rd: Any = producer_class({
                "bootstrap.servers": settings.kafka_bootstrap, "acks": 1, "linger.ms": 5,
                "partitioner": "murmur2_random", "queue.buffering.max.messages": 1_000_000})
            self._kp: Any = None
        else:
            self.kind = "kafka-python"
            self._rd = None
            self._kp = producer_for(settings)

    def send(self, key: bytes, value: bytes, ts: int) -> None:
        if self._rd is None:
            self._futures.append((ts, self._kp.send(self.topic, value, key=key)))
            return

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.sent.append((ts, msg.partition(), msg.offset()))

        self._rd.produce(self.topic, value, key, on_delivery=delivered)

    def serve(self) -> None:
        """Run delivery callbacks (between ticks)."""
        if self._rd is not None:
            self._rd.poll(0)

    def finish(self) -> list[tuple[int, int, int]]:
        """Flush; every event's ``(ts_ms, partition, offset)``, or SystemExit."""
        if self._rd is not None:
            if self._rd.flush(60) or self.errors:
                raise SystemExit(f"the load producer could not deliver: {self.errors[:1]}")
            return self.sent
        self._kp.flush()
        self._kp.close()
        return [(ts, meta.partition, meta.offset)
                for ts, meta in ((ts, future.get(timeout=60)) for ts, future in self._futures)]


def with_ts(body: bytes, ts_ms: int) -> bytes:
    return body[:-1] + b',"ts":' + str(ts_ms).encode() + b"}"


def produce_all(settings: Settings, stream: Sequence[tuple[bytes, bytes, int]]) -> float:
    producer = producer_for(settings)
    started = time.perf_counter()
    now = int(time.time() * 1000)
    for key, body, _ in stream:
        producer.send(settings.topic, with_ts(body, now), key=key)
    producer.flush()
    producer.close()
    return time.perf_counter() - started
