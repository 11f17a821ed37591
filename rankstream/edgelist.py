"""Reading ``src<TAB>dst`` edge lists and ``key<TAB>weight`` teleport lists, plain or
gzip-compressed.

Keys are taken verbatim (no URL canonicalisation): an edge list may name pages
by anything, and `rankstream rank` must print back exactly the keys it was given.
Events, by contrast, always carry canonical URLs (see ``producer.urls``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from rankstream.errors import InputError
from rankstream.input_files import numbered_lines

# Keys are verbatim and unbounded by the URL limit, but a line of a mebibyte is not an
# edge: an endless line (a binary file, /dev/zero, CR-only line ends) must fail with
# its line number instead of being read whole into memory.
MAX_EDGE_LINE_BYTES = 1 << 20


def iter_edges(path: Path) -> Iterator[tuple[str, str]]:
    """Yield ``(src, dst)`` per line; blank lines and ``#`` comments are skipped.

    Raises :class:`InputError` naming ``file:line`` for a line that is not exactly
    two non-empty tab-separated fields, or for bytes that are not UTF-8.
    """
    for _, src, dst in numbered_edges(path):
        yield src, dst


def numbered_edges(path: Path) -> Iterator[tuple[int, str, str]]:
    """:func:`iter_edges` with each edge's line number: ``(line, src, dst)``."""
    for line_no, text in _numbered_texts(path):
        fields = text.split("\t")
        if len(fields) != 2 or not fields[0] or not fields[1]:
            raise InputError(
                f"expected 'src<TAB>dst', got {len(fields)} field(s): {text[:80]!r}",
                where=f"{path}:{line_no}",
            )
        yield line_no, fields[0], fields[1]


def read_edges(path: Path) -> tuple[list[str], list[str]]:
    """All edges of ``path`` as two parallel lists of keys."""
    sources: list[str] = []
    targets: list[str] = []
    for src, dst in iter_edges(path):
        sources.append(src)
        targets.append(dst)
    return sources, targets


def read_teleport(path: Path) -> dict[str, tuple[float, int]]:
    """Teleport weights: ``key`` (weight 1) or ``key<TAB>weight`` per line, blank lines
    and ``#`` comments skipped; ``{key: (weight, line number)}``.

    A weight is a finite number >= 0 (any positive total: only the proportions
    matter); a key listed twice is an error rather than a sum, since it is more
    likely a mistake than a way of writing 2.
    """
    weights: dict[str, tuple[float, int]] = {}
    for line_no, text in _numbered_texts(path):
        where = f"{path}:{line_no}"
        key, *rest = text.split("\t")
        if not key or len(rest) > 1:
            raise InputError(f"expected 'key' or 'key<TAB>weight', got {text[:80]!r}",
                             where=where)
        weight = 1.0
        if rest:
            try:
                weight = float(rest[0])
            except ValueError:
                raise InputError(f"weight {rest[0][:40]!r} is not a number",
                                 where=where) from None
            if not (math.isfinite(weight) and weight >= 0.0):
                raise InputError(f"weight {rest[0][:40]!r} is not a finite number >= 0",
                                 where=where)
        if key in weights:
            raise InputError(f"{key[:80]!r} is listed twice (first on line "
                             f"{weights[key][1]})", where=where)
        weights[key] = (weight, line_no)
    return weights


def _numbered_texts(path: Path) -> Iterator[tuple[int, str]]:
    """``(line_no, text)`` of the lines that are not blank or ``#`` comments."""
    for line_no, raw in numbered_lines(path, MAX_EDGE_LINE_BYTES):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError("not UTF-8 text", where=f"{path}:{line_no}") from exc
        if text.strip() and not text.startswith("#"):
            yield line_no, text
