"""Local SGD as a consistency policy (HLSGD, Zhou et al. 2020): *when* to merge.

:mod:`hogkit.policy.local_sgd` holds *what* a merge writes (the arithmetic); the live
worker loop and the simulator run the replica's lifecycle. Admission never waits: the
policy encodes as ``SSP(-1)`` (Async) for ``hogkit.kernels.clock.admit``; what differs
is declared on the contract: ``local_steps`` (h) and ``overlap``.
"""

from __future__ import annotations

import math

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.kernels import clock as _kc
from hogkit.policy.base import Policy, spellings, spelled_int
from hogkit.validation import check_float, check_int

__all__ = ["LocalSGD", "MERGES"]

#: how a merge adds a worker's change: averaged over the W workers, or whole
MERGES = ("average", "sum")


class LocalSGD(Policy):
    """Local SGD with h local steps between merges (HLSGD, Zhou et al. 2020).

    Each worker takes ``h`` steps on a private replica starting from ``base`` (the shared
    values it pulled), then merges its change ``Δ = replica − base`` into the shared
    model as ``shared += Δ / W`` (:mod:`hogkit.policy.local_sgd`): when all W workers merge
    deltas from the same base, the shared model becomes ``base + mean_w Δ_w``, the
    model average of local SGD. With ``overlap=True`` the merge of round k runs while
    round k+1's local phase goes on (the worker commits its replica, keeps stepping, and
    merges the committed delta); the runtime owns those mechanics.

    ``merge="sum"`` adds each worker's change whole, ``shared += Δ``: every sample's
    update reaches the shared model at full weight, as under Hogwild!, written in bulk
    every h steps instead of element by element as it is made (per-worker replicas,
    DimmWitted's PerCore replication: between merges no two workers write one cache
    line; issue 26, ``benchmarks/dense.py``). The average keeps local SGD's step size
    whatever W is; the sum is W times the average, so its stable lr is Hogwild!'s.

    ``cost=c`` makes each merge take ``c`` times the wall time of the local phase it
    merges (live runs only: a paced round trip, the communication HLSGD's overlap is
    meant to hide; on shared memory a merge is a memory add and has nothing to hide).
    Without overlap the worker waits it out; with overlap the merge thread does, and the
    worker waits only where the next phase ends first (at its next merge point).

    Waiting: merges are lock-free adds, so no barrier is needed for correctness;
    ``wait`` behaves as :func:`Async` (``bound`` is ∞). hogkit departs from synchronous
    local SGD here (it averages at a barrier every h steps): merges arrive asynchronously,
    each at most h local steps old, which is the overlap the HLSGD paper aims for.
    """

    __slots__ = ("h", "overlap", "merge", "cost")
    _key = ("h", "overlap", "merge", "cost")
    spell = "local"
    spell_args = ("h",)
    cluster_bound = math.inf        # nodes merge as their workers do: no gate bound

    def __init__(self, h, overlap=False, merge="average", cost=0.0):
        self.h = check_int("local steps h", h, min_value=1,
                           fix="use h=1 to merge after every step")
        if not isinstance(overlap, bool):
            raise InvalidType(f"overlap={overlap!r} must be a bool")
        self.overlap = overlap
        if merge not in MERGES:
            raise InvalidArgument(f"merge={merge!r}: expected one of {MERGES} (average: "
                                  f"shared += delta / W, local SGD; sum: shared += delta, "
                                  f"Hogwild!'s full-weight updates written every h steps)")
        self.merge = merge
        self.cost = check_float("merge cost", cost, min_value=0.0,
                                fix="a multiple of the local phase's wall time; 0 for none")

    def merge_divisor(self, workers: int) -> int:
        """What a merge divides a worker's change by: W (average) or 1 (sum)."""
        return workers if self.merge == "average" else 1

    @property
    def local_steps(self):
        """h: steps on the private replica between merges."""
        return self.h

    @classmethod
    def spell_forms(cls):
        return ("local:H", "local:H:overlap", "local:H:sum", "local:H:overlap:sum",
                "local:H[:overlap][:sum]:costC")

    @classmethod
    def from_fields(cls, text, fields):
        flags = fields[1:]
        costs = [f for f in flags if f.startswith("cost")]
        flags = [f for f in flags if not f.startswith("cost")]
        if not fields or len(flags) > 2 or len(set(flags)) != len(flags) or any(
                f not in ("overlap", "sum") for f in flags) or len(costs) > 1:
            raise InvalidArgument(f"policy {text!r}: after H come at most 'overlap', "
                                  f"'sum' and 'costC', each once; expected {spellings()}")
        cost = 0.0
        if costs:
            try:
                cost = float(costs[0][4:])
            except ValueError:
                raise InvalidArgument(f"policy {text!r}: {costs[0]!r} is not cost "
                                      f"followed by a number (e.g. cost4: a merge takes "
                                      f"4x its phase's time)") from None
        return cls(spelled_int(text, fields[0], "h"), overlap="overlap" in flags,
                   merge="sum" if "sum" in flags else "average", cost=cost)

    def encode(self) -> np.ndarray:
        return self.row(_kc.K_SSP, -1)

    def simulable(self):
        if self.cost:
            return (f"{self!r}: a merge's cost is paced on live runs; the simulator's "
                    f"merges take no time (use cost=0)")
        if self.overlap:
            return (f"{self!r}: the simulator does not model overlapped merges; use "
                    f"LocalSGD({self.h}) (overlap=False)")
        return None

    def may_proceed(self, iterations, state, rank) -> bool:
        return True

    def merges_after(self, step) -> bool:
        """True when iteration ``step`` (0-based) ends a local phase: ``(step+1) % h == 0``."""
        return (step + 1) % self.h == 0

    def config(self) -> dict:
        return {"name": "local", "h": self.h, "overlap": self.overlap, "merge": self.merge,
                **({"cost": self.cost} if self.cost else {})}

    def __repr__(self):
        return (f"LocalSGD({self.h}{', overlap=True' if self.overlap else ''}"
                f"{', merge=' + repr(self.merge) if self.merge != 'average' else ''}"
                f"{f', cost={self.cost:g}' if self.cost else ''})")
