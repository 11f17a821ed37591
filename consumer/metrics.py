"""``GET /metrics``: the consumer's health and the scores' freshness for Prometheus.

Rendered from one :func:`consumer.readers.status` snapshot (one MULTI, so the graph's
counters and the scores' meta agree) in Prometheus' text format by prometheus_client,
so a dashboard or an alert rule needs no rankstream code. Nothing is kept in the
server process: every scrape reads Redis, and any number of ``rankstream serve``
replicas report the same figures.

Times are exposed as Unix timestamps, not ages (``time() - rankstream_consumer_
heartbeat_timestamp_seconds > 60`` is the alert), as Prometheus advises: an age is
stale the moment it is scraped. ``P status`` is what the lease holder last wrote; with
no consumer running it stays as the last one left it, so judge it by
``rankstream_consumer_running`` and the heartbeat. An unpublished ranking's bound is
``+Inf``. A status field that does not parse as a number is left out rather than
failing the scrape: its absence shows, and the other figures still arrive. Before
the first batch (no ``P graph``) the graph's counters read 0 and its gauges are
absent.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "render_metrics"]

# The classic text format every Prometheus (and compatible scraper) reads. Newer
# prometheus_client versions name 1.0.0 (UTF-8 metric names, Prometheus 3), which
# older servers may refuse; our names are plain ASCII, so the bodies are the same.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# P status field -> (metric name, help); gauges of the consumer's last heartbeat.
_CONSUMER_GAUGES = {
    "events_per_s": ("rankstream_consumer_events_per_second",
                     "Events consumed per second (recent rate)"),
    "link_changes_per_s": ("rankstream_consumer_link_changes_per_second",
                           "Link changes applied per second (recent rate)"),
    "last_batch_seconds": ("rankstream_consumer_last_batch_seconds",
                           "Wall time of the last batch"),
    "last_refresh_seconds": ("rankstream_consumer_last_refresh_seconds",
                             "Wall time of the last refresh of the rankings"),
    "load_seconds": ("rankstream_consumer_load_seconds",
                     "Time the consumer took to load the graph at start"),
}
# P status field -> (counter name without _total, help); counts of this consumer process.
_CONSUMER_COUNTERS = {
    "events": ("rankstream_consumer_events", "Events consumed by this consumer process"),
    "batches": ("rankstream_consumer_batches", "Batches applied by this consumer process"),
    "retries": ("rankstream_consumer_retries",
                "Retries of Redis or Kafka operations by this consumer process"),
}
_CONSUMER_TIMES = {
    "heartbeat_at": ("rankstream_consumer_heartbeat_timestamp_seconds",
                     "When the consumer last wrote its status"),
    "started_at": ("rankstream_consumer_started_timestamp_seconds",
                   "When the consumer process started"),
    "last_refresh_at": ("rankstream_consumer_last_refresh_timestamp_seconds",
                        "When the rankings were last refreshed"),
}
# P graph field -> (name, help, counter?): the graph as committed, whoever wrote it.
_GRAPH = {
    "version": ("rankstream_graph_events_applied", "Events applied to the graph", True),
    "stale_ignored": ("rankstream_graph_stale_events_ignored",
                      "Events ignored as older than the page's last", True),
    "dlq": ("rankstream_graph_dead_letters", "Invalid events sent to the dead-letter topic",
            True),
    "links": ("rankstream_graph_links", "Links in the graph", False),
    "pages": ("rankstream_graph_pages", "Live pages in the graph", False),
    "ids": ("rankstream_graph_page_ids", "Page ids ever assigned, removed pages included",
            False),
}
# Meta field -> (name, help): one series per algorithm.
_SCORES = {
    "fresh": ("rankstream_scores_fresh",
              "1 if the published scores meet their tolerance, else 0"),
    "published": ("rankstream_scores_published", "1 once scores were published"),
    "bound": ("rankstream_scores_bound",
              "Certified L1 error bound of the published scores (paper scale)"),
    "relative_bound": ("rankstream_scores_relative_bound",
                       "The bound divided by the sum of the scores"),
    "tolerance": ("rankstream_scores_tolerance", "Relative tolerance the scores must meet"),
    # Not _sum: a suffix Prometheus keeps for histograms and summaries (promlint).
    "total": ("rankstream_scores_mass", "Sum of the published scores (paper scale)"),
    "version": ("rankstream_scores_events_applied",
                "Events applied to the graph the published scores reflect"),
    "pages": ("rankstream_scores_pages", "Pages with a published score"),
}

# Figures an unpublished ranking does not have (its bound, +Inf, says what is known).
_PUBLISHED_ONLY = frozenset({"total", "tolerance", "version", "pages"})


def render_metrics(status: dict[str, Any]) -> bytes:
    """The text exposition of ``status`` (:func:`consumer.readers.status`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(status))
    return generate_latest(registry)


class _Snapshot(Collector):
    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        status = self.status
        consumer: dict[str, Any] = status["consumer"]
        running = GaugeMetricFamily("rankstream_consumer_running",
                                    "1 while a consumer holds the lease")
        running.add_metric([], 1.0 if status["running"] else 0.0)
        yield running
        if consumer:
            info = InfoMetricFamily("rankstream_consumer",
                                    "The consumer that last wrote its status")
            info.add_metric([], {name: str(consumer.get(name, ""))
                                 for name in ("state", "host", "pid", "topic")})
            yield info
        for field, (name, text) in _CONSUMER_GAUGES.items():
            yield from _one(GaugeMetricFamily(name, text), _number(consumer.get(field)))
        for field, (name, text) in _CONSUMER_COUNTERS.items():
            yield from _one(CounterMetricFamily(name, text), _number(consumer.get(field)))
        for field, (name, text) in _CONSUMER_TIMES.items():
            yield from _one(GaugeMetricFamily(name, text), _timestamp(consumer.get(field)))
        lag = consumer.get("lag")
        if isinstance(lag, dict) and lag:
            family = GaugeMetricFamily("rankstream_consumer_lag_events",
                                       "Events in Kafka not yet applied, per partition",
                                       labels=["partition"])
            for partition, value in sorted(lag.items()):
                number = _number(value)
                if number is not None:
                    family.add_metric([str(partition)], number)
            yield family
        graph: dict[str, int] = status["graph"]
        for field, (name, text, counter) in _GRAPH.items():
            figure: GaugeMetricFamily | CounterMetricFamily = (
                CounterMetricFamily(name, text) if counter else GaugeMetricFamily(name, text))
            value = _number(graph.get(field))
            if value is None and counter and not graph:
                # No graph yet: nothing applied, nothing dead-lettered. A counter that
                # appeared only with the first batch would hide that batch's dead
                # letters from increase(), which needs a sample before them.
                value = 0.0
            yield from _one(figure, value)
        yield from _scores(status["algorithms"])


def _scores(algorithms: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    for field, (name, text) in _SCORES.items():
        family = GaugeMetricFamily(name, text, labels=["algorithm"])
        for algorithm, meta in sorted(algorithms.items()):
            if field in _PUBLISHED_ONLY and not meta.get("published"):
                continue  # an unpublished meta reads 0 there, which would mislead
            value = meta.get(field)
            number = float(value) if isinstance(value, bool) else _number(value)
            if number is not None:
                family.add_metric([algorithm], number)
        yield family
    refreshed = GaugeMetricFamily("rankstream_scores_refreshed_timestamp_seconds",
                                  "When the published scores were computed",
                                  labels=["algorithm"])
    for algorithm, meta in sorted(algorithms.items()):
        when = _timestamp(meta.get("refreshed_at"))
        if when is not None:
            refreshed.add_metric([algorithm], when)
    yield refreshed


def _one(family: GaugeMetricFamily | CounterMetricFamily, value: float | None
         ) -> Iterator[Metric]:
    if value is not None:
        family.add_metric([], value)
        yield family


def _number(value: Any) -> float | None:
    """A stored figure as a float, or None (absent or not a number: left out)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # an int of 400 digits is no float
        return None
    return None if math.isnan(number) else number


def _timestamp(value: Any) -> float | None:
    """An ISO 8601 time as stored in Redis, as Unix seconds, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    # Naive means UTC, as everywhere in rankstream (the consumer writes an offset).
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
