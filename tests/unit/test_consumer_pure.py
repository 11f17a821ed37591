"""Pure helpers of the consumer: lock values, score commands, DLQ headers, logs, stats."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time

import pytest

from consumer.dead_letters import DeadLetter, DeadLetterSender, dead_letter_headers
from consumer.graph_write import GraphCounters
from consumer.jsonlog import JsonFormatter, safe_address
from consumer.kafka_source import Record
from consumer.lock import Holder
from consumer.pacing import POLL_MARGIN_S, WARMUP_PUBLICATIONS, WARMUP_TOLERANCE, Pacing
from consumer.prefetch import (
    EXTRA_POLL_MS,
    MAX_PREFETCH_BATCHES,
    TOP_UP_POLL_MS,
    Prefetcher,
    decode_records,
)
from consumer.publication import is_fresh, meta_fields
from consumer.readers import describe_bound
from consumer.recovery import Backoff
from consumer.serve_cli import _bind
from consumer.stats import (
    CATCHUP_BACKLOG_BATCHES,
    ConsumerStats,
    RateMeter,
    catching_up,
    lag_by_partition,
    seconds_to_catch_up,
)
from producer.schema import DEFAULT_LIMITS
from rankstream.errors import ServiceError, ServiceUnavailable


def bare_sender(producer: object) -> DeadLetterSender:
    """A DeadLetterSender over a stand-in for KafkaProducer's send/flush (no broker)."""
    sender = DeadLetterSender.__new__(DeadLetterSender)
    sender.topic, sender.source_topic, sender.max_value_bytes = "dlq", "events", 1 << 20
    sender._delivered, sender._in_flight = set(), {}
    sender._producer = producer
    return sender


def test_holder_round_trips_and_tolerates_garbage():
    holder = Holder("box", 42, "2026-01-01T00:00:00+00:00", "abc")
    assert Holder.decode(holder.encode()) == holder
    odd = Holder.decode(b"not json")
    assert odd is not None and odd.pid == -1
    assert Holder.decode(None) is None
    assert "pid 42 on host box" in holder.describe()


def test_fresh_is_never_published_above_the_relative_tolerance():
    assert is_fresh(True, 1e-4, 1e-6, total=1000.0)
    assert not is_fresh(True, 2e-3, 1e-6, total=1000.0)
    # At the edge, as readers see it: relative_bound one ulp over the tolerance.
    total = 134365.10974815712
    assert 3e-05 * total / total > 3e-05
    assert not is_fresh(True, 3e-05 * total, 3e-05, total=total)
    assert not is_fresh(False, 0.0, 1e-6, total=1000.0)
    assert not is_fresh(True, float("nan"), 1e-6, total=1000.0)


def test_meta_fields_keep_full_precision_and_offsets_json():
    fields = meta_fields(total=1234.5678901234567, bound=1e-9, tolerance=1e-6, fresh=True,
                         version=7, refreshed_at="now", offsets={"t:1": 5, "t:0": 3},
                         damping=0.85, pages=3, mode="local")
    assert float(fields["total"]) == 1234.5678901234567
    assert json.loads(fields["offsets"]) == {"t:0": 3, "t:1": 5}
    assert fields["fresh"] == "1" and fields["scale"] == "paper"
    assert float(fields["relative_bound"]) == 1e-9 / 1234.5678901234567


def test_dead_letter_headers_name_reason_and_origin():
    record = Record(partition=2, offset=17, key=b"k", value=b"\xff", timestamp_ms=0)
    headers = dict(dead_letter_headers(DeadLetter(record, "non-UTF-8: bad byte"), "links"))
    assert headers == {"error": b"non-UTF-8: bad byte", "source_topic": b"links",
                       "source_partition": b"2", "source_offset": b"17"}


def test_json_formatter_merges_fields_into_one_line():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("rankstream.test.jsonlog")
    logger.addHandler(handler)
    logger.propagate = False
    logger.warning("hello %s", "world", extra={"fields": {"batch": 3}})
    line = json.loads(stream.getvalue())
    assert line["msg"] == "hello world" and line["batch"] == 3 and line["level"] == "warning"


def test_safe_address_drops_credentials():
    assert safe_address("redis://user:secret@10.0.0.1:6380/0") == "10.0.0.1:6380"
    assert "secret" not in safe_address("rediss://:secret@host/0")


def test_lag_and_rates():
    assert lag_by_partition({0: 10, 1: 5}, {0: 7}) == {0: 3, 1: 5}
    # Catching up: CATCHUP_BACKLOG_BATCHES full batches (or more) waiting.
    assert CATCHUP_BACKLOG_BATCHES == 1
    assert catching_up(100, {0: 1000, 1: 60}, {0: 950, 1: 10})
    assert not catching_up(100, {0: 1000, 1: 60}, {0: 990, 1: 0})  # 70 left
    assert not catching_up(100, {}, {0: 5})  # nothing fetched yet: no known backlog
    assert seconds_to_catch_up({0: 1000, 1: 60}, {0: 800, 1: 60}, pace=100.0) == 2.0
    assert seconds_to_catch_up({0: 1000}, {0: 1000}, pace=0.0) == 0.0
    assert seconds_to_catch_up({0: 1000}, {}, pace=0.0) == float("inf")  # no pace yet
    meter = RateMeter(window_s=10.0)
    meter.add(100, now=0.0)
    meter.add(100, now=2.0)
    assert meter.rate(now=2.0) == 100.0
    assert meter.rate(now=100.0) == 0.0
    stats = ConsumerStats()
    stats.record_batch(10, 100)
    stats.last_batch_seconds = 0.01
    counters = GraphCounters(version=1, stale_ignored=2, dlq=3)
    fields = stats.status_fields(topic="t", counters=counters)
    assert fields["events"] == "10" and fields["dlq"] == "3" and json.loads(fields["lag"]) == {}
    assert fields["version"] == "1" and fields["stale_ignored"] == "2"
    assert stats.status_fields(topic="t", counters=None)["version"] == "0"


def test_decode_records_keeps_order_dead_letters_the_bad_and_tracks_next_offsets():
    good = b'{"type":"link_added","src":"https://a.test/","dst":"https://b.test/"}'
    records = [Record(0, 7, b"k", good, 0), Record(1, 3, b"k", b"{not json", 0),
               Record(0, 8, b"k", b'{"type":"page_removed","url":"https://a.test/"}', 0),
               Record(1, 4, None, b"\xff\xfe", 0)]
    batch = decode_records(records, DEFAULT_LIMITS)
    assert [type(e).__name__ for e in batch.events] == ["LinkAddedEvent", "PageRemovedEvent"]
    assert [(d.record.offset, d.reason.split(":")[0]) for d in batch.letters] == [
        (3, "malformed JSON"), (4, "not UTF-8")]
    assert batch.next_offsets == {0: 9, 1: 5}
    assert batch.records is records


def test_a_decoder_bug_dead_letters_the_record_instead_of_stalling_the_partition(monkeypatch):
    import producer.schema

    def broken(value, limits):
        raise KeyError("a bug")

    monkeypatch.setattr(producer.schema, "decode_event", broken)
    batch = decode_records([Record(0, 7, b"k", b"{}", 0)], DEFAULT_LIMITS)
    assert batch.events == [] and batch.next_offsets == {0: 8}
    assert [d.reason for d in batch.letters] == ["internal error: KeyError: 'a bug'"]


def test_a_retried_dead_letter_send_sends_only_the_letters_not_yet_confirmed():
    from kafka.errors import NotLeaderForPartitionError

    class Delivery:
        is_done = True

        def __init__(self, error):
            self.error = error

        def get(self, timeout=None):
            if self.error is not None:
                raise self.error

    class OnePartitionDown:
        """Stands in for KafkaProducer.send/flush: the letter at offset 1 fails twice."""

        def __init__(self):
            self.sent: list[int] = []
            self.failures = 2

        def send(self, topic, value, key, headers):
            offset = int(dict(headers)["source_offset"])
            self.sent.append(offset)
            failing = offset == 1 and self.failures > 0
            self.failures -= failing
            return Delivery(NotLeaderForPartitionError() if failing else None)

        def flush(self, timeout=None):
            pass

    sender = bare_sender(producer := OnePartitionDown())
    letters = [DeadLetter(Record(0, offset, b"k", b"x", 0), "bad") for offset in range(3)]
    for _ in range(2):
        with pytest.raises(ServiceUnavailable):
            sender.send(letters)
    sender.send(letters)
    assert producer.sent == [0, 1, 2, 1, 1]
    sender.send(letters)  # a new batch (same letters here) is sent whole again
    assert producer.sent == [0, 1, 2, 1, 1, 0, 1, 2]


def test_letters_still_queued_when_the_flush_times_out_are_waited_for_not_resent():
    """A dead-letter partition without a leader keeps its letters queued and the flush
    times out: the letters the others confirmed were not recorded, and every retry
    queued the whole batch again."""
    from kafka.errors import KafkaTimeoutError

    class Delivery:
        def __init__(self, done):
            self.is_done = done

        def get(self, timeout=None):
            assert self.is_done

    class LeaderlessPartition:
        def __init__(self):
            self.sent: list[int] = []
            self.queued: list[Delivery] = []

        def send(self, topic, value, key, headers):
            offset = int(dict(headers)["source_offset"])
            self.sent.append(offset)
            delivery = Delivery(done=offset % 2 == 0)  # odd ones: no leader
            if not delivery.is_done:
                self.queued.append(delivery)
            return delivery

        def flush(self, timeout=None):
            if any(not d.is_done for d in self.queued):
                raise KafkaTimeoutError("Timeout waiting for future")

    sender = bare_sender(producer := LeaderlessPartition())
    letters = [DeadLetter(Record(0, offset, b"k", b"x", 0), "bad") for offset in range(4)]
    for _ in range(2):
        with pytest.raises(ServiceUnavailable, match="still queued"):
            sender.send(letters)
    assert producer.sent == [0, 1, 2, 3]
    for delivery in producer.queued:  # the partition got a leader back
        delivery.is_done = True
    sender.send(letters)
    assert producer.sent == [0, 1, 2, 3] and not sender._in_flight

    # A send that raises (no metadata within max_block_ms) loses none of those before it.
    class BlockedOnce(LeaderlessPartition):
        def send(self, topic, value, key, headers):
            if int(dict(headers)["source_offset"]) == 2 and not getattr(self, "blocked", 0):
                self.blocked = 1
                raise KafkaTimeoutError("Failed to update metadata after 60.0 secs.")
            return super().send(topic, value, key, headers)

    sender._producer = producer = BlockedOnce()
    with pytest.raises(ServiceUnavailable):
        sender.send(letters)
    with pytest.raises(ServiceUnavailable, match="still queued"):
        sender.send(letters)
    assert producer.sent == [0, 1, 2, 3]


def test_backoff_doubles_with_jitter_up_to_its_cap():
    backoff = Backoff(initial_s=0.1, max_s=5.0)
    for attempt, base in ((0, 0.1), (1, 0.2), (3, 0.8), (6, 5.0), (60, 5.0)):
        delays = [backoff.delay(attempt) for _ in range(200)]
        assert all(base / 2 <= d <= base for d in delays), attempt
        assert len(set(delays)) > 1  # jittered: no thundering herd


class _FakeSource:
    """Stands in for KafkaSource.poll only (the policy below never touches Kafka)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.polls: list[int] = []
        self.offset = 0

    def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
        self.polls.append(timeout_ms)
        size = min(self.sizes.pop(0), max_records) if self.sizes else 0
        records = [Record(0, self.offset + i, None, b"{}", 0) for i in range(size)]
        self.offset += size
        return records


class _Work:
    """A stand-in for the engines' future: done after ``polls`` more polls."""

    def __init__(self, source: _FakeSource, polls: int) -> None:
        self.source, self.until = source, len(source.polls) + polls

    def done(self) -> bool:
        return len(self.source.polls) >= self.until


def _prefetcher(source: _FakeSource) -> Prefetcher:
    return Prefetcher(lambda: source, DEFAULT_LIMITS, batch_max_events=10, poll_timeout_ms=200,
                      backoff=Backoff(0.001, 0.001), stop_event=threading.Event())


def _never(next_offsets: dict[int, int]) -> bool:
    return False


def test_decoding_ahead_polls_while_the_engines_work_and_only_after_full_batches():
    source = _FakeSource([10, 10, 10, 10, 10, 10])
    ahead = _prefetcher(source)
    current = ahead.next()
    assert current is not None and len(current.records) == 10
    ahead.decode_during(_Work(source, 2), current, _never)
    # The first poll waits as usual, the extra one briefly; then the engines are done.
    assert source.polls == [200, 200, EXTRA_POLL_MS] and len(ahead.ahead) == 2
    ahead.decode_during(_Work(source, 10), current, _never)
    assert len(ahead.ahead) == MAX_PREFETCH_BATCHES  # bounded
    # After a batch that was not full (caught up), nothing is polled during the work.
    source = _FakeSource([4, 0, 10])
    ahead = _prefetcher(source)
    short = ahead.next()
    assert short is not None
    ahead.decode_during(_Work(source, 5), short, _never)
    assert source.polls == [200, TOP_UP_POLL_MS] and not ahead.ahead
    # Nor after a batch that reaches the caught-up targets.
    source = _FakeSource([10, 10])
    ahead = _prefetcher(source)
    full = ahead.next()
    assert full is not None
    ahead.decode_during(_Work(source, 5), full, lambda offsets: True)
    assert source.polls == [200] and not ahead.ahead


def test_a_short_poll_is_topped_up_by_a_second_one_for_the_fetch_in_flight():
    source = _FakeSource([4, 3, 5])
    fetched = _prefetcher(source).next()
    assert fetched is not None and [r.offset for r in fetched.records] == list(range(7))
    assert source.polls == [200, TOP_UP_POLL_MS] and fetched.next_offsets == {0: 7}
    source = _FakeSource([10, 5])  # a full batch needs no top-up
    assert len(_prefetcher(source).next().records) == 10 and source.polls == [200]  # type: ignore[union-attr]

    class _Failing(_FakeSource):
        def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
            if self.polls:
                raise ServiceUnavailable("broker gone")
            return super().poll(max_records, timeout_ms)

    failing = _Failing([4])
    fetched = _prefetcher(failing).next()  # the next poll reports the failure
    assert fetched is not None and len(fetched.records) == 4


class _Publications:
    """The parts of consumer.publishing.Publications that Pacing reads."""

    def __init__(self, *, due: bool = True, lag: float = 0.0, capped: bool = True,
                 last_seconds: float = 0.0) -> None:
        self.is_due, self.lag, self.capped, self.last_seconds = due, lag, capped, last_seconds
        self.count = 0

    def due(self, *, lagging: bool) -> bool:
        assert lagging
        return self.is_due


def _pacing(publications: _Publications, *, sweeps: float = 0.25) -> Pacing:
    return Pacing(publications, ConsumerStats(), tolerance=1e-6, batch_max_sweeps=sweeps,
                  stop_event=threading.Event())


def test_pacing_refreshes_when_a_publication_can_follow_and_no_tighter_than_it_shows():
    pacing = _pacing(_Publications(due=False))
    assert pacing.refresh_due(False) and not pacing.refresh_due(True)  # caught up / catching up
    assert not pacing.refresh_due(False, last=True)  # the drain follows
    pacing.stop_event.set()
    assert pacing.refresh_due(True)
    assert _pacing(_Publications(due=True)).refresh_due(True)
    assert _pacing(_Publications()).batch_sweeps() == 0.25
    assert _pacing(_Publications(), sweeps=0.0).batch_sweeps() is None
    # The target follows the published lag: a tenth of it, at most 1e-2, never
    # tighter than the tolerance, and only while publications are capped.
    assert _pacing(_Publications(lag=0.05)).batch_tolerance() == pytest.approx(5e-3)
    assert _pacing(_Publications(lag=1.0)).batch_tolerance() == 1e-2
    assert _pacing(_Publications(lag=0.05, capped=False)).batch_tolerance() is None
    warm = _pacing(_Publications(lag=5e-6))
    warm.warming = False
    assert warm.batch_tolerance() is None


def test_pacing_warms_up_until_the_lag_builds_up_or_for_a_few_publications():
    # A fast stream: no tighter than WARMUP_TOLERANCE until the lag's target reaches it.
    publications = _Publications(lag=0.0)
    pacing = _pacing(publications)
    assert pacing.batch_tolerance() == WARMUP_TOLERANCE  # the first batch after a start
    publications.count, publications.lag = 1, 2e-3  # capped: the lag builds up
    assert pacing.batch_tolerance() == WARMUP_TOLERANCE
    publications.count, publications.lag = 2, 0.02
    assert pacing.batch_tolerance() == pytest.approx(2e-3) and not pacing.warming
    publications.count, publications.lag = 3, 5e-3
    assert pacing.batch_tolerance() == pytest.approx(5e-4)  # follows the lag from now on
    # A stream whose publications stay whole: warming up ends after a few of them.
    publications = _Publications(lag=0.0)
    publications.count = 1  # the start's own publication
    pacing = _pacing(publications)
    for count in range(1, 1 + WARMUP_PUBLICATIONS):
        publications.count, publications.lag = count, 3e-7
        assert pacing.batch_tolerance() == WARMUP_TOLERANCE
    publications.count = 1 + WARMUP_PUBLICATIONS
    assert pacing.batch_tolerance() is None and not pacing.warming


def test_pacing_knows_when_the_drain_comes_before_a_publication_could_end():
    pacing = _pacing(_Publications(last_seconds=5.0))
    assert not pacing.caught_up({0: 10}) and not pacing.drain_comes_first({0: 10})
    pacing.targets = {0: 10_000, 1: 0}  # an empty partition needs nothing
    assert pacing.caught_up({0: 10_000}) and pacing.drain_comes_first({0: 10_000})
    assert not pacing.drain_comes_first({0: 9_800})  # no pace measured yet
    pacing.stats.events_meter.add(1000, now=time.monotonic() - 5.0)
    pacing.stats.events_meter.add(1000)  # ~400 events/s
    assert pacing.drain_comes_first({0: 9_800})  # ~0.5 s left; a publication takes 5 s
    assert not pacing.drain_comes_first({0: 0})  # ~25 s left


def test_pacing_puts_a_poll_off_until_shortly_before_the_refresh_should_end():
    pacing = _pacing(_Publications())
    assert pacing.poll_delay(100.0) == 0.0  # no refresh in flight
    pacing.refresh_started(100.0)
    assert pacing.poll_delay(100.0) == 0.0  # nothing measured yet: poll now
    pacing.refresh_took(0.4)
    pacing.planned(0.1)
    pacing.refresh_started(200.0)
    assert pacing.poll_delay(200.0) == pytest.approx(0.3 - POLL_MARGIN_S)
    assert pacing.poll_delay(200.35) == 0.0  # late already
    pacing.refresh_took(0.8)  # running estimates: 0.7 x old + 0.3 x new
    assert pacing.refresh_s == pytest.approx(0.52) and pacing.refresh_began is None
    pacing.refresh_started(300.0)
    pacing.stop_event.set()
    assert pacing.poll_delay(300.0) == 0.0  # stopping: no waiting


def test_serve_binds_before_uvicorn_so_failures_are_one_line_errors() -> None:
    """uvicorn would log and sys.exit(3) on these instead of raising."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ServiceError, match=rf"cannot serve on 127\.0\.0\.1:{port}"):
            _bind("127.0.0.1", port)
    with pytest.raises(ServiceError, match=r"cannot serve on no-such-host\.invalid:8080"):
        _bind("no-such-host.invalid", 8080)
    with _bind("127.0.0.1", 0) as listener:
        assert listener.getsockname()[1] > 0


def test_readers_give_up_on_a_stalled_redis_in_seconds_not_minutes():
    from consumer.redis_store import connect_redis
    from rankstream.settings import Settings

    settings = Settings()
    reader = connect_redis(settings, reader=True).connection_pool.connection_kwargs
    consumer = connect_redis(settings).connection_pool.connection_kwargs
    assert reader["socket_timeout"] == 5.0 and reader["retry"].get_retries() == 1
    assert consumer["socket_timeout"] == 30.0 and consumer["retry"].get_retries() == 3


def test_a_keyless_tombstone_is_dead_lettered_with_an_empty_value_and_a_header():
    # kafka-python refuses to send a record with neither key nor value: the
    # AssertionError stopped the consumer at that record on every start.
    sent = []

    class Producer:
        def send(self, topic, value, key, headers):
            assert key is not None or value is not None, "Need at least one: key or value"
            sent.append((value, dict(headers)))
            return None

    sender = bare_sender(Producer())
    sender._send_one(DeadLetter(Record(0, 5, None, None, 0), "empty message: a tombstone"))
    [(value, headers)] = sent
    assert value == b"" and headers["tombstone"] == b"1"
    assert headers["error"] == b"empty message: a tombstone"


def test_meta_takes_the_published_relative_bound_as_it_was_published():
    from consumer.readers import Meta

    empty = Meta.from_hash("pagerank", {"bound": "0.0", "total": "0.0", "relative_bound": "0.0",
                                        "fresh": "1"})
    assert empty.relative_bound == 0.0 and empty.as_dict()["relative_bound"] == 0.0
    older = Meta.from_hash("pagerank", {"bound": "2.0", "total": "4.0"})  # no field: derived
    assert older.relative_bound == 0.5


def test_a_failed_back_buffer_renewal_stays_due_for_the_retry() -> None:
    """It was marked done before the write: a retry skipped it, and the failure had
    stopped an idle consumer (the service now retries it like its other writes)."""
    from consumer.publishing import Publications

    class Publisher:
        calls = 0

        def renew_back_buffers(self) -> None:
            Publisher.calls += 1
            if Publisher.calls == 1:
                raise ServiceUnavailable("redis unavailable while renewing")

    publications = Publications(Publisher(), None, None, None, min_interval_s=0.0)  # type: ignore[arg-type]
    publications._buffers_due = 0.0
    try:
        with pytest.raises(ServiceUnavailable):
            publications.renew_buffers()
        publications.renew_buffers()
        publications.renew_buffers()  # done: not due for another third of the TTL
        assert Publisher.calls == 2
    finally:
        publications.close()


def test_failing_polls_back_off_more_each_time_and_a_stop_cuts_the_wait_short():
    """The pause after a failed poll stayed at its first step (0.05-0.1 s)."""

    class Down:
        def poll(self, max_records: int, timeout_ms: int) -> list[Record]:
            raise ServiceUnavailable("kafka: no broker")

    waits: list[float] = []

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            return False

    fetcher = Prefetcher(lambda: Down(), DEFAULT_LIMITS, batch_max_events=10,  # type: ignore[arg-type, return-value]
                         poll_timeout_ms=200, backoff=Backoff(0.1, 5.0), stop_event=Stop())
    for _ in range(8):
        assert fetcher.fetch() is None
    assert [w > 0.0 for w in waits] == [True] * 8
    assert waits[0] <= 0.1 and 2.5 <= waits[-1] <= 5.0  # doubling, capped (with jitter)
    fetcher._source = lambda: _FakeSource([3])  # type: ignore[assignment, return-value]
    assert fetcher.fetch() is not None and fetcher._failed_polls == 0
    # Polling ahead while the engines work: a failure hands the batch in hand back at
    # once (its commit and publication need not wait for Kafka).
    full = _FakeSource([10])
    fetcher._source = lambda: full  # type: ignore[assignment, return-value]
    current = fetcher.fetch()
    assert current is not None
    fetcher._source = lambda: Down()  # type: ignore[assignment, return-value]
    waits.clear()
    fetcher.decode_during(_Work(full, 100), current, _never)
    assert waits == [] and fetcher._failed_polls == 1 and not fetcher.ahead


def test_the_bound_is_described_on_the_scale_of_the_scores_beside_it() -> None:
    paper = describe_bound(True, 0.016, 1e-6, 1e-6)
    assert paper == ("fresh, certified L1 bound 1.60e-02 = 1.0e-06 of sum(y) "
                     "(tolerance 1.0e-06 of sum(y))")
    probability = describe_bound(False, 0.016, 1e-6, 1e-6, scale="probability")
    assert probability == ("NOT fresh, certified L1 bound 2.0e-06 on the probability scale "
                           "(tolerance 1.0e-06 of sum(y))")


@pytest.mark.parametrize(("reply", "retried"), [
    ("OOM command not allowed when used memory > 'maxmemory'.", True),
    ("READONLY You can't write against a read only replica.", True),
    ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable", True),
    ("EXECABORT Transaction discarded because of: OOM command not allowed when used "
     "memory > 'maxmemory'.", True),
    ("EXECABORT Transaction discarded because of previous errors.", False),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
    ("ERR unknown command 'FOO'", False),
])
@pytest.mark.parametrize("path", ["reply", "redis-py", "redis-py pipeline"])
def test_redis_refusals_that_pass_by_themselves_are_retried_others_stop(
        reply: str, retried: bool, path: str) -> None:
    """As each path raises them: our own reader keeps the reply whole; redis-py moves
    the codes it knows into ``status_code`` and its pipelines prefix the command."""
    import redis
    from redis._parsers.base import BaseParser

    from consumer.redis_store import redis_errors

    error = redis.ResponseError(reply) if path == "reply" else BaseParser.parse_error(reply)
    if path == "redis-py pipeline":
        redis.client.Pipeline.annotate_exception(None, error, 2,  # type: ignore[arg-type]
                                                 ("SET", "caused error: x", "1"))
    with pytest.raises(ServiceError) as caught, redis_errors("writing"):
        raise error
    assert isinstance(caught.value, ServiceUnavailable) is retried


def test_stored_json_nested_past_the_parser_is_shown_or_refused_not_a_traceback():
    """json.loads raises RecursionError (not ValueError) on a value nested a few
    thousand deep: `rankstream status` exited with a traceback, /status a bare 500."""
    from consumer.readers import _offsets, _status_dict
    from consumer.redis_store import stored_data

    deep = "[" * 5000 + "]" * 5000
    from consumer.keys import ALGORITHMS

    status = _status_dict("p:", [{b"lag": deep.encode()}, {}, {}, deep.encode(),
                                 *[{} for _ in ALGORITHMS]])
    assert status["consumer"]["lag"] == deep and status["lock"] == {"raw": deep}
    with pytest.raises(ServiceError, match="unexpected data"), stored_data("reading"):
        _offsets(deep)


def test_scores_that_sum_to_infinity_are_not_published():
    import numpy as np

    from consumer.score_publisher import _check_finite

    y = np.array([1e308, 1e308, 1.0])
    with pytest.raises(ServiceError, match="not finite"):
        _check_finite("pagerank", y, np.ones(3, dtype=bool), 0.0)
    _check_finite("pagerank", y, np.array([True, False, True]), 0.0)


def test_a_partition_read_over_counts_its_real_offsets_once_a_batch_committed():
    """After a recreated topic (stored offset 100, log end 40) the partition is read
    from its start, and positions() mapped the stale offset back to the start. It did
    so for good: once the new log reached 100 and a batch committed it, lag showed
    the whole partition and --until-caught-up waited for ever."""
    from kafka import KafkaConsumer, TopicPartition

    from consumer.kafka_source import KafkaSource

    partition = TopicPartition("events", 0)

    class RecreatedLog(KafkaConsumer):  # kafka-python's own assign/seek/position
        log_end = 40

        def partitions_for_topic(self, topic):
            return {0}

        def beginning_offsets(self, partitions, timeout_ms=None):
            return {tp: 0 for tp in partitions}

        def end_offsets(self, partitions, timeout_ms=None):
            return {tp: self.log_end for tp in partitions}

        def commit_async(self, offsets=None, callback=None):
            pass

    source = KafkaSource.__new__(KafkaSource)
    source.topic = "events"
    source._consumer = RecreatedLog(bootstrap_servers=["127.0.0.1:1"], api_version=(2, 8, 0),
                                    group_id="g", enable_auto_commit=False)
    source._partitions, source._log_starts, source._rewound, source._expected = [], {}, {}, {}
    source._next_partition_check = float("inf")
    try:
        source.assign({0: 100})
        assert source.positions({0: 100}) == {0: 0}  # nothing of the new log read yet
        source._expected[0] = 100  # the records up to 100 were handed out...
        source._consumer.seek(partition, 100)
        source.commit_for_monitoring({0: 100})  # ...and their batch committed
        assert source.positions({0: 100}) == {0: 100}
    finally:
        source._consumer.close()


def test_max_seconds_stops_a_consumer_blocked_in_retries_at_start(monkeypatch):
    """The limit was checked between steps only: with no broker at start the topic
    creation was retried for ever, far past --max-seconds."""
    import consumer.service as service_module
    from consumer.options import ConsumeOptions
    from consumer.service import ConsumerService
    from rankstream.settings import Settings

    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")

    def no_broker(settings):
        raise ServiceUnavailable("kafka: no broker")

    monkeypatch.setattr(service_module, "ensure_settings_topics", no_broker)
    monkeypatch.setattr(service_module, "check_redis_fits", lambda client: None)
    service = ConsumerService(Settings(), ConsumeOptions(
        max_seconds=0.3, backoff_initial_s=0.01, backoff_max_s=0.05, stop_grace_s=0.3))
    service.recovery.wait_for_redis = lambda within_s, stop_event: None
    service.lock.acquire = lambda: None
    service.lock.start_renewal = lambda: None
    service._set_state = lambda *args, **kwargs: None
    service.shutdown = lambda quiet=False: None
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable, match="gave up creating topics"):
        service.run()
    assert service.stop_reason == "max-seconds" and time.monotonic() - started < 5


def test_a_dropped_connection_while_checking_for_foreign_writes_is_retried():
    """After the lease was taken again, one Redis error in the check for foreign writes
    stopped the consumer; every other call around it is retried."""
    import redis

    from consumer.keys import Keys
    from consumer.lock import LockLost
    from consumer.recovery import Recovery
    from consumer.stats import ConsumerStats

    class LapsedLease:
        suspended, lost = threading.Event(), threading.Event()

        def still_ours(self):
            return False

        def reacquire(self):
            return True

    class OneBlip:
        calls = 0

        def hget(self, key, field):
            OneBlip.calls += 1
            if OneBlip.calls == 1:
                raise redis.ConnectionError("Connection reset by peer")
            return b"7"

        def hgetall(self, key):
            return {b"t:0": b"10"}

    recovery = Recovery(OneBlip(), LapsedLease(), Keys("rs:"), "t", ConsumerStats(),
                        Backoff(0.01, 0.02), stop_grace_s=30, set_state=lambda state: None)
    recovery.committed = (GraphCounters(version=7), {"t:0": 10})  # Redis holds it: carry on
    attempts = []

    def commit():
        attempts.append(None)
        if len(attempts) == 1:
            raise LockLost("lost the consumer lock rs:lock")
        return "committed"

    assert recovery.fenced("committing the graph", commit) == "committed"
    assert not LapsedLease.suspended.is_set()


def test_status_written_from_a_writer_thread_leaves_the_kafka_consumer_alone(monkeypatch):
    """A retry on the graph-writer thread writes "waiting" with the status fields,
    which read the lag from kafka-python's consumer while the loop polled it."""
    from consumer.options import ConsumeOptions
    from consumer.service import ConsumerService
    from rankstream.settings import Settings

    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    service = ConsumerService(Settings(), ConsumeOptions())
    calls = []

    class Source:
        def highwaters(self):
            calls.append(threading.get_ident())
            return {0: 10}

        def positions(self, offsets):
            return {0: 4}

    class Mirror:
        def __init__(self):
            self.offsets, self.counters = {0: 4}, None

    service.source, service.mirror = Source(), Mirror()  # type: ignore[assignment]
    writer = threading.Thread(target=service._status_fields)
    writer.start()
    writer.join()
    assert calls == [] and service.stats.lag == {}
    service._status_fields()
    assert calls == [threading.get_ident()] and service.stats.lag == {0: 6}


def test_max_seconds_past_what_a_timer_can_wait_is_no_limit_not_a_traceback(monkeypatch):
    """--max-seconds inf reached threading.Timer, whose thread died with an
    OverflowError traceback (and left no limit)."""
    import consumer.service as service_module
    from consumer.options import ConsumeOptions
    from consumer.service import ConsumerService
    from rankstream.settings import Settings

    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    timers = []
    monkeypatch.setattr(service_module.threading, "Timer",
                        lambda *args, **kwargs: timers.append(args))
    service = ConsumerService(Settings(), ConsumeOptions(max_seconds=float("inf")))

    def no_redis(*args, **kwargs):
        raise ServiceUnavailable("redis unavailable")

    service.recovery.wait_for_redis = no_redis
    service.shutdown = lambda quiet=False: None
    with pytest.raises(ServiceUnavailable):
        service.run()
    assert timers == []


def test_idle_refreshes_that_stay_unfresh_back_off(monkeypatch):
    """A refresh that cannot make the scores fresh (max_iter too low for the damping)
    was repeated, max_iter sweeps each time, at every empty poll; now after 1 s, 2 s,
    4 s... up to MAX_IDLE_REFRESH_DELAY_S, and at once again after new events."""
    import itertools
    from types import SimpleNamespace

    import consumer.service as service_module
    from consumer.options import ConsumeOptions
    from consumer.service import MAX_IDLE_REFRESH_DELAY_S, ConsumerService
    from rankstream.settings import Settings

    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    service = ConsumerService(Settings(), ConsumeOptions())
    clock = [1000.0]
    monkeypatch.setattr(service_module.time, "monotonic", lambda: clock[0])
    outcome = {"fresh": False}
    refreshes: list[float] = []

    class Refreshes:
        def now(self):
            refreshes.append(clock[0])
            return {"pagerank": SimpleNamespace(fresh=outcome["fresh"], relative_bound=0.5)}

    service.mirror = SimpleNamespace(start_reports={"pagerank": None})  # type: ignore[assignment]
    service.stats.fresh = {"pagerank": False}
    service.refreshes = Refreshes()  # type: ignore[assignment]
    service._maybe_publish = lambda **kwargs: None  # type: ignore[method-assign]

    def idle_polls(seconds: float) -> None:  # one empty poll every 50 ms
        for _ in range(int(seconds / 0.05)):
            if clock[0] >= service._idle_refresh_due:
                service._idle_refresh()
            clock[0] += 0.05

    idle_polls(8.0)
    assert [round(at - 1000.0) for at in refreshes] == [0, 1, 3, 7]
    idle_polls(2000.0)
    gaps = [b - a for a, b in itertools.pairwise(refreshes)]
    assert max(gaps) == pytest.approx(MAX_IDLE_REFRESH_DELAY_S, abs=0.1)
    count = len(refreshes)
    service._idle_refresh_delay = service._idle_refresh_due = 0.0  # as a new batch does
    outcome["fresh"] = True
    idle_polls(0.2)
    assert len(refreshes) == count + 4  # fresh again: no delay (stats.fresh lags)


def test_rate_meters_take_adds_and_reads_from_two_threads():
    """The loop thread adds while a writer thread's retry renders the status: "deque
    mutated during iteration" stopped a consumer (a review: 2,204 errors in 10 s)."""
    import sys

    from consumer.stats import RateMeter

    meter = RateMeter(window_s=0.001)
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                meter.rate()
            except Exception as exc:
                errors.append(exc)
                return

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not errors:
            for _ in range(100):
                meter.add(1)
    finally:
        stop.set()
        reader.join()
        sys.setswitchinterval(old)
    assert not errors, errors[0]


def test_shutdown_runs_every_step_whatever_one_raises(monkeypatch):
    """A status write that raised (a lease key of another type) skipped the release
    of the lease, of the back buffers and of Kafka; and an error of the loop while a
    writer thread retried an outage left shutdown waiting for that thread."""
    from consumer.lock import LockNotString
    from consumer.options import ConsumeOptions
    from consumer.service import ConsumerService
    from rankstream.settings import Settings

    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    service = ConsumerService(Settings(), ConsumeOptions())
    done: list[str] = []
    service._holding = service._lock_tried = True

    def status(*args, **kwargs):
        raise LockNotString("rs:lock holds a value that is not a consumer lease")

    service._set_state = status  # type: ignore[method-assign]
    service.publisher.release = lambda: done.append("back buffers")  # type: ignore[method-assign]
    service.lock.release = lambda: done.append("lease")  # type: ignore[method-assign]
    service.redis.close = lambda: done.append("redis")  # type: ignore[method-assign]
    with pytest.raises(LockNotString):
        service.shutdown()
    assert done == ["back buffers", "lease", "redis"]
    done.clear()
    service.shutdown(quiet=True)  # an error on its way out already: not replaced
    assert done == ["back buffers", "lease", "redis"]

    def broken_start() -> None:
        raise RuntimeError("a bug in planning")

    service = ConsumerService(Settings(), ConsumeOptions())
    service.start = broken_start  # type: ignore[method-assign]
    service.shutdown = lambda quiet=False: done.append(f"shutdown quiet={quiet}")  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        service.run()
    # The stop request bounds the worker threads' retries by the stop grace.
    assert service.stop_event.is_set() and service.recovery.stop_requested_at is not None
    assert done[-1] == "shutdown quiet=True"


def test_a_lease_that_keeps_vanishing_backs_off_and_heeds_a_stop():
    """A Redis evicting keys with a TTL took the lease at every write: each regain
    found nobody had written and carried on at once, a hot loop that ignored
    --max-seconds and SIGTERM (a review: 9,476 re-takes, 16 s of CPU)."""
    from consumer.keys import Keys
    from consumer.lock import LockLost
    from consumer.recovery import Recovery
    from consumer.stats import ConsumerStats

    class Evicted:
        suspended, lost = threading.Event(), threading.Event()

        def still_ours(self):
            return False

        def reacquire(self):
            return True

    class Kept:  # Redis still holds what we committed: "nobody wrote, continuing"
        def hget(self, key, field):
            return b"7"

        def hgetall(self, key):
            return {b"t:0": b"10"}

    sleeps: list[int] = []

    class Counting(Backoff):
        def sleep(self, attempt: int) -> None:
            sleeps.append(attempt)
            if len(sleeps) == 5:
                recovery.stop_requested_at = time.monotonic() - 1.0  # past the grace

    recovery = Recovery(Kept(), Evicted(), Keys("rs:"), "t", ConsumerStats(),
                        Counting(0.001, 0.002), stop_grace_s=0.5,
                        set_state=lambda state: None)
    recovery.committed = (GraphCounters(version=7), {"t:0": 10})

    def swap():
        raise LockLost("lost the consumer lock rs:lock")

    with pytest.raises(ServiceUnavailable, match="gave up publishing after the stop request"):
        recovery.fenced("publishing", swap)
    assert sleeps == [0, 1, 2, 3, 4]  # the first regain at once, then backing off


def test_a_refused_inline_renewal_leaves_the_decision_to_the_fence():
    """Out of memory past ttl/3: the renewal inside fenced() raised redis' raw
    OutOfMemoryError, which nothing retried (a traceback, under noeviction)."""
    import redis

    from consumer.lock import ConsumerLock

    class Full:
        def pipeline(self, transaction=True):
            raise redis.exceptions.OutOfMemoryError(
                "command not allowed when used memory > 'maxmemory'")

    lock = ConsumerLock(Full(), "rs:lock", ttl_ms=3000)  # type: ignore[arg-type]
    lock._renewed_at = time.monotonic() - 10.0  # renewal overdue
    with lock.fenced():
        pass  # the fenced write's own lease check decides


def test_a_catching_up_stop_is_taken_back_when_a_rebuild_falls_short(monkeypatch):
    """--until-caught-up: Redis went back during the final drain; the rebuild left
    the mirror short of the targets, and the consumer exited 0 with those events
    unread (a review). A stop asked for otherwise (a signal, --max-seconds) stands."""
    from consumer.options import ConsumeOptions
    from consumer.service import ConsumerService
    from rankstream.settings import Settings

    monkeypatch.setenv("RANKSTREAM_REDIS_URL", "redis://127.0.0.1:1/0")
    service = ConsumerService(Settings(), ConsumeOptions(until_caught_up=True))
    short = [True]
    service.caught_up = lambda next_offsets=None: not short[0]  # type: ignore[method-assign]
    service.request_stop("caught-up")
    assert service._resume_catching_up()
    assert not service.stop_event.is_set() and service.recovery.stop_requested_at is None
    service.request_stop("caught-up")
    short[0] = False
    assert not service._resume_catching_up()  # caught up after all: drain and exit
    short[0] = True
    service.request_stop("SIGTERM")
    assert not service._resume_catching_up() and service.stop_event.is_set()

    # A signal while it asks Kafka whether it caught up: the stop stands (a review:
    # the event was cleared and the reason wiped).
    service = ConsumerService(Settings(), ConsumeOptions(until_caught_up=True))

    def asked_meanwhile(next_offsets=None):
        service.request_stop("SIGTERM")
        return False

    service.caught_up = asked_meanwhile  # type: ignore[method-assign]
    service.request_stop("caught-up")
    assert not service._resume_catching_up()
    assert service.stop_event.is_set() and service.recovery.stop_requested_at is not None

    # Resumed: publications are capped again (the drain had uncapped them).
    service = ConsumerService(Settings(), ConsumeOptions(until_caught_up=True))
    service.caught_up = lambda next_offsets=None: False  # type: ignore[method-assign]
    service.request_stop("caught-up")
    service.publications.capped = False
    assert service._resume_catching_up() and service.publications.capped
