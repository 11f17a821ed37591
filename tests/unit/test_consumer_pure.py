"""Pure helpers of the consumer: lock values, score commands, DLQ headers, logs, stats."""

from __future__ import annotations

import io
import json
import logging
import socket

import pytest

from consumer.dead_letters import DeadLetter, DeadLetterSender, dead_letter_headers
from consumer.graph_write import GraphCounters
from consumer.jsonlog import JsonFormatter, safe_address
from consumer.kafka_source import Record
from consumer.lock import Holder
from consumer.prefetch import (
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


def test_meta_engine_bound_is_the_engines_own():
    from consumer.publication import meta_fields

    fields = meta_fields(total=100.0, bound=3e-3, tolerance=1e-4, fresh=True, version=1,
                         refreshed_at="t", offsets={}, damping=0.85, pages=100,
                         mode="local", engine_bound=1e-3, publication="x")
    assert fields["engine_bound"] == repr(1e-3) and fields["bound"] == repr(3e-3)


def test_a_record_kafka_python_cannot_read_names_the_remedy() -> None:
    """A header name that is not UTF-8 fails the whole fetch, for ever (session 37)."""
    from kafka.errors import CorruptRecordError

    from consumer.kafka_source import kafka_errors
    from rankstream.errors import ServiceError, ServiceUnavailable

    with pytest.raises(ServiceError) as raised, kafka_errors("polling"):
        raise CorruptRecordError("UnicodeDecodeError('utf-8', b'\\xff\\xfe', 0, 1)")
    assert not isinstance(raised.value, ServiceUnavailable)  # no retry gets past it
    assert "docs/reliability.md, 'Compressed batches'" in str(raised.value)
