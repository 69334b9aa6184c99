"""Recording staleness events in the shared log, in one compiled call.

Layout (built by ``hogkit.reader.StalenessLog.specs``): per worker ``w``

- ``gap_hist[w]`` / ``lag_hist[w]`` (B bins): exact counts for values 0..B-2, the last
  bin counts every value >= B-1;
- ``stats[w]`` (``STATS`` = 8 int64, one cache line): gap sum, gap max, lag sum, lag max,
  count of events, ring cursor (events written to the ring);
- ``ring[w]`` (R, 5): the last ring events ``(rank, step, gap, lag, t_ns)``.

Every event updates the histograms and exact stats (``record_stats``); the ring keeps
every ``stride``-th event (``record_event`` with its ``stride``), so a worker running
tens of millions of updates a second records exact distributions while the event
stream stays a sample of bounded rate. One writer per row (its worker).
"""

from numba import njit

STATS = 8
GAP_SUM, GAP_MAX, LAG_SUM, LAG_MAX, COUNT, CURSOR = 0, 1, 2, 3, 4, 5
EVENT_WIDTH = 5


@njit(cache=True, nogil=True, inline="always")
def record_stats(gap_hist, lag_hist, stats, rank, gap, lag):
    """Histograms and exact sums/max/count of one event; returns the events counted
    before this one (the event's index)."""
    top = gap_hist.shape[1] - 1
    gap_hist[rank, gap if gap < top else top] += 1
    lag_hist[rank, lag if lag < top else top] += 1
    stats[rank, GAP_SUM] += gap
    if gap > stats[rank, GAP_MAX]:
        stats[rank, GAP_MAX] = gap
    stats[rank, LAG_SUM] += lag
    if lag > stats[rank, LAG_MAX]:
        stats[rank, LAG_MAX] = lag
    n = stats[rank, COUNT]
    stats[rank, COUNT] = n + 1
    return n


@njit(cache=True, nogil=True, inline="always")
def record_ring(ring, stats, rank, step, gap, lag, t_ns):
    """Write one event to ``rank``'s ring: the row ``cursor % R`` is written before the
    cursor is advanced, so a reader that sees cursor c sees event c-1 complete (x86-64
    keeps stores in order)."""
    c = stats[rank, CURSOR]
    row = c % ring.shape[1]
    ring[rank, row, 0] = rank
    ring[rank, row, 1] = step
    ring[rank, row, 2] = gap
    ring[rank, row, 3] = lag
    ring[rank, row, 4] = t_ns
    stats[rank, CURSOR] = c + 1


@njit(cache=True, nogil=True)
def record_event(gap_hist, lag_hist, stats, ring, rank, step, gap, lag, t_ns, stride):
    """One event of worker ``rank``: always into the histograms and stats; into the
    ring when its index is a multiple of ``stride`` (1: every event). The caller checks
    ``rank`` and that gap, lag >= 0; only worker ``rank`` may write its rows."""
    n = record_stats(gap_hist, lag_hist, stats, rank, gap, lag)
    if stride <= 1 or n % stride == 0:
        record_ring(ring, stats, rank, step, gap, lag, t_ns)
