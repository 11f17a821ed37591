"""``./run bench NAME`` dispatches through ``python -m benchmarks``."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import BENCHMARKS, main


@pytest.mark.parametrize("argv", [[], ["nope"]])
def test_unknown_or_missing_benchmark_is_a_one_line_error(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ranker, pipeline, hits, text" in err


def test_every_benchmark_module_has_a_main():
    import importlib

    for module in BENCHMARKS.values():
        assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize("argv", [["--batch-sizes", "abc"], ["--batch-sizes", "-5"],
                                  ["--pages", "0"], ["--repeats", "0"],
                                  ["--accuracy", "nan"]])
def test_bad_ranker_benchmark_arguments_are_one_line_errors(argv, capsys):
    """They were tracebacks, or ran and printed a crossover "up to -5" with exit 0."""
    from benchmarks.bench_ranker import parse_args

    with pytest.raises(SystemExit) as stopped:
        parse_args(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: argument" in err


def test_the_crossover_is_the_smallest_losing_batch_whatever_the_order():
    from benchmarks.bench_ranker import parse_args
    from benchmarks.ranker_table import Row, crossover

    assert parse_args(["--batch-sizes", "10000,1000,100,1000"]).batch_sizes == [
        100, 1000, 10000]

    def row(batch: int, inc: float) -> Row:
        return Row("g", "pagerank", batch, inc=[inc], cold=1.0)

    assert crossover([row(10000, 2.0), row(1000, 1.5), row(100, 0.1)], "g",
                     "pagerank") == "1000"
    assert crossover([row(1000, 0.1), row(10, 0.1)], "g", "pagerank") == "none up to 1000"


def test_the_details_say_when_a_timed_batch_lost_the_second_core():
    from benchmarks.ranker_table import Row, row_details

    row = Row("g", "wpr", 1000, inc=[0.1, 0.2], moved=[5, 5], pushes=[9, 9],
              certified=[1e-7, 1e-7], modes_c=["global"] * 2, setting=1e-5)
    row.contended, row.contended_c = [False, False], [False, False]
    assert "TAKEN" not in row_details(row)
    row.contended = [False, True]
    assert "SECOND CORE TAKEN during 1 of 2 incr and 0 of 2 incr-c batches" in row_details(row)
