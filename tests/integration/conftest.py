"""Integration tests: every test here runs against the real Kafka broker and redis-server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankstream.settings import Settings

_HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _services_running(services: Settings) -> None:
    """Bring the services up (once per session) before any test in this directory."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Conftest hooks see the whole session's items; mark only the ones under this dir.
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)
