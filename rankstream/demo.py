"""``rankstream demo``: the README's main job, end to end on the real services.

It replays the shipped Python docs link graph (``data/python-docs-pages.jsonl.gz``,
one ``page`` event per crawled page) into Kafka, runs the consumer until it has
caught up, and prints the live top 10 for PageRank and WPR as readers see them in
Redis, with their freshness and certified error bound. The services must be up
(``./run demo`` starts them first).

Replaying twice is harmless: a repeated ``page`` event carries the same links and
timestamp, so the graph and the scores do not change.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankstream.errors import InputError
from rankstream.input_files import check_readable
from rankstream.settings import Settings

DEMO_EVENTS = Path(__file__).resolve().parent.parent / "data" / "python-docs-pages.jsonl.gz"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=Path, default=DEMO_EVENTS,
                        help="event log to replay (default: the shipped Python docs graph)")
    parser.add_argument("-k", type=int, default=10, help="how many top pages to show")


def run(args: argparse.Namespace, settings: Settings) -> int:
    from consumer import ConsumeOptions, connect_redis, run_consumer, top_with_meta
    from consumer.jsonlog import setup_json_logging
    from consumer.readers import MAX_TOP_K
    from producer.cli import LogPosition, log_events, replay
    from producer.schema import Limits
    from rankstream.services.stack import ensure_settings_topics

    if not 1 <= args.k <= MAX_TOP_K:  # before the replay, not after it
        raise InputError(f"k must be between 1 and {MAX_TOP_K}", where="-k")
    check_readable(args.events)
    ensure_settings_topics(settings)
    position = LogPosition()
    events = log_events(args.events, Limits.from_settings(settings), position)
    print(replay(settings, events, topic=settings.topic, position=position))

    setup_json_logging("WARNING")
    code = run_consumer(settings, ConsumeOptions(until_caught_up=True))
    if code != 0:
        return code

    client = connect_redis(settings)
    for algorithm in ("pagerank", "wpr"):
        rows, info = top_with_meta(client, settings.key_prefix, algorithm, args.k)
        print(f"\n{algorithm}: {info.describe()}, {info.pages} pages, "
              f"graph version {info.version}, refreshed {info.refreshed_at}")
        for rank, (url, value) in enumerate(rows, 1):
            print(f"{rank:3d}. {value:10.6f}  {url}")
    return 0
