"""Stand-ins for what :class:`consumer.score_publisher.ScorePublisher` reads from the
engines (a refresh report, the graph's URLs and live pages, the score vectors), shared
by the unit and the integration tests of publications."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Report:
    bound: float
    total: float
    fresh: bool = True
    mode: str = "local"


@dataclass
class FakeGraph:
    urls: list[str] = field(default_factory=list)
    live: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def num_ids(self) -> int:
        return len(self.urls)

    def key_of(self, pid: int) -> str:
        return self.urls[pid]

    def live_mask(self) -> np.ndarray:
        return self.live


@dataclass
class FakeRanks:
    """What ScorePublisher reads from ranker.LiveRanks: the graph and y per algorithm."""

    graph: FakeGraph
    y: dict[str, np.ndarray]

    def scores(self, algorithm: str) -> np.ndarray:
        return self.y[algorithm]
