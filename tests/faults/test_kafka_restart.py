"""The Kafka broker restarted (SIGTERM) and crashed (SIGKILL) while the consumer streams.

The fault stack's own broker is used, so the shared one never goes down. The log
keeps being replayed through both outages by a producer that waits for the
broker (its delivery timeout outlasts a restart), and dead letters have to be
produced while the broker comes and goes.
"""

from __future__ import annotations

from pathlib import Path

from rankstream.services import kafka_pid, kill_kafka, restart_kafka, start_kafka
from tests.faults.harness import Probe, Replayer, audit
from tests.faults.known_log import build_log
from tests.faults.stack import FaultStack, consumers, wait_for
from tests.faults.summary import record


def test_kafka_broker_restarted_and_killed_mid_stream(fault_stack: FaultStack,
                                                      tmp_path: Path) -> None:
    settings = fault_stack.scenario("kafka-restart", partitions=3, batch_max_events=40,
                                    poll_timeout_ms=100)
    log = build_log(2400, seed=51, invalid=0.02)
    client = fault_stack.client()
    probe = Probe(client, settings)
    recoveries: list[float] = []
    replayer = Replayer(settings, log, rate=60.0).start()
    with consumers(settings, tmp_path) as spawn:
        proc = spawn()
        for action in ("restart", "kill"):
            wait_for(lambda: probe.consumed() > 0, 60, "progress before the fault")
            old_pid = kafka_pid(fault_stack.kafka)
            if action == "restart":  # controlled shutdown, then start
                restart_kafka(fault_stack.kafka, timeout=180.0)
            else:  # a crash: no controlled shutdown, unflushed segments recovered
                kill_kafka(fault_stack.kafka)
                start_kafka(fault_stack.kafka, timeout=180.0)
            # The fault happened: a lookup that found no broker made both no-ops.
            assert old_pid is not None and kafka_pid(fault_stack.kafka) not in (None, old_pid)
            before = probe.consumed()
            recoveries.append(wait_for(probe.beyond(before), 120,
                                       f"progress after the broker {action}"))
            assert proc.alive(), proc.output()[-3000:]
        replayer.join(timeout=300)
        wait_for(lambda: probe.caught_up(len(log)), 120, "catching up")
        assert proc.stop() == 0, proc.output()[-3000:]
    result = audit(client, settings, log)
    client.close()
    record("Kafka broker restarted + killed", faults=2, result=result, recoveries=recoveries,
           note="recovery counted from the broker answering again: "
                + ", ".join(f"{s:.1f} s" for s in recoveries))
    result.check()
