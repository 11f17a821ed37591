"""The publishing side of rankstream: the event schema, URL canonicalisation, the client.

* :mod:`producer.schema` - the versioned event contract (``docs/events.md``):
  :func:`decode_event`, :func:`encode_event`, :func:`event_key`, :func:`iter_events`.
* :mod:`producer.field_checks` - :class:`Limits` and the checks the schema's
  validators run on URLs, link lists, texts and timestamps.
* :mod:`producer.urls` - :func:`canonicalize_url`, the one place URLs are normalised.
* :mod:`producer.client` - :class:`LinkPublisher`, what crawlers call.
* :mod:`producer.synthetic` - a seeded web-like event stream for demos and load.
* :mod:`producer.cli` - ``rankstream produce``.

Kafka is imported only when a :class:`LinkPublisher` is created.
"""

from producer.client import LinkPublisher
from producer.schema import (
    DEFAULT_LIMITS,
    SCHEMA_VERSION,
    Event,
    Limits,
    LinkAddedEvent,
    LinkRemovedEvent,
    PageEvent,
    PageRemovedEvent,
    decode_event,
    encode_event,
    event_key,
    event_source,
    iter_events,
    make_event,
)
from producer.synthetic import synthetic_event_dicts, synthetic_events
from producer.urls import UrlError, canonicalize_url

__all__ = [
    "DEFAULT_LIMITS",
    "SCHEMA_VERSION",
    "Event",
    "Limits",
    "LinkAddedEvent",
    "LinkPublisher",
    "LinkRemovedEvent",
    "PageEvent",
    "PageRemovedEvent",
    "UrlError",
    "canonicalize_url",
    "decode_event",
    "encode_event",
    "event_key",
    "event_source",
    "iter_events",
    "make_event",
    "synthetic_event_dicts",
    "synthetic_events",
]
