"""Replaying update races exactly: explicit schedules of non-atomic steps.

Hogwild! workers race: a vector read is not a snapshot, and a read-modify-write of a
row is not atomic, so an update can be lost. :func:`replay` runs an explicit schedule
of element-level steps (vector reads, non-atomic load/store pairs, atomic adds) on a
table, one at a time, and reports every lost update and every torn read; so a race
found by hypothesis (:mod:`hogkit.testing` generates the schedules) replays and
shrinks deterministically. :func:`interleave` builds a schedule from per-worker
programs and an order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import check_choice, check_int

__all__ = ["Step", "ReadRecord", "Replay", "replay", "interleave", "STEP_KINDS"]

STEP_KINDS = ("read", "load", "store", "add", "write")


class Step(NamedTuple):
    """One atomic step of a race schedule (see :func:`replay`).

    ``kind``: ``"read"`` (worker copies ``row`` into its current vector read),
    ``"load"`` (worker loads ``row`` into a private register: the first half of a
    non-atomic read-modify-write), ``"store"`` (worker writes ``register + value``
    back: the second half; the compute is private and folded into it), ``"add"``
    (an atomic ``row += value``, e.g. under a lock or with np.add.at semantics),
    ``"write"`` (worker writes ``value`` itself: a store of a value computed
    elsewhere, as :func:`hogkit.explore.explore` records a user's stores; after a
    ``load`` of the row by the same worker it overwrites, and counts as lost, the
    stores others made since, as ``store`` does).
    ``value``: the delta of a store/add, the value of a write (a scalar or a
    ``(width,)`` array).
    """

    kind: str
    rank: int
    row: int
    value: object = None


@dataclass(frozen=True)
class ReadRecord:
    """One vector read: the rows a worker read in consecutive ``read`` steps.

    ``versions[i]``: how many stores row ``rows[i]`` had seen when it was read;
    ``values``: what was read, ``(len(rows), width)``; ``positions``: schedule
    indices of the steps; ``torn``: True when no single instant had every row at the
    version read (the read is not a snapshot: some write fell between its steps).
    """

    rank: int
    rows: tuple
    versions: tuple
    values: np.ndarray
    positions: tuple
    torn: bool


@dataclass
class Replay:
    """What :func:`replay` returns: the final ``table``, every vector read, and the
    lost updates (``lost`` in total; ``lost_at``: ``(position, rank, row, n)`` for
    each store that overwrote ``n`` stores by others since its load)."""

    table: np.ndarray
    reads: list
    versions: np.ndarray
    lost: int
    lost_at: list

    @property
    def torn(self) -> int:
        """Number of torn vector reads."""
        return sum(r.torn for r in self.reads)


def _check_step(pos, step, n, width):
    if not isinstance(step, tuple) or len(step) not in (3, 4):
        raise InvalidType(f"schedule[{pos}]={step!r} must be a Step(kind, rank, row, "
                          f"value) from hogkit.engine.simulator")
    step = Step(*step)
    check_choice(f"schedule[{pos}].kind", step.kind, STEP_KINDS)
    check_int(f"schedule[{pos}].rank", step.rank, min_value=0)
    check_int(f"schedule[{pos}].row", step.row, min_value=0, max_value=n - 1,
              fix=f"the table has {n} rows")
    if step.kind in ("store", "add", "write"):
        if step.value is None:
            what = "the value to write" if step.kind == "write" else "the delta to add"
            raise InvalidArgument(f"schedule[{pos}]: a {step.kind} needs value= ({what}), "
                                  f"got None")
        v = np.asarray(step.value, dtype=np.float64)
        if v.ndim > 1 or (v.ndim == 1 and v.shape[0] != width):
            raise InvalidArgument(f"schedule[{pos}].value has shape {v.shape}; expected a "
                                  f"scalar or ({width},) for a table of width {width}")
    return step


def replay(schedule, initial, *, atomic=False) -> Replay:
    """Run a race ``schedule`` (a sequence of :class:`Step`) on a copy of ``initial``.

    ``initial``: a 1-D ``(n,)`` or 2-D ``(n, width)`` float array (a row is the unit
    of a step; use width 1 for element granularity). Steps run one at a time in
    order, each atomically (aligned element reads never tear); everything that makes
    Hogwild! racy is explicit in the schedule:

    - a **vector read** is a worker's consecutive ``read`` steps (ended by any other
      step of that worker); other workers' writes may fall between them, and the
      record says which version of each row it saw and whether it is **torn**;
    - a **non-atomic update** is ``load`` then ``store`` by one worker; a store
      writes ``register + value``, silently overwriting any store to that row by
      another worker since its load: a **lost update**, counted in ``lost``.
      ``atomic=True`` replays each store as an atomic add at its position instead
      (the reference without lost updates). A store with no load before it raises.

    Deterministic and pure: ``initial`` is not modified.
    """
    init = np.asarray(initial)
    if init.ndim not in (1, 2) or init.dtype not in (np.float32, np.float64):
        raise InvalidArgument(f"initial must be a 1-D or 2-D float32/float64 array, got "
                              f"shape {init.shape} dtype {init.dtype}")
    flat = init.ndim == 1
    table = init.reshape(init.shape[0], -1).astype(init.dtype, copy=True)
    n, width = table.shape
    steps = [_check_step(p, s, n, width) for p, s in enumerate(schedule)]
    version = np.zeros(n, np.int64)
    starts = [[-1] for _ in range(n)]    # position at which each version began
    registers = {}                        # (worker, row) -> (values, version at load)
    open_reads = {}                       # worker -> list of (row, version, values, pos)
    done_reads = []
    lost, lost_at = 0, []

    def close(w):
        items = open_reads.pop(w, None)
        if items:
            done_reads.append((w, items))

    for pos, (kind, w, r, value) in enumerate(steps):
        if kind != "read":
            close(w)
        if kind == "read":
            open_reads.setdefault(w, []).append((r, int(version[r]), table[r].copy(), pos))
        elif kind == "load":
            registers[(w, r)] = (table[r].copy(), int(version[r]))
        elif kind == "write":
            reg = registers.pop((w, r), None)
            if reg is not None and int(version[r]) - reg[1]:
                lost += int(version[r]) - reg[1]
                lost_at.append((pos, w, r, int(version[r]) - reg[1]))
            table[r] = np.asarray(value, dtype=table.dtype)
            version[r] += 1
            starts[r].append(pos)
        elif kind == "store" and not atomic:
            if (w, r) not in registers:
                raise InvalidArgument(
                    f"schedule[{pos}]: worker {w} stores row {r} without a load before it; "
                    f"put Step('load', {w}, {r}) earlier, or use kind='add' for an atomic "
                    f"update")
            reg, v0 = registers.pop((w, r))
            clobbered = int(version[r]) - v0
            if clobbered:
                lost += clobbered
                lost_at.append((pos, w, r, clobbered))
            table[r] = reg + np.asarray(value, dtype=table.dtype)
            version[r] += 1
            starts[r].append(pos)
        else:  # add, or store with atomic=True
            if kind == "store":
                registers.pop((w, r), None)
            table[r] += np.asarray(value, dtype=table.dtype)
            version[r] += 1
            starts[r].append(pos)
    for w in list(open_reads):
        close(w)
    reads = sorted((_read_record(w, items, starts, flat) for w, items in done_reads),
                   key=lambda rec: rec.positions[0])
    return Replay(table=table.reshape(init.shape), reads=reads, versions=version,
                  lost=lost, lost_at=lost_at)


def _read_record(w, items, starts, flat):
    """One vector read's record: torn when no instant had every row at the version
    read (the versions' lifetimes ``[start, next start)`` do not overlap)."""
    lo, hi = -2, math.inf
    for r, v, _, _ in items:
        s = starts[r][v]
        e = starts[r][v + 1] if v + 1 < len(starts[r]) else math.inf
        lo, hi = max(lo, s), min(hi, e)
    vals = np.stack([it[2] for it in items])
    return ReadRecord(rank=w, rows=tuple(it[0] for it in items),
                      versions=tuple(it[1] for it in items),
                      values=vals[:, 0] if flat else vals,
                      positions=tuple(it[3] for it in items), torn=not lo < hi)


def interleave(programs, order):
    """Merge per-worker programs into one schedule: ``order`` lists worker ids, each
    occurrence taking that worker's next step. ``programs[w]`` is a list of
    :class:`Step` of worker w (their ``rank`` field is set to w). ``order`` must use
    every step exactly once."""
    progs = [list(p) for p in programs]
    need = [len(p) for p in progs]
    used = [0] * len(progs)
    out = []
    for pos, w in enumerate(order):
        w = check_int(f"order[{pos}]", w, min_value=0, max_value=len(progs) - 1)
        if used[w] >= need[w]:
            raise InvalidArgument(f"order[{pos}]={w}: worker {w} has only {need[w]} steps; "
                                  f"order must name each worker once per step")
        out.append(Step(*progs[w][used[w]])._replace(rank=w))
        used[w] += 1
    if used != need:
        raise InvalidArgument(f"order uses {used} steps per worker but the programs have "
                              f"{need}; name each worker once per step")
    return out
