"""Periodic checkpoints of a live run, and resuming from one.

**What a checkpoint holds.** ``<out>/checkpoint.npz`` (the format of
:mod:`hogkit.state.checkpoint`: tmp → fsync → ``os.replace``): the parameters, plus in its
``meta`` the run's state so far (:class:`RunState`): training seconds, every worker's
iterations, updates, samples, skips and hold-backs, the loss curve, the staleness
histograms and exact sums/maxima, the config, and how it was taken. A periodic
checkpoint is **fuzzy** (copied while the workers write, labelled with the version
vector of updates it reflects at most); the one at the end is **quiesced**.

**Resuming** (:func:`hogkit.train` ``(resume=DIR)``, ``hogkit run --resume DIR``) starts a
new *segment* of the same run: the same data (built from the same seed), the
checkpoint's parameters, the remaining budget (steps not yet done, seconds not yet
spent), each worker's own state from ``worker_state.npz`` (:mod:`hogkit.state.worker_state`:
rule state such as momentum, density residuals, its random stream and sampler cursor;
density's step index goes on from the worker's earlier iterations), the histograms
carried over, and a summary, loss curve and ``events.jsonl`` (appended) that cover the
whole run. From the quiesced checkpoint at the end of a run this is exact: one worker
resumed computes what one uninterrupted run does. What a fuzzy checkpoint cannot
carry: updates made after it was taken are lost (at most ``checkpoint_every`` seconds
of work), and the worker state is copied while the workers write, like the
parameters. A checkpoint without a matching ``worker_state.npz`` (an older run)
resumes with fresh worker state and fresh streams (the segment number is mixed into
the workers' seeds, so no minibatch sequence is replayed).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np

from hogkit.state.checkpoint import read
from hogkit.errors import InvalidArgument
from hogkit.kernels import staleness as _ks

__all__ = ["RunState", "CHECKPOINT", "load_state", "check_compatible", "remaining",
           "pack_hist", "unpack_hist"]

CHECKPOINT = "checkpoint.npz"
#: the columns of the staleness stats carried across segments (sums, maxima, counts;
#: not the event rings' cursors)
CARRIED_STATS = (_ks.GAP_SUM, _ks.GAP_MAX, _ks.LAG_SUM, _ks.LAG_MAX, _ks.COUNT)


@dataclass
class RunState:
    """Everything a run has done so far, as saved in a checkpoint's meta."""
    segment: int = 0
    t: float = 0.0
    iterations: list = field(default_factory=list)
    updates: list = field(default_factory=list)
    samples: list = field(default_factory=list)
    nonfinite: list = field(default_factory=list)
    held: list = field(default_factory=list)
    curve: list = field(default_factory=list)
    gap_hist: list = field(default_factory=list)      # per worker: [[bin, count], ...]
    lag_hist: list = field(default_factory=list)
    stats: list = field(default_factory=list)         # per worker: CARRIED_STATS values
    events_dropped: int = 0

    def to_meta(self) -> dict:
        return asdict(self)

    @classmethod
    def from_meta(cls, meta) -> "RunState":
        keys = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in meta.get("state", {}).items() if k in keys})

    @property
    def total_iterations(self) -> int:
        return int(sum(self.iterations))


def pack_hist(hist: np.ndarray) -> list:
    """A (workers, bins) histogram as per-worker ``[[bin, count], ...]`` (nonzero),
    from one copy (the workers may be writing the live one)."""
    snap = np.array(hist, copy=True)
    return [[[int(b), int(row[b])] for b in np.flatnonzero(row)] for row in snap]


def unpack_hist(packed, out: np.ndarray) -> None:
    """Add a packed histogram into ``out`` (workers, bins)."""
    for w, row in enumerate(packed):
        for b, c in row:
            out[w, b] += c


def load_state(folder):
    """``(arrays, RunState, meta)`` of ``folder``'s checkpoint."""
    folder = os.fspath(folder)
    path = os.path.join(folder, CHECKPOINT)
    if not os.path.isdir(folder):
        raise InvalidArgument(f"resume={folder!r} is not a folder; give the results "
                              f"folder of the run to resume (runs/<timestamp>)")
    if not os.path.exists(path):
        raise InvalidArgument(f"{folder!r} has no {CHECKPOINT}: the run ended before its "
                              f"first checkpoint, or it was started with "
                              f"checkpoint_every=None; start it again instead")
    arrays, meta = read(path)
    if "state" not in meta:
        raise InvalidArgument(f"{path!r} has no run state (it was not written by "
                              f"hogkit.train); it cannot be resumed")
    return arrays, RunState.from_meta(meta), meta


def check_compatible(meta, config) -> None:
    """Refuse a resume whose run differs in what the saved state depends on."""
    old = meta.get("config", {})
    for key in ("workload", "workload_config", "workers", "shards"):
        if old.get(key) != config.get(key):
            raise InvalidArgument(
                f"cannot resume: {key} was {old.get(key)!r}, now {config.get(key)!r}; "
                f"resume with the same workload, options, workers and shards (the "
                f"policy, rule and budget may change)")


def remaining(steps, seconds, state: RunState):
    """The budget left: ``(steps, seconds)``; raises when nothing is left."""
    left_steps = None if steps is None else steps - state.total_iterations
    left_seconds = None if seconds is None else seconds - state.t
    done = ((left_steps is not None and left_steps <= 0)
            or (left_seconds is not None and left_seconds <= 0))
    if done:
        raise InvalidArgument(
            f"nothing left to run: {state.total_iterations} iterations in "
            f"{state.t:.1f} s already meet the budget (steps={steps}, seconds={seconds}); "
            f"give a larger budget to go on")
    return left_steps, left_seconds
