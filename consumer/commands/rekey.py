"""``rankstream rekey NEW_PREFIX``: the graph under a new key prefix, dense again.

What it keeps and why: :mod:`consumer.rekey`. Run it with the consumer stopped (it
refuses while one holds the lease), then point ``RANKSTREAM_KEY_PREFIX`` at the new
prefix, start the consumer, and delete the old keys.
"""

from __future__ import annotations

import argparse
import sys

from consumer.redis_store import connect_redis
from consumer.rekey import rekey
from rankstream.settings import Settings, derive_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("new_prefix", metavar="NEW_PREFIX",
                        help="the key prefix to copy the graph to (must hold no key)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    # The settings' own rules for a prefix (a "term" segment, say): a ConfigError.
    new_prefix = derive_settings(settings, "NEW_PREFIX", key_prefix=args.new_prefix).key_prefix
    client = connect_redis(settings, client_name="rankstream-rekey")
    try:
        report = rekey(client, settings.key_prefix, new_prefix, settings.topic)
    finally:
        client.close()
    sys.stdout.write(
        f"copied {settings.key_prefix!r} to {new_prefix!r}: {report.ids_before:,} page ids "
        f"-> {report.ids_after:,} ({report.pages:,} live pages, {report.links:,} links, "
        f"{report.terms:,} index terms). Next: RANKSTREAM_KEY_PREFIX={new_prefix}, start "
        f"the consumer, then delete the keys under {settings.key_prefix!r}.\n")
    return 0
