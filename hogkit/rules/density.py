"""Update density: send only a fraction of each update, drop or keep the rest.

The stale-value-tolerance studies of asynchronous training (e.g. on RNNs) apply only
a fraction d of each update and ask how much staleness the model then tolerates.
:class:`Density` is that filter, between the gradient and the rule::

    grads = density.filter(grads, dstate, step=step)      # then rule.apply(...)

Spatial density keeps, of the ``n`` entries of one gradient (all rows of a sparse
gradient counted together):

- ``how="topk"``: the ``k = ceil(d·n)`` entries of largest magnitude (ties: lowest
  position first);
- ``how="random"``: ``k = ceil(d·n)`` entries drawn uniformly without replacement
  from ``(seed, step, position in grads)``, the same with or without JIT;
- ``how="threshold"``: the entries with ``|x| > threshold`` (``fraction`` must be 1).

Temporal density (``every=k``): only every k-th step (``step % k == 0``) sends
anything; other steps return ``[]``.

The unsent part is dropped (``residual=False``) or accumulated into a residual that
is added to the next update of the same entries (``residual=True``; Seide et al.'s
error feedback). It is a flag because it changes the result. In residual mode mass
is conserved exactly: ``sent + residual_after == gradient + residual_before``,
entry by entry for dense gradients (summed per row for duplicated sparse rows). For
sparse rows the residual of a row is folded in the next time that row is in a batch.

State: ``{"r/<name>": zeros like the parameter}`` in residual mode, else ``{}``; per
worker and private (the residual is what *this* worker has not sent yet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.rules.grads import Grad
from hogkit.kernels import density as _k
from hogkit.validation import (FLOAT_DTYPES, INDEX_DTYPES, check_array, check_choice,
                               check_float, check_grads, check_indices, check_int)

__all__ = ["Density"]

HOWS = ("topk", "threshold", "random")
_INT64 = np.dtype(np.int64)


@dataclass(frozen=True)
class Density:
    """Keep a fraction of each update; see the module docstring for the semantics.

    ``Density(fraction, how="topk"|"threshold"|"random", residual=True,
    threshold=None, seed=0, every=1)``.
    """

    fraction: float
    how: str = "topk"
    residual: bool = True
    threshold: Optional[float] = None
    seed: int = 0
    every: int = 1

    def __post_init__(self):
        fraction = check_float("fraction", self.fraction, min_value=0.0, max_value=1.0,
                               exclude_min=True,
                               fix="use 0 < fraction <= 1 (1.0 sends everything)")
        object.__setattr__(self, "fraction", fraction)
        check_choice("how", self.how, HOWS)
        if not isinstance(self.residual, (bool, np.bool_)):
            raise InvalidType(f"residual={self.residual!r} must be a bool")
        object.__setattr__(self, "residual", bool(self.residual))
        if self.how == "threshold":
            if self.threshold is None:
                raise InvalidArgument("how='threshold' needs threshold=<float >= 0>; "
                                      "e.g. Density(1.0, how='threshold', threshold=1e-3)")
            object.__setattr__(self, "threshold", check_float(
                "threshold", self.threshold, min_value=0.0))
            if fraction != 1.0:
                raise InvalidArgument(
                    f"fraction={fraction} is not used with how='threshold' (the "
                    f"threshold decides); pass fraction=1.0")
        elif self.threshold is not None:
            raise InvalidArgument(f"threshold={self.threshold!r} is only used with "
                                  f"how='threshold', not how={self.how!r}; drop it")
        object.__setattr__(self, "seed", check_int("seed", self.seed, min_value=0))
        object.__setattr__(self, "every", check_int(
            "every", self.every, min_value=1, fix="every=1 sends at every step"))

    def init(self, params: Mapping[str, np.ndarray]) -> dict:
        if not self.residual:
            return {}
        return {f"r/{k}": np.zeros_like(v) for k, v in params.items()}

    # --- validation ---------------------------------------------------------------
    def _check(self, grads, state):
        out = []
        for grad in check_grads(grads):
            name, values, rows = grad.name, grad.values, grad.rows
            vname = f"Grad {name!r} values"
            check_array(vname, values, dtype=FLOAT_DTYPES, min_ndim=1)
            r = None
            if self.residual:
                key = f"r/{name}"
                if not isinstance(state, Mapping) or key not in state:
                    raise InvalidArgument(f"state has no {key!r}; build it with "
                                          f"density.init(params)")
                r = check_array(f"state[{key!r}]", state[key], dtype=values.dtype,
                                min_ndim=1, writeable=True)
            if rows is None:
                if r is not None:
                    check_array(vname, values, shape=r.shape)
            else:
                if r is not None:
                    check_indices(f"Grad {name!r} rows", rows, r.shape[0])
                    want = (rows.shape[0],) + r.shape[1:]
                else:
                    check_array(f"Grad {name!r} rows", rows, dtype=INDEX_DTYPES, ndim=1)
                    want = (rows.shape[0],) + values.shape[1:]
                check_array(vname, values, shape=want)
            out.append((grad, r))
        return out

    # --- the encoding the kernels take -----------------------------------------------
    @property
    def code(self) -> int:
        """``hogkit.kernels.density`` mode: NONE when everything is sent and nothing is
        held (fraction 1, no threshold, no residual), else TOPK, THRESHOLD or RANDOM."""
        if self.fraction == 1.0 and self.how != "threshold" and not self.residual:
            return _k.NONE
        return {"topk": _k.TOPK, "threshold": _k.THRESHOLD, "random": _k.RANDOM}[self.how]

    # --- the filter ---------------------------------------------------------------
    def filter(self, grads: Sequence[Grad], state, *, step: int) -> list:
        """Return the part of ``grads`` to send (new ``Grad`` objects; the inputs are
        not modified). In residual mode ``state`` absorbs the rest. Sparse rows go
        through ``hogkit.kernels.density.filter_rows``, the function the compiled step
        core calls, so both paths thin an update identically."""
        step = check_int("step", step, min_value=0)
        checked = self._check(grads, state)
        if self.every > 1 and step % self.every:
            if self.residual:                      # hold the whole update back
                for grad, r in checked:
                    if grad.rows is None:
                        rf = r.reshape(-1)
                        _k.fold_flat(grad.values.reshape(-1), rf, rf)
                    else:
                        rows = _rows64(grad.rows)
                        b = rows.shape[0]
                        _k.hold_rows(_as_rows(r, r.shape[0]), rows,
                                     _as_rows(grad.values, b), b)
            return []
        code = self.code
        if code == _k.NONE:
            return [grad for grad, _ in checked]   # everything is sent, nothing held
        # (in residual mode a full send still flushes the residual: it need not be
        # zero, e.g. a state carried over from a lower fraction or set by the caller)
        out = []
        for pos, (grad, r) in enumerate(checked):
            values = grad.values
            x = values.copy()
            if grad.rows is not None:
                rows = _rows64(grad.rows)
                b = rows.shape[0]
                R = _as_rows(r, r.shape[0]) if r is not None else _as_rows(x, b)[:0]
                _k.filter_rows(code, self.fraction, self.threshold or 0.0, self.residual,
                               self.seed, step, pos, R, rows, _as_rows(x, b), b,
                               np.empty(x.size, np.bool_))
                out.append(Grad(grad.name, x, grad.rows, grad.read))
                continue
            flat = x.reshape(-1)
            n = flat.size
            if r is not None:
                _k.fold_flat(values.reshape(-1), r.reshape(-1), flat)
            mask = np.empty(n, np.bool_)
            if code == _k.TOPK:
                _k.topk_mask(flat, _k.keep_count(self.fraction, n), mask)
            elif code == _k.THRESHOLD:
                _k.threshold_mask(flat, self.threshold, mask)
            else:
                _k.random_mask(n, _k.keep_count(self.fraction, n),
                               _k.mask_seed(self.seed, step, pos), mask)
            if r is None:
                _k.drop_flat(flat, mask)
            else:
                _k.split_flat(flat, mask, r.reshape(-1))
            out.append(Grad(grad.name, x, grad.rows, grad.read))
        return out


def _rows64(rows):
    return rows if rows.dtype == _INT64 else rows.astype(np.int64)


def _as_rows(a, n):
    return a.reshape(n, math.prod(a.shape[1:]))
