"""Parsing an event's JSON text strictly: what ``json.loads`` lets through, refused.

Python's parser accepts ``NaN`` and ``Infinity``, keeps the last of duplicate keys
and raises on integers of more than 4,300 digits. An event must be plain RFC 8259
JSON with one meaning, so :func:`parse_strict_json` refuses the first two and keeps
huge integers as :class:`HugeInteger` for the schema to refuse by field (or ignore,
in an extra field). Every refusal is an :class:`~rankstream.errors.InputError` whose
message starts with ``malformed JSON:``, the category the dead-letter topic records.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

from rankstream.errors import InputError

__all__ = ["HugeInteger", "parse_strict_json"]


class HugeInteger(float):
    """An integer of thousands of digits, kept as the float it rounds to (inf)."""


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # {"type":"link_added","type":"page",...} is ambiguous (RFC 8259 leaves duplicate
    # names to the parser, and json.loads keeps the last): refuse it instead of
    # guessing. About 0.2 us per event.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()  # a set: scanning the list was quadratic (110k keys: minutes)
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key[:40]!r}")
            seen.add(key)
    return obj


def _integer(digits: str) -> int | float:
    # Python refuses to parse integers of more than 4,300 digits (a ValueError that
    # would reject the whole event). Such a number can only be a bad `ts` (refused as
    # out of range, by its type) or sit in an extra field, which is ignored.
    return int(digits) if len(digits) <= 4000 else HugeInteger(digits)


# Built once: json.loads would build a new decoder per call when given parse_constant.
_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_int=_integer,
                                 object_pairs_hook=_unique_keys)


def parse_strict_json(text: str) -> Any:
    """The JSON value in ``text``, or InputError ``"malformed JSON: ..."``."""
    try:
        return _JSON_DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON: {exc.msg} at char {exc.pos}") from exc
    except ValueError as exc:  # NaN / Infinity, a duplicate key
        raise InputError(f"malformed JSON: {exc}") from exc
    except RecursionError as exc:
        raise InputError("malformed JSON: nested too deeply") from exc
