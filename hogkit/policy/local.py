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
from hogkit.validation import check_int

__all__ = ["LocalSGD"]


class LocalSGD(Policy):
    """Local SGD with h local steps between merges (HLSGD, Zhou et al. 2020).

    Each worker takes ``h`` steps on a private replica starting from ``base`` (the shared
    values it pulled), then merges its change ``Δ = replica − base`` into the shared
    model as ``shared += Δ / W`` (:mod:`hogkit.policy.local_sgd`): when all W workers merge
    deltas from the same base, the shared model becomes ``base + mean_w Δ_w``, the
    model average of local SGD. With ``overlap=True`` the merge of round k runs while
    round k+1's local phase goes on (the worker commits its replica, keeps stepping, and
    merges the committed delta); the runtime owns those mechanics.

    Waiting: merges are lock-free adds, so no barrier is needed for correctness;
    ``wait`` behaves as :func:`Async` (``bound`` is ∞). hogkit departs from synchronous
    local SGD here (it averages at a barrier every h steps): merges arrive asynchronously,
    each at most h local steps old, which is the overlap the HLSGD paper aims for.
    """

    __slots__ = ("h", "overlap")
    _key = ("h", "overlap")
    spell = "local"
    spell_args = ("h",)
    cluster_bound = math.inf        # nodes merge as their workers do: no gate bound

    def __init__(self, h, overlap=False):
        self.h = check_int("local steps h", h, min_value=1,
                           fix="use h=1 to merge after every step")
        if not isinstance(overlap, bool):
            raise InvalidType(f"overlap={overlap!r} must be a bool")
        self.overlap = overlap

    @property
    def local_steps(self):
        """h: steps on the private replica between merges."""
        return self.h

    @classmethod
    def spell_forms(cls):
        return ("local:H", "local:H:overlap")

    @classmethod
    def from_fields(cls, text, fields):
        if len(fields) not in (1, 2):
            raise InvalidArgument(f"policy {text!r} has {len(fields)} argument(s); "
                                  f"expected {spellings()}")
        if len(fields) == 2 and fields[1] != "overlap":
            raise InvalidArgument(f"policy {text!r}: third field must be 'overlap'; "
                                  f"expected {spellings()}")
        return cls(spelled_int(text, fields[0], "h"), overlap=len(fields) == 2)

    def encode(self) -> np.ndarray:
        return self.row(_kc.K_SSP, -1)

    def simulable(self):
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
        return {"name": "local", "h": self.h, "overlap": self.overlap}

    def __repr__(self):
        return f"LocalSGD({self.h}{', overlap=True' if self.overlap else ''})"
