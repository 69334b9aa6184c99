"""Update rules: small objects with explicit state that apply a list of ``Grad``.

Shell, functional core, kernel: a rule object holds hyper-parameters only; ``init``
builds its state (a plain dict of numpy arrays, so a simulator can hold, copy and
replay it); ``apply`` validates every gradient at the Python boundary, then calls one
``hogkit.kernels`` kernel per gradient. Nothing is written until every gradient of
the call has passed its checks, so a bad input leaves parameters and state as they
were.

Protocol (docs/contracts.md)::

    rule.needs_read -> bool          DC-ASGD and Gap-Aware need Grad.read
    rule.init(params) -> state       dict of arrays, keys "<slot>/<param name>"
    rule.apply(params, grads, state, *, staleness=0, rank=0) -> None   in place

Parameters of any ndim >= 1 are accepted. A dense ``Grad`` is applied to the flat
view of its parameter; a sparse ``Grad`` indexes the first axis and the parameter is
seen as a 2-D ``(n, prod(shape[1:]))`` view (no copy). Duplicate rows add up like
``np.add.at``; stateful rules process duplicates one after the other.

State ownership: the state returned by ``init`` is **per worker and private** (each
worker calls ``init`` on its own). A runtime that wants shared state (e.g. one
momentum buffer for all workers) places the same arrays, e.g. views of a shared
store, in every worker's state dict; the rules work unchanged, and the read-modify-
write of the shared buffer is then a Hogwild! race like the parameter update.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import (FLOAT_DTYPES, check_array, check_float, check_grads,
                               check_indices, check_int)
from hogkit.kernels import guard as _guard
from hogkit.kernels import rule as _rule

__all__ = ["SGD", "StalenessAware", "DelayCompensated", "GapAware", "AdaGrad", "RMSProp"]

_INT64 = np.dtype(np.int64)


# --- the boundary: validate, then hand views to the kernels --------------------------

class _Item:
    """One validated gradient: ``p``/``g``/``read`` are flat (dense) or 2-D (rows)."""

    __slots__ = ("name", "param", "p", "rows", "g", "read")

    def __init__(self, name, param, p, rows, g, read):
        self.name, self.param, self.p, self.rows, self.g, self.read = (
            name, param, p, rows, g, read)


def _as_rows(a, n):
    """View ``a`` (shape ``(n,) + rest``) as 2-D ``(n, prod(rest))`` without copying."""
    return a.reshape(n, math.prod(a.shape[1:]))


def _ok(a, dtype, shape):
    """Fast path of the boundary checks: plain attribute comparisons, no messages."""
    return (a.__class__ is np.ndarray and a.dtype == dtype and a.shape == shape
            and a.flags.c_contiguous)


def _rows_ok(rows, n):
    if rows.__class__ is not np.ndarray or rows.dtype != _INT64 or rows.ndim != 1 \
            or not rows.flags.c_contiguous:
        return False
    if rows.shape[0] == 0:
        return True
    lo, hi = _guard.index_bounds(rows)
    return lo >= 0 and hi < n


def _prepare(rule, params, grads, *, needs_read):
    """Check every gradient against its parameter; return the kernel-ready views.

    Runs every step, so each check first tries a fast path (attribute comparisons and
    a one-pass numba scan of the row indices); only when that fails does the full
    check run, to raise with the value, the constraint and the fix.
    """
    if not isinstance(params, Mapping):
        raise InvalidType(f"params must be a mapping name -> numpy array, got "
                          f"{type(params).__name__}")
    items = []
    for grad in check_grads(grads):
        name = grad.name
        param = params.get(name)
        if param is None:
            raise InvalidArgument(f"Grad {name!r} names no parameter; parameters are "
                                  f"{sorted(params)}")
        if not (param.__class__ is np.ndarray and param.dtype in FLOAT_DTYPES
                and param.ndim >= 1 and param.flags.c_contiguous and param.flags.writeable):
            check_array(f"params[{name!r}]", param, dtype=FLOAT_DTYPES, min_ndim=1,
                        writeable=True)
        vname = f"Grad {name!r} values"
        rows = grad.rows
        if rows is None:
            shape = param.shape
            if not _ok(grad.values, param.dtype, shape):
                check_array(vname, grad.values, dtype=param.dtype, shape=shape)
            p, g = param.reshape(-1), grad.values.reshape(-1)
        else:
            n = param.shape[0]
            if not _rows_ok(rows, n):
                rows = check_indices(f"Grad {name!r} rows", rows, n)
                if rows.dtype != _INT64:
                    rows = rows.astype(np.int64)
            shape = (rows.shape[0],) + param.shape[1:]
            if not _ok(grad.values, param.dtype, shape):
                check_array(vname, grad.values, dtype=param.dtype, shape=shape)
            p, g = _as_rows(param, n), _as_rows(grad.values, rows.shape[0])
        read = None
        if needs_read:
            if grad.read is None:
                raise InvalidArgument(
                    f"{type(rule).__name__} needs Grad.read (the parameter values the "
                    f"gradient was computed from) for {name!r}, got None; compute "
                    f"gradients with keep_read=True")
            if not _ok(grad.read, param.dtype, shape):
                check_array(f"Grad {name!r} read", grad.read, dtype=param.dtype,
                            shape=shape)
            read = grad.read.reshape(g.shape)
        items.append(_Item(name, param, p, rows, g, read))
    return items


def _slot(state, slot, item, dtype=None, shape=None):
    """The state array ``state["<slot>/<name>"]``, checked; viewed like ``item.p``
    unless an explicit ``shape`` is asked for (then returned as is)."""
    key = f"{slot}/{item.name}"
    if not isinstance(state, Mapping) or key not in state:
        raise InvalidArgument(f"state has no {key!r}; build the state with "
                              f"rule.init(params) for the same parameters")
    a = state[key]
    check_array(f"state[{key!r}]", a, dtype=dtype or item.param.dtype,
                shape=shape or item.param.shape, writeable=True)
    return a if shape else a.reshape(item.p.shape)


def _check_staleness(staleness):
    return check_int("staleness", staleness, min_value=0,
                     fix="staleness is the number of updates by others since the read")


def _lr(lr):
    return check_float("lr", lr, min_value=0.0, exclude_min=True,
                       fix="use a positive learning rate such as 0.01")


def _unit(name, value, fix=""):
    return check_float(name, value, min_value=0.0, max_value=1.0, exclude_max=True, fix=fix)


def _zeros_like(params, slot):
    return {f"{slot}/{k}": np.zeros_like(v) for k, v in params.items()}


_NO_K = np.zeros(1, np.int64)


class _Kernel:
    """What every rule shares: the encoding the kernels take (``kind``, ``cfg()``,
    ``slots``) and ``apply``, which validates the grads and sends each through
    ``hogkit.kernels.rule`` (``apply_rows`` for sparse rows, ``apply_flat`` for dense
    gradients): one dispatch for the Python path and the compiled step core."""

    #: state slots: (S1 name, S2 name, has a step count "k")
    slots = (None, None, False)

    def init(self, params):
        """Fresh state for ``params``: zeros like each parameter for every slot the
        rule uses (``"<slot>/<name>"``), and an int64 ``(1,)`` step count ``"k/<name>"``
        when it counts steps."""
        s1, s2, has_k = self.slots
        state = {}
        for slot in (s1, s2):
            if slot:
                state.update(_zeros_like(params, slot))
        if has_k:
            state.update({f"k/{k}": np.zeros(1, np.int64) for k in params})
        return state

    def _s1(self, state, slot, item):
        """The first state slot for ``item``, checked and viewed like ``item.p``."""
        return _slot(state, slot, item)

    def cfg(self) -> np.ndarray:
        """The float64 hyper-parameter vector of ``hogkit.kernels.rule`` (built once,
        read-only: rules are frozen)."""
        c = self.__dict__.get("_cfg")
        if c is None:
            c = self._build_cfg()
            c.flags.writeable = False
            object.__setattr__(self, "_cfg", c)
        return c

    def __getstate__(self):
        """Pickled without the cached ``cfg()``: an unpickled array is writeable, and a
        writeable ``cfg`` in a spawned worker is another type to numba (read-only is part
        of an array's type), so each worker compiled its core afresh, ~9 s of a cold run,
        instead of loading what the parent warmed. Rebuilt read-only on first use."""
        return {k: v for k, v in self.__dict__.items() if k != "_cfg"}

    def _build_cfg(self):
        c = np.zeros(_rule.NCFG)
        c[_rule.LR] = self.lr
        c[_rule.MU] = getattr(self, "momentum", 0.0)
        for attr, i in (("lam", _rule.LAM), ("lam0", _rule.LAM0), ("m", _rule.M),
                        ("eps", _rule.EPS), ("gamma", _rule.GAMMA), ("lr_max", _rule.LR_MAX)):
            if hasattr(self, attr):
                c[i] = getattr(self, attr)
        return c

    def config(self) -> dict:
        out = {"name": type(self).__name__}
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        return out

    def apply(self, params, grads, state, *, staleness=0, rank=0):
        """Apply ``grads`` to ``params`` in place at ``staleness`` (updates applied by
        others since the gradient's read); ``rank`` (the worker's id) is accepted for
        symmetry and unused. Nothing is written unless every gradient passes its checks."""
        tau = _check_staleness(staleness)
        items = _prepare(self, params, grads, needs_read=self.needs_read)
        s1n, s2n, has_k = self.slots
        s1 = [self._s1(state, s1n, it) if s1n else _empty(it) for it in items]
        s2 = [_slot(state, s2n, it) if s2n else _empty(it) for it in items]
        ks = [_slot(state, "k", it, dtype=np.int64, shape=(1,)) if has_k else _NO_K
              for it in items]
        kind, cfg = self.kind, self.cfg()
        for it, a, b, k in zip(items, s1, s2, ks):
            read = it.read if it.read is not None else _empty(it)
            if it.rows is None:
                _rule.apply_flat(kind, cfg, it.p, a, b, k, 0, it.g, read, tau)
            else:      # the row kernels turn the read copies into gaps in place
                read = read.copy() if it.read is not None else read
                _rule.apply_rows(kind, cfg, it.p, a, b, k, 0, it.rows, it.g, read, -1, tau,
                                 False)


_EMPTIES = {}


def _empty(item):
    """An empty array standing in for unused state (the kernels' arguments are typed);
    one per (dtype, rank, width), shared: nothing is ever written to it."""
    p = item.p
    key = (p.dtype, p.ndim, p.shape[1] if p.ndim == 2 else 0)
    e = _EMPTIES.get(key)
    if e is None:
        e = _EMPTIES[key] = np.empty((0,) if p.ndim == 1 else (0, p.shape[1]), p.dtype)
    return e


# --- the rules -----------------------------------------------------------------------

@dataclass(frozen=True)
class _Momentum(_Kernel):
    """What SGD and StalenessAware share: ``lr``, optional heavy-ball ``momentum``."""

    lr: float
    momentum: float = 0.0

    needs_read = False

    def __post_init__(self):
        object.__setattr__(self, "lr", _lr(self.lr))
        object.__setattr__(self, "momentum", _unit(
            "momentum", self.momentum, fix="use 0.0 for plain SGD, 0.9 is common"))

    @property
    def slots(self):
        return ("m" if self.momentum else None, None, False)


@dataclass(frozen=True)
class SGD(_Momentum):
    """Plain SGD, optionally with heavy-ball momentum.

    ``w ← w − lr·g``; with momentum ``mu > 0``: ``m ← mu·m + g``, ``w ← w − lr·m``.
    On sparse rows the momentum is lazy: only the touched rows of ``m`` move (rows not
    in the batch do not decay), one step per occurrence of a row.

    State: ``{"m/<name>": zeros like the parameter}`` when ``momentum > 0``, else
    ``{}``; per worker and private unless the runtime passes shared arrays (see the
    module docstring). ``staleness`` is accepted and ignored.
    """

    kind = _rule.SGD


@dataclass(frozen=True)
class StalenessAware(_Momentum):
    """Staleness-aware SGD (Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for
    distributed deep learning", IJCAI 2016): the learning rate is divided by the
    gradient's staleness τ,

        w ← w − (lr / max(τ, 1)) · g

    where τ = ``staleness`` = updates applied by others since this gradient's read
    (τ = 0 and τ = 1 both give plain SGD). With momentum ``mu > 0`` the stale
    gradient is damped before it enters the buffer: ``m ← mu·m + g / max(τ, 1)``,
    ``w ← w − lr·m`` (a hogkit choice: the paper has no momentum).

    State as :class:`SGD` (``"m/<name>"`` when ``momentum > 0``), per worker, private.
    """

    kind = _rule.STALENESS_AWARE


@dataclass(frozen=True)
class DelayCompensated(_Kernel):
    """DC-ASGD (Zheng, Meng, Wang, Chen, Yu, Ma, Liu, "Asynchronous stochastic
    gradient descent with delay compensation", ICML 2017). With ``w_bak`` the
    parameters the worker read (``Grad.read``) and ``w`` their value now, the stale
    gradient is corrected by a cheap diagonal Hessian approximation:

        constant (DC-ASGD-c):  g' = g + λ · g ⊙ g ⊙ (w − w_bak)
        adaptive (DC-ASGD-a):  MS ← m·MS + (1 − m)·g ⊙ g,   λ_t = λ0 / sqrt(MS + ε),
                               g' = g + λ_t ⊙ g ⊙ g ⊙ (w − w_bak)
        then                   w ← w − lr · g'

    A fresh read (``w == w_bak``) gives plain SGD exactly; in engine runs a step the
    update clock calls fresh (gap 0) is not measured (``kernels.rule.apply_rows``).
    State: ``{}`` (constant)
    or ``{"ms/<name>": zeros like the parameter}`` (adaptive), per worker, private
    (the paper keeps MS per worker too); on sparse rows MS moves on touched rows only.
    """

    lr: float
    lam: float = 0.04
    adaptive: bool = False
    lam0: float = 2.0
    m: float = 0.95
    eps: float = 1e-7

    needs_read = True

    def __post_init__(self):
        object.__setattr__(self, "lr", _lr(self.lr))
        object.__setattr__(self, "lam", check_float(
            "lam", self.lam, min_value=0.0, fix="the paper uses lam=0.04"))
        if not isinstance(self.adaptive, (bool, np.bool_)):
            raise InvalidType(f"adaptive={self.adaptive!r} must be a bool")
        object.__setattr__(self, "adaptive", bool(self.adaptive))
        object.__setattr__(self, "lam0", check_float(
            "lam0", self.lam0, min_value=0.0, fix="the paper uses lam0=2.0"))
        object.__setattr__(self, "m", _unit("m", self.m, fix="the paper uses m=0.95"))
        object.__setattr__(self, "eps", check_float(
            "eps", self.eps, min_value=0.0, exclude_min=True, fix="use eps=1e-7"))

    @property
    def kind(self):
        return _rule.DC_ADAPTIVE if self.adaptive else _rule.DC

    @property
    def slots(self):
        return ("ms" if self.adaptive else None, None, False)


@dataclass(frozen=True)
class GapAware(_Kernel):
    """Gap-Aware (Barkai, Hakimi, Schuster, "Gap-aware mitigation of gradient
    staleness", ICLR 2020). The penalty is the gap between the parameters the
    gradient was computed from (``Grad.read``) and their value now, measured in
    units of a typical step:

        Δ = w_now − w_read
        u = mu·m + g                       (the undamped step; u = g when mu = 0)
        v ← γ·v + (1 − γ)·u ⊙ u,   v̂ = v / (1 − γ^k)    (k: this parameter's step count)
        C = lr_max · (sqrt(v̂) + 1e-8),    G = 1 + |Δ| / C   (G = 1 when fresh)
        m ← mu·m + g / G,   w ← w − lr·m   (w ← w − lr · g / G when mu = 0)

    ``lr_max`` defaults to ``lr`` (hogkit's rules have a constant learning rate).
    Departures: u is the momentum step taken with the *undamped* g, so C does not
    depend on G; the paper also damps weight decay, which hogkit's rules do not have.
    A fresh read gives plain SGD (with momentum) exactly; in engine runs a step the
    update clock calls fresh (gap 0) is not measured (``kernels.rule.apply_rows``).

    State: ``"v/<name>"`` (second moment, like the parameter), ``"k/<name>"`` (int64
    ``(1,)`` step count) and ``"m/<name>"`` when ``momentum > 0``; per worker,
    private. On sparse rows ``v`` and ``m`` move on touched rows only, and the bias
    correction uses the per-parameter ``k`` (a rarely touched row's v̂ is
    under-estimated, so its gap is over-estimated: the conservative side).
    """

    lr: float
    momentum: float = 0.0
    gamma: float = 0.999
    lr_max: Optional[float] = None

    needs_read = True
    kind = _rule.GAP_AWARE

    def __post_init__(self):
        object.__setattr__(self, "lr", _lr(self.lr))
        object.__setattr__(self, "momentum", _unit(
            "momentum", self.momentum, fix="use 0.0 for plain SGD, 0.9 is common"))
        object.__setattr__(self, "gamma", check_float(
            "gamma", self.gamma, min_value=0.0, max_value=1.0, exclude_min=True,
            exclude_max=True, fix="the paper uses gamma=0.999"))
        lr_max = self.lr if self.lr_max is None else check_float(
            "lr_max", self.lr_max, min_value=0.0, exclude_min=True,
            fix="lr_max is the largest learning rate of the schedule; omit it to use lr")
        object.__setattr__(self, "lr_max", lr_max)

    @property
    def slots(self):
        return ("v", "m" if self.momentum else None, True)


@dataclass(frozen=True)
class _Adaptive(_Kernel):
    """What AdaGrad and RMSProp share: an accumulator ``"s/<name>"`` per parameter, of
    the parameter's shape, or ``(rows, 1)`` with ``rowwise``; ``scale_by_staleness``
    divides the gradient by ``max(τ, 1)`` before it enters the accumulator and the
    step (what ``chain(scale_by_staleness(), adagrad())`` builds)."""

    needs_read = False
    slots = ("s", None, False)

    def _check_common(self):
        object.__setattr__(self, "lr", _lr(self.lr))
        for name in ("rowwise", "scale_by_staleness"):
            v = getattr(self, name)
            if not isinstance(v, (bool, np.bool_)):
                raise InvalidType(f"{name}={v!r} must be a bool (True or False)")
            object.__setattr__(self, name, bool(v))

    def _start(self):
        return 0.0

    def init(self, params):
        """``{"s/<name>": ...}``: filled with the start value, like the parameter, or
        ``(rows, 1)`` (one accumulator per row of the parameter's 2-D view) with
        ``rowwise``."""
        v = self._start()
        if self.rowwise:
            return {f"s/{k}": np.full((p.shape[0] if p.ndim else 1, 1), v, p.dtype)
                    for k, p in params.items()}
        return {f"s/{k}": np.full_like(p, v) for k, p in params.items()}

    def _s1(self, state, slot, item):
        if not self.rowwise:
            return _slot(state, slot, item)
        key = f"{slot}/{item.name}"
        a = state.get(key) if isinstance(state, Mapping) else None
        want = (item.param.shape[0], 1)
        if isinstance(a, np.ndarray) and a.shape != want:
            raise InvalidArgument(
                f"state[{key!r}] has shape {a.shape}; {type(self).__name__}(rowwise=True) "
                f"keeps one accumulator per row of parameter {item.name!r} "
                f"{item.param.shape}, shape {want}; build the state with rule.init(params)")
        a = _slot(state, slot, item, shape=want)
        return a if item.rows is not None else a.reshape(-1)

    def _build_cfg(self):
        c = super()._build_cfg()
        c[_rule.ALPHA] = getattr(self, "alpha", 0.0)
        c[_rule.STALE] = 1.0 if self.scale_by_staleness else 0.0
        return c


@dataclass(frozen=True)
class AdaGrad(_Adaptive):
    """AdaGrad (Duchi, Hazan, Singer, "Adaptive subgradient methods for online learning
    and stochastic optimization", JMLR 2011), with ``torch.optim.Adagrad``'s semantics
    (no lr decay, no weight decay)::

        s ← s + g ⊙ g,     w ← w − lr · g / (sqrt(s) + eps)

    ``s`` starts at ``initial_accumulator_value`` (torch's default 0.0; eps 1e-10 as
    torch's).

    ``rowwise=True``: one accumulator per row of the parameter's 2-D view ``(rows,
    prod(shape[1:]))``, fed the row's *mean* of ``g ⊙ g`` over its columns, one step size
    per row: ``s_r ← s_r + mean(g_r ⊙ g_r)``, ``w_r ← w_r − lr · g_r / (sqrt(s_r) +
    eps)``. This is the per-row adaptive step of LIBMF's FPSG (Chin, Zhuang, Juan, Lin,
    "A learning-rate schedule for stochastic gradient methods to matrix factorization",
    PAKDD 2015), made for sparse tables: the state is ``(rows, 1)``, a ``d``-th of the
    per-coordinate one. One difference to LIBMF stays: LIBMF steps with the accumulator
    *before* adding the current gradient (and starts it at 1); here, as in torch, the
    current gradient is added first. ``initial_accumulator_value=1.0`` gives LIBMF's
    start. A 1-D parameter has rows of one value, so row-wise is per coordinate there
    (the same numbers either way). A dense gradient of a 2-D parameter is row-wise over
    the parameter's rows too.

    On sparse rows only the touched rows of ``s`` move (lazy), one accumulator step per
    occurrence of a row. ``scale_by_staleness=True`` divides ``g`` by ``max(τ, 1)``
    first (Zhang et al., IJCAI 2016). State: ``{"s/<name>": ...}``, per worker and
    private (see the module docstring). Arithmetic and its order: ``kernels/adaptive.py``.
    """

    lr: float
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0
    rowwise: bool = False
    scale_by_staleness: bool = False

    kind = _rule.ADAGRAD

    def __post_init__(self):
        self._check_common()
        object.__setattr__(self, "eps", check_float(
            "eps", self.eps, min_value=0.0, exclude_min=True,
            fix="eps keeps the step finite where the accumulator is 0; torch uses 1e-10"))
        object.__setattr__(self, "initial_accumulator_value", check_float(
            "initial_accumulator_value", self.initial_accumulator_value, min_value=0.0,
            fix="the accumulator is a sum of squares; use 0.0 (torch) or 1.0 (LIBMF)"))

    def _start(self):
        return self.initial_accumulator_value


@dataclass(frozen=True)
class RMSProp(_Adaptive):
    """RMSProp (Tieleman & Hinton, "Lecture 6.5 — RMSProp", COURSERA: Neural Networks
    for Machine Learning, 2012), with ``torch.optim.RMSprop``'s semantics without
    momentum or centring::

        s ← alpha · s + (1 − alpha) · g ⊙ g,     w ← w − lr · g / (sqrt(s) + eps)

    ``s`` starts at 0 (alpha 0.99 and eps 1e-8 as torch's). ``rowwise=True``: one
    accumulator per row of the parameter's 2-D view fed the row's mean of ``g ⊙ g``, as
    :class:`AdaGrad`'s (the LIBMF-style row-wise step, with a moving mean in place of
    the sum); a 1-D parameter is per coordinate either way. Lazy on sparse rows (rows
    not in the batch do not decay), one step per occurrence; ``scale_by_staleness`` as
    :class:`AdaGrad`'s. State: ``{"s/<name>": ...}``, per worker and private.
    """

    lr: float
    alpha: float = 0.99
    eps: float = 1e-8
    rowwise: bool = False
    scale_by_staleness: bool = False

    kind = _rule.RMSPROP

    def __post_init__(self):
        self._check_common()
        object.__setattr__(self, "alpha", check_float(
            "alpha", self.alpha, min_value=0.0, max_value=1.0, exclude_min=True,
            exclude_max=True, fix="alpha is the decay of the mean of squares; torch "
                                  "uses 0.99"))
        object.__setattr__(self, "eps", check_float(
            "eps", self.eps, min_value=0.0, exclude_min=True,
            fix="eps keeps the step finite where the mean is 0; torch uses 1e-8"))
