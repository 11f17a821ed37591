"""GET /metrics's body: consumer.metrics renders a status snapshot for Prometheus."""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from consumer.metrics import render_metrics
from consumer.readers import Meta


def _samples(status: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = render_metrics(status).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _meta(**overrides: Any) -> dict[str, Any]:
    meta = {"algorithm": "pagerank", "published": True, "total": 530.0, "bound": 4.7e-4,
            "relative_bound": 8.9e-7, "tolerance": 1e-6, "fresh": True, "version": 1590,
            "refreshed_at": "2026-11-28T04:52:47.630+00:00", "offsets": {}, "damping": 0.85,
            "scale": "paper", "pages": 530}
    return {**meta, **overrides}


def _status() -> dict[str, Any]:
    return {
        "prefix": "rs:",
        "consumer": {"state": "running", "pid": "7747", "host": "vm",
                     "topic": "rankstream.links", "events_per_s": "530.0", "events": "530",
                     "batches": "3", "retries": "2", "last_batch_seconds": "0.0661",
                     "heartbeat_at": "2026-11-28T04:52:47.645+00:00",
                     "started_at": "2026-11-28T04:52:47.219+00:00",
                     "lag": {"0": 0, "1": 12}, "lag_total": "12"},
        "running": True,
        "lock": {"pid": 7747, "host": "vm"},
        "graph": {"version": 1590, "links": 16014, "pages": 530, "ids": 531, "dlq": 4,
                  "stale_ignored": 2},
        "offsets": {},
        "algorithms": {"pagerank": _meta(),
                       "wpr": Meta("wpr", published=False).as_dict()},
    }


def test_the_status_snapshot_as_prometheus_series() -> None:
    samples = _samples(_status())
    assert samples[("rankstream_consumer_running", ())] == 1.0
    assert samples[("rankstream_consumer_info", (("host", "vm"), ("pid", "7747"),
                                                 ("state", "running"),
                                                 ("topic", "rankstream.links")))] == 1.0
    assert samples[("rankstream_consumer_events_total", ())] == 530
    assert samples[("rankstream_consumer_retries_total", ())] == 2
    assert samples[("rankstream_consumer_lag_events", (("partition", "1"),))] == 12
    assert samples[("rankstream_consumer_lag_events", (("partition", "0"),))] == 0
    # Timestamps, not ages: an age is stale the moment it is scraped.
    assert samples[("rankstream_consumer_heartbeat_timestamp_seconds", ())] == 1795841567.645
    assert samples[("rankstream_graph_events_applied_total", ())] == 1590
    assert samples[("rankstream_graph_dead_letters_total", ())] == 4
    assert samples[("rankstream_graph_page_ids", ())] == 531
    pagerank = (("algorithm", "pagerank"),)
    assert samples[("rankstream_scores_fresh", pagerank)] == 1.0
    assert samples[("rankstream_scores_bound", pagerank)] == 4.7e-4
    assert samples[("rankstream_scores_events_applied", pagerank)] == 1590
    assert samples[("rankstream_scores_refreshed_timestamp_seconds", pagerank)] == \
        1795841567.63
    assert samples[("rankstream_scores_mass", pagerank)] == 530.0
    assert samples[("rankstream_scores_tolerance", pagerank)] == 1e-6
    # An unpublished ranking (the meta the readers give it): not fresh, an infinite
    # bound, and none of the figures it does not have (its meta reads 0 there).
    wpr = (("algorithm", "wpr"),)
    assert samples[("rankstream_scores_published", wpr)] == 0.0
    assert samples[("rankstream_scores_fresh", wpr)] == 0.0
    assert samples[("rankstream_scores_bound", wpr)] == math.inf
    for name in ("mass", "tolerance", "events_applied", "pages", "refreshed_timestamp_seconds"):
        assert (f"rankstream_scores_{name}", wpr) not in samples


def test_no_consumer_yet_and_figures_that_do_not_parse_are_left_out() -> None:
    status = _status()
    status["running"] = False
    status["consumer"] = {}
    status["graph"] = {}
    samples = _samples(status)
    assert samples[("rankstream_consumer_running", ())] == 0.0
    assert not any(name.startswith("rankstream_consumer_info") for name, _ in samples)
    # No graph yet: its counters read 0, so that increase() sees the first batch's
    # dead letters; its size is not known, so its gauges are left out.
    graph = {name: value for (name, _), value in samples.items()
             if name.startswith("rankstream_graph_")}
    assert graph == {"rankstream_graph_events_applied_total": 0.0,
                     "rankstream_graph_stale_events_ignored_total": 0.0,
                     "rankstream_graph_dead_letters_total": 0.0}

    status = _status()
    status["consumer"].update(events_per_s="fast", heartbeat_at="yesterday", retries="nan",
                              lag="not json")
    status["graph"]["links"] = 10**400  # a hand-written HSET: no float holds it
    status["graph"]["dlq"] = "many"  # left out, not read as 0: the graph exists
    status["consumer"]["state"] = 'odd "state"\nwith a newline'
    samples = _samples(status)  # still parses: label values are escaped
    assert ("rankstream_consumer_events_per_second", ()) not in samples
    assert ("rankstream_consumer_heartbeat_timestamp_seconds", ()) not in samples
    assert ("rankstream_consumer_retries_total", ()) not in samples
    assert not any(name == "rankstream_consumer_lag_events" for name, _ in samples)
    assert ("rankstream_graph_links", ()) not in samples
    assert ("rankstream_graph_dead_letters_total", ()) not in samples
    assert samples[("rankstream_consumer_events_total", ())] == 530  # the rest arrives
    info = [labels for name, labels in samples if name == "rankstream_consumer_info"]
    assert dict(info[0])["state"] == 'odd "state"\nwith a newline'


def test_the_documented_alert_rules_name_metrics_that_exist() -> None:
    """docs/monitoring.md's rules (checked with promtool when written) must keep
    naming series /metrics serves: a renamed metric would silence an alert."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text()
    rules = doc[doc.index("```yaml\n"):doc.index("```\n", doc.index("```yaml\n") + 8)]
    named = set(re.findall(r"\b(rankstream_[a-z_]+)", rules.split("rules:", 1)[1]))
    served = {name for name, _ in _samples(_status())}
    assert named and named <= served, named - served


def _status_from_a_real_consumer() -> dict:
    from consumer.readers import ALGORITHMS, _status_dict
    from consumer.stats import ConsumerStats
    stats = ConsumerStats(state="running", lag={0: 3, 1: 4}, load_seconds=1.5,
                          last_refresh_at="2026-11-28T04:52:47.630+00:00",
                          last_refresh_seconds=0.25, last_batch_seconds=0.5)
    fields = stats.status_fields(topic="t", counters=None)
    return _status_dict("rs:", [fields, {}, {}, None, *({} for _ in ALGORITHMS)])


def test_every_consumer_figure_the_status_writer_stores_is_exposed() -> None:  # M10
    from prometheus_client.parser import text_string_to_metric_families

    from consumer.metrics import (
        _CONSUMER_COUNTERS,
        _CONSUMER_GAUGES,
        _CONSUMER_TIMES,
        render_metrics,
    )
    names = {sample.name for family in text_string_to_metric_families(
        render_metrics(_status_from_a_real_consumer()).decode()) for sample in family.samples}
    expected = {name for name, _ in _CONSUMER_GAUGES.values()}
    expected |= {f"{name}_total" for name, _ in _CONSUMER_COUNTERS.values()}
    expected |= {name for name, _ in _CONSUMER_TIMES.values()}
    assert expected <= names, expected - names
    assert "rankstream_consumer_lag_events" in names


def test_a_lag_figure_that_does_not_parse_is_left_out_not_a_failed_scrape() -> None:  # M3
    from prometheus_client.parser import text_string_to_metric_families

    from consumer.metrics import render_metrics
    status = _status_from_a_real_consumer()
    status["consumer"]["lag"] = {"0": "many", "1": None, "2": 7}
    lags = {sample.labels["partition"]: sample.value
            for family in text_string_to_metric_families(render_metrics(status).decode())
            for sample in family.samples if sample.name == "rankstream_consumer_lag_events"}
    assert lags == {"2": 7.0}


def test_every_metric_is_named_in_the_http_api_doc() -> None:
    """docs/hits.md names each metric, in full or as the suffix after its group's
    prefix (`_load_seconds` after rankstream_consumer_); a new one must be added."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "hits.md").read_text()
    # The hand-made status has every graph and score figure, a real consumer's
    # status every consumer figure.
    names = {name for status in (_status(), _status_from_a_real_consumer())
             for name, _ in _samples(status)}
    assert "rankstream_consumer_load_seconds" in names
    for name in names:
        group = next(prefix for prefix in ("rankstream_consumer", "rankstream_graph",
                                           "rankstream_scores") if name.startswith(prefix))
        assert name in doc or f"`{name[len(group):]}" in doc, name
