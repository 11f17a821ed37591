"""``rankstream status``: consumer health, graph counters and score freshness."""

from __future__ import annotations

import argparse
import json
import sys

from consumer.readers import describe_bound, json_safe, status
from consumer.redis_store import connect_redis
from rankstream.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def run(args: argparse.Namespace, settings: Settings) -> int:
    client = connect_redis(settings, client_name="rankstream-status", reader=True)
    try:
        raw = status(client, settings.key_prefix)
    finally:
        client.close()
    info = json_safe(raw)
    if args.json:
        sys.stdout.write(json.dumps(info) + "\n")
        return 0
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
    return 0
