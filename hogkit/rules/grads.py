"""``Grad``: one parameter's gradient, as computed and before it is applied.

Computing an update and applying it are separate steps (DESIGN "compute, then
apply"): a workload returns a list of ``Grad``; the density filter may thin it; a
rule applies it to the shared parameters. The live runtime applies at once, the
simulator holds grads and applies them later through the same rule.

A ``Grad`` is either

- **dense**: ``rows is None`` and ``values.shape == param.shape``; or
- **sparse rows**: ``rows`` is a 1-D int64 array of row indices into the
  parameter's first axis (duplicates allowed: their contributions add up, as with
  ``np.add.at``) and ``values.shape == (len(rows),) + param.shape[1:]``.

``read`` optionally holds the parameter values the gradient was computed from
(same shape as ``values``): the ``w_bak`` of DC-ASGD and the ``w_read`` of
Gap-Aware. Workloads that read rows directly (matrix factorisation) fill it cheaply;
rules that need it and do not get it raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass
class Grad:
    name: str
    values: np.ndarray
    rows: Optional[np.ndarray] = None
    read: Optional[np.ndarray] = None

    @property
    def sparse(self) -> bool:
        return self.rows is not None

    def __repr__(self):
        kind = f"rows={len(self.rows)}" if self.rows is not None else "dense"
        return f"Grad({self.name!r}, {kind}, values{self.values.shape} {self.values.dtype})"
