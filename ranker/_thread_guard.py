"""Whether this process gets the two cores its two-thread kernels count on.

Two kernel threads that do not get two cores (a busy neighbour on a shared box) run
slower than one: each parallel region waits for the thread the scheduler left out.
On the 1M-page cyclic graph with a busy loop on the other core, 1k-batch refreshes
took 668 ms for PageRank on two threads against 353 on one (idle: 216-236 against
335), and 200-310 ms for WPR against about 100 (idle: 87-99 on two threads).

So the refreshes time their two-thread sweeps (:mod:`ranker._split_sweep`) on two
clocks: the wall clock, and the process's CPU clock, which counts every thread's
time. Idle, a two-thread sweep uses 1.7-2.1 CPU seconds per wall second; with the
busy loop beside it, 1.0-1.5. Below ``SHARED_CORES`` the rest of the refresh runs its
kernels on one thread, and so does every absorb and refresh of the engines sharing
the guard for ``PAUSE_SECONDS``, after which two threads are tried again. Contended,
that brings PageRank back to about one thread's time, and WPR too: its sweeps are the
ones timed, but its other parallel passes (the owed re-weigh's settle, the
statistics) lose as much when the core is taken (docs/benchmark-history.md, session
21).

This judges what the process was given, not how fast the sweeps were: a per-link
cost against the cheapest seen (session 20's rule) could only time dense sweeps
(thin ones cost more per link), so WPR's were never judged, and it needed an idle
sweep first to learn from. Another busy thread of this process only raises the
ratio, so it can hide a taken core but never invent one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numba

from ranker import _split_sweep

# CPU seconds per wall second during two-thread sweeps below which the second core is
# taken (idle 1.7-2.1, with a busy loop beside the run 1.0-1.5; session 21).
SHARED_CORES = 1.6
# Two-thread sweeps are judged together once they took this long: the process clock
# counts the other thread's time in scheduler ticks (4 ms here), so a single 5 ms
# sweep read anywhere from 1.0 to 3.5 CPU seconds per second, idle.
JUDGED_WALL = 0.025
# One kernel thread for this long after a taken core was seen.
PAUSE_SECONDS = 2.0


def clocks() -> tuple[float, float]:
    """``(wall, process CPU)`` now, for :meth:`ThreadGuard.timed_since`."""
    return time.perf_counter(), time.process_time()


class ThreadGuard:
    """Shared by a :class:`ranker.LiveRanks`' engines: contention is the machine's,
    so what one engine's sweeps found holds for the other's refresh too."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.until = -float("inf")  # kernels on one thread until this clock reading
        self.wall = 0.0  # two-thread sweeps timed since the last judgement
        self.cpu = 0.0
        self.taken_count = 0  # judgements that found the second core taken (benchmarks)

    def paused(self) -> bool:
        return self.clock() < self.until

    @contextmanager
    def kernel_threads(self, pages: int) -> Iterator[None]:
        """Around an absorb or a refresh over ``pages`` pages: its kernels on one thread
        while paused, or on a graph below :data:`ranker._split_sweep.SPLIT_MIN_PAGES`.
        There a parallel region shares out microseconds of work and, when the second
        core is taken, waits for it: on the 530-page docs graph under load an absorb
        took 100-575 ms on two threads against 0.4-1.3 ms on one (a review's
        measurement); and no sweep is timed there to notice. The calling thread's
        limit is restored afterwards, whatever was decided inside."""
        limit = numba.get_num_threads()
        if limit > 1 and (pages < _split_sweep.SPLIT_MIN_PAGES or self.paused()):
            numba.set_num_threads(1)
        try:
            yield
        finally:
            numba.set_num_threads(limit)

    def timed(self, wall: float, cpu: float) -> bool:
        """After a two-thread sweep that took ``wall`` seconds while the process used
        ``cpu`` CPU seconds: whether the refresh keeps two threads. If not, the calling
        thread's kernels go on with one (call this within :meth:`kernel_threads`)."""
        self.wall += wall
        self.cpu += cpu
        if self.wall < JUDGED_WALL:
            return True
        taken = self.cpu < SHARED_CORES * self.wall
        self.wall = self.cpu = 0.0
        if taken:
            self.taken_count += 1
            self.until = self.clock() + PAUSE_SECONDS
            numba.set_num_threads(1)
        return not taken

    def timed_since(self, start: tuple[float, float]) -> bool:
        """:meth:`timed` for a sweep that began at ``start``, from :func:`clocks`."""
        wall, cpu = clocks()
        return self.timed(wall - start[0], cpu - start[1])
