"""producer.timestamps: an event's ts, the rules a mutation review (session 31) found
nothing pinned down (the schema's own tests cover the rest through decode_event)."""

from __future__ import annotations

import time

import pytest


@pytest.mark.parametrize(("ts", "detail"), [
    (253_402_300_800_000, "253402300800000 out of range (epoch milliseconds expected)"),  # T2
    ("1969-12-31T23:59:59Z", "'1969-12-31T23:59:59Z' out of range (1970 to 9999 UTC)"),  # T3
    ("2025-12-31T24:00:00.5Z", "not ISO 8601: '2025-12-31T24:00:00.5Z'"),  # T11, T12
    # Python 3.11's parser stopped at the NUL: a date (session 37's review).
    ("2026-01-01T00:00:00Z\x00 junk", "not ISO 8601: '2026-01-01T00:00:00Z\\x00 junk'"),
    ("\uff12026-01-01", "not ISO 8601: '\uff12026-01-01'"),  # a full-width digit
])
def test_ts_bounds_and_a_fractional_end_of_day_are_refused(ts, detail) -> None:
    from producer.timestamps import BadTimestamp, epoch_millis
    with pytest.raises(BadTimestamp) as caught:
        epoch_millis(ts)
    assert str(caught.value) == detail


@pytest.mark.parametrize(("ts", "millis"), [
    ("2016-12-31T23:59:60", 1_483_228_800_000),  # a naive leap second (T7)
    ("2025-12-31T24:00Z", 1_767_225_600_000),  # 24:00 without seconds (T10)
])
def test_more_rfc3339_spellings(ts, millis) -> None:
    from producer.timestamps import epoch_millis
    assert epoch_millis(ts) == millis


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="needs time.tzset")
def test_a_naive_ts_is_utc_whatever_the_hosts_time_zone(monkeypatch) -> None:  # T17
    from producer.timestamps import epoch_millis
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert epoch_millis("2026-01-01T00:00:00") == 1_767_225_600_000
        assert epoch_millis("2016-12-31T23:59:60") == 1_483_228_800_000
    finally:
        monkeypatch.undo()
        time.tzset()
