"""Benchmark: the streaming pipeline end to end, Kafka -> consumer -> Redis graph + scores.

    .venv/bin/python -m benchmarks.bench_pipeline [--events 100000] [--latency-seconds 20]
    .venv/bin/python -m benchmarks.bench_pipeline --events 1000000      # the full run

Everything runs on this machine: the broker, redis-server, the producer and the
consumer. The stream is :func:`producer.synthetic.synthetic_event_dicts` with no
edits: one ``page`` event per crawled page of a copying-model web graph, about 10
links each. Phases, on a private topic and key prefix (deleted afterwards unless
``--keep``):

1. produce: the first ``--events`` events are published (pre-filled topic);
2. throughput: an in-process consumer runs ``--until-caught-up`` from offset 0;
   the clock runs from its first poll to its last publication, so the figure is
   "link changes per second from Kafka to visible scores" (graph transaction,
   incremental PageRank + WPR, score publication, all included);
3. floors: the same adjacency is written again under a scratch prefix, in chunks
   of one consumer batch, by (a) a bare redis-py pipeline of grouped SADDs and
   (b) the consumer's raw-RESP write path alone. (a) is the I/O floor the
   target compares against. (c) a bare kafka-python ``KafkaConsumer`` with the
   consumer's fetch settings reads the topic again (its record parsing is pure
   Python, so it is a floor of its own);
4. latency: a consumer subprocess restarts on the loaded graph (its restart time
   is reported) while the producer publishes ``--latency-events`` more events at
   a fixed rate (default: half of the measured throughput, capped at half the
   100k target) stamping each with the wall clock. A watcher polls
   ``P meta:pagerank`` every 10 ms; an event is visible when the published
   offsets pass it, and visible-fresh when they pass it with ``fresh = 1`` (the
   publication's certified bound within the tolerance). Latency = visible -
   stamped, p50/p99, both ways; an event not yet visible when the watch ends (at
   most 120 s after the last send) counts as (the watch's last sample - stamped),
   and the run prints how many were visible. The target is on "visible": on an
   initial crawl publications are capped (consumer.score_publisher), so the scores
   of new pages and the largest moves are visible within the latency while the rest
   lags by the published bound, which the run also prints; "visible-fresh" is then
   only reached once the stream slows down. The latency line names the target only
   when the phase ran at the target's rate (half of 100k), else the rate it used.

``--texts`` gives every page event a 4-word title and half its links a 2-word anchor
text (:func:`producer.synthetic.with_text`): the consumer then also keeps the
HITS term index exact (docs/hits.md). The floors still write the links alone.

Targets (issue 3): >= 100k link changes/s end to end on 2 cores; p99 <= 2 s at half
that rate; end to end >= 0.5 x the bare redis-py floor.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis as redis_py

from benchmarks.arguments import at_least, bench_parser, positive
from benchmarks.cpu_use import CpuMeter, cpu_line
from benchmarks.pipeline_load import LoadProducer, encode_stream, produce_all, with_ts
from consumer.graph_write import GraphWrite, commit_graph, group_members
from consumer.kafka_source import (
    FETCH_MAX_BYTES,
    MAX_PARTITION_FETCH_BYTES,
    receive_max_bytes,
)
from consumer.keys import Keys
from consumer.options import ConsumeOptions
from consumer.redis_store import connect_redis, load_stored
from consumer.service import ConsumerService
from consumer.snapshot import leave_snapshot, snapshot_path
from rankstream.services import up
from rankstream.services.kafka import delete_topics
from rankstream.services.stack import ensure_settings_topics, kafka_client_options
from rankstream.services.testing import delete_keys
from rankstream.settings import Settings, load_settings

TARGET_LINKS_PER_S = 100_000
PRODUCE_TICK_S = 0.005  # the latency phase's producer sends in ticks this long
# After its last send the latency phase waits at most this long for every event to
# become visible; an event still not visible then counts as (the last sample -
# its stamp), about this long or more, in the percentiles.
VISIBLE_DEADLINE_S = 120.0


def say(text: str) -> None:
    print(text, flush=True)


@dataclass
class Throughput:
    seconds: float
    events: int
    link_changes: int
    batches: int
    phases: dict[str, float]  # summed per-batch phase times of the consumer's log
    publications: list[dict[str, Any]]
    batch_records: list[dict[str, Any]]
    cpu: dict[str, float | None]  # CPU seconds of the consumer, Redis, the broker

    @property
    def links_per_s(self) -> float:
        return self.link_changes / self.seconds


class LogCapture(logging.Handler):
    """Keeps the consumer's structured ``batch`` and ``published`` records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.batches: list[dict[str, Any]] = []
        self.publications: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None)
        if fields is None:
            return
        if record.msg == "batch":
            self.batches.append({**fields, "t": record.created})
        elif record.msg == "published":
            self.publications.append({**fields, "t": record.created})


PHASES = ("plan_s", "refresh_wait_s", "rank_s", "prefetch_s", "wait_commit_s")


def run_throughput(settings: Settings) -> Throughput:
    capture = LogCapture()
    logger = logging.getLogger("rankstream.consumer")
    logger.addHandler(capture)
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    service = ConsumerService(settings, ConsumeOptions(until_caught_up=True))
    try:
        service.start()
        capture.publications.clear()  # the start publication is not part of the run
        meter = CpuMeter(service.redis, settings.kafka_bootstrap)
        cpu_before = meter.sample()
        started = time.perf_counter()
        try:
            while not service.stops.event.is_set():
                service.step()
                if service.caught_up():
                    break
            drain_started = time.perf_counter()
            service.drain()  # the last publication: scores visible
            elapsed = time.perf_counter() - started
            cpu = meter.sample().since(cpu_before)
            # What a clean stop leaves for the latency phase's restart, as
            # ConsumerService.run does (outside the timing: the scores are visible).
            leave_snapshot(service.redis, service.keys, service.snapshot, service.mirror,
                           service.publisher)
        finally:
            service.shutdown()
    finally:
        logger.removeHandler(capture)
        logger.setLevel(previous_level)
    phases = {name: sum(float(b.get(name, 0.0)) for b in capture.batches) for name in PHASES}
    # Outside the batches: idle polls, and the drain (the refresh to the tolerance and
    # the last, uncapped publication).
    phases["drain_s"] = started + elapsed - drain_started
    phases["other_s"] = elapsed - sum(phases.values())
    return Throughput(elapsed, service.stats.events, service.stats.link_changes,
                      service.stats.batches, phases, capture.publications, capture.batches, cpu)


def kafka_floor(settings: Settings, records: int) -> float:
    """Records/s of a bare KafkaConsumer reading the topic from the start."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
        max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES, fetch_max_bytes=FETCH_MAX_BYTES,
        receive_message_max_bytes=receive_max_bytes(settings.max_message_bytes),
        fetch_max_wait_ms=100,
        receive_buffer_bytes=4 * 1024 * 1024, max_poll_records=settings.batch_max_events,
        **kafka_client_options(settings))
    try:
        parts = consumer.partitions_for_topic(settings.topic) or set()
        consumer.assign([TopicPartition(settings.topic, p) for p in parts])
        consumer.seek_to_beginning()
        seen = 0
        started = time.perf_counter()
        while seen < records:
            for batch in consumer.poll(timeout_ms=1000,
                                       max_records=settings.batch_max_events).values():
                seen += len(batch)
        return seen / (time.perf_counter() - started)
    finally:
        consumer.close()


def floors(client: redis_py.Redis, settings: Settings, batch_links: int) -> tuple[float, float]:
    """(bare redis-py pipeline, raw-RESP write path) in links/s on the same adjacency."""
    stored = load_stored(client, Keys(settings.key_prefix), settings.topic)
    src, dst = stored.edge_src, stored.edge_dst
    results = []
    for mode in ("bare", "script"):
        prefix = f"{settings.key_prefix}floor-{mode}:"
        keys = Keys(prefix)
        started = time.perf_counter()
        for begin in range(0, src.size, batch_links):
            s, d = src[begin:begin + batch_links], dst[begin:begin + batch_links]
            if mode == "bare":
                pipe = client.pipeline(transaction=False)
                for owners, members, key_of in ((s, d, keys.out_links), (d, s, keys.in_links)):
                    group_owner, counts, ordered = group_members(owners, members)
                    values = ordered.tolist()
                    pos = 0
                    for owner, count in zip(group_owner.tolist(), counts.tolist(), strict=True):
                        pipe.execute_command("SADD", key_of(owner), *values[pos:pos + count])
                        pos += count
                pipe.execute()
            else:
                commit_graph(client, keys, GraphWrite(insert_src=s, insert_dst=d))
        results.append(src.size / (time.perf_counter() - started))
        delete_keys(settings, prefix)
    return results[0], results[1]


def run_latency(settings: Settings, stream: Sequence[tuple[bytes, bytes, int]],
                rate_events: float, env: dict[str, str], log_path: str) -> dict[str, float]:
    client = connect_redis(settings)
    keys = Keys(settings.key_prefix)
    started = time.perf_counter()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "consumer", "consume"], env=env,
                                stderr=log_file)
    try:
        while client.hget(keys.status, "state") != b"running" or \
                client.hget(keys.status, "pid") != str(proc.pid).encode():
            if proc.poll() is not None:
                raise SystemExit("the consumer subprocess died while starting")
            time.sleep(0.05)
        restart_s = time.perf_counter() - started
        samples: list[tuple[float, dict[str, int], bool]] = []  # (ms, offsets, fresh)
        bounds: list[float] = []  # the published relative bound, per sample
        done = threading.Event()

        def watch() -> None:
            watcher = connect_redis(settings)
            while not done.is_set():
                raw, fresh, relative = watcher.hmget(keys.meta("pagerank"),
                                                     ["offsets", "fresh", "relative_bound"])
                samples.append((time.time() * 1000, json.loads(raw) if raw else {},
                                fresh == b"1"))
                bounds.append(float(relative) if relative else float("nan"))
                time.sleep(0.01)

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        # The producer runs on this box too, so it must cost little (see LoadProducer):
        # it sends in ticks of PRODUCE_TICK_S, each event stamped when it is sent.
        producer = LoadProducer(settings)
        say(f"  load producer: {producer.kind}")
        begin = time.perf_counter()
        count = 0
        while count < len(stream):
            due = min(len(stream), int((time.perf_counter() - begin) * rate_events) + 1)
            ts = int(time.time() * 1000)
            for key, body, _ in stream[count:due]:
                producer.send(key, with_ts(body, ts), ts)
            count = max(count, due)
            producer.serve()
            time.sleep(PRODUCE_TICK_S)
        sent = producer.finish()
        produce_s = time.perf_counter() - begin
        last = {f"{settings.topic}:{p}": o + 1 for _, p, o in sent}
        deadline = time.time() + VISIBLE_DEADLINE_S
        while time.time() < deadline:
            if samples and all(samples[-1][1].get(k, 0) >= v for k, v in last.items()):
                break
            time.sleep(0.05)
        done.set()
        thread.join()
        watch_end_ms = time.time() * 1000
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    times = np.array([t for t, _, _ in samples])
    # An event no sample showed is not visible at the last sample: its latency is at
    # least (last sample - stamp).
    last_seen_ms = float(times[-1]) if samples else watch_end_ms
    fresh = np.array([f for _, _, f in samples], dtype=bool)
    result: dict[str, float] = {"restart_s": restart_s, "sent": float(len(sent)),
                                "achieved_rate": len(stream) / produce_s,
                                "bound_p50": float(np.nanmedian(bounds)) if bounds else np.nan,
                                "bound_max": float(np.nanmax(bounds)) if bounds else np.nan}
    # Offsets only grow: the running max per partition makes "first sample covering
    # offset o" a binary search; next_usable[i] is the first usable sample >= i.
    covered: dict[int, np.ndarray] = {}
    for _, partition, _ in sent:
        if partition not in covered:
            field = f"{settings.topic}:{partition}"
            covered[partition] = np.maximum.accumulate(
                np.array([o.get(field, 0) for _, o, _ in samples] or [0]))
    for name, usable in (("", np.ones_like(fresh)), ("fresh_", fresh)):
        next_usable = np.full(len(samples) + 1, len(samples))
        for i in range(len(samples) - 1, -1, -1):
            next_usable[i] = i if usable[i] else next_usable[i + 1]
        latencies = []
        stamps = []
        seen = 0
        for ts, partition, offset in sent:
            first = int(np.searchsorted(covered[partition], offset + 1))
            hit = int(next_usable[min(first, len(samples))])
            if hit < len(samples):
                latencies.append(times[hit] - ts)
                seen += 1
            else:  # never seen: counted at its lower bound, not left out
                latencies.append(max(last_seen_ms - ts, 0.0))
            stamps.append(ts)
        lat = np.array(latencies) / 1000.0
        if not name and lat.size:
            say("  p99 per 5 s of the phase (s)              " + windowed_p99(
                (np.array(stamps) - min(stamps)) / 1000.0, lat, 5.0))
        result[f"{name}visible"] = float(seen)
        for label, q in (("p50", 50), ("p99", 99), ("max", 100)):
            result[f"{name}{label}"] = float(np.percentile(lat, q)) if lat.size else float("nan")
    result.update(publication_stats(log_path))
    return result


def visible_of(latency: dict[str, float], name: str) -> str:
    """'visible N of M', and how the events never seen count in the percentiles."""
    seen, sent = int(latency[f"{name}visible"]), int(latency["sent"])
    text = f"visible {seen:,} of {sent:,}"
    if seen < sent:
        # The watch ends VISIBLE_DEADLINE_S after the last send unless all are visible.
        least = f", about {VISIBLE_DEADLINE_S:.0f} s or more," if not name else ""
        text += (f"; the {sent - seen:,} never seen count as (last sample - stamp){least}"
                 f" in p50/p99/max, which are then lower bounds")
    return text


def windowed_p99(offsets_s: np.ndarray, latencies: np.ndarray, window_s: float) -> str:
    """The p99 latency of the events stamped in each ``window_s`` of the phase: is
    the tail the restart's warm-up, or steady?"""
    window = (offsets_s // window_s).astype(np.int64)
    return " ".join(f"{np.percentile(latencies[window == w], 99):.2f}"
                    for w in range(int(window.max()) + 1) if np.any(window == w))


def publication_stats(log_path: str) -> dict[str, float]:
    """Count, mean and max duration and mean members of the logged publications."""
    rows = []
    with open(log_path, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if '"published"' in line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    seconds = np.array([float(r["seconds"]) for r in rows[1:]])  # [0]: the start one
    members = np.array([float(r["members"]) for r in rows[1:]])
    return {"publications": float(seconds.size),
            "pub_mean_s": float(seconds.mean()) if seconds.size else float("nan"),
            "pub_max_s": float(seconds.max()) if seconds.size else float("nan"),
            "pub_members": float(members.mean()) if members.size else float("nan")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser("python -m benchmarks.bench_pipeline", __doc__.splitlines()[0])
    parser.add_argument("--events", type=at_least(1), default=100_000,
                        help="page events pre-filled for the throughput run (full: 1000000)")
    parser.add_argument("--latency-events", type=at_least(1), default=None,
                        help="events of the latency phase (default: rate x --latency-seconds)")
    parser.add_argument("--latency-seconds", type=positive, default=20.0)
    parser.add_argument("--rate", type=positive, default=None,
                        help="latency phase rate in link changes/s (default: half the measured "
                             "throughput, at most half the 100k target)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--texts", action="store_true",
                        help="page events carry a title and anchor text on half their links "
                             "(the HITS term index's work; the floors write links only)")
    parser.add_argument("--keep", action="store_true", help="keep the topic and keys")
    parser.add_argument("--consumer-log", default="bench_pipeline_consumer.log",
                        help="JSON log of the latency phase's consumer process (the "
                             "throughput phase's batch and publication records go to "
                             "PATH.throughput)")
    args = parser.parse_args(argv)

    base = load_settings()
    up(base, timeout=180.0)
    token = uuid.uuid4().hex[:8]
    settings = base.model_copy(update={"topic": f"bench.pipeline.{token}",
                                       "dlq_topic": f"bench.pipeline.{token}.dlq",
                                       "key_prefix": f"bench:{token}:"})
    options = kafka_client_options(settings)
    ensure_settings_topics(settings)
    client = connect_redis(settings)
    try:
        say(f"generating {args.events:,} page events (+ the latency phase's) ...")
        gen_started = time.perf_counter()
        # Enough for the latency phase at its largest default rate (~8 links/event).
        extra = args.latency_events or int((args.rate or TARGET_LINKS_PER_S / 2) / 8
                                           * args.latency_seconds)
        stream = encode_stream(args.events + extra, args.seed, texts=args.texts)
        first, rest = stream[: args.events], stream[args.events:]
        links = sum(n for _, _, n in first)
        say(f"  {len(stream):,} events in {time.perf_counter() - gen_started:.1f} s; "
            f"the first {len(first):,} carry {links:,} links")
        produce_s = produce_all(settings, first)
        say(f"produced {len(first):,} events in {produce_s:.1f} s "
            f"({len(first) / produce_s:,.0f} events/s)")

        result = run_throughput(settings)
        say(f"throughput: {result.events:,} events, {result.link_changes:,} link changes, "
            f"{result.batches} batches in {result.seconds:.1f} s")
        with open(f"{args.consumer_log}.throughput", "w", encoding="utf-8") as records:
            for kind, rows in (("batch", result.batch_records),
                              ("published", result.publications)):
                for row in rows:
                    records.write(json.dumps({"msg": kind, **row}, default=str) + "\n")
        batch_links = max(1, result.link_changes // max(result.batches, 1))
        bare, script = floors(client, settings, batch_links)
        kafka_records = kafka_floor(settings, len(first))

        rate_links = args.rate or min(result.links_per_s, TARGET_LINKS_PER_S) / 2
        target_rate = TARGET_LINKS_PER_S / 2
        if math.isclose(rate_links, target_rate, rel_tol=1e-6):
            rate_note = f"target p99 <= 2 s at {target_rate:,.0f} link changes/s"
        else:
            why = "--rate" if args.rate else "half the measured throughput"
            rate_note = (f"at {rate_links:,.0f} link changes/s ({why}), not the target's "
                         f"{target_rate:,.0f}: no target verdict")
        links_per_event = links / max(len(first), 1)
        rate_events = rate_links / links_per_event
        count = args.latency_events or int(rate_events * args.latency_seconds)
        env = dict(os.environ)
        env.update({"RANKSTREAM_TOPIC": settings.topic, "RANKSTREAM_DLQ_TOPIC": settings.dlq_topic,
                    "RANKSTREAM_KEY_PREFIX": settings.key_prefix})
        say(f"latency: {count:,} events at {rate_events:,.0f} events/s "
            f"({rate_links:,.0f} link changes/s) ...")
        latency = run_latency(settings, rest[:count], rate_events, env, args.consumer_log)

        say("")
        say(f"{'end-to-end throughput':<44}{result.links_per_s:>12,.0f} link changes/s "
            f"({result.events / result.seconds:,.0f} events/s)")
        say(f"{'bare redis-py pipeline floor (same links)':<44}{bare:>12,.0f} links/s")
        say(f"{'consumer raw-RESP write path alone':<44}{script:>12,.0f} links/s")
        say(f"{'bare kafka-python KafkaConsumer':<44}{kafka_records * links_per_event:>12,.0f}"
            f" links/s ({kafka_records:,.0f} records/s)")
        say(f"{'ratio end-to-end / bare floor':<44}{result.links_per_s / bare:>12.2f}"
            "   (target >= 0.5)")
        phases = ", ".join(f"{k[:-2]} {v:.1f}" for k, v in result.phases.items())
        pubs = result.publications
        say(f"{'  consumer main thread, summed seconds':<44}  {phases}")
        say(f"{'  CPU during the run':<44}  {cpu_line(result.cpu, result.seconds)}")
        if pubs:
            say(f"{'  publications during the run':<44}  {len(pubs)}, mean "
                f"{np.mean([p['seconds'] for p in pubs]):.2f} s, "
                f"{np.mean([p['members'] for p in pubs]):,.0f} members")
        say(f"{'latency rate (achieved)':<44}{latency['achieved_rate'] * links_per_event:>12,.0f}"
            f" link changes/s")
        say(f"{'event -> visible score p50 / p99 / max':<44}{latency['p50']:>8.3f} s"
            f" / {latency['p99']:.3f} s / {latency['max']:.3f} s   ({rate_note})")
        say(f"{'  visible':<44}{visible_of(latency, '')}")
        say(f"{'  published relative L1 bound p50 / max':<44}{latency['bound_p50']:>10.1e}"
            f" / {latency['bound_max']:.1e}   (fresh when <= the tolerance "
            f"{settings.tolerance:g})")
        say(f"{'event -> visible fresh score p50 / p99 / max':<44}{latency['fresh_p50']:>8.3f} s"
            f" / {latency['fresh_p99']:.3f} s / {latency['fresh_max']:.3f} s")
        say(f"{'  visible fresh':<44}{visible_of(latency, 'fresh_')}")
        say(f"{'  publications during the latency phase':<44}  {latency['publications']:.0f}, "
            f"mean {latency['pub_mean_s']:.2f} s, max {latency['pub_max_s']:.2f} s, "
            f"{latency['pub_members']:,.0f} members")
        say(f"{'consumer restart on the loaded graph':<44}{latency['restart_s']:>10.1f} s")
        say(f"{'target >= 100k link changes/s':<44}"
            f"{'met' if result.links_per_s >= TARGET_LINKS_PER_S else 'NOT met':>12}")
    finally:
        client.close()
        if not args.keep:
            delete_topics(settings.kafka_bootstrap, [settings.topic, settings.dlq_topic],
                          **options)
            delete_keys(settings, settings.key_prefix)
            snapshot = snapshot_path(settings)
            if snapshot is not None:
                snapshot.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
