"""ranker: the math of rankstream. Pure numpy/scipy/numba; no Kafka, Redis or pydantic.

* static (cold) solvers: :func:`pagerank`, :func:`weighted_pagerank`, :func:`hits`;
* the dynamic link graph the consumer mirrors: :class:`LinkGraph`, :class:`EdgeBatch`;
* the incremental engine with certified error bounds: :class:`LiveRanks`.

Definitions follow ``docs/algorithms.md`` of the project's shared material exactly.
"""

from ranker._kernels import set_kernel_threads
from ranker.edge_batches import AppliedBatch, EdgeBatch
from ranker.hits import hits
from ranker.incremental import LiveRanks
from ranker.linkgraph import LinkGraph
from ranker.pagerank import pagerank
from ranker.results import HitsResult, RankResult, RefreshReport
from ranker.weighted_pagerank import weighted_pagerank, wpr_matrix

__all__ = [
    "AppliedBatch",
    "EdgeBatch",
    "HitsResult",
    "LinkGraph",
    "LiveRanks",
    "RankResult",
    "RefreshReport",
    "hits",
    "pagerank",
    "set_kernel_threads",
    "weighted_pagerank",
    "wpr_matrix",
]
