"""``rankstream consume``: run the streaming consumer (Kafka -> Redis graph and scores)."""

from __future__ import annotations

import argparse
import logging

from consumer.jsonlog import setup_json_logging
from consumer.lock import DEFAULT_TTL_MS
from consumer.options import ConsumeOptions
from consumer.service import run_consumer
from rankstream.errors import ConfigError, RankstreamError
from rankstream.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--until-caught-up", action="store_true",
                        help="stop once the end offsets seen at start are consumed and "
                             "published")
    parser.add_argument("--max-seconds", type=float, default=None, metavar="S",
                        help="stop (cleanly) after S seconds")
    parser.add_argument("--lock-ttl-ms", type=int, default=DEFAULT_TTL_MS, metavar="MS",
                        help="lease time of the single-consumer lock (renewed every ttl/3)")
    parser.add_argument("--plain-writes", action="store_true",
                        help="no server-side scripts: plain HSETs for new pages' id maps, "
                             "the term index's diff read before the transaction, and a "
                             "WATCHed MULTI for the score swap (for Redis ACLs without "
                             "scripting)")
    parser.add_argument("--log-level", default="INFO", type=str.upper,
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])


MAX_LOCK_TTL_MS = 86_400_000


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.max_seconds is not None and not args.max_seconds > 0:  # NaN fails this too
        raise ConfigError("--max-seconds must be positive")
    if not 1000 <= args.lock_ttl_ms <= MAX_LOCK_TTL_MS:
        # Past Redis' range it failed only at the lease, as "redis: cannot take...".
        raise ConfigError(f"--lock-ttl-ms must be between 1000 and {MAX_LOCK_TTL_MS} (a day)")
    setup_json_logging(args.log_level)
    options = ConsumeOptions(until_caught_up=args.until_caught_up, max_seconds=args.max_seconds,
                             lock_ttl_ms=args.lock_ttl_ms, bulk_writes=not args.plain_writes)
    try:
        return run_consumer(settings, options)
    except RankstreamError:
        raise  # the CLI prints these on one line (exit 2)
    except Exception:
        # A bug, not bad input or a failed service: say so in the JSON log that
        # operators watch; the traceback and exit code 1 follow as usual.
        logging.getLogger("rankstream.consumer").exception("consumer crashed")
        raise
