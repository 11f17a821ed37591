"""What the benchmarks' command lines share: the CLI's one-line errors (not argparse's
usage dump, and never a traceback from a number checked too late) and checked numbers.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from rankstream.cli import OneLineParser


def bench_parser(prog: str, description: str) -> argparse.ArgumentParser:
    return OneLineParser(prog=prog, description=description)


def at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer of at least ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:,}, got {value:,}")
        return value
    return parse


def positive(text: str) -> float:
    """An argparse ``type``: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0.0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value
