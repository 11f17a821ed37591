"""The publishing client crawlers call: validated events, keyed, batched, confirmed.

    with LinkPublisher("127.0.0.1:9092", "rankstream.links") as publisher:
        publisher.publish_page("https://example.org/", ["https://example.org/about"])
        publisher.publish_page_removed("https://example.org/old")
    # leaving the block flushes: every event is acknowledged by the broker, or
    # ServiceError says how many were not and why.

Every event is validated and canonicalised with :mod:`producer.schema` before it is
sent, so a bad URL is an :class:`~rankstream.errors.InputError` raised at the call
site, not a dead letter later. Messages are keyed by the SOURCE url (page url or link
src), so all events of one page land in one partition, in the order published.

Delivery is confirmed, never assumed: ``acks="all"`` and the idempotent producer
(retries cannot duplicate or reorder a partition's messages). A failed delivery is
recorded by the future's errback and raised as :class:`~rankstream.errors.ServiceError`
by the next ``publish_*``, ``flush()`` or ``close()``; none is swallowed. As with any
Kafka producer, an event that timed out is unconfirmed, not known to be lost: the
broker may have written it.

kafka-python 2.3's idempotent producer has one way to ignore its delivery timeout
(session 37's review): when a batch it had sent expires during an outage, its I/O
thread waits for a new producer id until the broker is back, expiring nothing and
deaf to ``close``. ``flush()`` is therefore bounded by the delivery and request
timeouts, and ``close()`` says when that thread could not be stopped, since it then
delivers the unconfirmed events once the broker returns. (``idempotent=False`` has
no such state, at the price of a retried batch possibly written twice; the consumer
applies a repeated event idempotently, but counts it twice.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from producer.schema import DEFAULT_LIMITS, Event, Limits, encode_event, event_key, make_event
from rankstream.errors import ConfigError, InputError, ServiceError, ServiceUnavailable

__all__ = ["LinkPublisher"]

Timestamp = int | str | datetime
Link = str | Mapping[str, str]


def check_topic_name(topic: object) -> None:
    """ConfigError unless Kafka accepts ``topic`` as a name (found only by the first
    send otherwise)."""
    from kafka.util import ensure_valid_topic_name

    try:
        ensure_valid_topic_name(topic)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad topic name: {exc}") from exc


class LinkPublisher:
    """Publishes link events to one Kafka topic. Not thread-safe; use one per thread."""

    def __init__(
        self,
        bootstrap: str | Sequence[str],
        topic: str,
        *,
        limits: Limits = DEFAULT_LIMITS,
        security: Mapping[str, Any] | None = None,
        client_id: str = "rankstream-producer",
        linger_ms: int = 20,
        batch_size: int = 256 * 1024,
        compression_type: str | None = None,
        delivery_timeout_ms: int = 30_000,
        max_block_ms: int = 10_000,
        request_timeout_ms: int = 10_000,
        idempotent: bool = True,
    ) -> None:
        """Connect a producer.

        Args:
            bootstrap: ``"host:port[,host:port]"`` or a list of addresses.
            topic: the event topic.
            limits: the input limits events are validated against (use the consumer's).
            security: kafka-python security keywords (``security_protocol``,
                ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``,
                ``ssl_cafile``, ...), as built by
                :func:`rankstream.services.stack.kafka_client_options`.
            linger_ms, batch_size: batching; 20 ms and 256 KiB trade a little latency
                for far fewer requests.
            compression_type: None (default: CPU is the scarce resource on one box),
                ``"gzip"``, or any codec kafka-python has installed.
            delivery_timeout_ms: how long a message may wait for its acknowledgement,
                retries included, before it counts as failed.
            max_block_ms: how long ``publish_*`` may block for metadata (for example a
                missing topic: topics are not auto-created). kafka-python 2.3 has no
                bounded buffer: while the broker is slow, unacknowledged events queue
                in memory until ``delivery_timeout_ms`` fails them; call
                :meth:`flush` now and then for back-pressure.
            idempotent: idempotent producer (needs ``acks="all"``, which we always use).
        """
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        if isinstance(bootstrap, str):
            servers = [part.strip() for part in bootstrap.split(",") if part.strip()]
        else:
            servers = list(bootstrap)
        self.topic = topic
        self.limits = limits
        self.sent = 0
        self.delivered = 0
        self._failures: list[BaseException] = []  # not reported to the caller yet (a sample)
        self._unreported = 0
        self._failed_total = 0
        self._lock = threading.Lock()
        self._closed = False
        # The longest kafka-python itself should need to settle every event sent: a
        # batch expires delivery_timeout_ms after it was created, and a request in
        # flight then may take request_timeout_ms more to fail.
        self._flush_bound = (delivery_timeout_ms + request_timeout_ms) / 1000 + 5.0
        check_topic_name(topic)
        try:
            self._producer = KafkaProducer(
                bootstrap_servers=servers,
                client_id=client_id,
                acks="all",
                enable_idempotence=idempotent,
                # One request in flight per broker: kafka-python's idempotent producer
                # requires it, and without idempotence it is what keeps retries from
                # reordering one key's events (the default is 5).
                max_in_flight_requests_per_connection=1,
                linger_ms=linger_ms,
                batch_size=batch_size,
                compression_type=compression_type,
                delivery_timeout_ms=delivery_timeout_ms,
                request_timeout_ms=request_timeout_ms,
                max_block_ms=max_block_ms,
                max_request_size=max(limits.max_message_bytes + 64 * 1024, 1_048_576),
                **dict(security or {}),
            )
        except KafkaError as exc:
            raise ServiceUnavailable(f"cannot connect a producer to {servers}: {exc!r}") from exc
        except (OSError, ValueError, TypeError, AssertionError) as exc:
            # AssertionError: kafka-python's word for an unknown option ("security"
            # holding a misspelt key), which would otherwise escape our error root.
            raise ServiceError(f"cannot create a producer for {servers}: {exc}") from exc

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> LinkPublisher:
        """A publisher for ``settings.topic`` with the settings' limits and security."""
        from rankstream.services.stack import kafka_client_options

        options: dict[str, Any] = {
            "limits": Limits.from_settings(settings),
            "security": kafka_client_options(settings),
        }
        options.update(overrides)
        topic = options.pop("topic", settings.topic)
        return cls(settings.kafka_bootstrap, topic, **options)

    # --- publishing ---------------------------------------------------------------

    def publish_page(
        self,
        url: str,
        links: Sequence[Link],
        title: str | None = None,
        ts: Timestamp | None = None,
    ) -> None:
        """The full current out-link set of ``url``; each link a URL or {"url", "text"}."""
        if isinstance(links, str | bytes | dict) or not isinstance(links, Iterable):
            raise InputError("wrong type: links: expected a sequence of links",
                             where="links")
        data: dict[str, Any] = {"type": "page", "url": url, "links": list(links)}
        if title is not None:
            data["title"] = title
        self._publish_dict(data, ts)

    def publish_link_added(self, src: str, dst: str, ts: Timestamp | None = None) -> None:
        """One new link ``src -> dst``."""
        self._publish_dict({"type": "link_added", "src": src, "dst": dst}, ts)

    def publish_link_removed(self, src: str, dst: str, ts: Timestamp | None = None) -> None:
        """One link ``src -> dst`` gone."""
        self._publish_dict({"type": "link_removed", "src": src, "dst": dst}, ts)

    def publish_page_removed(self, url: str, ts: Timestamp | None = None) -> None:
        """The page is gone, with its in- and out-links."""
        self._publish_dict({"type": "page_removed", "url": url}, ts)

    def publish_event(self, event: Event) -> None:
        """An already validated event (from :func:`producer.schema.decode_event`).

        Raises :class:`InputError`, sending nothing, if its encoding exceeds
        ``limits.max_message_bytes``: the consumer would only dead-letter it (a long
        title or anchor texts can get there with few links).
        """
        value = encode_event(event)
        if len(value) > self.limits.max_message_bytes:
            raise InputError(f"message too large: {len(value)} > "
                             f"{self.limits.max_message_bytes} bytes")
        self.publish_raw(value, event_key(event))

    def publish_raw(self, value: bytes | None, key: bytes | None = None) -> None:
        """Bytes as they are, unvalidated: for replaying logs and injecting bad input
        (``None``: a tombstone, which needs a key). Wrong types are InputErrors."""
        from kafka.errors import KafkaError

        if value is not None and not isinstance(value, bytes | bytearray | memoryview):
            raise InputError(f"a message value is bytes or None, got {type(value).__name__}")
        if key is not None and not isinstance(key, bytes | bytearray | memoryview):
            raise InputError(f"a message key is bytes or None, got {type(key).__name__}")
        if value is None and key is None:  # kafka-python asserts on it
            raise InputError("a tombstone (no value) needs a key")
        self._raise_failures(unsent=True)
        if self._closed:
            raise ServiceError("publisher is closed")
        try:
            future = self._producer.send(self.topic, value=value, key=key)
        except KafkaError as exc:
            raise ServiceError(f"cannot send to {self.topic}: {exc!r}") from exc
        self.sent += 1
        future.add_callback(self._on_delivered)
        future.add_errback(self._on_failed)

    def _publish_dict(self, data: dict[str, Any], ts: Timestamp | None) -> None:
        if ts is not None:
            data["ts"] = ts.isoformat() if isinstance(ts, datetime) else ts
        self.publish_event(make_event(data, self.limits))

    # --- delivery reports (called on kafka-python's I/O thread) --------------------

    def _on_delivered(self, _metadata: object) -> None:
        with self._lock:
            self.delivered += 1

    def _on_failed(self, exc: BaseException) -> None:
        with self._lock:
            self._failed_total += 1
            self._unreported += 1
            if len(self._failures) < 100:  # keep a sample, count them all
                self._failures.append(exc)

    @property
    def failed(self) -> int:
        """Events whose delivery failed (reported or not yet reported)."""
        with self._lock:
            return self._failed_total

    def _raise_failures(self, *, unsent: bool = False) -> None:
        """Report the delivery failures not reported yet; ``unsent``: raised instead of
        sending the caller's event, which the message then says."""
        with self._lock:
            if not self._failures:
                return
            first, count = self._failures[0], self._unreported
            self._failures = []
            self._unreported = 0
        which, also = ("earlier ", "; this event was not sent either") if unsent else ("", "")
        raise ServiceError(
            f"{count} {which}event(s) not delivered to {self.topic}: {first!r}{also}"
        ) from first

    # --- lifecycle ----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every event sent so far is acknowledged; raise on any failure.

        ``timeout`` None: as long as the delivery timeout allows (see the module's doc).
        """
        from kafka.errors import KafkaError

        if not self._closed:
            try:
                self._producer.flush(timeout=self._flush_bound if timeout is None else timeout)
            except KafkaError as exc:
                pending = self.sent - self.delivered - self.failed
                raise ServiceError(
                    f"flush of {self.topic} timed out with {pending} event(s) unconfirmed: "
                    f"{exc!r}"
                ) from exc
        self._raise_failures()

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, then release the connection; delivery failures are raised after."""
        from kafka.errors import KafkaError

        if self._closed:
            self._raise_failures()
            return
        flushed = False
        try:
            self.flush(timeout)
            flushed = True
        finally:
            self._closed = True
            try:
                self._producer.close(timeout=0 if timeout is None else min(timeout, 5.0))
            except KafkaError as exc:
                # kafka-python's close flushes again, and raises while events are still
                # unconfirmed, before it stops its I/O thread: that thread and its
                # sockets would live on (one more per outage in a long-running
                # crawler), and could still deliver events the caller had re-sent
                # through a new publisher. Stop it here (a private attribute of
                # kafka-python 2.x, which has no public way). After a failed flush, the
                # flush's ServiceError (which counts the events) is the one that
                # propagates.
                sender = getattr(self._producer, "_sender", None)
                if sender is not None and sender.is_alive():
                    sender.force_close()
                    sender.join(1.0)
                    if sender.is_alive():  # waiting for a producer id: see the module
                        self._stuck_warning()
                if flushed:
                    raise ServiceError(f"closing the producer of {self.topic}: {exc!r}"
                                       ) from exc

    def _stuck_warning(self) -> None:
        import logging

        logging.getLogger(__name__).warning(
            "the producer of %s could not be stopped: kafka-python's I/O thread waits for "
            "the broker and will deliver the %d unconfirmed event(s) when it is back; "
            "re-sending them through a new publisher may write them twice",
            self.topic, self.sent - self.delivered - self.failed)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # The body's exception stays the one raised; delivery trouble becomes a note.
        try:
            self.close()
        except ServiceError as delivery:
            exc.add_note(f"also, on close: {delivery}")
