"""``python -m benchmarks NAME [ARGS...]`` (what ``./run bench NAME`` calls).

NAME is ranker, pipeline, hits or text; ARGS go to that benchmark (``--help`` lists them).
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {"ranker": "benchmarks.bench_ranker", "pipeline": "benchmarks.bench_pipeline",
              "hits": "benchmarks.bench_hits", "text": "benchmarks.bench_text_index"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHMARKS:
        given = f" {argv[0]!r}" if argv else ""
        print(f"benchmarks: unknown or missing benchmark{given}; choose one of "
              f"{', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[argv[0]])
    result: int = module.main(argv[1:])
    return result


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
