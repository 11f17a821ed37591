"""Line-oriented input files (edge lists, event logs), plain or gzip-compressed.

Both readers take bytes and number the lines themselves: a text-mode reader decodes
ahead in chunks, so a bad byte would be reported a thousand lines early, and a
truncated gzip member at whatever line the decoder had reached. gzip is recognised
by its magic bytes, not by the file name, so a compressed log without ``.gz`` (or a
plain one with it) is read as what it is. ``-`` is standard input.

A file is opened once and its magic bytes are peeked at (or read and put back in
front of the rest), never read and reopened: a pipe (``/dev/stdin``, ``<(...)``)
cannot give back what a probe took, and reading one twice silently lost its first
8 KiB.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

from rankstream.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
STDIN = "-"


def _unreadable(name: str, exc: OSError) -> InputError:
    if isinstance(exc, FileNotFoundError):
        return InputError("cannot read: no such file", where=name)
    if isinstance(exc, IsADirectoryError):
        return InputError("cannot read: is a directory, not a file", where=name)
    if isinstance(exc, PermissionError):
        return InputError("cannot read: permission denied", where=name)
    return InputError(f"cannot read: {exc.strerror or exc}", where=name)


def _stdin() -> IO[bytes]:
    if sys.stdin is None:  # started with `<&-`
        raise InputError("cannot read: standard input is closed", where=STDIN)
    return sys.stdin.buffer


def _opened(name: str) -> IO[bytes]:
    """``name`` opened for buffered binary reading, or InputError with a short reason."""
    if name == STDIN:
        return _stdin()
    try:
        return open(name, "rb")
    except OSError as exc:
        raise _unreadable(name, exc) from exc


def input_path(text: str) -> Path:
    """An argparse ``type`` for an input file: ``Path("")`` is ``.``, and an empty
    argument was reported as "cannot read: is a directory"."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    path = Path(text)
    if text != STDIN and os.fspath(path) == STDIN:
        # Path("./-") is Path("-"): the usual way to name a file called "-" read stdin.
        return Path.cwd() / STDIN
    return path


def same_input(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two inputs are one file: ``-`` is this process's stdin, and so are
    ``/dev/stdin`` and ``/dev/fd/0`` (by device and inode, as any two names of a file)."""
    def identity(path: str | os.PathLike[str]) -> tuple[int, int] | str:
        name = os.fspath(path)
        try:
            found = os.fstat(0) if name == STDIN else os.stat(name)
        except OSError:
            return os.path.abspath(name)
        return found.st_dev, found.st_ino

    return identity(a) == identity(b)


def check_readable(path: str | os.PathLike[str]) -> None:
    """InputError, worded as :func:`open_input` words it, if ``path`` cannot be read.

    A regular file is opened and closed; a pipe or device is only looked up, since
    opening and closing its reading end could cut off the process writing to it.
    """
    name = os.fspath(path)
    if name == STDIN:
        _stdin()  # closed: said before `produce -` connects and creates its topics
        return
    try:
        mode = os.stat(name).st_mode
    except OSError as exc:
        raise _unreadable(name, exc) from exc
    if stat.S_ISDIR(mode):
        raise _unreadable(name, IsADirectoryError(name))
    if stat.S_ISREG(mode):
        _opened(name).close()


@contextlib.contextmanager
def open_input(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """``path`` open for reading bytes, gunzipped when it is gzip data.

    Raises :class:`InputError` (``where=path``) with a short reason when it cannot
    be opened: ``no such file``, ``is a directory``, ``permission denied``, or the
    system's message.
    """
    name = os.fspath(path)
    raw = _opened(name)
    closing = contextlib.nullcontext(raw) if name == STDIN else raw
    with closing:
        stream, head = _with_head(raw, len(GZIP_MAGIC))
        if head == GZIP_MAGIC:
            with gzip.GzipFile(fileobj=stream, mode="rb") as unzipped:
                yield cast(IO[bytes], unzipped)  # a BufferedIOBase: what the readers use
        else:
            yield stream


def _with_head(raw: IO[bytes], count: int) -> tuple[IO[bytes], bytes]:
    """(a stream of all of ``raw``, its first ``count`` bytes), nothing consumed.

    ``peek`` reads a pipe at most once, and a pipe may deliver a single byte first
    (``ssh host cat log.gz |``): a gzip stream was then taken for text. So when the
    peek falls short, the bytes are read and put back in front of the rest.
    """
    head = getattr(raw, "peek", lambda _n: b"")(count)[:count]
    if len(head) >= count:
        return raw, head
    head = raw.read(count)  # blocks until count bytes or the end of the input
    return io.BufferedReader(_Prefixed(head, raw)), head


class _Prefixed(io.RawIOBase):
    """``prefix``, then the rest of ``rest``."""

    def __init__(self, prefix: bytes, rest: IO[bytes]) -> None:
        self._prefix = prefix
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._prefix:
            size = min(len(view), len(self._prefix))
            view[:size] = self._prefix[:size]
            self._prefix = self._prefix[size:]
            return size
        read = getattr(self._rest, "read1", self._rest.read)  # one raw read: no waiting
        data = read(len(view))
        view[: len(data)] = data
        return len(data)


def numbered_lines(
    path: str | os.PathLike[str], max_line_bytes: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_no, line)`` from 1, the line's bytes without the newline (and
    without a UTF-8 byte order mark at the start of the file, which would otherwise
    become part of the first key or break the first event's JSON).

    With ``max_line_bytes``, a longer line (whitespace counts) raises
    :class:`InputError` naming ``path:line`` after reading at most that many bytes of
    it: a log that is one endless line (a binary file, a missing newline) must not be
    read whole into memory before its size is checked. A read error (a truncated or
    corrupt gzip stream, an I/O error) raises :class:`InputError` naming ``path:line``
    of the line that could not be read.
    """
    name = os.fspath(path)
    with open_input(name) as stream:
        line_no = 0
        if max_line_bytes is None:
            limit = 0
            lines: Iterator[bytes] = iter(stream)
        else:
            # Room for the longest allowed line, a byte order mark and "\r\n".
            limit = max_line_bytes + len(UTF8_BOM) + 2
            lines = iter(lambda: stream.readline(limit), b"")
        try:
            for line_no, line in enumerate(lines, start=1):
                # A read that filled its room without reaching the newline is the
                # start of a longer line, even if stripping its "\r"s made it fit
                # (the rest would have come back as a line of its own).
                cut_short = len(line) == limit and not line.endswith(b"\n")
                if line_no == 1 and line.startswith(UTF8_BOM):
                    line = line[len(UTF8_BOM):]
                text = line.rstrip(b"\r\n")
                if max_line_bytes is not None and (cut_short or len(text) > max_line_bytes):
                    raise InputError(f"line longer than {max_line_bytes} bytes",
                                     where=f"{name}:{line_no}")
                yield line_no, text
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"cannot read: {exc}", where=f"{name}:{line_no + 1}") from exc
