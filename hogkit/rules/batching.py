"""Per-worker batch sizes against stragglers (docs/algorithms.md §3).

All three take the **global** batch B (samples per round over all workers):

- :class:`FixedBatch(B)`: B split evenly, whatever the speeds (``B/W`` each; a
  remainder goes to the lowest ranks).
- :class:`AdaptiveBatch(B, predictor)` (LB-BSP, Chen et al., SoCC 2018/2020): the global
  batch B stays fixed; worker i gets ``b_i = B · v̂_i / Σ_j v̂_j`` with v̂_i its predicted
  speed (samples/s) for the next iteration. Predictors: ``"last"`` (last measured
  value), ``"ema"`` (exponential moving average), ``"narx"`` (an online linear
  regressor on lagged speeds and a load signal, fitted by recursive least squares).
- :class:`EpochBalancedBatch(B)` (DBS, Ye et al. 2020): the same share, recomputed only
  once per epoch from the samples/s measured over the epoch.

Interface (all three; pure numpy, no shared state of their own):

``observe(rank, samples, seconds, load=None)``
    record one measured iteration of ``rank`` (predictor state is private and per rank).
``speed(rank, load=None) -> float``
    the predicted speed v̂_rank to publish (``load`` = the load expected for the next
    iteration, NARX only; default the last load observed). 0.0 while unknown.
``end_epoch(rank)``
    close an epoch for ``rank`` (only DBS uses it).
``sizes(speeds) -> int64 array``
    integer shares for all W workers from the published speeds: sum exactly B, each
    ≥ ``min_batch``, largest-remainder rounding of ``B·v̂_i/Σv̂``. Unknown speeds
    (≤ 0 or not finite) count as the mean of the known ones (all equal if none known).
``weight(b_i, *, workers) -> float``
    ``b_i / B``: the weight of a worker's mean gradient over b_i samples, so that the
    weighted gradients of one synchronous round sum to the mean gradient over all B
    samples (a batch-B step). Under the Hogwild per-update learning-rate convention
    (every worker's update at full lr) scale by ``workers`` instead: ``W·b_i/B``, which
    is 1 for FixedBatch and for equal speeds.
``global_batch(workers)``, ``config()``.

Shared-memory use (the runtime's part): each worker publishes ``speed(rank)`` into its
own slot of a shared float64 array and every worker computes ``sizes(that array)``. To
have all workers of one BSP round use the same speeds, publish at the end of iteration t
into row ``t % 2`` of a (2, W) array and read row ``t % 2`` after the round's barrier.
"""

from __future__ import annotations

import math

import numpy as np

from hogkit.errors import InvalidArgument
from hogkit.validation import check_choice, check_float, check_int

__all__ = ["FixedBatch", "AdaptiveBatch", "EpochBalancedBatch", "shares", "weights"]


# --------------------------------------------------------------------------- pure core

def _clean_speeds(speeds):
    v = np.asarray(speeds, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise InvalidArgument(f"speeds must be a non-empty 1-D array (one per worker), "
                              f"got shape {v.shape}")
    known = np.isfinite(v) & (v > 0)
    if not known.any():
        return np.ones_like(v)
    if not known.all():
        v = np.where(known, v, v[known].mean())
    return v


def shares(global_batch, speeds, *, min_batch=1) -> np.ndarray:
    """Integer shares of ``global_batch`` proportional to ``speeds``.

    ``q_i = B·v_i/Σv``; floors, then the leftover units go to the largest fractional
    parts (ties: lower rank). Shares below ``min_batch`` are raised to it, taking units
    from the shares furthest above their ideal ``q_i``. Sum is exactly B; v_i ≥ v_j
    implies b_i ≥ b_j (before the min_batch fix). Unknown speeds (≤ 0 or not finite)
    count as the mean of the known ones.
    """
    B = check_int("global_batch", global_batch, min_value=1)
    m = check_int("min_batch", min_batch, min_value=0)
    v = _clean_speeds(speeds)
    W = v.size
    if B < m * W:
        raise InvalidArgument(f"global_batch={B} cannot give {W} workers at least "
                              f"min_batch={m} each; raise global_batch to >= {m * W}")
    q = B * v / v.sum()
    b = np.floor(q).astype(np.int64)
    left = B - int(b.sum())
    if left > 0:
        order = np.argsort(-(q - b), kind="stable")
        b[order[:left]] += 1
    low = np.flatnonzero(b < m)
    for i in low:
        need = m - int(b[i])
        b[i] = m
        while need:
            surplus = np.where(b > m, b - q, -np.inf)
            j = int(np.argmax(surplus))
            b[j] -= 1
            need -= 1
    return b


def weights(sizes) -> np.ndarray:
    """``b_i / Σ b_j``: weights under which a round of per-worker mean gradients sums
    to the mean gradient over all samples of the round."""
    b = np.asarray(sizes, dtype=np.float64)
    return b / b.sum()


# --------------------------------------------------------------------------- predictors

class _Last:
    def __init__(self):
        self.v = 0.0

    def update(self, v, load):
        self.v = v

    def predict(self, load):
        return self.v


class _EMA:
    def __init__(self, alpha):
        self.alpha = alpha
        self.v = 0.0
        self.n = 0

    def update(self, v, load):
        self.v = v if self.n == 0 else self.alpha * v + (1 - self.alpha) * self.v
        self.n += 1

    def predict(self, load):
        return self.v


_P0 = 1.0        # RLS prior covariance (speeds normalised by the first one)
_P_MAX = 1e4     # reset P above this trace (wind-up under forgetting)


class _NARX:
    """v_t ≈ θ·[v_{t−1} … v_{t−p}, load_t, 1], fitted online by recursive least squares
    with forgetting factor λ (so a step change is tracked in a few observations). The
    prior θ₀ is the last-value predictor with covariance I, so with little excitation
    (steady speed) it stays close to "last".

    Until p+2 observations have been seen, and whenever a prediction is not finite or
    not positive, it falls back to the last value; predictions are clipped to
    [last/4, 4·last] so a fitting transient right after a step change stays sane.
    """

    def __init__(self, lags, forget):
        self.p = lags
        self.lam = forget
        n = lags + 2
        self.theta = np.zeros(n)
        self.theta[0] = 1.0       # prior: the last value (speeds are normalised, ~1)
        self.P = np.eye(n) * _P0
        self.hist = []            # last p speeds, newest first
        self.load = 0.0
        self.n = 0
        self.scale = 0.0          # speeds are normalised by the first one for conditioning

    def _x(self, load):
        return np.array(self.hist + [load, 1.0])

    def update(self, v, load):
        load = self.load if load is None else float(load)
        if self.scale == 0.0:
            self.scale = v if v > 0 else 1.0
        y = v / self.scale
        if len(self.hist) == self.p:
            x = self._x(load)
            Px = self.P @ x
            k = Px / (self.lam + x @ Px)
            self.theta = self.theta + k * (y - self.theta @ x)
            self.P = (self.P - np.outer(k, Px)) / self.lam
            # Covariance wind-up: with forgetting and little excitation (constant speed)
            # P grows without bound; reset it before it loses precision.
            if not np.isfinite(self.P).all() or np.trace(self.P) > _P_MAX:
                self.P = np.eye(self.P.shape[0]) * _P0
        self.hist = ([y] + self.hist)[: self.p]
        self.load = load
        self.n += 1

    def predict(self, load):
        if not self.hist:
            return 0.0
        last = self.hist[0] * self.scale
        if self.n < self.p + 2:
            return last
        load = self.load if load is None else float(load)
        v = float(self.theta @ self._x(load)) * self.scale
        if not (math.isfinite(v) and v > 0):
            return last
        return min(max(v, 0.25 * last), 4.0 * last)   # a transient never swings far


# --------------------------------------------------------------------------- batchers

class _Base:
    def observe(self, rank, samples, seconds, load=None):
        """Record that ``rank`` processed ``samples`` in ``seconds``."""
        check_int("samples", samples, min_value=0)
        check_float("seconds", seconds, min_value=0.0, exclude_min=True,
                    fix="time the iteration with time.perf_counter()")
        if load is not None:
            check_float("load", load)
        self._observe(rank, samples / seconds, load)

    def _observe(self, rank, v, load):
        pass

    def speed(self, rank, load=None) -> float:
        return 1.0

    def end_epoch(self, rank):
        pass

    def weight(self, b_i, *, workers) -> float:
        """``b_i / global_batch(workers)`` (see the module doc)."""
        return b_i / self.global_batch(workers)


class FixedBatch(_Base):
    """The global batch ``B`` split evenly over the workers, whatever their speeds
    (the baseline LB-BSP and DBS are compared with). For a per-worker size, pass an
    int ``batch`` to ``train``."""

    def __init__(self, global_batch, *, min_batch=1):
        self.B = check_int("global_batch", global_batch, min_value=1)
        self.min_batch = check_int("min_batch", min_batch, min_value=0)

    def global_batch(self, workers=None) -> int:
        return self.B

    def sizes(self, speeds) -> np.ndarray:
        return shares(self.B, np.ones(np.asarray(speeds).shape[0]), min_batch=self.min_batch)

    def config(self) -> dict:
        return {"name": "fixed", "global_batch": self.B, "min_batch": self.min_batch}

    def __repr__(self):
        return f"FixedBatch({self.B})"


class AdaptiveBatch(_Base):
    """LB-BSP (Chen et al., SoCC 2018/2020): ``b_i = B · v̂_i / Σ_j v̂_j``, B fixed.

    ``predictor``: ``"last"`` | ``"ema"`` (``alpha``, weight of the newest value) |
    ``"narx"`` (``lags`` lagged speeds + a load input + bias, RLS with forgetting
    factor ``forget``). The paper's NARX is a small neural network; hogkit uses its
    linear special case, fitted online (no training phase). ``min_batch``: floor of
    each share.
    """

    def __init__(self, global_batch, predictor="last", *, alpha=0.3, lags=2,
                 forget=0.9, min_batch=1):
        self.B = check_int("global_batch", global_batch, min_value=1)
        self.predictor = check_choice("predictor", predictor, ("last", "ema", "narx"))
        self.alpha = check_float("alpha", alpha, min_value=0.0, max_value=1.0,
                                 exclude_min=True)
        self.lags = check_int("lags", lags, min_value=1, max_value=16)
        self.forget = check_float("forget", forget, min_value=0.5, max_value=1.0)
        self.min_batch = check_int("min_batch", min_batch, min_value=0)
        self._pred = {}

    def _new(self):
        if self.predictor == "last":
            return _Last()
        if self.predictor == "ema":
            return _EMA(self.alpha)
        return _NARX(self.lags, self.forget)

    def _observe(self, rank, v, load):
        p = self._pred.get(rank)
        if p is None:
            p = self._pred[rank] = self._new()
        p.update(v, load)

    def speed(self, rank, load=None) -> float:
        p = self._pred.get(rank)
        return 0.0 if p is None else float(p.predict(load))

    def global_batch(self, workers=None) -> int:
        return self.B

    def sizes(self, speeds) -> np.ndarray:
        return shares(self.B, speeds, min_batch=self.min_batch)

    def config(self) -> dict:
        d = {"name": "adaptive", "global_batch": self.B, "predictor": self.predictor,
             "min_batch": self.min_batch}
        if self.predictor == "ema":
            d["alpha"] = self.alpha
        if self.predictor == "narx":
            d.update(lags=self.lags, forget=self.forget)
        return d

    def __repr__(self):
        return f"AdaptiveBatch({self.B}, predictor={self.predictor!r})"

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_pred"] = {}            # predictor state is per process, not shipped
        return d


class EpochBalancedBatch(_Base):
    """DBS (Ye et al. 2020): ``b_i = B · v_i / Σ_j v_j`` with v_i the samples/s that
    worker i achieved over the previous epoch; fixed during an epoch.

    ``observe`` accumulates samples and seconds; ``end_epoch(rank)`` turns them into the
    speed that ``speed(rank)`` reports for the next epoch (0.0 = unknown before the first
    epoch ends, so the first epoch splits B evenly).
    """

    def __init__(self, global_batch, *, min_batch=1):
        self.B = check_int("global_batch", global_batch, min_value=1)
        self.min_batch = check_int("min_batch", min_batch, min_value=0)
        self._acc = {}
        self._speed = {}

    def observe(self, rank, samples, seconds, load=None):
        check_int("samples", samples, min_value=0)
        check_float("seconds", seconds, min_value=0.0, exclude_min=True)
        s, t = self._acc.get(rank, (0, 0.0))
        self._acc[rank] = (s + samples, t + seconds)

    def end_epoch(self, rank):
        s, t = self._acc.pop(rank, (0, 0.0))
        if t > 0 and s > 0:
            self._speed[rank] = s / t

    def speed(self, rank, load=None) -> float:
        return self._speed.get(rank, 0.0)

    def global_batch(self, workers=None) -> int:
        return self.B

    def sizes(self, speeds) -> np.ndarray:
        return shares(self.B, speeds, min_batch=self.min_batch)

    def config(self) -> dict:
        return {"name": "epoch", "global_batch": self.B, "min_batch": self.min_batch}

    def __repr__(self):
        return f"EpochBalancedBatch({self.B})"

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_acc"], d["_speed"] = {}, {}
        return d
