"""Reading ``src<TAB>dst`` edge lists, plain or gzip-compressed.

Keys are taken verbatim (no URL canonicalisation): an edge list may name pages
by anything, and `rankstream rank` must print back exactly the keys it was given.
Events, by contrast, always carry canonical URLs (see ``producer.urls``).
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from rankstream.errors import InputError


def open_text(path: Path) -> IO[str]:
    """Open a UTF-8 text file, transparently gunzipping ``*.gz``."""
    try:
        if path.suffix == ".gz":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
        return path.open("r", encoding="utf-8")
    except FileNotFoundError as exc:
        raise InputError(f"no such file: {path}") from exc
    except IsADirectoryError as exc:
        raise InputError(f"is a directory, not a file: {path}") from exc
    except PermissionError as exc:
        raise InputError(f"cannot read {path}: permission denied") from exc


def iter_edges(path: Path) -> Iterator[tuple[str, str]]:
    """Yield ``(src, dst)`` per line; blank lines and ``#`` comments are skipped.

    Raises :class:`InputError` naming ``file:line`` for a line that is not exactly
    two non-empty tab-separated fields, or for bytes that are not UTF-8.
    """
    with open_text(path) as handle:
        line_no = 0
        try:
            for line_no, line in enumerate(handle, start=1):
                text = line.rstrip("\r\n")
                if not text.strip() or text.startswith("#"):
                    continue
                fields = text.split("\t")
                if len(fields) != 2 or not fields[0] or not fields[1]:
                    raise InputError(
                        f"expected 'src<TAB>dst', got {len(fields)} field(s): {text[:80]!r}",
                        where=f"{path}:{line_no}",
                    )
                yield fields[0], fields[1]
        except UnicodeDecodeError as exc:
            raise InputError("not UTF-8 text", where=f"{path}:{line_no + 1}") from exc
        except (OSError, EOFError) as exc:  # truncated or corrupt gzip
            raise InputError(f"cannot read: {exc}", where=f"{path}:{line_no + 1}") from exc


def read_edges(path: Path) -> tuple[list[str], list[str]]:
    """All edges of ``path`` as two parallel lists of keys."""
    sources: list[str] = []
    targets: list[str] = []
    for src, dst in iter_edges(path):
        sources.append(src)
        targets.append(dst)
    return sources, targets
