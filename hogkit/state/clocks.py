"""Per-worker counters in shared memory: the clocks staleness and policies are read from.

:class:`Clocks` is a thin shell over int64 views of a :class:`~hogkit.state.store.ParamStore`
built from :meth:`Clocks.specs` (names start with ``clk_``)::

    store = ParamStore.create({**params, **Clocks.specs(workers, shards)})
    clocks = Clocks(store.views())           # in the parent and, after attach, in workers

Layout (``hogkit.kernels.clock``): one 64-byte row of 8 int64 slots per worker (updates,
iterations, heartbeat, state, latest iteration time, current step), so a worker's writes
never invalidate a peer's cache line; per-shard counters padded to whole lines per
worker too. ``updates``, ``iterations``... are strided views of that matrix, and the
definitions read from it (clock lag, others' updates, SSP admission, DSSP's grant) are
the kernels of ``hogkit.kernels.clock``, shared with the compiled step core and the
simulator.

Every slot has exactly one writer (worker ``w`` writes row ``w``; the parent writes
``stop`` and may mark a dead worker FAILED), so no atomics and no locks are needed (numba
has no CPU atomics; a cross-process lock held by a killed worker would deadlock all).

What is racy: a read of one aligned int64 slot never tears (it is the old or the new
value). A read of a whole vector (``updates.sum()``, ``iterations.min()``) is *not* a
snapshot; because every slot only grows, such a sum lies between the true sums at the
start and at the end of the read. Writes by another process become visible without a
fence on x86-64 (TSO); on weaker memory models they become visible "soon".
"""

from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.kernels import clock as _k
from hogkit.validation import check_int, check_indices

__all__ = ["Clocks", "IDLE", "RUNNING", "DONE", "FAILED", "STATES"]

IDLE, RUNNING, DONE, FAILED = _k.IDLE, _k.RUNNING, _k.DONE, _k.FAILED
STATES = {IDLE: "IDLE", RUNNING: "RUNNING", DONE: "DONE", FAILED: "FAILED"}

_I64 = np.dtype(np.int64)
_UNSIGNED = {np.dtype(np.int64): np.dtype(np.uint64), np.dtype(np.int32): np.dtype(np.uint32)}
_LINE = 8                      # int64 per 64-byte cache line


def _shard_ids(shards, n):
    """Check shard ids are int32/int64, 1-D, in [0, n); returns them.

    Fast path for the hot loop: one reduction over an unsigned view (a negative id turns
    into a huge unsigned one), about 1 us; anything else goes to ``check_indices`` for
    the full message.
    """
    if shards.__class__ is np.ndarray and shards.ndim == 1:
        u = _UNSIGNED.get(shards.dtype)
        if u is not None and (shards.size == 0 or shards.view(u).max() < n):
            return shards
    check_indices("shards", shards, n)
    return shards


class Clocks:
    """Single-writer int64 counters per worker (see the module docstring).

    Fields (views into shared memory; all but ``slots`` and ``stop`` are strided views
    of ``slots``):

    ``slots`` (W, 8)      the whole per-worker rows (``hogkit.kernels.clock`` layout)
    ``updates`` (W,)      updates applied by worker w
    ``iterations`` (W,)   iterations finished by worker w (the SSP clock c_w)
    ``heartbeat_ns`` (W,) ``time.monotonic_ns()`` of w's last :meth:`beat` (CLOCK_MONOTONIC
                          is system-wide on Linux, so comparable across processes)
    ``state`` (W,)        IDLE=0 RUNNING=1 DONE=2 FAILED=3
    ``interval_ns`` (W,)  how long w's latest iteration took (DSSP's timing)
    ``step`` (W,)         the step w is running now
    ``shard_updates`` (W, S)  updates by w that touched shard s
    ``stop`` (1,)         1 once the parent asked every worker to stop
    """

    IDLE, RUNNING, DONE, FAILED = IDLE, RUNNING, DONE, FAILED

    @staticmethod
    def specs(workers, shards=1) -> dict:
        """``{name: (shape, dtype)}`` to pass to ``ParamStore.create`` (zero-filled)."""
        W = check_int("workers", workers, min_value=1, fix="use workers=1 or more")
        S = check_int("shards", shards, min_value=1, fix="use shards=1 for no sharding")
        return {
            "clk_slots": ((W, _k.SLOT), _I64),
            "clk_shard_updates": ((W, S), _I64),
            "clk_stop": ((_LINE,), _I64),     # [0]: the flag; a line of its own
        }

    def __init__(self, views: Mapping[str, np.ndarray]):
        if not isinstance(views, Mapping):
            raise InvalidType(f"views must be a mapping name -> ndarray (store.views()), "
                              f"got {type(views).__name__}")
        need = ("clk_slots", "clk_shard_updates", "clk_stop")
        missing = [n for n in need if n not in views]
        if missing:
            raise InvalidArgument(f"views lack {missing}; create the store with "
                                  f"Clocks.specs(workers, shards)")
        for n in need:
            a = views[n]
            if not isinstance(a, np.ndarray) or a.dtype != _I64:
                raise InvalidType(f"{n} must be an int64 ndarray, got "
                                  f"{getattr(a, 'dtype', type(a).__name__)}")
        slots, su, stop = (views[n] for n in need)
        if slots.ndim != 2 or slots.shape[1] != _k.SLOT or slots.shape[0] < 1:
            raise InvalidArgument(f"clk_slots has shape {slots.shape}, expected "
                                  f"(workers>=1, {_k.SLOT})")
        W = slots.shape[0]
        if stop.shape != (_LINE,):
            raise InvalidArgument(f"clk_stop has shape {stop.shape}, expected ({_LINE},)")
        if su.ndim != 2 or su.shape[0] != W or su.shape[1] < 1:
            raise InvalidArgument(f"clk_shard_updates has shape {su.shape}, expected "
                                  f"({W}, shards>=1)")
        self.workers = W
        self.shards = su.shape[1]
        self.slots = slots
        self.updates = slots[:, _k.UPD]
        self.iterations = slots[:, _k.ITER]
        self.heartbeat_ns = slots[:, _k.BEAT]
        self.state = slots[:, _k.STATE]
        self.interval_ns = slots[:, _k.INTERVAL]
        self.step = slots[:, _k.STEP]
        self.shard_updates = su
        self.stop = stop[:1]

    def _rank(self, rank):
        # Cheap check: a negative rank would wrap around to another worker's slot and
        # break the single-writer rule.
        if rank.__class__ is not int:
            rank = check_int("rank", rank)
        if not 0 <= rank < self.workers:
            raise InvalidArgument(f"rank={rank} must be in [0, {self.workers})")
        return rank

    # ---------------------------------------------------------------- writers (hot path)

    def tick_update(self, rank, shards=None, *, count=1):
        """Count one applied update by ``rank`` (``count``: that many at once, a
        replica's merge of its phase's steps; dense, every shard).

        ``shards``: int64/int32 array of the shard ids the update touched; each distinct
        shard is counted once per update (duplicates collapse). ``None`` means a dense
        update, which touches every shard.
        """
        rank = self._rank(rank)
        if shards is not None:
            _shard_ids(shards, self.shards)
            if count != 1:
                raise ValueError("tick_update: count != 1 is for dense updates (shards=None)")
        self.updates[rank] += count
        if shards is None:
            if self.shards == 1:
                self.shard_updates[rank, 0] += count
            else:
                self.shard_updates[rank] += count
        else:
            row = self.shard_updates[rank]
            # Buffered fancy increment: a[idx] = a[idx] + 1, so a shard id repeated in
            # ``shards`` is counted once. Only this worker writes this row.
            row[shards] += 1

    def tick_iteration(self, rank, *, beat=False):
        """Count one finished iteration of ``rank`` (its SSP clock). ``beat=True`` also
        records the finish time as the heartbeat and the time since the previous beat
        as the latest iteration time (``hogkit.kernels.clock.finish_iteration``)."""
        rank = self._rank(rank)
        _k.finish_iteration(self.slots, rank, time.monotonic_ns() if beat else 0)

    def beat(self, rank):
        """Record ``time.monotonic_ns()`` as ``rank``'s heartbeat."""
        rank = self._rank(rank)
        self.heartbeat_ns[rank] = time.monotonic_ns()

    def set_state(self, rank, s):
        """Set ``rank``'s state (IDLE, RUNNING, DONE, FAILED). Writer: the worker; the
        parent may mark a dead worker FAILED (the worker no longer writes)."""
        rank = self._rank(rank)
        if s not in STATES:
            raise InvalidArgument(f"state {s!r} is not one of {STATES}")
        self.state[rank] = s

    def request_stop(self):
        """Parent: ask every worker to stop (workers poll :meth:`stopping`)."""
        self.stop[0] = 1

    def stopping(self) -> bool:
        """True once the parent called :meth:`request_stop`."""
        return bool(self.stop[0])

    # ---------------------------------------------------------------- readers

    def total_updates(self) -> int:
        """Sum of every worker's updates (racy sum, see the module docstring)."""
        return int(self.updates.sum())

    def min_iteration(self) -> int:
        """Slowest worker's iteration count (racy, see the module docstring)."""
        return int(self.iterations.min())

    def lag(self, rank) -> int:
        """``rank``'s clock lag: its iterations minus the fewest of any worker that is
        not DONE (``hogkit.kernels.clock.clock_lag``, the one definition)."""
        return int(_k.clock_lag(self.slots, self._rank(rank)))

    def __repr__(self):
        return (f"Clocks(workers={self.workers}, shards={self.shards}, "
                f"updates={self.updates.tolist()}, iterations={self.iterations.tolist()})")
