"""Polling ahead and pacing, against stand-ins for Kafka and the publications: what
the consumer polls while the engines work, when it refreshes and when it publishes."""

from __future__ import annotations

import threading
import time

import pytest

from consumer.kafka_source import Record
from consumer.pacing import POLL_MARGIN_S, WARMUP_PUBLICATIONS, WARMUP_TOLERANCE, Pacing
from consumer.prefetch import (
    EXTRA_POLL_MS,
    MAX_PREFETCH_BATCHES,
    TOP_UP_POLL_MS,
    Prefetcher,
)
from consumer.recovery import Backoff
from consumer.stats import ConsumerStats
from producer.schema import DEFAULT_LIMITS
from rankstream.errors import ServiceUnavailable


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
