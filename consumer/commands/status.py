"""``rankstream status``: consumer health, graph counters and score freshness.

With ``--check`` its exit code says whether the consumer is healthy, for a
supervisor's probe or a cron alert: 0 healthy, 1 not (the reasons on one line of
stderr), 2 when Redis cannot be read. Healthy means a consumer holds the lease, its
last state is ``running``, and its heartbeat is recent; ``--max-lag`` and
``--fresh`` add the backlog and the published scores' freshness. ``--prometheus``
prints what ``GET /metrics`` serves (:mod:`consumer.metrics`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from typing import Any

from consumer.keys import Keys
from consumer.metrics import render_metrics
from consumer.readers import describe_bound, json_safe, status
from consumer.redis_store import check_layout, connect_redis
from rankstream.errors import InputError
from rankstream.settings import Settings

# The heartbeat is written about once a second while the loop runs, but not while a
# long step holds it (a refresh after a huge batch): the default allows for those. A
# starting consumer is not healthy yet (state "starting" while it loads the graph,
# which takes minutes on millions of pages): give a liveness probe a start-up grace.
DEFAULT_MAX_AGE_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON object on stdout")
    output.add_argument("--prometheus", action="store_true",
                        help="the figures of GET /metrics, in Prometheus' text format "
                             "(for node_exporter's textfile collector, say)")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless the consumer is healthy (the reasons on stderr)")
    parser.add_argument("--max-age", type=float, default=DEFAULT_MAX_AGE_S, metavar="S",
                        help="with --check: the oldest heartbeat that counts as healthy "
                             f"(seconds, default {DEFAULT_MAX_AGE_S:g})")
    parser.add_argument("--max-lag", type=int, default=None, metavar="N",
                        help="with --check: unhealthy past N events of lag")
    parser.add_argument("--fresh", action="store_true",
                        help="with --check: unhealthy unless every algorithm's published "
                             "scores are fresh")


def check_options(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.max_age) and args.max_age > 0):
        raise InputError(f"--max-age must be a positive number of seconds, got {args.max_age}")
    if args.max_lag is not None and args.max_lag < 0:
        raise InputError(f"--max-lag must be at least 0, got {args.max_lag}")
    if not args.check and (args.fresh or args.max_lag is not None
                           or args.max_age != DEFAULT_MAX_AGE_S):
        raise InputError("--max-age, --max-lag and --fresh go with --check")


def problems(raw: dict[str, Any], *, max_age_s: float, max_lag: int | None, fresh: bool,
             now: datetime | None = None) -> list[str]:
    """Why the consumer described by ``raw`` (:func:`consumer.readers.status`) is not
    healthy; empty when it is. The heartbeat's age is read against this machine's
    clock: keep the consumer's and the checker's clocks in sync (NTP)."""
    found: list[str] = []
    consumer, lock = raw["consumer"], raw["lock"]
    if not lock:
        found.append("no consumer holds the lease")
    elif "raw" in lock:
        found.append("the lease key holds a value that is not rankstream's")
    elif (str(lock.get("pid")), lock.get("host")) != (consumer.get("pid"), consumer.get("host")):
        # The holder has not written its status yet: what is there is a predecessor's.
        found.append(f"status not written by the lease holder (pid {lock.get('pid')} on "
                     f"{lock.get('host')})")
    state = consumer.get("state")
    if lock and state != "running":
        found.append(f"consumer state {state or 'unknown'}")
    beat = consumer.get("heartbeat_at")
    try:
        age = ((now or datetime.now(UTC)) - datetime.fromisoformat(beat)).total_seconds()
    except (TypeError, ValueError):
        found.append("no heartbeat")
    else:
        if age > max_age_s:
            found.append(f"last heartbeat {age:.0f} s ago")
        elif age < -max_age_s:  # a clock ahead would hide a heartbeat that stopped
            found.append(f"last heartbeat {-age:.0f} s in the future: clocks out of sync")
    if max_lag is not None:
        try:
            lag = int(consumer.get("lag_total", ""))
        except ValueError:
            found.append("lag unknown")
        else:
            if lag > max_lag:
                found.append(f"lag {lag} events")
    if fresh:
        for algorithm, meta in raw["algorithms"].items():
            if not meta["published"]:
                found.append(f"{algorithm} scores not published")
            elif not meta["fresh"]:
                found.append(f"{algorithm} scores not fresh")
    return found


def run(args: argparse.Namespace, settings: Settings) -> int:
    check_options(args)
    client = connect_redis(settings, client_name="rankstream-status", reader=True)
    try:
        # As every other reader: an unfinished rekey copy or another layout's counters
        # were printed, and exported by --prometheus, where GET /metrics refused them.
        check_layout(client, Keys(settings.key_prefix))
        raw = status(client, settings.key_prefix)
    finally:
        client.close()
    found = problems(raw, max_age_s=args.max_age, max_lag=args.max_lag, fresh=args.fresh)
    code = 1 if args.check and found else 0
    if code:
        sys.stderr.write(f"rankstream status: unhealthy: {'; '.join(found)}\n")
    if args.prometheus:
        sys.stdout.write(render_metrics(raw).decode())
        return code
    info = json_safe(raw)
    if args.json:
        if args.check:
            info["healthy"], info["problems"] = not found, found
        sys.stdout.write(json.dumps(info) + "\n")
        return code
    out = sys.stdout.write
    consumer = info["consumer"]
    lock = info["lock"]
    state = consumer.get("state", "-")
    if not lock:
        running = "not running"
    elif "raw" in lock:  # a value that is not a lease of ours (readers._status_dict)
        running = f"lease key holds an unexpected value {lock['raw']!r}"
    else:
        running = f"running (pid {lock.get('pid')} on {lock.get('host')})"
    if not lock and state in ("running", "waiting"):
        # Its last word, not its state: it stopped without a clean exit, and its lease
        # has expired (until then, up to RANKSTREAM's lease TTL, it still shows running).
        state = f"{state} when it last wrote (killed or crashed?)"
    out(f"consumer   {running}; state {state}, "
        f"heartbeat {consumer.get('heartbeat_at', '-')}\n")
    out(f"throughput {consumer.get('events_per_s', '0')} events/s, "
        f"{consumer.get('link_changes_per_s', '0')} link changes/s; "
        f"lag {consumer.get('lag_total', '-')} {consumer.get('lag', '')}\n")
    graph = info["graph"]
    out(f"graph      version {graph.get('version', 0)}, pages {graph.get('pages', 0)}, "
        f"links {graph.get('links', 0)}, stale ignored {graph.get('stale_ignored', 0)}, "
        f"dead letters {graph.get('dlq', 0)}\n")
    for alg, m in raw["algorithms"].items():  # raw: an infinite bound is not null here
        if not m["published"]:
            out(f"{alg:<10} not published\n")
            continue
        freshness = describe_bound(m["fresh"], m["bound"], m["relative_bound"],
                                   m["tolerance"])
        out(f"{alg:<10} {freshness}, version {m['version']}, "
            f"refreshed {m['refreshed_at']}\n")
    return code
