"""Helpers for tests that run against the real services (used by the pytest conftests).

Kept in the package, not in a conftest, so test modules can import the types and
both ``tests/integration`` and ``tests/faults`` share one implementation.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis as redis_py

from rankstream.services.kafka import delete_topics
from rankstream.services.stack import ensure_settings_topics, kafka_client_options
from rankstream.settings import Settings


@dataclass(frozen=True)
class Isolated:
    """Names private to one test: its own topics and Redis key prefix.

    ``settings`` is the session settings with ``topic``, ``dlq_topic`` and
    ``key_prefix`` replaced, ready to hand to a producer or a consumer.
    """

    settings: Settings
    topic: str
    dlq_topic: str
    key_prefix: str


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:60].strip("-") or "test"


def redis_client(settings: Settings) -> redis_py.Redis:
    """A redis-py client for ``settings.redis_url`` with the configured credentials."""
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    return redis_py.Redis.from_url(settings.redis_url, username=settings.redis_username,
                                   password=password)


def delete_keys(settings: Settings, prefix: str) -> int:
    """Unlink every key under ``prefix``; returns how many."""
    client = redis_client(settings)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.unlink(*keys[start : start + 1000])
        return len(keys)
    finally:
        client.close()


@contextlib.contextmanager
def isolated(settings: Settings, name: str) -> Iterator[Isolated]:
    """Fresh topics (created now, deleted after) and a Redis prefix (wiped after)."""
    token = uuid.uuid4().hex[:10]
    topic = f"test.{_slug(name)}.{token}"
    # Restart snapshots too: a test's consumers leave theirs in a directory of its own,
    # not in the user's cache.
    snapshots = Path(tempfile.mkdtemp(prefix="rankstream-snapshots-"))
    own = settings.model_copy(
        update={"topic": topic, "dlq_topic": f"{topic}.dlq", "key_prefix": f"test:{token}:",
                "snapshot_dir": snapshots}
    )
    options = kafka_client_options(own)
    ensure_settings_topics(own)
    try:
        yield Isolated(own, own.topic, own.dlq_topic, own.key_prefix)
    finally:
        delete_topics(own.kafka_bootstrap, [own.topic, own.dlq_topic], **options)
        delete_keys(own, own.key_prefix)
        shutil.rmtree(snapshots, ignore_errors=True)
