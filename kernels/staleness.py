"""Recording staleness events in the shared log, in one compiled call.

Layout (built by ``hogkit.state.reader.StalenessLog.specs``): per worker ``w``

- ``gap_hist[w]`` / ``lag_hist[w]`` (B bins, log-linear in the HdrHistogram manner,
  :func:`bucket`): one bin per value below ``EXACT`` = 128, then ``SUB`` = 64 bins per
  power of two, so a bin spans at most 1/64 of its lower bound and its midpoint is
  within 0.8 % of any value in it; the last bin counts every value from its lower
  bound up (the overflow bin). The default ``HIST_BINS`` = 2241 bins reach 2**40
  exactly-bucketed, the overflow bin holds values >= 2**40;
- ``stats[w]`` (``STATS`` = 8 int64, one cache line): gap sum, gap max, lag sum, lag max,
  count of events, ring cursor (events written to the ring);
- ``ring[w]`` (R, 5): the last ring events ``(rank, step, gap, lag, t_ns)``.

Every event updates the histograms and exact stats (``record_stats``); the ring keeps
every ``stride``-th event (``record_event`` with its ``stride``), so a worker running
tens of millions of updates a second records exact distributions while the event
stream stays a sample of bounded rate. One writer per row (its worker).
"""

from numba import njit

from ._intrinsics import monotonic_ns

STATS = 8
GAP_SUM, GAP_MAX, LAG_SUM, LAG_MAX, COUNT, CURSOR = 0, 1, 2, 3, 4, 5
EVENT_WIDTH = 5

#: values below EXACT have a bin each; above, SUB bins per power of two
EXACT, SUB = 128, 64
#: bins of the default histogram: exact to 127, log-linear to 2**40, one overflow bin
HIST_BINS = EXACT + (40 - 7) * SUB + 1


@njit(cache=True, nogil=True, inline="always")
def bucket(v, top):
    """The bin of value ``v >= 0`` in a histogram whose last bin is ``top``."""
    if v < EXACT:
        i = v
    else:
        e = 7                                  # 2**e <= v < 2**(e+1)
        x = v >> 8
        while x:
            x >>= 1
            e += 1
        i = EXACT + (e - 7) * SUB + ((v >> (e - 6)) - SUB)
    return i if i < top else top


def bin_low(i):
    """The smallest value bin ``i`` holds (the inverse of :func:`bucket`)."""
    if i < EXACT:
        return i
    e, j = 7 + (i - EXACT) // SUB, (i - EXACT) % SUB
    return (SUB + j) << (e - 6)


def width_at(low):
    """How many values the bin whose lowest value is ``low`` holds (not the overflow
    bin): 1 below ``EXACT``, else ``2**(e - 6)`` for ``2**e <= low < 2**(e + 1)``."""
    low = int(low)
    return 1 if low < EXACT else 1 << (low.bit_length() - 7)


def bin_width(i):
    """How many values bin ``i`` holds (the last, overflow, bin: from its low up)."""
    return 1 if i < EXACT else 1 << (7 + (i - EXACT) // SUB - 6)


@njit(cache=True, nogil=True, inline="always")
def record_stats(gap_hist, lag_hist, stats, rank, gap, lag):
    """Histograms and exact sums/max/count of one event; returns the events counted
    before this one (the event's index)."""
    top = gap_hist.shape[1] - 1
    gap_hist[rank, bucket(gap, top)] += 1
    lag_hist[rank, bucket(lag, top)] += 1
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


@njit(cache=True, nogil=True, inline="always")
def record_event(gap_hist, lag_hist, stats, ring, rank, step, gap, lag, t_ns, stride):
    """One event of worker ``rank``: always into the histograms and stats; into the
    ring when its index is a multiple of ``stride`` (1: every event), stamped ``t_ns``
    or, when ``t_ns < 0``, the monotonic clock read then (only for the events the ring
    keeps). The one definition: the step core, the simulator and the Python
    ``StalenessLog`` all record through it. The caller checks ``rank`` and that gap,
    lag >= 0; only worker ``rank`` may write its rows."""
    n = record_stats(gap_hist, lag_hist, stats, rank, gap, lag)
    if stride <= 1 or n % stride == 0:
        record_ring(ring, stats, rank, step, gap, lag, monotonic_ns() if t_ns < 0 else t_ns)
