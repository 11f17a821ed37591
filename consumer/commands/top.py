"""``rankstream top``: the live top-k pages of an algorithm, read from Redis."""

from __future__ import annotations

import argparse
import json
import sys

from consumer.keys import ALGORITHMS, Keys
from consumer.readers import SCALES, json_safe, top_with_meta
from consumer.redis_store import check_layout, connect_redis
from rankstream.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-k", type=int, default=10, help="how many pages (default 10)")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="pagerank")
    parser.add_argument("--scale", choices=SCALES, default="paper",
                        help="paper: y as published; probability: y / sum(y)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def run(args: argparse.Namespace, settings: Settings) -> int:
    client = connect_redis(settings, client_name="rankstream-top", reader=True)
    try:
        check_layout(client, Keys(settings.key_prefix))
        rows, info = top_with_meta(client, settings.key_prefix, args.algorithm, args.k,
                                   args.scale)
    finally:
        client.close()
    if args.json:
        payload = {
            "algorithm": args.algorithm, "scale": args.scale,
            "top": [{"rank": i + 1, "url": url, "score": value}
                    for i, (url, value) in enumerate(rows)],
            "meta": info.as_dict(),
        }
        sys.stdout.write(json.dumps(json_safe(payload)) + "\n")
        return 0
    if not info.published:
        sys.stdout.write(f"no {args.algorithm} scores published under "
                         f"{settings.key_prefix!r} yet\n")
        return 0
    sys.stdout.write(f"{args.algorithm} top {len(rows)} ({args.scale} scale) - "
                     f"{info.describe(args.scale)}, version {info.version}, "
                     f"refreshed {info.refreshed_at}\n")
    for i, (url, value) in enumerate(rows, start=1):
        sys.stdout.write(f"{i:>4}  {value:.8f}  {url}\n")
    return 0
