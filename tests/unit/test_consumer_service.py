"""The consumer service's loop against stand-ins (no broker, no Redis): stop limits,
retries at start, the lease's fallbacks, threads, idle refreshes and shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from consumer.graph_write import GraphCounters
from consumer.recovery import Backoff
from consumer.stats import ConsumerStats, RateMeter
from rankstream.errors import ServiceUnavailable


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


@pytest.mark.timeout(120)  # a stop that never bounds the retries hangs, not fails
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
    monkeypatch.setattr(service_module, "check_layout", lambda client, keys: None)
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
    assert service.stops.reason == "max-seconds" and time.monotonic() - started < 5


def test_a_dropped_connection_while_checking_for_foreign_writes_is_retried():
    """After the lease was taken again, one Redis error in the check for foreign writes
    stopped the consumer; every other call around it is retried."""
    import redis

    from consumer.keys import Keys
    from consumer.lock import LockLost
    from consumer.recovery import Recovery

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

    import consumer.refreshes as refreshes_module
    from consumer.refreshes import MAX_IDLE_REFRESH_DELAY_S, Refreshes

    clock = [1000.0]
    monkeypatch.setattr(refreshes_module.time, "monotonic", lambda: clock[0])
    outcome = {"fresh": False}
    refreshed: list[float] = []
    published: list[float] = []
    mirror = SimpleNamespace(start_reports={"pagerank": None})
    refreshes = Refreshes(None, None, None, lambda: mirror)  # type: ignore[arg-type, return-value]

    def now() -> dict[str, SimpleNamespace]:
        refreshed.append(clock[0])
        return {"pagerank": SimpleNamespace(fresh=outcome["fresh"], relative_bound=0.5)}

    refreshes.now = now  # type: ignore[method-assign, assignment]
    stale = {"pagerank": False}  # stats.fresh: lags the publications

    def idle_polls(seconds: float) -> None:  # one empty poll every 50 ms
        for _ in range(int(seconds / 0.05)):
            refreshes.idle_refresh(stale, lambda: published.append(clock[0]))
            clock[0] += 0.05

    idle_polls(8.0)
    assert [round(at - 1000.0) for at in refreshed] == [0, 1, 3, 7]
    assert published == refreshed  # each refresh is published again
    idle_polls(2000.0)
    gaps = [b - a for a, b in itertools.pairwise(refreshed)]
    assert max(gaps) == pytest.approx(MAX_IDLE_REFRESH_DELAY_S, abs=0.1)
    count = len(refreshed)
    refreshes.new_events()
    outcome["fresh"] = True
    idle_polls(0.2)
    assert len(refreshed) == count + 4  # fresh again: no delay (stats.fresh lags)
    assert not refreshes.refresh_if_stale({"pagerank": True}, lambda: None)


def test_rate_meters_take_adds_and_reads_from_two_threads():
    """The loop thread adds while a writer thread's retry renders the status: "deque
    mutated during iteration" stopped a consumer (a review: 2,204 errors in 10 s)."""
    import sys


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
    assert service.stops.event.is_set() and service.recovery.stop_requested_at is not None
    assert done[-1] == "shutdown quiet=True"


def test_a_lease_that_keeps_vanishing_backs_off_and_heeds_a_stop():
    """A Redis evicting keys with a TTL took the lease at every write: each regain
    found nobody had written and carried on at once, a hot loop that ignored
    --max-seconds and SIGTERM (a review: 9,476 re-takes, 16 s of CPU)."""
    from consumer.keys import Keys
    from consumer.lock import LockLost
    from consumer.recovery import Recovery

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
    service.stops.request("caught-up")
    assert service._resume_catching_up()
    assert not service.stops.event.is_set() and service.recovery.stop_requested_at is None
    service.stops.request("caught-up")
    short[0] = False
    assert not service._resume_catching_up()  # caught up after all: drain and exit
    short[0] = True
    service.stops.request("SIGTERM")
    assert not service._resume_catching_up() and service.stops.event.is_set()

    # A signal while it asks Kafka whether it caught up: the stop stands (a review:
    # the event was cleared and the reason wiped).
    service = ConsumerService(Settings(), ConsumeOptions(until_caught_up=True))

    def asked_meanwhile(next_offsets=None):
        service.stops.request("SIGTERM")
        return False

    service.caught_up = asked_meanwhile  # type: ignore[method-assign]
    service.stops.request("caught-up")
    assert not service._resume_catching_up()
    assert service.stops.event.is_set() and service.recovery.stop_requested_at is not None

    # Resumed: publications are capped again (the drain had uncapped them).
    service = ConsumerService(Settings(), ConsumeOptions(until_caught_up=True))
    service.caught_up = lambda next_offsets=None: False  # type: ignore[method-assign]
    service.stops.request("caught-up")
    service.publications.capped = False
    assert service._resume_catching_up() and service.publications.capped
