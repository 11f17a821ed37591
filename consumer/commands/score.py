"""``rankstream score URL``: one page's published scores (URL canonicalised first)."""

from __future__ import annotations

import argparse
import json
import sys

from consumer.keys import ALGORITHMS, Keys
from consumer.readers import SCALES, json_safe, score_with_meta
from consumer.redis_store import check_layout, connect_redis
from producer.urls import canonicalize_url
from rankstream.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="page URL (canonicalised like the producer does)")
    parser.add_argument("--algorithm", choices=ALGORITHMS, default=None,
                        help="one algorithm (default: all)")
    parser.add_argument("--scale", choices=SCALES, default="paper")
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, settings: Settings) -> int:
    algorithms = [args.algorithm] if args.algorithm else list(ALGORITHMS)
    client = connect_redis(settings, client_name="rankstream-score", reader=True)
    try:
        check_layout(client, Keys(settings.key_prefix))
        answers = {alg: score_with_meta(client, settings.key_prefix, args.url, alg, args.scale)
                   for alg in algorithms}
    finally:
        client.close()
    values = {alg: value for alg, (value, _) in answers.items()}
    if args.json:
        # score() accepted the URL, so it canonicalises; the page is stored under that.
        sys.stdout.write(json.dumps(json_safe({
            "url": canonicalize_url(args.url), "scale": args.scale, "scores": values,
            "meta": {alg: info.as_dict() for alg, (_, info) in answers.items()}})) + "\n")
    else:
        for alg, (value, info) in answers.items():
            shown = ("not ranked" if value is None
                     else f"{value:.10g}  ({info.describe(args.scale)}, version "
                           f"{info.version})")
            sys.stdout.write(f"{alg:<9} {shown}\n")
    # Exit 1 when the page is unknown everywhere, so scripts can test for it.
    return 0 if any(v is not None for v in values.values()) else 1
