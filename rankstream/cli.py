"""The ``rankstream`` command: one entry point, one settings read, one error path.

Each subcommand lives in the module that owns it and exposes two functions:

* ``add_arguments(parser: argparse.ArgumentParser) -> None``
* ``run(args: argparse.Namespace, settings: Settings) -> int``

Any :class:`~rankstream.errors.RankstreamError` becomes a one-line message on
stderr and exit code 2; so do argparse misuse and any ``OSError`` no command
translated (a full disk under ``> out``). No traceback reaches a user, even one who
started us with stdin, stdout or stderr closed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from rankstream.errors import RankstreamError, os_error_text

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


def complain(text: str) -> None:
    sys.stderr.write(one_line(text) + "\n")


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus an error; we print just the error, on one line."""

    def error(self, message: str) -> NoReturn:
        complain(f"{self.prog}: error: {message}")
        raise SystemExit(EXIT_USAGE)


def _drop_unwritable_stdout() -> None:
    """Output still buffered for a stdout that failed (a full disk) would fail again
    when the interpreter flushes at exit, printing a traceback-like "Exception
    ignored" and exiting 120: send it nowhere. Output for a working stdout is kept."""
    try:
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


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
    # Started with stdout or stderr closed (`>&-`, `2>&-`): a daemon may be. Every
    # write to a closed one raised AttributeError, which turned exit 2 into 1, and
    # `status --check` means 1 as "unhealthy". (A closed stdin: rankstream.input_files.)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (lives as long as we do)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    try:
        parser = _build_parser(args_list)  # imports the command's module: ^C may land here
        args = parser.parse_args(args_list)
        command = f" {args.command}"
        from rankstream.settings import load_settings  # pydantic: inside the ^C handler

        settings = load_settings()
        code: int = args._module.run(args, settings)
        sys.stdout.flush()  # a failed write of the last output is an error of this run
    except RankstreamError as exc:
        complain(f"rankstream{command}: error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        complain(f"rankstream{command}: interrupted")
        return 130
    except BrokenPipeError:
        # `rankstream rank ... | head` closes our stdout early; that is not an error.
        return 0
    except OSError as exc:
        # What no command translated: `top > /dev/full` printed a traceback and exited
        # 1, which `status --check` means as "unhealthy", and `produce` failed that
        # way only after every event was acknowledged.
        _drop_unwritable_stdout()
        complain(f"rankstream{command}: error: {os_error_text(exc)}")
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
