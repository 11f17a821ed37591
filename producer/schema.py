"""The event schema: the public, versioned contract between crawlers and the consumer.

One JSON object per Kafka message (or per line of a JSON-lines log), told apart by
``"type"``:

* ``page``: ``{"type":"page","url":U,"links":[U2 | {"url":U2,"text":anchor}, ...],
  "title"?:str,"ts"?:T}`` - the full current out-link set of ``U``; replaces the old one.
* ``link_added`` / ``link_removed``: ``{"type":...,"src":U,"dst":V,"ts"?:T}``.
* ``page_removed``: ``{"type":"page_removed","url":U,"ts"?:T}`` - the page is gone, with
  its in- and out-links.

``"v"`` is the schema version (default 1; any other value is rejected). Unknown extra
fields are ignored, so a newer producer may add optional fields without breaking older
consumers; a change of meaning bumps ``v``. ``ts`` is epoch milliseconds (int) or an
ISO 8601 string (naive means UTC) and is normalised to epoch milliseconds. Every URL is
canonicalised by :func:`producer.urls.canonicalize_url`; self links and duplicate
links of a ``page`` event are dropped (first occurrence wins, order kept).

:func:`decode_event` is the only way bytes become events. It checks cheap things first
(size, UTF-8), parses with ``json.loads`` (never evaluates anything), validates with one
prebuilt pydantic ``TypeAdapter``, and raises :class:`~rankstream.errors.InputError`
whose message is ``"<category>: <detail>"``, the category being stable (see
``docs/events.md``): that string is what the dead-letter topic records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from producer.field_checks import (
    DEFAULT_LIMITS,
    Limits,
    checked_text,
    checked_url,
    fail,
    json_type,
    links_at_once,
    links_one_by_one,
    parse_ts,
    shown,
)
from producer.strict_json import parse_strict_json
from rankstream.errors import InputError
from rankstream.input_files import numbered_lines

__all__ = [
    "DEFAULT_LIMITS",
    "SCHEMA_VERSION",
    "SUPPORTED_VERSIONS",
    "Event",
    "Limits",
    "LinkAddedEvent",
    "LinkRemovedEvent",
    "PageEvent",
    "PageRemovedEvent",
    "decode_event",
    "encode_event",
    "event_key",
    "event_source",
    "iter_events",
    "make_event",
]

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
_SUPPORTED_TEXT = ", ".join(str(v) for v in sorted(SUPPORTED_VERSIONS))


def _limits_of(info: ValidationInfo) -> Limits:
    context = info.context
    if context is None:
        return DEFAULT_LIMITS
    limits: Limits = context.get("limits", DEFAULT_LIMITS)
    return limits


def _url_field(value: str, info: ValidationInfo) -> str:
    return checked_url(value, _limits_of(info), info.field_name or "url")


Url = Annotated[StrictStr, AfterValidator(_url_field)]


# --- models -----------------------------------------------------------------------


class _EventBase(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    v: StrictInt = SCHEMA_VERSION
    ts: int | None = None

    @field_validator("v")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value not in SUPPORTED_VERSIONS:
            fail("unsupported version", f"{value} (supported: {_SUPPORTED_TEXT})")
        return value

    @field_validator("ts", mode="before")
    @classmethod
    def _normalise_ts(cls, value: object) -> int | None:
        return parse_ts(value)


class PageEvent(_EventBase):
    """The full current out-link set of ``url`` as a crawler saw it; replaces the old set.

    ``links`` are canonical, without self links or duplicates, in first-seen order.
    ``anchors`` holds ``(link url, anchor text)``, in link order, for links given with text.
    """

    type: Literal["page"] = "page"
    url: StrictStr
    links: tuple[StrictStr, ...]
    title: StrictStr | None = None
    # Always built by _canonical_links from checked strings (an "anchors" key in the
    # input is replaced or dropped there), so pydantic need not check it again.
    anchors: SkipValidation[tuple[tuple[str, str], ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _canonical_links(cls, data: Any, info: ValidationInfo) -> Any:
        # One Python pass over the links does canonicalisation, limits, self-link and
        # duplicate removal; pydantic then only checks the resulting tuple of strings.
        if isinstance(data, PageEvent):
            return data
        if not isinstance(data, Mapping):
            # Only model_validate(..., from_attributes=True) gets here (the union
            # routes events by their "type" key): it would skip the checks below.
            fail("wrong type", f"page event: expected object, got {json_type(data)}")
        limits = _limits_of(info)
        out = dict(data)
        page_url = None
        if "url" in data:
            page_url = out["url"] = checked_url(data["url"], limits, "url")
        links = data.get("links")
        if links is None:  # pydantic says which: missing, or null
            out.pop("anchors", None)
            return out
        if not isinstance(links, list | tuple):
            # pydantic's tuple would also take a set or a generator (from make_event),
            # whose URLs the checks below would never see.
            fail("wrong type", f"links: expected array, got {json_type(links)}")
        if len(links) > limits.max_links_per_page:
            fail("too many links", f"{len(links)} > {limits.max_links_per_page}")
        out["links"], out["anchors"] = (links_at_once(links, page_url, limits)
                                        or links_one_by_one(links, page_url, limits))
        return out

    @field_validator("title")
    @classmethod
    def _valid_title(cls, value: str | None) -> str | None:
        return None if value is None else checked_text(value, "title")


class LinkAddedEvent(_EventBase):
    """One link ``src -> dst`` appeared (an incremental edit; no stale rule)."""

    type: Literal["link_added"] = "link_added"
    src: Url
    dst: Url


class LinkRemovedEvent(_EventBase):
    """One link ``src -> dst`` disappeared; removing an absent link is a no-op."""

    type: Literal["link_removed"] = "link_removed"
    src: Url
    dst: Url


class PageRemovedEvent(_EventBase):
    """The page is gone; its in- and out-links go with it."""

    type: Literal["page_removed"] = "page_removed"
    url: Url


Event = Annotated[
    PageEvent | LinkAddedEvent | LinkRemovedEvent | PageRemovedEvent,
    Field(discriminator="type"),
]
_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


# --- decoding and encoding --------------------------------------------------------


def decode_event(raw: bytes | None, limits: Limits = DEFAULT_LIMITS) -> Event:
    """Bytes of one message -> a validated, canonical event, or :class:`InputError`.

    ``None`` is a Kafka tombstone (a record with a null value)."""
    if raw is None:
        raise InputError("empty message: a tombstone (null value)")
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise InputError(f"not bytes: got {type(raw).__name__}")
    if len(raw) > limits.max_message_bytes:
        raise InputError(f"message too large: {len(raw)} > {limits.max_message_bytes} bytes")
    if not raw:
        raise InputError("empty message: no bytes")
    if raw[:3] == b"\xef\xbb\xbf":  # RFC 8259: senders must not add one
        raise InputError("malformed JSON: starts with a UTF-8 byte order mark")
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    return make_event(parse_strict_json(text), limits)


def make_event(obj: object, limits: Limits = DEFAULT_LIMITS) -> Event:
    """Validate an already parsed JSON value (a dict) into an event, or InputError."""
    if type(obj) is not dict:
        raise InputError(f"not a JSON object: got {json_type(obj)}")
    version = obj.get("v", SCHEMA_VERSION)
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise InputError(
            f"unsupported version: {shown(version)} (supported: {_SUPPORTED_TEXT})"
        )
    try:
        return _EVENT_ADAPTER.validate_python(obj, context={"limits": limits})
    except ValidationError as exc:
        raise InputError(_reason(exc)) from exc


_TYPE_WORDS = {
    "string_type": "expected string",
    "int_type": "expected integer",
    "tuple_type": "expected array",
    "list_type": "expected array",
    "literal_error": "unexpected value",
}


def _reason(exc: ValidationError) -> str:
    """The first pydantic error as ``"<category>: <detail>"``."""
    error = exc.errors(include_url=False)[0]
    kind = error["type"]
    loc = [str(part) for part in error["loc"]]
    if loc and loc[0] in _TYPE_TAGS:
        loc = loc[1:]  # the discriminated union puts the tag first
    where = ".".join(loc)
    if kind == "rankstream":
        return str(error["ctx"]["reason"])
    if kind == "union_tag_not_found":
        return "missing field: type"
    if kind == "union_tag_invalid":
        given = error["input"].get("type") if isinstance(error["input"], dict) else None
        return f"unknown type: {shown(given)} (expected one of {', '.join(_TYPE_TAGS)})"
    if kind == "missing":
        return f"missing field: {where}"
    detail = _TYPE_WORDS.get(kind, error["msg"])
    return f"wrong type: {where}: {detail}, got {json_type(error['input'])}"


_TYPE_TAGS = ("page", "link_added", "link_removed", "page_removed")


def encode_event(event: Event) -> bytes:
    """The canonical JSON encoding of an event (compact, UTF-8, ``v`` explicit)."""
    obj: dict[str, Any] = {"type": event.type, "v": event.v}
    if isinstance(event, PageEvent):
        obj["url"] = event.url
        anchors = dict(event.anchors)
        obj["links"] = [
            {"url": link, "text": anchors[link]} if link in anchors else link
            for link in event.links
        ]
        if event.title is not None:
            obj["title"] = event.title
    elif isinstance(event, PageRemovedEvent):
        obj["url"] = event.url
    else:
        obj["src"] = event.src
        obj["dst"] = event.dst
    if event.ts is not None:
        obj["ts"] = event.ts
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def event_key(event: Event) -> bytes:
    """The Kafka key: the SOURCE url, so one page's events stay in one partition."""
    if isinstance(event, LinkAddedEvent | LinkRemovedEvent):
        return event.src.encode("utf-8")
    return event.url.encode("utf-8")


def event_source(event: Event) -> str:
    """The source URL of an event as text (what :func:`event_key` encodes)."""
    if isinstance(event, LinkAddedEvent | LinkRemovedEvent):
        return event.src
    return event.url


def iter_events(
    path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS
) -> Iterator[tuple[int, Event]]:
    """Yield ``(line_no, event)`` from a JSON-lines log, plain or gzip (by magic bytes).

    Blank lines are skipped. A bad line raises :class:`InputError` with
    ``where="path:line"``; an unreadable file raises it with ``where=path``.
    """
    name = os.fspath(path)
    for line_no, line in numbered_lines(name, max_line_bytes=limits.max_message_bytes):
        stripped = line.strip()
        if not stripped:
            continue
        try:
            event = decode_event(stripped, limits)
        except InputError as exc:
            raise InputError(str(exc), where=f"{name}:{line_no}") from exc
        yield line_no, event
