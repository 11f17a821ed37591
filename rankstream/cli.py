"""The ``rankstream`` command: one entry point, one settings read, one error path.

Each subcommand lives in the module that owns it and exposes two functions:

* ``add_arguments(parser: argparse.ArgumentParser) -> None``
* ``run(args: argparse.Namespace, settings: Settings) -> int``

Any :class:`~rankstream.errors.RankstreamError` becomes a one-line message on
stderr and exit code 2; so does argparse misuse. No traceback reaches a user.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from rankstream.errors import RankstreamError

# name -> (module, one-line help). Modules are imported only when their command
# runs, so `rankstream rank` never pays for Kafka or Redis imports.
COMMANDS: dict[str, tuple[str, str]] = {
    "consume": ("consumer.commands.consume", "run the streaming consumer (Kafka -> Redis)"),
    "top": ("consumer.commands.top", "the top pages by live score"),
    "score": ("consumer.commands.score", "one page's live scores"),
    "status": ("consumer.commands.status", "consumer health, lag, freshness and error bound"),
    "rekey": ("consumer.commands.rekey",
              "copy the graph to a new key prefix with dense ids (consumer stopped)"),
    "demo": ("rankstream.demo", "replay the Python docs graph and show the live top 10"),
    "rank": ("rankstream.rank_command", "rank an edge list offline (no services)"),
    "produce": ("producer.cli", "publish an event log or a synthetic stream to Kafka"),
    "hits": ("consumer.hits_cli", "HITS hubs and authorities for query terms or --seed URLs"),
    "serve": ("consumer.serve_cli", "run the HTTP query API (FastAPI on uvicorn)"),
    "services": (
        "rankstream.services.command",
        "start, stop or inspect the local Kafka broker and redis-server",
    ),
}

EXIT_USAGE = 2


def one_line(text: str) -> str:
    """``text`` with every unprintable character escaped (``\\n``, ``\\x85``,
    ``\\u2028``, a lone surrogate's ``\\udc80``): a path or value a user gave, holding
    a newline, split the error message over two lines, and a surrogate (from a
    non-UTF-8 file name) could not be written to stderr at all."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus an error; we print just the error, on one line."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(one_line(f"{self.prog}: error: {message}") + "\n")
        raise SystemExit(EXIT_USAGE)


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="rankstream",
        description="Streaming PageRank, Weighted PageRank and HITS: link events from Kafka, "
        "live scores in Redis.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = "" if not args_list else f" {args_list[0]}"
    try:
        parser = _build_parser(args_list)  # imports the command's module: ^C may land here
        args = parser.parse_args(args_list)
        command = f" {args.command}"
        if sys.stdout is None:  # started with stdout closed (`>&-`): a daemon may be
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as we do)
        from rankstream.settings import load_settings  # pydantic: inside the ^C handler

        settings = load_settings()
        code: int = args._module.run(args, settings)
    except RankstreamError as exc:
        sys.stderr.write(one_line(f"rankstream{command}: error: {exc}") + "\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write(one_line(f"rankstream{command}: interrupted") + "\n")
        return 130
    except BrokenPipeError:
        # `rankstream rank ... | head` closes our stdout early; that is not an error.
        return 0
    return code


if __name__ == "__main__":
    raise SystemExit(main())
