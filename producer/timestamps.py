"""An event's ``ts``: epoch milliseconds, from an int or an ISO 8601 string.

Kept apart from the schema's models because the rules are about time, not JSON:
what counts as a date (1970 to 9999 UTC: a larger int is a unit mistake,
microseconds, not a date), which RFC 3339 spellings Python 3.11's parser refuses and
we accept anyway, and how far ahead of this clock a crawler's may run.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

# Year 9999 in epoch ms: anything larger is a unit mistake (microseconds), not a date.
MAX_TS_MS = 253_402_300_799_999
MAX_TS_LEAD_MS = 86_400_000  # how far ahead of the decoder's clock a ts may be
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
# What RFC 3339 allows and Python 3.11's fromisoformat refuses (iso_moment).
_LEAP_SECOND = re.compile(r"(?<=[T ]\d\d:\d\d:)60(?=$|[.,Z+-])")
_END_OF_DAY = re.compile(r"(?<=[T ])24:00(?::00(?:[.,]0+)?)?(?=$|[Z+-])")


class BadTimestamp(ValueError):
    """A ``ts`` that is no date this project accepts; the message is the detail of
    a ``bad ts`` reason."""


def epoch_millis(value: int | str) -> int:
    """``value`` (epoch ms, or ISO 8601 with naive meaning UTC) in epoch ms."""
    if type(value) is int:
        if not 0 <= value <= MAX_TS_MS:
            raise BadTimestamp(f"{value} out of range (epoch milliseconds expected)")
        return _not_ahead(value, str(value))
    assert isinstance(value, str)
    shown = repr(value[:40])
    if not (value.isascii() and value.isprintable()):
        # Python 3.11's parser stops at a NUL after "Z": "...00Z\x00 junk" was a date.
        raise BadTimestamp(f"not ISO 8601: {shown}")
    try:
        moment = iso_moment(value)
    except ValueError:
        raise BadTimestamp(f"not ISO 8601: {shown}") from None
    except OverflowError:  # 9999-12-31T24:00:00Z is the year 10000
        raise BadTimestamp(f"{shown} out of range (1970 to 9999 UTC)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    millis = (moment - _EPOCH) // _ONE_MS
    if not 0 <= millis <= MAX_TS_MS:
        raise BadTimestamp(f"{shown} out of range (1970 to 9999 UTC)")
    return _not_ahead(millis, shown)


def iso_moment(text: str) -> datetime:
    """``datetime.fromisoformat``, plus what RFC 3339 allows and Python 3.11's parser
    refuses: a lower-case ``t`` or ``z``, a leap second (``23:59:60``, read as POSIX
    time reads it: the next second) and ``24:00:00``, the end of a day."""
    try:  # the common forms at fromisoformat's own speed (the rewrites cost 10x)
        return datetime.fromisoformat(text)
    except ValueError:
        pass
    text = text.upper()
    later = timedelta(0)
    if (leap := _LEAP_SECOND.search(text)) is not None:
        text, later = f"{text[:leap.start()]}59{text[leap.end():]}", timedelta(seconds=1)
    elif (end := _END_OF_DAY.search(text)) is not None:
        text, later = f"{text[:end.start()]}23:59:59{text[end.end():]}", timedelta(seconds=1)
    return datetime.fromisoformat(text) + later


def _not_ahead(millis: int, shown: str) -> int:
    # A page event from the future would make every later crawl of its URL "older"
    # and ignored until that date (a year-7000 ts froze the URL for good). Crawler
    # clocks may drift, so a day of lead is allowed.
    if millis > time.time() * 1000 + MAX_TS_LEAD_MS:
        raise BadTimestamp(f"{shown} is in the future (more than a day ahead of this clock)")
    return millis
