"""The session's fault-injection summary: one row per scenario, printed as a table.

``tests/faults/conftest.py`` prints it from ``pytest_terminal_summary``; the same
Markdown is what docs/reliability.md shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tests.faults.harness import Audit


@dataclass(frozen=True)
class SummaryRow:
    scenario: str
    faults: int
    events: int
    links_lost: int
    duplicates: int
    max_recovery_s: float | None
    bound: float | None  # the largest final relative bound of the published scores
    error: float | None  # the largest measured relative L1 error vs the cold recompute
    note: str = ""


SUMMARY: list[SummaryRow] = []


def record(scenario: str, *, faults: int, result: Audit | None, events: int | None = None,
           recoveries: Iterable[float] = (), note: str = "") -> SummaryRow:
    """Add one scenario's row to the session summary (printed by the conftest hook)."""
    recoveries = list(recoveries)
    row = SummaryRow(
        scenario=scenario, faults=faults,
        events=events if events is not None else (result.messages if result else 0),
        links_lost=result.lost if result else 0,
        duplicates=result.duplicates if result else 0,
        max_recovery_s=max(recoveries) if recoveries else None,
        bound=max(result.score_bound.values()) if result else None,
        error=max(result.score_error.values()) if result else None,
        note=note)
    SUMMARY.append(row)
    return row


def summary_lines(rows: Sequence[SummaryRow]) -> list[str]:
    """The table as Markdown lines (what docs/reliability.md shows)."""
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    head = ("| scenario | faults injected | events replayed | links lost | duplicates | "
            "max recovery (s) | final bound (rel.) | measured error (rel.) |")
    lines = [head, "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r.scenario} | {r.faults} | {r.events} | {r.links_lost} | "
                     f"{r.duplicates} | {num(r.max_recovery_s, '.2f')} | {num(r.bound, '.2e')} "
                     f"| {num(r.error, '.2e')} |")
    recoveries = [r.max_recovery_s for r in rows if r.max_recovery_s is not None]
    bounds = [r.bound for r in rows if r.bound is not None]
    errors = [r.error for r in rows if r.error is not None]
    lines.append(
        f"| **all {len(rows)} scenarios** | {sum(r.faults for r in rows)} | "
        f"{sum(r.events for r in rows)} | {sum(r.links_lost for r in rows)} | "
        f"{sum(r.duplicates for r in rows)} | {num(max(recoveries, default=None), '.2f')} | "
        f"{num(max(bounds, default=None), '.2e')} | {num(max(errors, default=None), '.2e')} |")
    notes = [f"* {r.scenario}: {r.note}" for r in rows if r.note]
    return lines + (["", *notes] if notes else [])
