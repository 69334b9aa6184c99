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


#: a run that skipped more than this share of its steps (samples, on the per-sample lane)
#: for non-finite gradients says so when it ends (``nonfinite="skip"``)
SKIP_NOTICE_SHARE = 0.01


def note_skipped(run, per_sample: bool = False) -> None:
    """Put the share that ``nonfinite="skip"`` dropped in
    ``run.extra["nonfinite_skipped_share"]``: of the run's steps (its workers'
    iterations), or of its samples on the per-sample lane (which skips samples), and
    warn (:class:`RunNotice`) when it is over :data:`SKIP_NOTICE_SHARE`: a run that
    drops a large part of its updates has not trained what its counts say."""
    unit = "samples" if per_sample else "steps"
    total = (int(run.extra.get("samples", 0)) if per_sample
             else sum(int(w.get("iterations", 0)) for w in run.per_worker))
    skipped = int(run.extra.get("nonfinite_skipped", 0))
    share = skipped / total if total > 0 else 0.0
    run.extra["nonfinite_skipped_share"] = round(share, 6)
    if share > SKIP_NOTICE_SHARE:
        import warnings

        from hogkit.errors import RunNotice
        loss = "NaN" if not np.isfinite(run.final_loss) else f"{run.final_loss:.4g}"
        warnings.warn(f"hogkit: nonfinite='skip' dropped {skipped} of {total} {unit} "
                      f"({100 * share:.1f} %), final loss {loss}: lower the learning "
                      f"rate, or clean the data (hogkit checks it for NaN/inf before "
                      f"a run)", RunNotice, stacklevel=3)


def _num(x):
    x = float(x)
    return x if np.isfinite(x) else None
