"""Field-level checks of events: limits, URLs, link lists, texts, timestamps.

Each failure is a :func:`fail` (a pydantic error whose text is ``"<category>:
<detail>"``, the dead-letter reason :func:`producer.schema.decode_event` reports).
Kept apart from the models in :mod:`producer.schema`, which call them from their
validators.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from pydantic_core import PydanticCustomError

from producer.strict_json import HugeInteger
from producer.timestamps import BadTimestamp, epoch_millis
from producer.urls import UrlError, _canonicalize_cached, already_canonical_lines_matcher

__all__ = ["DEFAULT_LIMITS", "Limits", "checked_text", "checked_url", "fail", "json_type",
           "links_at_once", "links_one_by_one", "parse_ts", "shown"]


@dataclass(frozen=True, slots=True)
class Limits:
    """Input limits; each violation is an :class:`InputError` (a DLQ entry downstream).

    Built explicitly by the caller, usually with :meth:`from_settings`.
    """

    max_url_length: int = 8192
    max_links_per_page: int = 10_000
    max_message_bytes: int = 1_048_576
    allowed_schemes: frozenset[str] = frozenset({"http", "https", "file"})
    _scheme_prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _all_canonical: Callable[[str], object] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        schemes = frozenset(s.lower() for s in self.allowed_schemes)
        object.__setattr__(self, "allowed_schemes", schemes)
        object.__setattr__(self, "_scheme_prefixes", tuple(f"{s}:" for s in sorted(schemes)))
        object.__setattr__(self, "_all_canonical", already_canonical_lines_matcher(schemes))

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        """Limits from a :class:`rankstream.settings.Settings` (duck-typed on purpose)."""
        return cls(
            max_url_length=settings.max_url_length,
            max_links_per_page=settings.max_links_per_page,
            max_message_bytes=settings.max_message_bytes,
            allowed_schemes=frozenset(settings.allowed_schemes),
        )


DEFAULT_LIMITS = Limits()


# --- checks (the models' validators in producer.schema call these) ---------------


def fail(category: str, detail: str) -> NoReturn:
    raise PydanticCustomError("rankstream", "{reason}", {"reason": f"{category}: {detail}"})


def checked_url(raw: object, limits: Limits, where: str) -> str:
    """Canonical form of ``raw`` within ``limits``; the hot path of decoding."""
    if type(raw) is not str:
        fail("wrong type", f"{where}: expected string, got {json_type(raw)}")
    if len(raw) > limits.max_url_length:
        fail("url too long", f"{where}: {len(raw)} > {limits.max_url_length}")
    try:
        canonical = _canonicalize_cached(raw)
    except UrlError as exc:
        fail("bad url", f"{where}: {exc}")
    if not canonical.startswith(limits._scheme_prefixes):
        scheme = canonical.partition(":")[0]
        allowed = ", ".join(sorted(limits.allowed_schemes))
        fail("disallowed scheme", f"{where}: {scheme!r} (allowed: {allowed})")
    if len(canonical) > limits.max_url_length:  # only the added "/" can get here
        fail("url too long", f"{where}: {len(canonical)} > {limits.max_url_length}")
    return canonical


def _all_plain_and_canonical(links: list[Any] | tuple[Any, ...], limits: Limits) -> bool:
    """True if every link is a string that is already canonical, allowed and short."""
    if not links:
        return True
    try:
        joined = "\n".join(links)
    except TypeError:  # an object link (with anchor text) or a wrong type
        return False
    if limits._all_canonical(joined) is None:
        return False
    if joined.count("\n") != len(links) - 1:  # a link with a newline of its own
        return False
    return max(map(len, links)) <= limits.max_url_length


def _canonical_links_and_texts(links: list[Any] | tuple[Any, ...], limits: Limits
                               ) -> tuple[list[str], list[tuple[int, str, str]]] | None:
    """The links' URLs and their non-empty texts as ``(index, url, text)``, if every
    link is a URL string or a ``{url, text}`` object, every text a string or absent,
    and every URL already canonical, allowed and short; else None, and the per-link
    path finds what is wrong (or canonicalises). Texts are not checked here."""
    urls = list(links)
    texts = []
    for index, item in enumerate(links):
        if type(item) is str:
            continue
        if type(item) is not dict:
            return None
        url = item.get("url")
        text = item.get("text")
        if type(url) is not str or (text is not None and type(text) is not str):
            return None
        urls[index] = url
        if text:
            texts.append((index, url, text))
    if not _all_plain_and_canonical(urls, limits):
        return None
    return urls, texts


# (links, anchors) of a page event: canonical links without the self link or
# duplicates, in first-seen order, and (url, first non-empty text) in link order.
_Links = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]


def links_at_once(links: list[Any] | tuple[Any, ...], page_url: str | None,
                  limits: Limits) -> _Links | None:
    """The page's links if every URL is already canonical, allowed and short: one
    regex vets them all (the usual page, with or without anchor text). None: some
    link needs :func:`links_one_by_one` (canonicalising, or an error to report)."""
    urls: list[Any] | tuple[Any, ...]
    texts: list[tuple[int, str, str]]
    if _all_plain_and_canonical(links, limits):
        urls, texts = links, []
    else:
        split = _canonical_links_and_texts(links, limits)
        if split is None:
            return None
        urls, texts = split
    unique = dict.fromkeys(urls)
    unique.pop(page_url, None)
    first_texts: dict[str, str] = {}
    for index, url, text in texts:
        checked_text(text, f"links[{index}].text")  # a self link's too, as below
        if url != page_url and url not in first_texts:
            first_texts[url] = text
    anchors = (tuple((url, first_texts[url]) for url in unique if url in first_texts)
               if first_texts else ())
    return tuple(unique), anchors


def links_one_by_one(links: list[Any] | tuple[Any, ...], page_url: str | None,
                     limits: Limits) -> _Links:
    """The page's links, each canonicalised and checked on its own."""
    seen: dict[str, None] = {}
    anchors: dict[str, str] = {}
    for index, item in enumerate(links):
        text = None
        if type(item) is not str:
            if not isinstance(item, Mapping):
                fail("wrong type", f"links[{index}]: expected URL string or "
                     f"{{url, text}} object, got {json_type(item)}")
            text = item.get("text")
            item = item.get("url")
            if item is None:
                fail("missing field", f"links[{index}].url")
        canonical = checked_url(item, limits, f"links[{index}]")
        if text is not None:
            if type(text) is not str:
                fail("wrong type", f"links[{index}].text: expected string, "
                     f"got {json_type(text)}")
            # Checked where it is not kept too (a self link's, a later duplicate's):
            # whether an event is valid must not depend on where its links point.
            text = checked_text(text, f"links[{index}].text") if text else None
        if canonical == page_url:
            continue
        seen[canonical] = None
        # A duplicate link may still bring the first anchor text.
        if text and canonical not in anchors:
            anchors[canonical] = text
    # Anchors in link order, so that encoding and decoding again gives an equal event.
    return tuple(seen), tuple((url, anchors[url]) for url in seen if url in anchors)


def checked_text(value: str, where: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            fail("bad text", f"{where}: invalid unicode (lone surrogate)")
    return value


def parse_ts(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is int or type(value) is str:
        try:
            return epoch_millis(value)
        except BadTimestamp as exc:
            fail("bad ts", str(exc))
    if type(value) is HugeInteger:
        fail("bad ts", "integer out of range (epoch milliseconds expected)")
    fail("bad ts", f"expected epoch ms (int) or ISO 8601 string, got {json_type(value)}")


def shown(value: object, limit: int = 40) -> str:
    """A value from the input as it may appear in an error: JSON spelling (null, not
    None), control characters escaped (a reason is one line, and may reach a terminal),
    cut to ``limit`` characters. An array or object is shown as its JSON type: dumping
    one nested almost as deep as the parser allows ran out of recursion."""
    if isinstance(value, list | dict):
        return f"an {json_type(value)}"
    # ASCII-only: json.dumps leaves U+0085, U+2028/9 and lone surrogates raw otherwise,
    # which broke the reason's line or came out as "?" in a dead letter's header.
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def json_type(value: object) -> str:
    names = {str: "string", int: "integer", HugeInteger: "integer", float: "number",
             bool: "boolean",
             list: "array", dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)
