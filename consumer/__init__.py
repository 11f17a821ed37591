"""The streaming service: Kafka events in, Redis graph and live scores out.

Public API:

* :class:`ConsumerService` / :func:`run_consumer` with :class:`ConsumeOptions`:
  the ``rankstream consume`` loop (consumer/service.py, consumer/options.py);
* readers of the public Redis layout (docs/redis-keys.md): :func:`top`,
  :func:`top_with_meta` (the rows and their publication's meta, read together),
  :func:`score`, :func:`score_with_meta`, :func:`status`, :func:`meta`;
* :class:`Keys`: every key name under a prefix; :func:`connect_redis`: a redis-py
  client built from settings.
"""

from consumer.keys import ALGORITHMS, Keys
from consumer.options import ConsumeOptions
from consumer.readers import Meta, meta, score, score_with_meta, status, top, top_with_meta
from consumer.redis_store import connect_redis
from consumer.service import ConsumerService, run_consumer

__all__ = [
    "ALGORITHMS",
    "ConsumeOptions",
    "ConsumerService",
    "Keys",
    "Meta",
    "connect_redis",
    "meta",
    "run_consumer",
    "score",
    "score_with_meta",
    "status",
    "top",
    "top_with_meta",
]
