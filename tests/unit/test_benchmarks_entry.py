"""``./run bench NAME`` dispatches through ``python -m benchmarks``."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import BENCHMARKS, main


@pytest.mark.parametrize("argv", [[], ["nope"]])
def test_unknown_or_missing_benchmark_is_a_one_line_error(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ranker, pipeline, hits" in err


def test_every_benchmark_module_has_a_main():
    import importlib

    for module in BENCHMARKS.values():
        assert callable(importlib.import_module(module).main)
