"""consumer.graph_commits: the bookkeeping around each batch's graph transaction.

The transaction itself (commit_graph, against a real Redis) is the integration
tests' business; here it is replaced by a recorder, so what this class adds can be
pinned down: counts and group offsets only once a transaction committed, the
committed offsets merged across partitions, each transaction told the counters of
the one before, and close() waiting for the one in flight. A mutation review found
none of it pinned down by any test (the integration suite let all five through).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

import consumer.graph_commits as graph_commits
from consumer.graph_commits import GraphCommits
from consumer.stats import ConsumerStats


class _Recovery:
    """What GraphCommits uses of consumer.recovery.Recovery."""

    def __init__(self) -> None:
        self.committed: tuple[Any, dict[str, int]] = ("start", {})

    def fenced(self, _what: str, write: Any) -> Any:
        return write()


def _planned(counters: str, offsets: dict[str, int], links: int) -> Any:
    return SimpleNamespace(write=SimpleNamespace(counters=counters, offsets=offsets,
                                                 link_changes=links))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def commit_graph(_client: Any, _keys: Any, write: Any, **kwargs: Any) -> int:
        seen.append({"write": write, **kwargs})
        if write.counters == "fails":
            raise RuntimeError("the transaction failed")
        return 1

    monkeypatch.setattr(graph_commits, "commit_graph", commit_graph)
    return seen


def _commits() -> tuple[GraphCommits, _Recovery, ConsumerStats]:
    recovery, stats = _Recovery(), ConsumerStats()
    commits = GraphCommits(None, None, None, recovery, stats, bulk=True)  # type: ignore[arg-type]
    return commits, recovery, stats


def test_each_transaction_is_counted_once_it_committed(calls: list[dict[str, Any]]) -> None:
    commits, recovery, stats = _commits()
    handed: list[dict[int, int]] = []
    commits.submit(_planned("v1", {"t:0": 5}, links=7), next_offsets={0: 5}, messages=3)
    commits.settle(handed.append)
    commits.submit(_planned("v2", {"t:1": 9}, links=2), next_offsets={1: 9}, messages=4)
    commits.settle(handed.append)
    commits.close()
    assert (stats.batches, stats.events, stats.link_changes) == (2, 7, 9)
    assert handed == [{0: 5}, {1: 9}]
    # Each transaction is told the counters the one before committed (the rollback
    # check), and the committed offsets keep every partition's.
    assert [call["after"] for call in calls] == ["start", "v1"]
    assert recovery.committed == ("v2", {"t:0": 5, "t:1": 9})
    assert all(call["bulk"] is True for call in calls)


def test_a_transaction_that_failed_is_neither_counted_nor_handed_on(
        calls: list[dict[str, Any]]) -> None:
    commits, recovery, stats = _commits()
    handed: list[dict[int, int]] = []
    commits.submit(_planned("fails", {"t:0": 5}, links=7), next_offsets={0: 5}, messages=3)
    with pytest.raises(RuntimeError, match="the transaction failed"):
        commits.settle(handed.append)
    assert (stats.batches, stats.events, handed) == (0, 0, [])
    assert recovery.committed == ("start", {})
    assert commits.in_flight is None  # settled: the next batch may go
    commits.settle(handed.append)  # nothing in flight: nothing happens
    assert handed == []
    commits.close()


def test_close_waits_for_the_transaction_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    release, finished = threading.Event(), threading.Event()

    def slow_commit(*_args: Any, **_kwargs: Any) -> int:
        release.wait(5)
        finished.set()
        return 1

    monkeypatch.setattr(graph_commits, "commit_graph", slow_commit)
    commits, _, _ = _commits()
    commits.submit(_planned("v1", {}, links=0), next_offsets={}, messages=0)
    threading.Timer(0.2, release.set).start()
    commits.close()
    assert finished.is_set()
