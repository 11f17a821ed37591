"""Derive the shipped demo log ``data/python-docs-pages.jsonl.gz`` from the link TSV.

    python -m producer.make_demo_data [LINKS.tsv.gz] [OUT.jsonl.gz]

Input: ``src<TAB>dst`` lines (the crawl of the Python 3.11 docs in ``../shared/data``).
Output: one ``page`` event per source page, in order of first appearance, carrying
its full link list (in file order), ``title`` = the last path component of its URL
and ``ts`` increasing by one second from 2026-01-01T00:00:00Z. Every event is
validated and canonically encoded by :mod:`producer.schema`; the gzip header carries
no name and mtime 0, so the same input always gives byte-identical output.
"""

from __future__ import annotations

import gzip
import io
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from producer.schema import encode_event, make_event
from producer.urls import UrlError, canonicalize_url
from rankstream.edgelist import numbered_edges
from rankstream.errors import InputError

__all__ = ["build_demo_lines", "main", "write_demo_data"]

_REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = _REPO / "data" / "python-docs-links.tsv.gz"  # ../shared/data's, copied
DEFAULT_OUTPUT = _REPO / "data" / "python-docs-pages.jsonl.gz"
TS_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
TS_STEP_MS = 1000


def _title(url: str) -> str:
    parts = [part for part in urlsplit(url).path.split("/") if part]
    return parts[-1] if parts else url


def build_demo_lines(source: Path) -> list[bytes]:
    """The encoded ``page`` events (without newlines) for the TSV at ``source``.

    Sources are grouped by canonical URL (``http://A/`` and ``http://a/`` are one
    page: two events would have the second replace the first's links); a bad URL is
    an InputError naming its line.
    """
    links: dict[str, list[str]] = {}
    for line_no, src, dst in numbered_edges(source):
        try:
            page, target = canonicalize_url(src), canonicalize_url(dst)
        except UrlError as exc:
            raise InputError(f"bad url: {exc}", where=f"{source}:{line_no}") from exc
        links.setdefault(page, []).append(target)
    encoded = []
    for index, (url, targets) in enumerate(links.items()):
        event = make_event({"type": "page", "url": url, "links": targets, "title": _title(url),
                            "ts": TS_START_MS + index * TS_STEP_MS})
        encoded.append(encode_event(event))
    return encoded


def write_demo_data(source: Path = DEFAULT_SOURCE, output: Path = DEFAULT_OUTPUT) -> int:
    """Write the gzipped JSON-lines log deterministically; returns the event count."""
    lines = build_demo_lines(source)
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz:
        for line in lines:
            gz.write(line + b"\n")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(buffer.getvalue())
    return len(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    source = Path(args[0]) if args else DEFAULT_SOURCE
    output = Path(args[1]) if len(args) > 1 else DEFAULT_OUTPUT
    try:
        count = write_demo_data(source, output)
    except InputError as exc:
        sys.stderr.write(f"make_demo_data: error: {exc}\n")
        return 2
    except OSError as exc:  # an output path that is a directory, or not writable
        sys.stderr.write(f"make_demo_data: error: {output}: cannot write: "
                         f"{exc.strerror or exc}\n")
        return 2
    print(f"wrote {count} page events to {output} ({output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
