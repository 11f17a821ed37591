"""``rankstream consume``'s command layer: how a crash reaches the JSON log."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator

import pytest

from consumer.commands import consume
from rankstream.errors import ServiceUnavailable
from rankstream.settings import Settings


@pytest.fixture
def records(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[logging.LogRecord]]:
    """What the consumer logs (its JSON handler, which does not propagate, stays off)."""
    caught: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record)

    handler = Catch()
    logger = logging.getLogger("rankstream.consumer")
    logger.addHandler(handler)
    monkeypatch.setattr(consume, "setup_json_logging", lambda level: None)
    yield caught
    logger.removeHandler(handler)


def args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    consume.add_arguments(parser)
    return parser.parse_args([])


def test_a_crash_is_logged_with_its_traceback_and_raised(
        monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord]) -> None:
    def crash(*_: object) -> int:
        raise IndexError("index 718 is out of bounds for axis 0 with size 715")

    monkeypatch.setattr(consume, "run_consumer", crash)
    with pytest.raises(IndexError):
        consume.run(args(), Settings())
    [record] = records
    assert record.getMessage() == "consumer crashed" and record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[0] is IndexError


def test_a_failed_service_is_not_a_crash(monkeypatch: pytest.MonkeyPatch,
                                         records: list[logging.LogRecord]) -> None:
    def unavailable(*_: object) -> int:
        raise ServiceUnavailable("redis at 127.0.0.1:6379 refused the connection")

    monkeypatch.setattr(consume, "run_consumer", unavailable)
    with pytest.raises(ServiceUnavailable):
        consume.run(args(), Settings())
    assert not records
