"""Redis restarted, killed, unreachable, frozen and rolled back while the consumer streams.

All against the fault stack's own redis-server (AOF on, ``appendfsync everysec``),
so restarting or freezing it disturbs no other test.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from rankstream.services import frozen_redis, kill_redis, redis_pid, start_redis, stop_redis
from tests.faults.harness import Probe, Replayer, audit
from tests.faults.known_log import build_log
from tests.faults.stack import ConsumerProcess, FaultStack, consumers, wait_for
from tests.faults.summary import record

FREEZE_SECONDS = 30.0
UNREACHABLE_SECONDS = 5.0
LEASE_MS = 10_000  # the frozen scenario's consumer lease
# A waiting consumer sleeps in socket reads and backoff; 5% of one core is generous.
MAX_CPU_SHARE_WHILE_FROZEN = 0.05


def log_lines(text: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def test_redis_restarted_killed_and_unreachable_mid_stream(fault_stack: FaultStack,
                                                           tmp_path: Path) -> None:
    settings = fault_stack.scenario("redis-restart", partitions=3, batch_max_events=40,
                                    poll_timeout_ms=100)
    log = build_log(1800, seed=31)
    server = fault_stack.redis
    client = fault_stack.client()
    probe = Probe(client, settings)
    recoveries: list[float] = []
    unreachable_cpu: list[float] = []

    def fault_then_recover(action: str, proc: ConsumerProcess) -> None:
        wait_for(lambda: probe.consumed() > 0, 60, "progress before the fault")
        before = probe.consumed()
        old_pid = redis_pid(server)
        if action == "restart":  # SIGTERM: Redis fsyncs the AOF and exits cleanly
            stop_redis(server)
            start_redis(server)
        elif action == "unreachable":  # connection refused for a while
            stop_redis(server)
            cpu = proc.cpu_seconds()
            time.sleep(UNREACHABLE_SECONDS)
            unreachable_cpu.append(proc.cpu_seconds() - cpu)
            start_redis(server)
        else:  # SIGKILL: AOF loses at most what the kernel had not received
            kill_redis(server)
            start_redis(server)
        # The fault happened: a lookup that found no server would make each a no-op.
        assert old_pid is not None and redis_pid(server) not in (None, old_pid), action
        recoveries.append(wait_for(lambda: probe.consumed() > before, 60,
                                   f"progress after the Redis {action}"))

    aof = client.config_get("appendonly")
    assert {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v
            for k, v in aof.items()} == {"appendonly": "yes"}
    replayer = Replayer(settings, log, rate=150.0).start()
    with consumers(settings, tmp_path) as spawn:
        proc = spawn()
        for action in ("restart", "unreachable", "kill"):
            fault_then_recover(action, proc)
            assert proc.alive(), proc.output()[-3000:]
        replayer.join()
        wait_for(lambda: probe.caught_up(len(log)), 120, "catching up")
        assert proc.stop() == 0, proc.output()[-3000:]
    lines = log_lines(proc.output())
    retried = [line for line in lines if line.get("msg") == "retrying"]
    assert retried, "the consumer never had to retry: did the faults reach it?"
    result = audit(client, settings, log)
    client.close()
    share = unreachable_cpu[0] / UNREACHABLE_SECONDS
    record(f"Redis restarted / killed / unreachable {UNREACHABLE_SECONDS:.0f} s", faults=3,
           result=result, recoveries=recoveries,
           note=f"{len(retried)} retries logged, consumer never exited; CPU while refused: "
                f"{unreachable_cpu[0]:.2f} s in {UNREACHABLE_SECONDS:.0f} s")
    assert share < MAX_CPU_SHARE_WHILE_FROZEN, "the consumer spun while Redis was down"
    result.check()


def test_redis_frozen_for_30_seconds(fault_stack: FaultStack, tmp_path: Path) -> None:
    settings = fault_stack.scenario("redis-frozen", partitions=2, batch_max_events=40,
                                    poll_timeout_ms=100)
    log = build_log(1200, seed=41)
    client = fault_stack.client()
    probe = Probe(client, settings)
    # The replay spans the freeze, so the consumer has work it cannot commit.
    replayer = Replayer(settings, log, rate=1200 / (FREEZE_SECONDS + 10)).start()
    with consumers(settings, tmp_path) as spawn:
        # A lease shorter than the freeze: it lapses meanwhile, so the thaw goes through
        # the fencing path (the default 30 s lease lapsed or not by chance).
        proc = spawn("--lock-ttl-ms", str(LEASE_MS))
        wait_for(lambda: probe.consumed() > 100, 60, "progress before the freeze")
        cpu_before = proc.cpu_seconds()
        with frozen_redis(fault_stack.redis):
            frozen_at = time.monotonic()
            time.sleep(FREEZE_SECONDS)
            cpu = proc.cpu_seconds() - cpu_before
            frozen_for = time.monotonic() - frozen_at
            assert proc.alive(), proc.output()[-3000:]
        before = probe.consumed()
        recovery = wait_for(lambda: probe.consumed() > before, 90, "progress after the thaw")
        replayer.join()
        wait_for(lambda: probe.caught_up(len(log)), 120, "catching up")
        assert probe.state() == "running"
        assert proc.stop() == 0, proc.output()[-3000:]
    share = cpu / frozen_for
    retaken = any(str(line.get("msg", "")).startswith("lease re-taken")
                  for line in log_lines(proc.output()))
    assert share < MAX_CPU_SHARE_WHILE_FROZEN, f"consumer used {cpu:.2f} s CPU while frozen"
    assert retaken, "the lease outlived the freeze: the fencing path was not exercised"
    result = audit(client, settings, log)
    client.close()
    record("Redis frozen (SIGSTOP) 30 s", faults=1, result=result, recoveries=[recovery],
           note=f"consumer CPU while frozen: {cpu:.3f} s in {frozen_for:.0f} s "
                f"({100 * share:.2f}% of a core); the {LEASE_MS / 1000:.0f} s lease "
                f"expired meanwhile and was re-taken")
    result.check()


def test_redis_rolled_back_to_an_older_state(fault_stack: FaultStack, tmp_path: Path) -> None:
    """Redis comes back without its last acknowledged writes, as after a failover to a
    replica that lagged (replication is asynchronous) or a restore from a backup: its
    files are copied while it is frozen, and after more batches committed it is killed
    and restarted from the copy. The lease in the copy is still the consumer's and not
    yet expired, so only the graph's counters tell that Redis went back: the
    consumer's next transaction (or idle poll) must see it, rebuild from Redis and
    read the lost events again from Kafka (before, it committed on top and those
    events were lost for good)."""
    settings = fault_stack.scenario("redis-rollback", partitions=2, batch_max_events=40,
                                    poll_timeout_ms=100)
    log = build_log(1500, seed=53)
    server = fault_stack.redis
    client = fault_stack.client()
    probe = Probe(client, settings)
    copy = tmp_path / "redis-data"
    replayer = Replayer(settings, log, rate=150.0).start()
    with consumers(settings, tmp_path) as spawn:
        proc = spawn()
        wait_for(lambda: probe.consumed() > 200, 60, "progress before the copy")
        with frozen_redis(server):
            shutil.copytree(server.data_dir, copy)
        copied_at = time.monotonic()
        after_copy = probe.consumed()
        wait_for(lambda: probe.consumed() > after_copy + 200, 60, "progress after the copy")
        ahead = probe.consumed()
        kill_redis(server)
        shutil.rmtree(server.data_dir)
        shutil.copytree(copy, server.data_dir)
        start_redis(server)
        # Within the consumer's 30 s lease: the copy's lease is still valid, so the lease
        # path (which already rebuilt after a lapse) is not what finds the rollback.
        assert time.monotonic() - copied_at < 20, "too slow: the lease in the copy lapsed"
        # (How far Redis went back is read from the consumer's log below: a probe here
        # raced the consumer, which had often re-read past `ahead` already.)
        recovery = wait_for(lambda: probe.consumed() > ahead, 90, "progress past the rollback")
        replayer.join()
        wait_for(lambda: probe.caught_up(len(log)), 120, "catching up")
        assert proc.stop() == 0, proc.output()[-3000:]
    rebuilt = [line for line in log_lines(proc.output())
               if str(line.get("msg", "")).startswith("redis went back")]
    result = audit(client, settings, log)
    client.close()
    assert rebuilt, "the consumer never noticed that Redis went back"
    found = rebuilt[0]
    back, committed = int(found["stored_progress"]), int(found["committed_progress"])
    assert back < committed, found
    record("Redis rolled back (restart from an older copy)", faults=1, result=result,
           recoveries=[recovery],
           note=f"Redis went back from {committed} to {back} messages counted "
                f"(about {ahead} consumed when it was killed); {len(rebuilt)} rebuild(s) "
                "from Redis, the lost events read again")
    result.check()
