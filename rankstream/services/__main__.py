"""Entry point of ``python -m rankstream.services``: reads the settings once, then acts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rankstream.errors import RankstreamError
from rankstream.services import command
from rankstream.settings import load_settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rankstream.services",
        description="Start, stop and inspect the local Kafka broker and redis-server.",
    )
    command.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command.run(args, load_settings())
    except RankstreamError as exc:
        sys.stderr.write(f"rankstream services {args.action}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"rankstream services {args.action}: interrupted\n")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
