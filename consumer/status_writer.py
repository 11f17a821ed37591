"""Writing ``P status``, the consumer's health and counters (`rankstream status` reads it).

The write is fenced like every other shared write (a consumer that lost its lease,
and may not know yet, must not overwrite the live one's status): a ``WATCH`` of the
lease, a ``GET``, then ``MULTI``/``HSET``/``EXEC``. Those round trips queue behind
whatever Redis is busy with (a 50k-link graph transaction, a publication's chunks);
on the consumer's main thread that cost up to 0.5 s per heartbeat, 18 s of a 112 s
run on the 1M-page stream. So periodic heartbeats are written from a thread of
their own, and one still in flight makes the next one wait for the following
interval rather than queue up. A state change (``running``, ``waiting``,
``stopped``) is written synchronously, after any periodic write still in flight, so
the last state written is always the newest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import redis

from consumer.lock import ConsumerLock, LockLost, LockNotString

log = logging.getLogger("rankstream.consumer")


class StatusWriter:
    """Heartbeats of one consumer process into its ``P status`` hash."""

    def __init__(self, client: redis.Redis, key: str, lock: ConsumerLock, *,
                 interval_s: float) -> None:
        self.client = client
        self.key = key
        self.lock = lock
        self.interval_s = interval_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="status")
        self._in_flight: Future[None] | None = None
        # Not 0.0: time.monotonic() counts from boot on Linux, so on a machine up for
        # less than interval_s a zero would make the first heartbeat look recent.
        self._last = float("-inf")

    def heartbeat(self, fields: Callable[[], dict[str, str]], *, force: bool = False) -> None:
        """Write ``fields()`` if ``interval_s`` has passed (always if ``force``).

        ``fields`` is called on the caller's thread, and only when a write is due.
        """
        now = time.monotonic()
        in_flight = self._in_flight
        if not force and (now - self._last < self.interval_s
                          or (in_flight is not None and not in_flight.done())):
            return
        self._last = now
        snapshot = fields()
        if force:
            if in_flight is not None:
                in_flight.result()
            self._write(snapshot)
        else:
            self._in_flight = self._executor.submit(self._write, snapshot)

    def close(self) -> None:
        """Wait for a write in flight and stop the thread."""
        self._executor.shutdown(wait=True)

    def _write(self, fields: dict[str, str]) -> None:
        try:
            with self.lock.fenced(), self.client.pipeline(transaction=True) as pipe:
                self.lock.check_in(pipe, self.key)
                pipe.multi()
                pipe.hset(self.key, mapping=fields)  # type: ignore[arg-type]
                pipe.execute()
        except (LockLost, LockNotString, redis.WatchError):
            return  # P status belongs to the lease holder (the loop stops on the lease)
        except redis.RedisError as exc:
            log.warning("status write failed", extra={"fields": {"error": str(exc)[:300]}})
