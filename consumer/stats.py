"""Health and counters of the running consumer, published to ``P status``.

``rankstream status`` (and the HTTP API) read that hash; every value is a string
(JSON for the per-partition maps) so ``redis-cli HGETALL rs:status`` stays readable.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from consumer.graph_write import GraphCounters


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class RateMeter:
    """Events per second over a sliding window of recent batches.

    Thread-safe: the loop thread adds while a writer thread's retry renders the status
    ("deque mutated during iteration" stopped a consumer, a review found)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, count: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._samples.append((now, count))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._samples and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            if not self._samples:
                return 0.0
            # At least one second, so a single fresh sample does not read as a huge rate.
            span = max(now - self._samples[0][0], 1.0)
            return sum(c for _, c in self._samples) / span


def lag_by_partition(ends: Mapping[int, int], positions: Mapping[int, int]) -> dict[int, int]:
    """Messages not yet consumed, per partition (never negative)."""
    return {p: max(0, int(end) - int(positions.get(p, 0))) for p, end in ends.items()}


# A consumer is catching up (scores published at the catching-up pace, refreshes only
# before a publication; consumer.pacing) while at least this many full batches wait
# beyond the one it just polled. A full batch used to count as catching up by itself:
# in the 1M-page stream's latency phase (5k events/s) a restart's first slow refresh
# left 6-7k events waiting, and the consumer then polled a full batch, absorbed it
# unrefreshed and refreshed only the short one after it, cycle after cycle: ~5 s at
# p99 3.2-3.6 s. A bar of 4 batches did worse on an overloaded box (a consumer that
# cannot keep up needs the catching-up pace soon: p99 4.1 and 9.9 s against 2.9 and
# 5.1 s, alternating runs), so one.
CATCHUP_BACKLOG_BATCHES = 1


def catching_up(batch_max: int, ends: Mapping[int, int], positions: Mapping[int, int]) -> bool:
    """Do at least :data:`CATCHUP_BACKLOG_BATCHES` full batches wait beyond ``positions``?

    ``ends``: the log-end offsets the last fetches reported (none known: no backlog).
    Counted from the offsets, not from the batch's size: a poll returns a short batch
    at a fetch-buffer boundary even far behind.
    """
    return sum(lag_by_partition(ends, positions).values()) >= CATCHUP_BACKLOG_BATCHES * batch_max


def seconds_to_catch_up(ends: Mapping[int, int], positions: Mapping[int, int],
                        pace: float) -> float:
    """Seconds until ``positions`` reach ``ends`` at ``pace`` messages/s (inf if the
    pace is not known yet and anything is left)."""
    left = sum(lag_by_partition(ends, positions).values())
    if not left:
        return 0.0
    return left / pace if pace > 0.0 else math.inf


@dataclass
class ConsumerStats:
    """Counters the loop updates; :meth:`status_fields` renders them for Redis."""

    started_at: str = field(default_factory=iso_now)
    pid: int = field(default_factory=os.getpid)
    host: str = field(default_factory=socket.gethostname)
    state: str = "starting"
    batches: int = 0
    events: int = 0  # messages consumed (valid and invalid)
    link_changes: int = 0
    retries: int = 0
    last_batch_seconds: float = 0.0
    last_refresh_at: str = ""
    last_refresh_seconds: float = 0.0
    bound: dict[str, float] = field(default_factory=dict)
    fresh: dict[str, bool] = field(default_factory=dict)
    lag: dict[int, int] = field(default_factory=dict)
    load_seconds: float = 0.0
    events_meter: RateMeter = field(default_factory=RateMeter)
    links_meter: RateMeter = field(default_factory=RateMeter)

    def record_batch(self, messages: int, link_changes: int) -> None:
        """A batch whose graph transaction committed."""
        now = time.monotonic()
        self.batches += 1
        self.events += messages
        self.link_changes += link_changes
        self.events_meter.add(messages, now)
        self.links_meter.add(link_changes, now)

    def status_fields(self, *, topic: str, counters: GraphCounters | None) -> dict[str, str]:
        """The ``P status`` hash (all strings); no counters before the graph is loaded."""
        counters = counters or GraphCounters()
        total_lag = sum(self.lag.values())
        return {
            "state": self.state,
            "pid": str(self.pid),
            "host": self.host,
            "started_at": self.started_at,
            "heartbeat_at": iso_now(),
            "topic": topic,
            "events_per_s": f"{self.events_meter.rate():.1f}",
            "link_changes_per_s": f"{self.links_meter.rate():.1f}",
            "events": str(self.events),
            "batches": str(self.batches),
            "last_batch_seconds": f"{self.last_batch_seconds:.4f}",
            "lag": json.dumps({str(p): v for p, v in sorted(self.lag.items())}),
            "lag_total": str(total_lag),
            "dlq": str(counters.dlq),
            "stale_ignored": str(counters.stale_ignored),
            "version": str(counters.version),
            "retries": str(self.retries),
            "last_refresh_at": self.last_refresh_at,
            "last_refresh_seconds": f"{self.last_refresh_seconds:.4f}",
            "bound": json.dumps(self.bound),
            "fresh": json.dumps({k: int(v) for k, v in self.fresh.items()}),
            "load_seconds": f"{self.load_seconds:.3f}",
        }
