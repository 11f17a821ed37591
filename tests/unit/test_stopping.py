"""consumer.stopping: stop requests, their reasons and the grace they start."""

from __future__ import annotations

import os
import signal
import threading
from types import SimpleNamespace

import pytest


def _stops():
    from consumer.stopping import StopRequests
    return StopRequests(SimpleNamespace(stop_requested_at=None))


def test_a_signal_before_the_withdrawal_keeps_the_first_stop_as_it_was() -> None:  # S3
    from consumer.stopping import CAUGHT_UP
    stops = _stops()
    stops.request(CAUGHT_UP)
    asked_at = stops.recovery.stop_requested_at
    stops.request("SIGTERM")
    assert stops.withdraw_caught_up(lambda: True) is False
    assert stops.event.is_set() and stops.reason == CAUGHT_UP
    assert stops.recovery.stop_requested_at == asked_at  # the grace is not restarted


def test_a_stop_asked_while_a_caught_up_stop_is_withdrawn_wins() -> None:  # S4
    from consumer.stopping import CAUGHT_UP
    stops = _stops()

    class TimerFiresFirst(threading.Event):
        def clear(self) -> None:
            stops.request("max-seconds")  # lands after the check, before the clear
            super().clear()

    stops.event = TimerFiresFirst()
    stops.request(CAUGHT_UP)
    assert stops.withdraw_caught_up(lambda: True) is False
    assert stops.event.is_set() and stops.reason == "max-seconds"
    assert stops.recovery.stop_requested_at is not None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_ask_for_a_clean_stop(signum) -> None:  # S7
    stops = _stops()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stops.install_signal_handlers()
        # Checked before sending: without a handler SIGINT would interrupt the run itself.
        assert signal.getsignal(signum) not in (signal.SIG_DFL, signal.default_int_handler,
                                                before[signum])
        os.kill(os.getpid(), signum)
        assert stops.event.wait(5)
        assert stops.reason == signal.Signals(signum).name
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_a_stop_asked_just_after_the_clear_keeps_its_reason_and_grace() -> None:
    """The --max-seconds timer firing between the withdrawal's clear and its resets:
    the stop stood with no reason and no stop time, so retries lost the grace (a
    review; the resets now come before the clear)."""
    from consumer.stopping import CAUGHT_UP
    stops = _stops()

    class TimerFiresAfterTheClear(threading.Event):
        def clear(self) -> None:
            super().clear()
            stops.request("max-seconds")

    stops.event = TimerFiresAfterTheClear()
    stops.request(CAUGHT_UP)
    assert stops.withdraw_caught_up(lambda: True) is False
    assert stops.event.is_set() and stops.reason == "max-seconds"
    assert stops.recovery.stop_requested_at is not None
