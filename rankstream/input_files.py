"""Line-oriented input files (edge lists, event logs), plain or gzip-compressed.

Both readers take bytes and number the lines themselves: a text-mode reader decodes
ahead in chunks, so a bad byte would be reported a thousand lines early, and a
truncated gzip member at whatever line the decoder had reached. gzip is recognised
by its magic bytes, not by the file name, so a compressed log without ``.gz`` (or a
plain one with it) is read as what it is.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from typing import IO

from rankstream.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"


def open_input(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open ``path`` for reading bytes, gunzipping it when it is gzip data.

    Raises :class:`InputError` (``where=path``) with a short reason when it cannot
    be opened: ``no such file``, ``is a directory``, ``permission denied``, or the
    system's message.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as probe:
            gzipped = probe.read(2) == GZIP_MAGIC
        if gzipped:
            return gzip.open(name, "rb")  # type: ignore[return-value]
        return open(name, "rb")
    except FileNotFoundError as exc:
        raise InputError("cannot read: no such file", where=name) from exc
    except IsADirectoryError as exc:
        raise InputError("cannot read: is a directory, not a file", where=name) from exc
    except PermissionError as exc:
        raise InputError("cannot read: permission denied", where=name) from exc
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", where=name) from exc


def numbered_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_no, line)`` from 1, the line's bytes without the newline.

    A read error (a truncated or corrupt gzip stream, an I/O error) raises
    :class:`InputError` naming ``path:line`` of the line that could not be read.
    """
    name = os.fspath(path)
    with open_input(name) as stream:
        line_no = 0
        try:
            for line_no, line in enumerate(stream, start=1):
                yield line_no, line.rstrip(b"\r\n")
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"cannot read: {exc}", where=f"{name}:{line_no + 1}") from exc
