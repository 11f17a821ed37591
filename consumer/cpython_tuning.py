"""CPython settings for a consumer process: the cycle collector and the GIL hand-off.

The consumer's main thread decodes and plans batches in pure Python while the
ranker thread runs compiled kernels that release the GIL. Two interpreter defaults
cost that arrangement dearly, both measured on the pipeline benchmark. Both
settings are process-wide, applied once the mirror is loaded.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["GC_YOUNG_THRESHOLD", "GIL_SWITCH_INTERVAL_S", "tune_garbage_collector",
           "tune_gil_switching"]

# Decoding one 5,000-event batch allocates ~100k container objects that all die with
# the batch (reference counting frees them; they form no cycles). With CPython's
# default young-generation threshold (700) that meant ~1,350 collections, 11 of them
# full ones over the whole mirror, per 100k events: 1.7 s of GIL-holding collector
# in a 10 s run (measured with gc.callbacks). See tune_garbage_collector().
GC_YOUNG_THRESHOLD = 100_000
# A refresh on the ranker thread is a chain of GIL-free kernels joined by short Python
# steps, and each step must win the GIL back from the main thread, which decodes and
# plans in pure Python meanwhile. CPython hands the GIL over only after the switch
# interval (5 ms by default), so a refresh of a few dozen steps waited ~0.4 s per
# batch: measured on 1M pages, a quarter-sweep refresh of both engines beside a busy
# Python thread took 0.82-0.86 s instead of 0.41 s alone, and 0.47-0.61 s at 0.5 ms.
# In the 1M-page pipeline bench, two runs back to back: p99 event -> visible score
# 5.3 s at 5 ms, 4.6 s at 0.5 ms; throughput the same (81.6k, 80.6k link changes/s).
GIL_SWITCH_INTERVAL_S = 0.0005


def tune_garbage_collector() -> None:
    """Keep CPython's cycle collector off the hot path of a consumer process.

    ``gc.freeze()`` moves everything alive now (the freshly loaded mirror: URL
    lists, id maps) out of the collector's sight, so full collections no longer
    walk it; the raised young threshold lets a batch's short-lived objects be freed
    by reference counting before a collection ever starts. Measured on the 100k-event
    pipeline bench: collector time 1.72 s -> 0.03 s. Cyclic garbage is still
    collected, just after 100k net allocations instead of 700.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def tune_gil_switching() -> None:
    """Let the ranker thread win the GIL back quickly (see GIL_SWITCH_INTERVAL_S).

    Process-wide, like :func:`tune_garbage_collector`; never loosens a tighter
    interval someone else set.
    """
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
