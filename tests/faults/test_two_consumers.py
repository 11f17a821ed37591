"""Two consumers started by mistake on the same topic and key prefix.

The design (docs/redis-keys.md, "The single-consumer lease"): the second one
REFUSES to start while the first holds the lease, and a first one that stalled
past its lease (SIGSTOP here) is FENCED: when it wakes up, its transactions
abort on the changed lease, it writes nothing and stops with an error, while the
consumer that took over carries on. Either way no event is applied twice.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from consumer.lock import ConsumerLock
from tests.faults.harness import Probe, Replayer, audit
from tests.faults.known_log import build_log
from tests.faults.stack import FaultStack, consumers, wait_for
from tests.faults.summary import record

LEASE_MS = 2000
# The first consumer's: it must keep its lease through step 1 (renewing every third of
# it) on a busy box, yet lose it soon once frozen in step 2.
FIRST_LEASE_MS = 6000


def test_second_consumer_refuses_and_a_stalled_first_one_is_fenced(
        fault_stack: FaultStack, tmp_path: Path) -> None:
    settings = fault_stack.scenario("two-consumers", partitions=2, batch_max_events=40,
                                    poll_timeout_ms=100)
    log = build_log(1500, seed=61)
    client = fault_stack.client()
    probe = Probe(client, settings)
    replayer = Replayer(settings, log, rate=100.0).start()
    lease = ("--lock-ttl-ms", str(LEASE_MS))
    with consumers(settings, tmp_path) as spawn:
        first = spawn("--lock-ttl-ms", str(FIRST_LEASE_MS))
        wait_for(lambda: probe.consumed() > 0 and probe.state() == "running", 60,
                 "the first consumer")

        # 1. A second consumer while the first is healthy: refused, nothing written.
        version = probe.graph_version()
        second = spawn(*lease)
        assert second.wait(timeout=60) == 2
        refusal = second.output()
        assert "refusing to start" in refusal and f"pid {first.pid}" in refusal, refusal
        assert first.alive() and probe.graph_version() >= version
        # Nor did it write the status (the lease holder's alone) before refusing.
        assert client.hget(probe.keys.status, "pid") == str(first.pid).encode()

        # 2. The first stalls past its lease; a third consumer takes over.
        os.kill(first.pid, signal.SIGSTOP)
        time.sleep(FIRST_LEASE_MS / 1000 + 1.0)
        third = spawn(*lease)
        before = probe.consumed()
        takeover = wait_for(lambda: probe.consumed() > before, 60, "the third consumer")
        wait_for(lambda: client.hget(probe.keys.status, "pid") == str(third.pid).encode(),
                 10, "the status of the live consumer")
        # 3. The first wakes up: its next transaction is fenced off and it stops.
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=60) == 2, first.output()[-3000:]
        fenced = first.output().strip().splitlines()[-1]
        assert "another consumer took" in fenced, first.output()[-3000:]
        assert third.alive()
        # The live consumer owns P status: the fenced one must not write its
        # state=stopped there on its way out.
        assert probe.state() == "running"
        assert client.hget(probe.keys.status, "pid") == str(third.pid).encode()
        replayer.join()
        wait_for(lambda: probe.caught_up(len(log)), 120, "catching up")
        assert third.stop() == 0, third.output()[-3000:]
    result = audit(client, settings, log)
    client.close()
    record("Two consumers on one topic", faults=2, result=result, recoveries=[takeover],
           note="the second refused (exit 2); the stalled first was fenced (exit 2) after "
                "a third took the expired lease")
    result.check()


def test_both_writer_threads_can_retake_an_expired_lease(fault_stack: FaultStack) -> None:
    """After a stall past the TTL, the graph writer and the score writer both find the
    lease gone and both call ``reacquire``: the second must see the lease as its own
    (regression: it took its own process for another consumer and stopped it)."""
    client = fault_stack.client()
    key = f"faults:{os.getpid()}:{time.monotonic_ns()}:lock"
    lock = ConsumerLock(client, key, ttl_ms=LEASE_MS)
    stranger = ConsumerLock(client, key, ttl_ms=LEASE_MS, pid=1)  # pid 1 is alive
    try:
        lock.acquire()
        client.delete(key)  # the TTL ran out while the process was frozen
        assert lock.reacquire() and lock.reacquire()  # one writer thread, then the other
        assert lock.still_ours()
        assert not stranger.reacquire()  # a live stranger is still refused
    finally:
        lock.release()
        client.close()
