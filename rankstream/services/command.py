"""``python -m rankstream.services up|down|status|env`` (also usable as ``rankstream services``)."""

from __future__ import annotations

import argparse
import math
import sys
import time

from rankstream.errors import ConfigError, ServiceError, os_error_text
from rankstream.services.stack import down, env_lines, status, up
from rankstream.settings import Settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["up", "down", "status", "env"],
        help="up: start what is missing and wait; down: stop what we started; "
        "status: one line per service; env: RANKSTREAM_* export lines",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, metavar="SECONDS",
        help="how long to wait for each service (default 120)",
    )
    parser.add_argument(
        "--no-install", action="store_true",
        help="fail instead of installing missing Debian packages (redis-server, maven, java)",
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Carry out one action; errors surface as RankstreamError (exit 2 at the caller).

    A file-system failure (a full disk, a read-only home, a state dir under a file)
    is a ServiceError naming the path, not a traceback.
    """
    try:
        return _run(args, settings)
    except BrokenPipeError:
        raise  # the callers treat a closed stdout as a normal end
    except OSError as exc:
        raise ServiceError(os_error_text(exc)) from exc


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if not 0 < args.timeout < math.inf:  # NaN fails this too
        raise ConfigError("--timeout must be a positive number of seconds")
    if args.action == "up":
        started = time.monotonic()
        states = up(settings, timeout=args.timeout, install=not args.no_install, log=_say)
        for state in states:
            print(state)
        _say(f"services ready in {time.monotonic() - started:.1f}s")
        return 0
    if args.action == "down":
        for line in down(settings, timeout=min(args.timeout, 60.0)):
            print(line)
        return 0
    if args.action == "status":
        states = status(settings)
        for state in states:
            print(state)
        return 0 if all(s.up for s in states) else 1
    for line in env_lines(settings):
        print(line)
    return 0
