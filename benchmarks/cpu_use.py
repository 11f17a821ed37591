"""Where a pipeline run's CPU goes: the consumer under test, Redis and the Kafka broker.

On this 2-core box the three share the cores, so a consumer step that makes Redis or
the broker work harder slows the run as much as one in the consumer itself; the
per-batch phase times alone (the consumer's wait for its commits, say) do not show
whose CPU the time went to.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import psutil


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far (user + system); None where the process cannot be seen."""

    consumer: float
    redis: float | None
    kafka: float | None

    def since(self, earlier: CpuSample) -> dict[str, float | None]:
        def minus(now: float | None, then: float | None) -> float | None:
            return None if now is None or then is None else now - then

        return {"consumer": self.consumer - earlier.consumer,
                "redis": minus(self.redis, earlier.redis),
                "kafka": minus(self.kafka, earlier.kafka)}


def _listener(port: int) -> psutil.Process | None:
    """The local process listening on ``port``, if this user may see it."""
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port \
                    and conn.pid is not None:
                return psutil.Process(conn.pid)
    return None


class CpuMeter:
    """Samples this process (the consumer runs in it), Redis (``INFO cpu``, which any
    server answers) and the broker (by its port; None if remote or not ours)."""

    def __init__(self, client: Any, kafka_bootstrap: str) -> None:
        self._client = client
        port = kafka_bootstrap.split(",")[0].rpartition(":")[2]
        self._kafka = _listener(int(port)) if port.isdigit() else None

    def sample(self) -> CpuSample:
        info = self._client.info("cpu")
        redis = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        kafka = None
        if self._kafka is not None:
            with contextlib.suppress(psutil.Error):
                times = self._kafka.cpu_times()
                kafka = times.user + times.system
        return CpuSample(time.process_time(), redis, kafka)


def cpu_line(used: dict[str, float | None], seconds: float) -> str:
    """``consumer 61.2 s (1.43 cores), redis ...`` for a phase of ``seconds``."""
    parts = []
    for name, value in used.items():
        parts.append(f"{name} n/a" if value is None
                     else f"{name} {value:.1f} s ({value / seconds:.2f} cores)")
    return ", ".join(parts)
