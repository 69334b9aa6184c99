"""``Run``: what a training run (live or simulated) leaves behind.

The live runtime and the simulator both return a ``Run``, so reports and plots
read one format. ``Run.summary()`` is the JSON written to ``summary.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass
class Run:
    config: dict
    workers: int
    updates: int
    wall_s: float
    initial_loss: float
    final_loss: float
    staleness: dict                      # {"update_gap": stats, "clock_lag": stats}
    per_worker: list                     # one dict per rank
    loss_curve: list = field(default_factory=list)   # [{"t": s, "updates": n, "loss": x}]
    params: Optional[dict] = None        # final parameter snapshot (not in the summary)
    out: Optional[str] = None            # results folder, if written
    simulated: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def updates_per_s(self) -> float:
        return self.updates / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        gap = self.staleness["update_gap"]
        out = {
            "config": self.config,
            "workers": self.workers,
            "updates": int(self.updates),
            "wall_s": round(self.wall_s, 4),
            "updates_per_s": round(self.updates_per_s, 1),
            "initial_loss": _num(self.initial_loss),
            "final_loss": _num(self.final_loss),
            # the same shape as Run.staleness: {"update_gap": {...}, "clock_lag": {...}}
            "staleness": {"update_gap": gap, "clock_lag": self.staleness["clock_lag"]},
            "wait_fraction": [w.get("wait_fraction", 0.0) for w in self.per_worker],
            "per_worker": self.per_worker,
            "loss_curve": self.loss_curve,
            "simulated": self.simulated,
        }
        out.update(self.extra)
        return out

    def checksum(self) -> str:
        """A short hash of the final parameters (for determinism checks)."""
        import hashlib
        h = hashlib.sha256()
        for name in sorted(self.params or {}):
            h.update(name.encode())
            h.update(np.ascontiguousarray(self.params[name]).tobytes())
        return h.hexdigest()[:16]


def _num(x):
    x = float(x)
    return x if np.isfinite(x) else None
