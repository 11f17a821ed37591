"""``rankstream produce``: replay an event log, or a synthetic stream, into the topic.

    rankstream produce data/python-docs-pages.jsonl.gz
    rankstream produce --synthetic 100000 --seed 7 --links-per-page 10

Each line of a log is validated as it streams (same limits as the consumer). The
first bad line stops the replay: events before it have been sent and are flushed
(acknowledged), nothing after it is sent, and the error names ``FILE:LINE``, the
reason and how many events went out (exit code 2). A log is a unit of work, so a
partial replay must be loud; fix the line and replay the whole file again: duplicate
``page`` events are harmless, the consumer treats them idempotently.

A progress bar goes to stderr when it is a terminal; the final count goes to stdout.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from producer.schema import Event, Limits, PageEvent, iter_events
from rankstream.errors import ConfigError, InputError, ServiceError
from rankstream.input_files import check_readable, input_path
from rankstream.settings import Settings, derive_settings

__all__ = ["LogPosition", "ReplaySummary", "add_arguments", "log_events",
           "replay", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "file", nargs="?", type=input_path, metavar="FILE.jsonl[.gz]",
        help="JSON-lines event log to replay (gzip detected by content; - for stdin)",
    )
    source.add_argument(
        "--synthetic", type=int, metavar="N",
        help="send N events of a seeded web-like stream instead of a file",
    )
    parser.add_argument("--seed", type=int, default=0,
                        help="synthetic stream seed (default 0); every seed reuses the same "
                        "URLs and timestamps from 2026-01-01, so a second stream into the "
                        "same graph has many of its page events ignored as stale: use "
                        "another RANKSTREAM_KEY_PREFIX and topic for it")
    parser.add_argument(
        "--links-per-page", type=float, default=10.0, metavar="K",
        help="mean links per synthetic page (default 10)",
    )
    parser.add_argument(
        "--topic", default=None, help="topic to publish to (default: RANKSTREAM_TOPIC)"
    )
    parser.add_argument(
        "--no-create-topics", action="store_true",
        help="do not create the topics if missing (they are never auto-created by the broker)",
    )


# The synthetic stream's graph is built in memory before the first event is sent
# (about 65 bytes a link, measured: 2M events of 10 links peaked at 1.3 GB), so its
# size is bounded before anything is created: 1e26 events was a numpy traceback, and
# 3e9 a process killed for its memory without a word.
MAX_SYNTHETIC_LINKS = 100_000_000


def _check(args: argparse.Namespace) -> None:
    if args.synthetic is not None and args.synthetic < 0:
        raise InputError(f"--synthetic must be >= 0, got {args.synthetic}")
    if args.seed < 0:  # numpy's generator refuses it, after the topics were created
        raise InputError(f"--seed must be >= 0, got {args.seed}")
    if not 0 < args.links_per_page < math.inf:  # NaN fails this too
        raise InputError(f"--links-per-page must be > 0, got {args.links_per_page}")
    if args.synthetic is not None and args.synthetic * args.links_per_page > MAX_SYNTHETIC_LINKS:
        raise InputError(f"--synthetic {args.synthetic} x --links-per-page "
                         f"{args.links_per_page:g} is more than {MAX_SYNTHETIC_LINKS:,} links "
                         "(the synthetic graph is built in memory first)")
    if args.topic is not None:
        from producer.client import check_topic_name

        try:  # before connecting: found only after a 30 s wait for Kafka otherwise
            check_topic_name(args.topic)
        except ConfigError as exc:  # "" too: it is not "no --topic"
            raise InputError(f"--topic: {exc}") from exc
    if args.file is not None:
        check_readable(args.file)  # before connecting: a typo is not a Kafka error


class LogPosition:
    """``FILE:LINE`` of the event being published, for an error the publisher raises
    (a message too large once encoded) after the line itself was read fine."""

    def __init__(self) -> None:
        self.where: str | None = None


def log_events(path: Path, limits: Limits, position: LogPosition) -> Iterator[Event]:
    """The events of a log, keeping ``position`` at the line of the latest."""
    for line_no, event in iter_events(path, limits):
        position.where = f"{path}:{line_no}"
        yield event


def _events(args: argparse.Namespace, limits: Limits, position: LogPosition
            ) -> tuple[Iterator[Event], int | None]:
    if args.file is not None:
        return log_events(args.file, limits, position), None
    from producer.synthetic import synthetic_events

    stream = synthetic_events(
        args.synthetic, limits=limits, seed=args.seed, links_per_page=args.links_per_page
    )
    return stream, args.synthetic


def _progress(events: Iterable[Event], total: int | None) -> Iterator[Event]:
    from tqdm import tqdm

    bar = tqdm(events, total=total, unit="ev", file=sys.stderr, disable=not sys.stderr.isatty(),
               dynamic_ncols=True, mininterval=0.5)
    try:
        yield from bar
    finally:
        bar.close()


def run(args: argparse.Namespace, settings: Settings) -> int:
    _check(args)
    if args.topic is not None:  # the settings' rules hold for it (not the DLQ topic)
        settings = derive_settings(settings, "--topic", topic=args.topic)
    topic = settings.topic
    if not args.no_create_topics:
        from rankstream.services.stack import ensure_settings_topics

        ensure_settings_topics(settings)
    position = LogPosition()
    events, total = _events(args, Limits.from_settings(settings), position)
    summary = replay(settings, events, topic=topic, total=total, position=position)
    print(summary)
    return 0


@dataclass(frozen=True)
class ReplaySummary:
    """What one replay sent; every event counted here was acknowledged by the broker."""

    topic: str
    events: int
    links: int
    seconds: float

    def __str__(self) -> str:
        rate = self.events / max(self.seconds, 1e-9)
        return (f"sent {self.events} events ({self.links} page links) to {self.topic} in "
                f"{self.seconds:.1f} s ({rate:,.0f} events/s), all acknowledged")


def replay(settings: Settings, events: Iterable[Event], *, topic: str,
           total: int | None = None, position: LogPosition | None = None) -> ReplaySummary:
    """Publish ``events`` in order and wait until the broker acknowledged all of them.

    An InputError stops it; when it names no place, ``position`` (if given) says where.
    """
    from producer.client import LinkPublisher

    sent = links = 0
    started = time.monotonic()
    publisher = LinkPublisher.from_settings(settings, topic=topic)
    try:
        with publisher:
            try:
                for event in _progress(events, total):
                    publisher.publish_event(event)
                    sent += 1
                    if isinstance(event, PageEvent):
                        links += len(event.links)
            except InputError as exc:
                where = position.where if position is not None and exc.where is None else None
                delivery = ""
                try:
                    publisher.flush()
                except ServiceError as failed:  # both facts, the bad line first
                    delivery = f" (and {failed})"
                raise InputError(f"{exc}; stopped there, {sent} event(s) before it were "
                                 f"sent{delivery}", where=where) from exc
    except KeyboardInterrupt:
        # The publisher's exit waited for the events sent so far: say how they fared.
        sys.stderr.write(f"produce: interrupted after {sent} event(s) sent, "
                         f"{publisher.delivered} acknowledged\n")
        raise
    except ServiceError as exc:
        where = f" at {position.where}" if position is not None and position.where else ""
        raise type(exc)(f"{exc} (after {sent} event(s) sent{where}, "
                        f"{publisher.delivered} acknowledged)") from exc
    return ReplaySummary(topic, sent, links, time.monotonic() - started)

