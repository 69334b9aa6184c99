"""Measured staleness: what each worker saw between its read and its apply.

Two measures per update (docs/algorithms.md §1):

* **update gap** ``tau`` - updates applied by *other* workers between this worker's read of
  the parameters and its apply: ``tau = (sum(u_now) - u_now[me]) - (sum(u_read) -
  u_read[me])`` over the single-writer counters ``u`` of :class:`~hogkit.state.clocks.Clocks`.
  With per-shard counters ``u[w, s]``, ``gap(shards)`` counts only updates by others that
  touched those shards.
* **clock lag** - ``own iterations - min over the workers that are not DONE`` at read
  time (the SSP distance ``c_p - min_q c_q`` of Ho et al., NIPS 2013; the one definition
  of ``hogkit.kernels.clock.clock_lag``, which the policies and the simulator use too).

:class:`StalenessLog` keeps both in shared memory so the parent can read them live:
per-worker histograms (log-linear bins, ``hogkit.kernels.staleness.bucket``: exact
below 128, then 64 bins per power of two up to 2**40, so every percentile is within 1 %
of the exact value; the last bin counts every larger value), exact per-worker
count/sum/max (so mean and max are always exact),
and a per-worker ring of recent events (every event, or every ``stride``-th one: the
compiled step core samples the ring so that millions of updates a second keep exact
histograms and a bounded event stream). Every row has one writer (its worker).

What is racy: the vector reads in :meth:`Reader.read` and :meth:`Reader.gap` are not
snapshots (Hogwild! does not stop the world). Counters only grow, so a racy sum lies
between the true sums at the start and at the end of the read; a gap is therefore exact
whenever no other worker applies an update *during* the few microseconds of the read
itself, and off by at most the updates applied in that window otherwise. :meth:`summary`
read while workers run may see a histogram and a count one event apart; after the workers
stop it is exact.
"""

from __future__ import annotations

import math
import time
from typing import Mapping

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.state.clocks import _shard_ids
from hogkit.kernels import staleness as _ks
from hogkit.kernels.clock import clock_lag as _clock_lag
from hogkit.kernels.staleness import record_event as _record_event
from hogkit.validation import check_int

__all__ = ["StalenessLog", "Reader", "EVENT_FIELDS"]

EVENT_FIELDS = ("rank", "step", "gap", "lag", "t_ns")
_I64 = np.dtype(np.int64)
_GAP_SUM, _GAP_MAX, _LAG_SUM, _LAG_MAX = _ks.GAP_SUM, _ks.GAP_MAX, _ks.LAG_SUM, _ks.LAG_MAX


class StalenessLog:
    """Per-worker staleness histograms, exact stats and event rings in shared memory.

    Build the store from :meth:`specs` (names start with ``log_``), then
    ``StalenessLog(store.views())`` in the parent and in every worker.
    """

    @staticmethod
    def specs(workers, ring=4096, bins=_ks.HIST_BINS) -> dict:
        """``{name: (shape, dtype)}`` for ``ParamStore.create`` (zero-filled)."""
        W = check_int("workers", workers, min_value=1, fix="use workers=1 or more")
        R = check_int("ring", ring, min_value=1, fix="keep at least one event per worker")
        B = check_int("bins", bins, min_value=2,
                      fix=f"bins=2 keeps only 0 and an overflow bin; {_ks.HIST_BINS} (the "
                          f"default) reaches 2**40")
        return {
            "log_gap_hist": ((W, B), _I64),
            "log_lag_hist": ((W, B), _I64),
            # gap sum, gap max, lag sum, lag max, events, ring cursor (a line per worker)
            "log_stats": ((W, _ks.STATS), _I64),
            "log_ring": ((W, R, len(EVENT_FIELDS)), _I64),
        }

    def __init__(self, views: Mapping[str, np.ndarray]):
        if not isinstance(views, Mapping):
            raise InvalidType(f"views must be a mapping name -> ndarray (store.views()), "
                              f"got {type(views).__name__}")
        need = ("log_gap_hist", "log_lag_hist", "log_stats", "log_ring")
        missing = [n for n in need if n not in views]
        if missing:
            raise InvalidArgument(f"views lack {missing}; create the store with "
                                  f"StalenessLog.specs(workers, ring, bins)")
        for n in need:
            if not isinstance(views[n], np.ndarray) or views[n].dtype != _I64:
                raise InvalidType(f"{n} must be an int64 ndarray")
        gh, lh = views["log_gap_hist"], views["log_lag_hist"]
        ring, stats = views["log_ring"], views["log_stats"]
        W = stats.shape[0] if stats.ndim == 2 else -1
        if (W < 1 or gh.ndim != 2 or gh.shape[0] != W or gh.shape[1] < 2
                or lh.shape != gh.shape
                or stats.shape != (W, _ks.STATS)
                or ring.ndim != 3 or ring.shape[0] != W or ring.shape[1] < 1
                or ring.shape[2] != len(EVENT_FIELDS)):
            raise InvalidArgument(
                "log views have inconsistent shapes "
                f"({ {n: views[n].shape for n in need} }); create the store with "
                "StalenessLog.specs(workers, ring, bins)")
        self.workers = W
        self.bins = gh.shape[1]
        self.ring = ring.shape[1]
        self.gap_hist, self.lag_hist = gh, lh
        self.stats = stats
        self.events = ring
        self.count = stats[:, _ks.COUNT]        # events recorded by worker w
        self.cursor = stats[:, _ks.CURSOR]      # events written to w's ring

    def arrays(self):
        """The arrays the compiled step core records into."""
        return (self.gap_hist, self.lag_hist, self.stats, self.events)

    # ---------------------------------------------------------------- writer (hot path)

    def record(self, rank, *, step, gap, lag, t_ns, stride=1):
        """Record one update of worker ``rank`` (only that worker may call this): into
        the histograms and stats, and into the ring when it is a ``stride``-th event.

        The ring row is written before the cursor is advanced, so a reader that sees
        cursor ``c`` sees event ``c-1`` complete (on x86-64's ordered stores).
        """
        if rank.__class__ is not int:
            rank = check_int("rank", rank)
        if not 0 <= rank < self.workers:
            raise InvalidArgument(f"rank={rank} must be in [0, {self.workers})")
        if gap < 0 or lag < 0:
            raise InvalidArgument(f"gap={gap} and lag={lag} must be >= 0 (they count "
                                  f"updates and iterations)")
        _record_event(self.gap_hist, self.lag_hist, self.stats, self.events, rank, step,
                      gap, lag, t_ns, stride)

    # ---------------------------------------------------------------- parent side

    def summary(self, rank=None) -> dict:
        """``{"gap": {...}, "lag": {...}}`` over all workers, or one ``rank``.

        Each part: ``count``, ``mean``, ``max`` (always exact), ``p50``, ``p99``,
        ``p999`` (nearest-rank percentiles from the histogram: exact below 128, else the
        middle of the value's bin, within 1 % of the exact value; a percentile that falls
        into the overflow bin reads the bin's lower bound and is named in
        ``lower_bounds``), ``overflow`` (how many values were in the overflow bin) and
        ``histogram`` ``{bin's lowest value: count}`` of non-empty bins. With no events:
        count 0 and zeros elsewhere.
        """
        if rank is not None:
            rank = check_int("rank", rank, min_value=0, max_value=self.workers - 1)
        return {"gap": self._part(self.gap_hist, _GAP_SUM, _GAP_MAX, rank),
                "lag": self._part(self.lag_hist, _LAG_SUM, _LAG_MAX, rank)}

    def _part(self, hist, isum, imax, rank):
        rows = slice(None) if rank is None else slice(rank, rank + 1)
        h = hist[rows].sum(axis=0)
        count = int(self.count[rows].sum())
        total = int(self.stats[rows, isum].sum())
        mx = int(self.stats[rows, imax].max())
        n = int(h.sum())
        out = {"count": count, "mean": total / count if count else 0.0}
        low = []
        for name, q in (("p50", 0.50), ("p99", 0.99), ("p999", 0.999)):
            out[name], bound = _percentile(h, n, q, mx)
            if bound:
                low.append(name)
        out.update({"max": mx, "overflow": int(h[-1]), "lower_bounds": low,
                    "histogram": {_ks.bin_low(int(i)): int(h[i]) for i in np.flatnonzero(h)}})
        return out

    def drain(self, cursors=None):
        """Events written since ``cursors``: returns ``(events, cursors, dropped)``.

        ``cursors`` is what the previous call returned (``None`` = from the start).
        ``events`` is a list of dicts with keys :data:`EVENT_FIELDS`, ordered by
        ``t_ns``; ``dropped`` counts events that were overwritten before they could be
        read (the ring of ``ring`` slots per worker was lapped), including any a writer
        overwrote while this call was copying them. Drain at least every ``ring - 1``
        events per worker to lose none: when a worker's ring is full, its oldest slot is
        treated as possibly mid-overwrite (the writer may be writing the next event into
        it) and counted as dropped.
        """
        W = self.workers
        if cursors is None:
            cursors = np.zeros(W, dtype=_I64)
        else:
            cursors = np.asarray(cursors)
            if cursors.shape != (W,) or cursors.dtype.kind not in "iu":
                raise InvalidArgument(f"cursors must be {W} ints (what drain() returned), "
                                      f"got shape {cursors.shape} dtype {cursors.dtype}")
        now = self.cursor.copy()
        if (now < cursors).any():
            raise InvalidArgument(f"cursors {cursors.tolist()} are ahead of the log "
                                  f"({now.tolist()}); they come from another log")
        R = self.ring
        events, dropped = [], 0
        for w in range(W):
            start, end = int(cursors[w]), int(now[w])
            lo = max(start, end - R)
            if end > lo:
                rows = self.events[w, np.arange(lo, end) % R]  # a copy
                # Event i lives in slot i % R; while the writer writes event j it
                # overwrites event j - R. Events i <= after - R may be torn.
                after = int(self.cursor[w])
                ok = max(lo, after - R + 1)
                rows = rows[ok - lo:]
                lo = ok
                events.extend(dict(zip(EVENT_FIELDS, r)) for r in rows.tolist())
            dropped += lo - start
        events.sort(key=lambda e: e["t_ns"])
        return events, now, dropped

    def __repr__(self):
        return (f"StalenessLog(workers={self.workers}, ring={self.ring}, "
                f"bins={self.bins}, events={self.count.tolist()})")


def _percentile(h, n, q, mx):
    """``(value, lower_bound)``: the nearest-rank percentile (smallest v with
    #(values <= v) >= ceil(q n)) read from the log-linear histogram ``h``: exact in the
    one-value bins, else the middle of the bin (never above the exact max ``mx``), and
    the overflow bin's lower bound with ``lower_bound=True``."""
    if n == 0:
        return 0, False
    k = max(1, math.ceil(q * n))
    b = int(np.searchsorted(np.cumsum(h), k))
    if b == len(h) - 1 and (b >= _ks.EXACT or mx > b):
        return _ks.bin_low(b), True
    if b < _ks.EXACT:
        return b, False
    return min(_ks.bin_low(b) + (_ks.bin_width(b) - 1) // 2, mx), False


class Reader:
    """One worker's staleness probe: :meth:`read` before computing a gradient, :meth:`gap`
    before applying it, :meth:`commit` after.

    ``shards``: keep per-shard totals too (``True``), or not (``False``); ``None`` = when
    the clocks have more than one shard. Per-shard reads cost O(workers x shards).

    Hot path: :meth:`read`, :meth:`gap` and :meth:`commit` allocate no arrays (one
    short list of W Python ints per counter read; for ``gap(shards)`` a
    ``workers x len(shards)`` temporary). Measured (CPython 3.11, numpy 2.4, one busy
    core): ``read()`` + ``commit(step)`` about 2 us for 2 to 16 workers; with per-shard
    counters (8 shards) ``read()`` + ``gap(shards)`` + ``commit`` about 8 us.
    """

    def __init__(self, clocks, log, rank, *, shards=None):
        W = clocks.workers
        self.rank = check_int("rank", rank, min_value=0, max_value=W - 1,
                              fix=f"ranks are 0..{W - 1} for {W} workers")
        if log is not None and log.workers != W:
            raise InvalidArgument(f"log is for {log.workers} workers, clocks for {W}; "
                                  f"build both from the same worker count")
        if shards is None:
            shards = clocks.shards > 1
        if not isinstance(shards, (bool, np.bool_)):
            raise InvalidType(f"shards={shards!r} must be True, False or None")
        self.clocks, self.log = clocks, log
        self.per_shard = bool(shards)
        self._u = clocks.updates
        self._slots = clocks.slots
        self._su = clocks.shard_updates
        self._own_su = clocks.shard_updates[self.rank]
        self._others_read = None  # sum of others' updates at read time
        self._lag = 0
        self._col_read = np.zeros(clocks.shards, dtype=_I64) if self.per_shard else None

    def read(self):
        """Record the clock vector (others' updates, per shard too) and the clock lag."""
        r = self.rank
        # tolist() + builtin sum: one C pass over W int64s, ~5x cheaper than the
        # numpy reduction's fixed overhead for the worker counts hogkit runs (W <= 64).
        u = self._u.tolist()
        self._others_read = sum(u) - u[r]  # u[r] is ours alone: stable
        self._lag = _clock_lag(self._slots, r)
        if self.per_shard:
            buf = self._col_read
            np.add.reduce(self._su, axis=0, out=buf)
            np.subtract(buf, self._own_su, out=buf)

    def set_read(self, others, lag):
        """Record a read measured in compiled code (``kernels.step.python_begin``):
        others' updates summed and the clock lag at that moment. Whole-clock readers
        only (a per-shard reader must :meth:`read` its shard counters itself)."""
        if self.per_shard:
            raise InvalidArgument("set_read() on a per-shard reader; call read()")
        self._others_read = int(others)
        self._lag = int(lag)

    def others_read(self) -> int:
        """Others' updates summed at the last read (what :meth:`gap` subtracts)."""
        if self._others_read is None:
            raise InvalidArgument("no read yet; call reader.read() when the parameters "
                                  "are read")
        return self._others_read

    def gap(self, shards=None) -> int:
        """``tau`` now: updates applied by other workers since :meth:`read`.

        With ``shards`` (int64 shard ids the update touches; needs a per-shard reader):
        the largest per-shard count over those shards of updates by others that touched
        the shard (*choice*: max, not sum, so an update by another worker that touched
        several of them counts once; exact for one shard, never above the global gap).
        """
        if self._others_read is None:
            raise InvalidArgument("gap() before read(); call reader.read() when the "
                                  "parameters are read")
        if shards is None:
            u = self._u.tolist()
            return sum(u) - u[self.rank] - self._others_read
        if not self.per_shard:
            raise InvalidArgument("gap(shards) needs per-shard counters; build the reader "
                                  "with Reader(..., shards=True) and clocks with shards>1")
        _shard_ids(shards, self.clocks.shards)
        if shards.size == 0:
            return 0
        now = np.add.reduce(self._su.take(shards, axis=1), axis=0)  # (len(shards),)
        now -= self._own_su.take(shards)
        now -= self._col_read.take(shards)
        return int(now.max())

    @property
    def lag(self) -> int:
        """Clock lag recorded by the last :meth:`read`."""
        return self._lag

    def commit(self, step, gap=None, *, t_ns=None):
        """Record one event ``(rank, step, gap, lag, t_ns)`` in the log; returns
        ``(gap, lag)``. ``gap=None`` measures :meth:`gap` now; ``t_ns`` defaults to
        ``time.monotonic_ns()`` (the simulator passes its virtual time)."""
        if gap is None:
            gap = self.gap()
        elif self._others_read is None:
            raise InvalidArgument("commit() before read(); call reader.read() first")
        lag = self._lag
        log = self.log
        if log is not None:
            if gap < 0:
                raise InvalidArgument(f"gap={gap} must be >= 0 (it counts updates)")
            # the rank was checked when the reader was built: straight to the kernel
            _record_event(log.gap_hist, log.lag_hist, log.stats, log.events, self.rank,
                          step, gap, lag, time.monotonic_ns() if t_ns is None else t_ns, 1)
        return gap, lag

    def __repr__(self):
        return f"Reader(rank={self.rank}, per_shard={self.per_shard})"
