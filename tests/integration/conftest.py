"""Integration tests: every test here runs against the real Kafka broker and redis-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rankstream.services.kafka import delete_topics
from rankstream.services.stack import ensure_settings_topics, kafka_client_options
from rankstream.services.testing import Isolated
from rankstream.settings import Settings


@pytest.fixture(autouse=True)
def _services_running(services: Settings) -> None:
    """Bring the services up (once per session) before any test in this directory."""


@pytest.fixture
def one_partition(isolated: Isolated) -> Iterator[Settings]:
    """The test's settings on a single-partition topic: the log order is total."""
    settings = isolated.settings.model_copy(update={
        "topic": f"{isolated.topic}.p1", "dlq_topic": f"{isolated.topic}.p1.dlq",
        "topic_partitions": 1})
    options = kafka_client_options(settings)
    ensure_settings_topics(settings)
    try:
        yield settings
    finally:
        delete_topics(settings.kafka_bootstrap, [settings.topic, settings.dlq_topic], **options)
