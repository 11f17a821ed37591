"""Why and when the consumer stops: a signal, ``--max-seconds``, an error, or catching up.

A stop is a request, not an exit: the loop finishes the batch in hand, drains (the
last publication goes out whole and fresh), and shuts down. The request also bounds
every retry still waiting on Redis or Kafka by the stop grace
(:attr:`consumer.recovery.Recovery.stop_requested_at`), so an outage cannot hold a
stopping consumer, and its lease, forever.

Catching up (``--until-caught-up``) is the one reason that can be taken back: a
rebuild in the final drain (Redis went back) can leave the mirror short of the
targets again, and exiting 0 then left those events unread (a review). Every other
reason stands once given.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from consumer.recovery import Recovery

CAUGHT_UP = "caught-up"


class StopRequests:
    """The stop event the consumer's threads watch, and the reason it was set."""

    def __init__(self, recovery: Recovery) -> None:
        self.recovery = recovery
        self.event = threading.Event()
        self.reason = ""  # the first reason given since the event was last cleared
        self._asked = ""  # a reason other than catching up: never taken back

    def request(self, reason: str) -> None:
        if reason != CAUGHT_UP:
            self._asked = reason
        if not self.event.is_set():
            self.reason = reason
            self.recovery.stop_requested_at = time.monotonic()
            self.event.set()

    def withdraw_caught_up(self, still_short: Callable[[], bool]) -> bool:
        """Take back a stop that only catching up asked for, if ``still_short()``;
        returns whether it was taken back."""
        if self.reason != CAUGHT_UP or not still_short() or self._asked:
            return False
        # Reset before the clear: a stop asked after the clear (the --max-seconds
        # timer's thread, a signal) sets its own reason and time, which a reset after
        # it wiped out (a review: the stop stood, with no reason and no grace).
        self.reason = ""
        self.recovery.stop_requested_at = None
        self.event.clear()
        if self._asked:  # asked before the event was cleared: it still wins
            self.request(self._asked)
            return False
        return True

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT ask for a clean stop (exit 0 once drained)."""
        def handler(signum: int, _frame: FrameType | None) -> None:
            self.request(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def deadline(self, max_seconds: float | None) -> threading.Timer | None:
        """Start a timer that asks for a stop after ``max_seconds`` (None: no limit).

        A timer, not a check between steps: a consumer blocked in retries (no broker
        at start, Redis down mid-run) never got back to the loop, and ran on past
        ``--max-seconds``. Infinity, or more than a timer can wait, is no limit.
        """
        if max_seconds is None or max_seconds > threading.TIMEOUT_MAX:
            return None
        timer = threading.Timer(max_seconds, self.request, ("max-seconds",))
        timer.daemon = True
        timer.start()
        return timer
