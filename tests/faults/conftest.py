"""Fault-injection scenarios: marker ``faults``, the dedicated stack, the summary table.

Like ``tests/integration`` every test here may use the shared services (the
``services`` fixture of tests/conftest.py), but the scenarios that restart, kill
or freeze a service run against :func:`fault_stack`: a redis-server and a Kafka
broker of their own, so nothing else in the session notices.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rankstream.settings import Settings
from tests.faults.stack import STACK_DIR_NAME, FaultStack, start_stack, stop_stack
from tests.faults.summary import SUMMARY, summary_lines


@pytest.fixture(autouse=True)
def _services_running(services: Settings) -> None:
    """Bring the shared services up (once per session): the stack reuses Kafka's jars."""


@pytest.fixture(scope="session")
def fault_stack(services: Settings, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[FaultStack]:
    """A redis-server and a Kafka broker on free ports, only for the fault scenarios."""
    stack = start_stack(services, tmp_path_factory.mktemp(STACK_DIR_NAME))
    try:
        yield stack
    finally:
        stop_stack(stack)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    if not SUMMARY:
        return
    terminalreporter.section("fault-injection summary")
    for line in summary_lines(SUMMARY):
        terminalreporter.write_line(line)
