"""Fixtures shared by every test directory that needs the real services.

``tests/integration`` and ``tests/faults`` turn :func:`services` on for all their
tests with an autouse fixture in their own conftest; unit tests never touch it.
There is no opt-in flag: CI runs everything, and the services start on demand.
The tests under ``tests/integration``, ``tests/faults`` and ``tests/soak`` carry the
marker named after their directory (for ``-m``), set by one hook here.
"""

from __future__ import annotations

import gc
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from rankstream.services import up
from rankstream.services.testing import Isolated
from rankstream.services.testing import isolated as isolate
from rankstream.settings import Settings, load_settings

# CI must not turn red on a slow moment of a shared box (a deadline) or on an example
# no earlier run tried: property tests run derandomized by default. To search for new
# examples: pytest --hypothesis-profile explore.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, database=None,
                                     print_blob=True)
hypothesis_settings.register_profile("explore", deadline=None)
hypothesis_settings.load_profile("ci")

_TESTS = Path(__file__).parent
# The tests under each of these directories carry the marker of the same name.
MARKED_DIRECTORIES = ("integration", "faults", "soak")


@pytest.fixture(autouse=True)
def _interpreter_settings_restored() -> Iterator[None]:
    """An in-process consumer tunes the whole interpreter (consumer.cpython_tuning:
    gc.freeze, the collector threshold, the GIL switch interval); put it back after
    each test, so later tests do not run differently depending on their order."""
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)
    sys.setswitchinterval(interval)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (CI's time limit in .ci/run, a cancelled job) would end Python at once,
    # without teardown, and leave the fault scenarios' own Kafka and Redis running.
    # As an interrupt pytest stops, tears every fixture down, then exits.
    signal.signal(signal.SIGTERM, _interrupted)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = Path(item.path).relative_to(_TESTS).parts[0]
        except ValueError:  # not under tests/
            continue
        if top in MARKED_DIRECTORIES:
            item.add_marker(getattr(pytest.mark, top))


@pytest.fixture(scope="session")
def services() -> Settings:
    """Kafka and Redis answering at the configured addresses; returns the settings.

    Calls the same idempotent ``up`` as ``./run services up``, so a run started by
    ./run (which already brought them up) pays well under a second here.

    It deliberately does not stop them at the end: ./run owns their lifetime, a
    developer's running services (or the user's own, reused ones) must survive a
    test run, and restarting a broker for every pytest run would cost seconds.
    """
    settings = load_settings()
    up(settings, timeout=180.0)
    return settings


@pytest.fixture
def isolated(services: Settings, request: pytest.FixtureRequest) -> Iterator[Isolated]:
    """Per-test topics (created, then deleted) and Redis key prefix (wiped after)."""
    with isolate(services, request.node.name) as names:
        yield names
