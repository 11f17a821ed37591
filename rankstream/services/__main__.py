"""Entry point of ``python -m rankstream.services``: reads the settings once, then acts."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from rankstream.cli import OneLineParser, one_line
from rankstream.errors import RankstreamError
from rankstream.services import command
from rankstream.settings import load_settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(  # misuse: one line and exit 2, as every other command
        prog="python -m rankstream.services",
        description="Start, stop and inspect the local Kafka broker and redis-server.",
    )
    command.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        code = command.run(args, load_settings())
        sys.stdout.flush()  # a closed pipe shows here, not as noise at exit
        return code
    except RankstreamError as exc:
        sys.stderr.write(one_line(f"rankstream services {args.action}: error: {exc}") + "\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"rankstream services {args.action}: interrupted\n")
        return 130
    except BrokenPipeError:
        # `./run services status | head -1` closes our stdout early: not an error. The
        # interpreter flushes stdout again at exit; let that go nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
