"""Integration tests: every test here runs against the real Kafka broker and redis-server."""

from __future__ import annotations

import pytest

from rankstream.settings import Settings


@pytest.fixture(autouse=True)
def _services_running(services: Settings) -> None:
    """Bring the services up (once per session) before any test in this directory."""
