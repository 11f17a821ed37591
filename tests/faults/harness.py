"""The fault-injection harness: a known event log's replay, and the final audit.

Every scenario follows the same shape:

1. build a known log (:func:`tests.faults.known_log.build_log`): seeded synthetic
   events plus odd URLs, re-delivered (duplicate) and stale ``page`` events, and
   invalid messages;
2. replay it into Kafka (:class:`Replayer`, optionally at a fixed rate, in the
   background) while the scenario injects its fault;
3. let a consumer catch up, then :func:`audit` Redis against the graph the log
   defines (computed offline with the same event semantics): no link lost, no
   effect applied twice (counters are exact), offsets consistent in Redis, in the
   score meta and in Kafka, every invalid message in the DLQ, the published
   scores within their certified bound of a cold recompute, and the term index
   with its source counts equal to what the log's titles and anchors give;
4. record a row for the summary table printed at the end of the session
   (:mod:`tests.faults.summary`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis as redis_py

from consumer import readers
from consumer.keys import ALGORITHMS, Keys
from consumer.redis_store import load_stored
from producer.client import LinkPublisher
from producer.schema import Limits, decode_event
from ranker.bounds import static_tolerance
from ranker.linkgraph import LinkGraph
from ranker.pagerank import pagerank
from ranker.weighted_pagerank import weighted_pagerank
from rankstream.errors import InputError
from rankstream.graph_updates import EventApplier
from rankstream.services import kafka_client_options
from rankstream.settings import Settings
from tests.faults.known_log import Message
from tests.text_index_model import Sources, model_of, stored_sources

# -- replay --------------------------------------------------------------------------

class Replayer:
    """Publishes a log in order, at ``rate`` messages/s (None: as fast as possible).

    Runs in a background thread once :meth:`start` is called, or inline with
    :meth:`run`. Chunks are flushed (acknowledged by the broker) before the next
    one, so ``published`` never counts a message the broker might not have.
    """

    def __init__(self, settings: Settings, log: Sequence[Message], *,
                 rate: float | None = None, chunk: int = 50) -> None:
        self.settings = settings
        self.log = log
        self.rate = rate
        self.chunk = chunk
        self.published = 0
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        started = time.monotonic()
        with LinkPublisher.from_settings(self.settings, delivery_timeout_ms=120_000,
                                         max_block_ms=60_000,
                                         request_timeout_ms=10_000) as publisher:
            for begin in range(0, len(self.log), self.chunk):
                part = self.log[begin:begin + self.chunk]
                if self.rate:
                    due = started + begin / self.rate
                    time.sleep(max(0.0, due - time.monotonic()))
                for message in part:
                    publisher.publish_raw(message.value, message.key)
                publisher.flush()
                self.published = begin + len(part)

    def start(self) -> Replayer:
        def body() -> None:
            try:
                self.run()
            except BaseException as exc:  # reported by join()
                self.error = exc

        self._thread = threading.Thread(target=body, name="replayer", daemon=True)
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self.published == len(self.log)

    def join(self, timeout: float = 300.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise AssertionError("the replayer did not finish")
        if self.error is not None:
            raise AssertionError(f"replay failed: {self.error!r}") from self.error
        assert self.done


def replay(settings: Settings, log: Sequence[Message]) -> None:
    """Publish the whole log now."""
    Replayer(settings, log, chunk=500).run()


# -- progress probes -------------------------------------------------------------------

class Probe:
    """Cheap reads of a consumer's progress from Redis."""

    def __init__(self, client: redis_py.Redis, settings: Settings) -> None:
        self.client = client
        self.keys = Keys(settings.key_prefix)

    def consumed(self) -> int:
        """Messages whose effect is committed: the sum of ``P offsets``."""
        return sum(int(v) for v in self.client.hvals(self.keys.offsets))

    def beyond(self, count: int) -> Callable[[], bool]:
        """A check for :func:`tests.faults.stack.wait_for`: consumed more than ``count``."""
        return lambda: self.consumed() > count

    def state(self) -> str:
        raw = self.client.hget(self.keys.status, "state")
        return raw.decode() if isinstance(raw, bytes) else ""

    def published_version(self) -> int:
        raw = self.client.hget(self.keys.meta("pagerank"), "version")
        return int(raw) if raw else -1

    def graph_version(self) -> int:
        raw = self.client.hget(self.keys.graph, "version")
        return int(raw) if raw else 0

    def published_ahead(self) -> dict[str, int]:
        """The algorithms whose published ``version`` is ahead of the committed graph's:
        scores published for a batch whose transaction had not committed (or never
        did). Empty when all is well. No MULTI (the kill scenario's MONITOR would take
        it for a consumer's transaction): the metas are read before the graph, in one
        round trip Redis runs in order, and versions only grow, so a meta ahead of the
        graph read after it was ahead at the time."""
        with self.client.pipeline(transaction=False) as pipe:
            for algorithm in ALGORITHMS:
                pipe.hget(self.keys.meta(algorithm), "version")
            pipe.hget(self.keys.graph, "version")
            *published, graph = pipe.execute()
        committed = int(graph) if graph else 0
        return {algorithm: int(raw)
                for algorithm, raw in zip(ALGORITHMS, published, strict=True)
                if raw and int(raw) > committed}

    def caught_up(self, total: int) -> bool:
        """All ``total`` messages committed and the scores published for that graph."""
        return (self.consumed() >= total
                and self.published_version() == self.graph_version())


# -- the audit -------------------------------------------------------------------------

@dataclass
class Expected:
    """What the log defines, computed offline with the consumer's own event semantics."""

    graph: LinkGraph
    edges: set[tuple[str, str]]
    pages: set[str]
    applied: int
    stale_ignored: int
    invalid: list[bytes]
    messages: int
    index: Sources  # the term index: (term, URL) -> sources (tests/text_index_model.py)


def expected_state(log: Sequence[Message], limits: Limits) -> Expected:
    events = []
    invalid = []
    for message in log:
        try:
            events.append(decode_event(message.value, limits))
        except InputError:
            invalid.append(message.value)
    graph = LinkGraph()
    result = EventApplier(graph).apply(events)
    graph.apply(result.batch)
    src, dst = graph.edges()
    edges = {(graph.key_of(s), graph.key_of(d)) for s, d in zip(src.tolist(), dst.tolist(),
                                                                strict=True)}
    pages = {graph.key_of(p) for p in range(graph.num_ids) if graph.is_live(p)}
    return Expected(graph, edges, pages, result.applied, result.stale_ignored, invalid,
                    len(log), model_of(events))


def stored_graph(client: redis_py.Redis, settings: Settings
                 ) -> tuple[set[tuple[str, str]], set[str]]:
    """(links as URL pairs, live page URLs) as Redis holds them."""
    stored = load_stored(client, Keys(settings.key_prefix), settings.topic)
    urls = stored.urls
    edges = {(urls[s], urls[d]) for s, d in zip(stored.edge_src.tolist(),
                                                stored.edge_dst.tolist(), strict=True)}
    dead = set(stored.removed.tolist())
    return edges, {u for i, u in enumerate(urls) if i not in dead}


def index_problems(client: redis_py.Redis, settings: Settings) -> list[str]:
    """What :func:`stored_graph` does not read back: the in-link sets (HITS reads them)
    must be the transpose of the out-link sets, and ``page:id`` the inverse of
    ``page:url``. A replay or crash bug could leave either inconsistent unseen."""
    keys = Keys(settings.key_prefix)
    stored = load_stored(client, keys, settings.topic)
    out_pairs = set(zip(stored.edge_src.tolist(), stored.edge_dst.tolist(), strict=True))
    head = keys.in_head.encode()
    names = [name for name in client.scan_iter(match=f"{keys.in_head}*", count=1000)
             if name[len(head):].isdigit()]
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.smembers(name)
        members: list[Any] = pipe.execute()
    in_pairs = {(int(src), int(name[len(head):]))
                for name, sources in zip(names, members, strict=True) for src in sources}
    problems = []
    if in_pairs != out_pairs:
        problems.append(f"in-link sets differ from the out-link sets' transpose: "
                        f"{len(in_pairs - out_pairs)} extra, {len(out_pairs - in_pairs)} missing")
    by_id: Any = client.hgetall(keys.page_url)
    by_url: Any = client.hgetall(keys.page_id)
    if {url: page for page, url in by_id.items()} != by_url:
        problems.append(f"page:id ({len(by_url)} URLs) is not the inverse of page:url "
                        f"({len(by_id)} ids)")
    return problems


def exact_scores(graph: LinkGraph, algorithm: str, damping: float) -> dict[str, float]:
    """A cold recompute (paper scale) over the live pages, as exact as a static solve
    certifies (ranker.bounds.static_tolerance)."""
    solve = pagerank if algorithm == "pagerank" else weighted_pagerank
    result = solve(graph.to_csr(), damping=damping, max_iter=10_000,
                   tol=static_tolerance(graph.num_ids, damping), alive=graph.live_mask())
    return {graph.key_of(p): float(result.scores[p])
            for p in range(graph.num_ids) if graph.is_live(p)}


def kafka_end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                             **kafka_client_options(settings))
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: int(off) for tp, off in ends.items()}
    finally:
        consumer.close()


def read_dead_letters(settings: Settings) -> list[tuple[bytes, dict[str, bytes]]]:
    """Every message of the DLQ topic (value, headers), re-sends included."""
    from kafka import KafkaConsumer, TopicPartition

    total = sum(kafka_end_offsets(settings, settings.dlq_topic).values())
    if not total:
        return []
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                             consumer_timeout_ms=15_000, **kafka_client_options(settings))
    out: list[tuple[bytes, dict[str, bytes]]] = []
    try:
        consumer.assign([TopicPartition(settings.dlq_topic, 0)])
        consumer.seek_to_beginning()
        for message in consumer:
            out.append((message.value, dict(message.headers)))
            if len(out) >= total:
                break
    finally:
        consumer.close()
    return out


def committed_group_offsets(settings: Settings) -> dict[int, int]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap,
                             **kafka_client_options(settings))
    try:
        found = admin.list_consumer_group_offsets(settings.group_id)
    finally:
        admin.close()
    return {tp.partition: int(meta.offset) for tp, meta in found.items()
            if tp.topic == settings.topic}


@dataclass
class Audit:
    """The outcome of :func:`audit`; :meth:`check` asserts it is clean."""

    messages: int
    links_expected: int
    links_lost: int
    links_spurious: int
    pages_lost: int
    pages_spurious: int
    counter_excess: dict[str, int]
    counter_missing: dict[str, int]
    offsets: dict[str, int]
    kafka_ends: dict[str, int]
    meta_offsets: dict[str, dict[str, int]]
    meta_versions: dict[str, int]
    graph_version: int
    group_offsets: dict[str, int]
    dlq_unique: int
    dlq_expected: int
    dlq_resent: int
    dlq_reasons_ok: bool
    score_error: dict[str, float]  # L1 vs the cold recompute, relative to sum(y)
    score_bound: dict[str, float]  # the published certified bound, relative to sum(y)
    fresh: dict[str, bool]
    tolerance: float = 0.0  # settings.tolerance, relative to sum(y)
    problems: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        """Effects applied twice: extra links or pages, counters above the log's."""
        return self.links_spurious + self.pages_spurious + sum(self.counter_excess.values())

    @property
    def lost(self) -> int:
        return self.links_lost + self.pages_lost + sum(self.counter_missing.values())

    def check(self) -> None:
        assert not self.problems, "; ".join(self.problems)


def audit(client: redis_py.Redis, settings: Settings, log: Sequence[Message]) -> Audit:
    """Compare Redis and Kafka with what ``log`` defines (see the module docstring)."""
    expected = expected_state(log, Limits.from_settings(settings))
    edges, pages = stored_graph(client, settings)
    status = readers.status(client, settings.key_prefix)
    counters = status["graph"]
    want = {"version": expected.applied, "links": len(expected.edges),
            "pages": len(expected.pages), "stale_ignored": expected.stale_ignored,
            "dlq": len(expected.invalid)}
    excess = {k: max(0, counters.get(k, 0) - v) for k, v in want.items()}
    missing = {k: max(0, v - counters.get(k, 0)) for k, v in want.items()}
    prefix = f"{settings.topic}:"
    offsets = {k: v for k, v in status["offsets"].items() if k.startswith(prefix)}
    ends = {f"{settings.topic}:{p}": off
            for p, off in kafka_end_offsets(settings, settings.topic).items() if off > 0}
    group = {f"{settings.topic}:{p}": off for p, off in committed_group_offsets(settings).items()}
    letters = read_dead_letters(settings)
    unique = {(h.get("source_partition"), h.get("source_offset")): (v, h) for v, h in letters}
    reasons_ok = all(h.get("error") and h.get("source_topic") == settings.topic.encode()
                     for _, h in unique.values())
    meta_offsets: dict[str, dict[str, int]] = {}
    meta_versions: dict[str, int] = {}
    error: dict[str, float] = {}
    bound: dict[str, float] = {}
    fresh: dict[str, bool] = {}
    for algorithm in ALGORITHMS:
        meta = readers.meta(client, settings.key_prefix, algorithm)
        meta_offsets[algorithm] = dict(meta.offsets or {})
        meta_versions[algorithm] = meta.version
        rows: Any = client.zrange(Keys(settings.key_prefix).scores(algorithm), 0, -1,
                                  withscores=True)
        published = {url.decode(): float(value) for url, value in rows}
        exact = exact_scores(expected.graph, algorithm, settings.damping)
        l1 = sum(abs(published.get(k, 0.0) - exact.get(k, 0.0))
                 for k in set(published) | set(exact))
        total = meta.total or 1.0
        error[algorithm] = l1 / total
        bound[algorithm] = meta.bound / total
        fresh[algorithm] = meta.fresh
    result = Audit(
        messages=len(log), links_expected=len(expected.edges),
        links_lost=len(expected.edges - edges), links_spurious=len(edges - expected.edges),
        pages_lost=len(expected.pages - pages), pages_spurious=len(pages - expected.pages),
        counter_excess={k: v for k, v in excess.items() if v},
        counter_missing={k: v for k, v in missing.items() if v},
        offsets=offsets, kafka_ends=ends, meta_offsets=meta_offsets,
        meta_versions=meta_versions, graph_version=counters.get("version", 0),
        group_offsets=group, dlq_unique=len(unique), dlq_expected=len(expected.invalid),
        dlq_resent=len(letters) - len(unique), dlq_reasons_ok=reasons_ok,
        score_error=error, score_bound=bound, fresh=fresh, tolerance=settings.tolerance)
    _find_problems(result, expected, unique)
    result.problems.extend(index_problems(client, settings))
    index = stored_sources(client, settings.key_prefix)
    if index != expected.index:
        result.problems.append(
            f"term index: {len(index - expected.index)} (term, page) sources too many, "
            f"{len(expected.index - index)} missing")
    return result


def _find_problems(result: Audit, expected: Expected,
                   unique: dict[Any, tuple[bytes, dict[str, bytes]]]) -> None:
    p = result.problems
    if result.lost:
        p.append(f"lost: {result.links_lost} links, {result.pages_lost} pages, "
                 f"counters short {result.counter_missing}")
    if result.duplicates:
        p.append(f"duplicated effects: {result.links_spurious} links, "
                 f"{result.pages_spurious} pages, counters over {result.counter_excess}")
    if result.offsets != result.kafka_ends:
        p.append(f"P offsets {result.offsets} != Kafka end offsets {result.kafka_ends}")
    for algorithm in ALGORITHMS:
        if result.meta_offsets[algorithm] != result.offsets:
            p.append(f"meta:{algorithm} offsets {result.meta_offsets[algorithm]} != "
                     f"P offsets {result.offsets}")
        if result.meta_versions[algorithm] != result.graph_version:
            p.append(f"meta:{algorithm} version {result.meta_versions[algorithm]} != graph "
                     f"version {result.graph_version}")
        if not result.fresh[algorithm]:
            p.append(f"{algorithm} not fresh at the end")
        # The certified bound covers the ZSET as published; allow float rounding only.
        if result.score_error[algorithm] > result.score_bound[algorithm] + 1e-9:
            p.append(f"{algorithm}: L1 error {result.score_error[algorithm]:.3g} > "
                     f"bound {result.score_bound[algorithm]:.3g} (relative)")
        # Fresh means within the tolerance: a loose bound the consumer itself called
        # fresh passed the check above.
        if result.fresh[algorithm] and (
                result.score_bound[algorithm] > result.tolerance * (1 + 1e-9)
                or result.score_error[algorithm] > result.tolerance + 1e-9):
            p.append(f"{algorithm}: fresh with bound {result.score_bound[algorithm]:.3g} "
                     f"and error {result.score_error[algorithm]:.3g} against the tolerance "
                     f"{result.tolerance:.3g}")
    if result.group_offsets != result.offsets:
        p.append(f"Kafka group offsets {result.group_offsets} != P offsets {result.offsets}")
    if result.dlq_unique != result.dlq_expected:
        p.append(f"DLQ holds {result.dlq_unique} distinct letters, expected "
                 f"{result.dlq_expected}")
    if sorted(v for v, _ in unique.values()) != sorted(expected.invalid):
        p.append("DLQ letters differ from the log's invalid messages")
    if not result.dlq_reasons_ok:
        p.append("a dead letter lacks its error or source headers")
