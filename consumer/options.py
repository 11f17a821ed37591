"""Run-time options of one consumer process: the flags of ``rankstream consume``."""

from __future__ import annotations

from dataclasses import dataclass

from consumer.lock import DEFAULT_TTL_MS

__all__ = ["ConsumeOptions"]


@dataclass(frozen=True)
class ConsumeOptions:
    """Run-time options of one consumer process (the CLI flags)."""

    until_caught_up: bool = False
    max_seconds: float | None = None
    lock_ttl_ms: int = DEFAULT_TTL_MS
    bulk_writes: bool = True
    status_interval_s: float = 1.0
    # Between the end of a publication and the start of the next (once caught up):
    # a capped publication takes a few hundred ms of Redis, and any pause here adds
    # directly to the event-to-score latency (while catching up the pause is as long
    # as the last publication, which leaves Redis to the graph half the time).
    min_publish_interval_s: float = 0.05
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    stop_grace_s: float = 30.0
    startup_wait_s: float = 60.0
