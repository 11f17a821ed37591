"""Line readers of edge lists and event logs: pipes, stdin, gzip and byte order marks."""

from __future__ import annotations

import gzip
import io
import os
import threading
import time
from pathlib import Path

import pytest

from rankstream.errors import InputError
from rankstream.input_files import check_readable, numbered_lines

LINES = [f"p{i}\tp{(i * 7 + 1) % 5000}".encode() for i in range(5000)]  # ~60 KB


def _fifo_with(tmp_path: Path, data: bytes, *, first: int = 0) -> Path:
    """A pipe that delivers ``data`` (its ``first`` bytes alone, a moment earlier)."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb", buffering=0) as sink:
            if first:
                sink.write(data[:first])
                time.sleep(0.2)
            sink.write(data[first:])

    threading.Thread(target=write, daemon=True).start()
    return fifo


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_a_pipe_is_read_whole(tmp_path: Path, compress: bool) -> None:
    """Opening a pipe twice (once to probe for gzip) lost its first 8 KiB."""
    data = b"\n".join(LINES) + b"\n"
    fifo = _fifo_with(tmp_path, gzip.compress(data) if compress else data)
    assert [line for _, line in numbered_lines(fifo)] == LINES


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_a_pipe_whose_first_byte_comes_alone(tmp_path: Path, compress: bool) -> None:
    """A peek reads a pipe once: gzip data whose first byte came alone was read as text."""
    data = b"\n".join(LINES) + b"\n"
    fifo = _fifo_with(tmp_path, gzip.compress(data) if compress else data, first=1)
    assert [line for _, line in numbered_lines(fifo)] == LINES


def test_dash_is_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO(b"a\tb\r\nc\td\n")))
    monkeypatch.setattr("sys.stdin", stdin)
    assert list(numbered_lines("-")) == [(1, b"a\tb"), (2, b"c\td")]


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "bom.tsv"
    path.write_bytes(b"\xef\xbb\xbfa\tb\n\xef\xbb\xbfc\td\n")
    # Only at the start of the file: elsewhere it is data, and the readers judge it.
    assert list(numbered_lines(path)) == [(1, b"a\tb"), (2, b"\xef\xbb\xbfc\td")]


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_a_line_past_the_limit_is_refused_by_line_number_without_reading_it_whole(
        tmp_path: Path, compress: bool) -> None:
    limit = 100
    fits = b"x" * limit
    path = tmp_path / "log"
    # The BOM only counts as such at the start of the file, so the first line carries it.
    data = b"\xef\xbb\xbf" + fits + b"\r\n" + fits + b"\n"
    path.write_bytes(gzip.compress(data) if compress else data)
    assert [line for _, line in numbered_lines(path, max_line_bytes=limit)] == [fits, fits]
    endless = data + b"z" * (limit + 1) + b"\n" + b"w" * 50_000_000
    path.write_bytes(gzip.compress(endless) if compress else endless)
    lines = numbered_lines(path, max_line_bytes=limit)
    assert [next(lines)[1], next(lines)[1]] == [fits, fits]
    with pytest.raises(InputError, match=rf"{path}:3: line longer than {limit} bytes"):
        next(lines)
    # Carriage returns past the room: too long, not a line that fits plus a blank one.
    path.write_bytes(fits + b"\r" * 10 + b"\n" + fits + b"\n")
    with pytest.raises(InputError, match=rf"{path}:1: line longer than {limit} bytes"):
        list(numbered_lines(path, max_line_bytes=limit))


def test_check_readable_words_errors_as_the_reader_does_and_leaves_pipes_alone(
        tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory"):
        check_readable(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        check_readable(tmp_path / "missing.jsonl")
    data = b"\n".join(LINES) + b"\n"
    fifo = _fifo_with(tmp_path, data)
    check_readable(fifo)  # does not open it: that could cut off the writer
    assert len(list(numbered_lines(fifo))) == len(LINES)
