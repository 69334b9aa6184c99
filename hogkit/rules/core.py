"""hogkit's built-in update rules, each on the rule contract (``hogkit.rules.base``).

``SGD`` (heavy-ball momentum optional), ``StalenessAware`` (Zhang et al.),
``DelayCompensated`` (DC-ASGD, Zheng et al.), ``GapAware`` (Barkai et al.), ``AdaGrad``
and ``RMSProp`` (per coordinate or row-wise, LIBMF's). Each is a frozen dataclass of
its hyper-parameters, checked when it is made; it names its kernels' configuration
(``cfg``: ``kernels/sgd.py``, ``kernels/delayed.py``, ``kernels/adaptive.py``), its
state, its capabilities and its spellings, and nothing else (the contract, ``apply``
and the registry are ``base.py``'s). State is per worker and private unless a runtime
passes shared arrays (``base.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hogkit.errors import InvalidArgument
from hogkit.kernels.adaptive import AdaGradCfg, RMSPropCfg
from hogkit.kernels.delayed import DCAdaptiveCfg, DCCfg, GapAwareCfg, StalenessCfg
from hogkit.kernels.sgd import MomentumCfg, SGDCfg
from hogkit.rules.base import Rule, State, check_flag, check_lr, check_unit
from hogkit.validation import check_float

__all__ = ["SGD", "StalenessAware", "DelayCompensated", "GapAware", "AdaGrad", "RMSProp"]


@dataclass(frozen=True)
class _Momentum(Rule):
    """What SGD and StalenessAware share: ``lr``, optional heavy-ball ``momentum``."""

    lr: float
    momentum: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "lr", check_lr(self.lr))
        object.__setattr__(self, "momentum", check_unit(
            "momentum", self.momentum, fix="use 0.0 for plain SGD, 0.9 is common"))

    @property
    def state(self):
        return State(first="m" if self.momentum else None)

    @classmethod
    def from_spell(cls, name, arg, *, lr, momentum=0.0):
        _no_setting(name, arg)
        return cls(lr=lr, momentum=momentum)


@dataclass(frozen=True)
class SGD(_Momentum):
    """Plain SGD, optionally with heavy-ball momentum.

    ``w ← w − lr·g``; with momentum ``mu > 0``: ``m ← mu·m + g``, ``w ← w − lr·m``.
    On sparse rows the momentum is lazy: only the touched rows of ``m`` move (rows not
    in the batch do not decay), one step per occurrence of a row.

    State: ``{"m/<name>": zeros like the parameter}`` when ``momentum > 0``, else
    ``{}``; per worker and private unless the runtime passes shared arrays.
    ``staleness`` is accepted and ignored.
    """

    spell = ("sgd",)

    def cfg(self):
        return MomentumCfg(self.lr, self.momentum) if self.momentum else SGDCfg(self.lr)

    @property
    def plain_sgd(self):
        return not self.momentum


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

    spell = ("staleness-aware",)

    def cfg(self):
        return StalenessCfg(self.lr, self.momentum)

    @property
    def gap_scaled(self):
        return True


@dataclass(frozen=True)
class DelayCompensated(Rule):
    """DC-ASGD (Zheng, Meng, Wang, Chen, Yu, Ma, Liu, "Asynchronous stochastic
    gradient descent with delay compensation", ICML 2017). With ``w_bak`` the
    parameters the worker read (``Grad.read``) and ``w`` their value now, the stale
    gradient is corrected by a cheap diagonal Hessian approximation:

        constant (DC-ASGD-c):  g' = g + λ · g ⊙ g ⊙ (w − w_bak)
        adaptive (DC-ASGD-a):  MS ← m·MS + (1 − m)·g ⊙ g,   λ_t = λ0 / sqrt(MS + ε),
                               g' = g + λ_t ⊙ g ⊙ g ⊙ (w − w_bak)
        then                   w ← w − lr · g'

    A fresh read (``w == w_bak``) gives plain SGD exactly; in engine runs a step the
    update clock calls fresh (gap 0) is not measured (``kernels.delayed``). State:
    ``{}`` (constant) or ``{"ms/<name>": zeros like the parameter}`` (adaptive), per
    worker, private (the paper keeps MS per worker too); on sparse rows MS moves on
    touched rows only. Spelled ``dc-asgd[:LAMBDA]`` and ``dc-asgd-adaptive[:LAMBDA0]``.
    """

    lr: float
    lam: float = 0.04
    adaptive: bool = False
    lam0: float = 2.0
    m: float = 0.95
    eps: float = 1e-7

    spell = ("dc-asgd", "dc-asgd-adaptive")
    needs_read = True

    def __post_init__(self):
        object.__setattr__(self, "lr", check_lr(self.lr))
        object.__setattr__(self, "lam", check_float(
            "lam", self.lam, min_value=0.0, fix="the paper uses lam=0.04"))
        object.__setattr__(self, "adaptive", check_flag("adaptive", self.adaptive))
        object.__setattr__(self, "lam0", check_float(
            "lam0", self.lam0, min_value=0.0, fix="the paper uses lam0=2.0"))
        object.__setattr__(self, "m", check_unit("m", self.m, fix="the paper uses m=0.95"))
        object.__setattr__(self, "eps", check_float(
            "eps", self.eps, min_value=0.0, exclude_min=True, fix="use eps=1e-7"))

    def cfg(self):
        if self.adaptive:
            return DCAdaptiveCfg(self.lr, self.lam0, self.m, self.eps)
        return DCCfg(self.lr, self.lam)

    @property
    def state(self):
        return State(first="ms" if self.adaptive else None)

    @classmethod
    def from_spell(cls, name, arg, *, lr, momentum=0.0):
        adaptive = name == "dc-asgd-adaptive"
        if not arg:
            return cls(lr=lr, adaptive=adaptive)
        try:
            value = float(arg)
        except ValueError:
            raise InvalidArgument(f"rule {name}:{arg}: {arg!r} is not a number; write "
                                  f"{name}:LAMBDA, e.g. {name}:0.2 (the "
                                  f"{'initial ' if adaptive else ''}delay-compensation "
                                  f"strength)") from None
        return cls(lr=lr, adaptive=adaptive, **({"lam0": value} if adaptive else
                                                {"lam": value}))


@dataclass(frozen=True)
class GapAware(Rule):
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
    update clock calls fresh (gap 0) is not measured (``kernels.delayed``).

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

    spell = ("gap-aware",)
    needs_read = True
    lr_fields = ("lr", "lr_max")

    def __post_init__(self):
        object.__setattr__(self, "lr", check_lr(self.lr))
        object.__setattr__(self, "momentum", check_unit(
            "momentum", self.momentum, fix="use 0.0 for plain SGD, 0.9 is common"))
        object.__setattr__(self, "gamma", check_float(
            "gamma", self.gamma, min_value=0.0, max_value=1.0, exclude_min=True,
            exclude_max=True, fix="the paper uses gamma=0.999"))
        lr_max = self.lr if self.lr_max is None else check_float(
            "lr_max", self.lr_max, min_value=0.0, exclude_min=True,
            fix="lr_max is the largest learning rate of the schedule; omit it to use lr")
        object.__setattr__(self, "lr_max", lr_max)

    def cfg(self):
        return GapAwareCfg(self.lr, self.momentum, self.gamma, self.lr_max)

    @property
    def state(self):
        return State(first="v", second="m" if self.momentum else None, counts=True)

    @classmethod
    def from_spell(cls, name, arg, *, lr, momentum=0.0):
        _no_setting(name, arg)
        return cls(lr=lr, momentum=momentum)


@dataclass(frozen=True)
class _Adaptive(Rule):
    """What AdaGrad and RMSProp share: an accumulator ``"s/<name>"`` per parameter, of
    the parameter's shape, or ``(rows, 1)`` with ``rowwise``; ``scale_by_staleness``
    divides the gradient by ``max(τ, 1)`` before it enters the accumulator and the
    step (what ``chain(scale_by_staleness(), adagrad())`` builds). Spelled ``NAME``
    and ``NAME-rowwise``."""

    def _check_common(self):
        object.__setattr__(self, "lr", check_lr(self.lr))
        for name in ("rowwise", "scale_by_staleness"):
            object.__setattr__(self, name, check_flag(name, getattr(self, name)))

    @property
    def state(self):
        return State(first="s", per_row=self.rowwise)

    @property
    def gap_scaled(self):
        return self.scale_by_staleness

    @classmethod
    def from_spell(cls, name, arg, *, lr, momentum=0.0):
        _no_setting(name, arg)
        return cls(lr=lr, rowwise=name.endswith("-rowwise"))


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
    private. Arithmetic and its order: ``kernels/adaptive.py``.
    """

    lr: float
    eps: float = 1e-10
    initial_accumulator_value: float = 0.0
    rowwise: bool = False
    scale_by_staleness: bool = False

    spell = ("adagrad", "adagrad-rowwise")
    torch_state = {"k": "step", "s": "sum"}

    def __post_init__(self):
        self._check_common()
        object.__setattr__(self, "eps", check_float(
            "eps", self.eps, min_value=0.0, exclude_min=True,
            fix="eps keeps the step finite where the accumulator is 0; torch uses 1e-10"))
        object.__setattr__(self, "initial_accumulator_value", check_float(
            "initial_accumulator_value", self.initial_accumulator_value, min_value=0.0,
            fix="the accumulator is a sum of squares; use 0.0 (torch) or 1.0 (LIBMF)"))

    def cfg(self):
        return AdaGradCfg(self.lr, self.eps, self.scale_by_staleness)

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

    spell = ("rmsprop", "rmsprop-rowwise")
    torch_state = {"k": "step", "s": "square_avg"}

    def __post_init__(self):
        self._check_common()
        object.__setattr__(self, "alpha", check_float(
            "alpha", self.alpha, min_value=0.0, max_value=1.0, exclude_min=True,
            exclude_max=True, fix="alpha is the decay of the mean of squares; torch "
                                  "uses 0.99"))
        object.__setattr__(self, "eps", check_float(
            "eps", self.eps, min_value=0.0, exclude_min=True,
            fix="eps keeps the step finite where the mean is 0; torch uses 1e-8"))

    def cfg(self):
        return RMSPropCfg(self.lr, self.alpha, self.eps, self.scale_by_staleness)


def _no_setting(name, arg):
    """A rule spelled without a ``:setting``."""
    if arg:
        raise InvalidArgument(f"rule {name}:{arg}: {name} takes no ':' setting; write "
                              f"{name}")
