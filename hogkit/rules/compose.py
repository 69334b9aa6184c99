"""Rules as pieces that compose, the way optax transformations do::

    from hogkit.rules.compose import chain, scale_by_staleness, gap_aware, momentum

    rule = chain(scale_by_staleness(), momentum(0.9), lr=0.05)   # == StalenessAware(0.05, 0.9)
    rule = chain(gap_aware(gamma=0.999), momentum(0.9), lr=0.05)  # == GapAware(0.05, 0.9)
    rule = chain(adagrad(rowwise=True), lr=0.1)          # == AdaGrad(0.1, rowwise=True)

Each piece transforms the gradient, in the order given: a **correction** for
staleness (at most one: :func:`scale_by_staleness`, :func:`delay_compensation` or
:func:`gap_aware`), then optionally :func:`momentum`, then the step ``w -= lr·u``.
A **scaling** piece (:func:`adagrad` or :func:`rmsprop`, at most one) divides by the
root of its accumulator instead; it composes with :func:`scale_by_staleness` put before
it (the damped gradient enters the accumulator and the step:
``AdaGrad(..., scale_by_staleness=True)``), and with nothing else: no kernel has
DC-ASGD's or Gap-Aware's correction, or momentum, on top of an adaptive step.
:func:`chain` resolves the pipeline to the one fused kernel that computes it
(``hogkit.kernels.rule``) and returns that rule object, so a chained rule runs in one
kernel call per parameter, on the compiled step core and on the Python step alike, and
computes bit for bit what the class it equals computes (``tests/test_compose.py``).

A pipeline no kernel computes (two corrections, momentum before a correction, momentum
with DC-ASGD, an adaptive piece with another correction or momentum) is refused with what would run instead; adding a fused kernel for it is
the way to add it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hogkit.errors import InvalidArgument, InvalidType

__all__ = ["Piece", "chain", "scale_by_staleness", "delay_compensation", "gap_aware",
           "momentum", "adagrad", "rmsprop"]


@dataclass(frozen=True)
class Piece:
    """One transformation of a chain: ``kind`` ("staleness", "dc", "gap", "momentum",
    "adagrad", "rmsprop")
    and its hyper-parameters (checked by the rule :func:`chain` builds)."""

    kind: str
    options: dict = field(default_factory=dict)

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{_MAKERS[self.kind]}({args})"


def scale_by_staleness() -> Piece:
    """``g / max(tau, 1)`` (Zhang et al., IJCAI 2016), tau the update gap."""
    return Piece("staleness")


def delay_compensation(lam=0.04, *, adaptive=False, lam0=2.0, m=0.95, eps=1e-7) -> Piece:
    """DC-ASGD's ``g + lam·g⊙g⊙(w − w_read)`` (Zheng et al., ICML 2017); ``adaptive``
    uses ``lam0 / sqrt(MS + eps)`` with ``MS`` a moving mean of ``g⊙g`` (rate ``m``)."""
    return Piece("dc", {"lam": lam, "adaptive": adaptive, "lam0": lam0, "m": m, "eps": eps})


def gap_aware(gamma=0.999, lr_max: Optional[float] = None) -> Piece:
    """Gap-Aware's ``g / G``, ``G = 1 + |w − w_read| / C`` (Barkai et al., ICLR 2020)."""
    return Piece("gap", {"gamma": gamma, "lr_max": lr_max})


def momentum(mu) -> Piece:
    """Heavy-ball momentum ``m ← mu·m + u`` (u: the gradient as corrected so far);
    the step is ``lr·m``. State per worker, lazy on sparse rows."""
    return Piece("momentum", {"mu": mu})


def adagrad(eps=1e-10, initial_accumulator_value=0.0, *, rowwise=False) -> Piece:
    """AdaGrad's scaling ``u = g / (sqrt(s) + eps)``, ``s ← s + g⊙g`` (Duchi et al.,
    JMLR 2011); ``rowwise``: one accumulator per row fed the row's mean of ``g⊙g``
    (LIBMF's FPSG). See :class:`~hogkit.rules.core.AdaGrad`."""
    return Piece("adagrad", {"eps": eps, "initial_accumulator_value": initial_accumulator_value,
                             "rowwise": rowwise})


def rmsprop(alpha=0.99, eps=1e-8, *, rowwise=False) -> Piece:
    """RMSProp's scaling ``u = g / (sqrt(s) + eps)``, ``s ← alpha·s + (1 − alpha)·g⊙g``
    (Tieleman & Hinton 2012). See :class:`~hogkit.rules.core.RMSProp`."""
    return Piece("rmsprop", {"alpha": alpha, "eps": eps, "rowwise": rowwise})


_MAKERS = {"staleness": "scale_by_staleness", "dc": "delay_compensation",
           "gap": "gap_aware", "momentum": "momentum", "adagrad": "adagrad",
           "rmsprop": "rmsprop"}
_CORRECTIONS = ("staleness", "dc", "gap")
_SCALINGS = ("adagrad", "rmsprop")


def chain(*pieces, lr):
    """The rule that applies ``pieces`` in order, then ``w -= lr·u`` (see the module
    docstring); one of :class:`~hogkit.rules.core.SGD`, :class:`~hogkit.rules.core.StalenessAware`,
    :class:`~hogkit.rules.core.DelayCompensated`, :class:`~hogkit.rules.core.GapAware`,
    :class:`~hogkit.rules.core.AdaGrad`, :class:`~hogkit.rules.core.RMSProp`."""
    from hogkit.rules import core as rules
    for i, p in enumerate(pieces):
        if not isinstance(p, Piece):
            raise InvalidType(f"chain() piece {i} is {p!r}; pass pieces from "
                              f"hogkit.rules.compose ({', '.join(m + '()' for m in _MAKERS.values())})")
    kinds = [p.kind for p in pieces]
    for k in set(kinds):
        if kinds.count(k) > 1:
            raise InvalidArgument(f"chain{_show(pieces)} has {_MAKERS[k]}() twice; give it once")
    if any(k in _SCALINGS for k in kinds):
        return _adaptive(pieces, kinds, lr)
    fixes = [k for k in kinds if k in _CORRECTIONS]
    if len(fixes) > 1:
        raise InvalidArgument(
            f"chain{_show(pieces)} stacks two staleness corrections "
            f"({', '.join(_MAKERS[k] + '()' for k in fixes)}); no fused kernel computes "
            f"both: keep one")
    mu = 0.0
    if "momentum" in kinds:
        if kinds[-1] != "momentum":
            raise InvalidArgument(
                f"chain{_show(pieces)} puts momentum() before {_MAKERS[kinds[-1]]}(): the "
                f"kernels correct the gradient, then accumulate momentum; put momentum() "
                f"last")
        mu = pieces[-1].options["mu"]
    fix = pieces[kinds.index(fixes[0])] if fixes else None
    if fix is None:
        return rules.SGD(lr, momentum=mu)
    if fix.kind == "staleness":
        return rules.StalenessAware(lr, momentum=mu)
    if fix.kind == "gap":
        return rules.GapAware(lr, momentum=mu, **fix.options)
    if mu:
        raise InvalidArgument(f"chain{_show(pieces)}: DC-ASGD's kernel has no momentum "
                              f"term; drop momentum() or use gap_aware() with momentum()")
    return rules.DelayCompensated(lr, **fix.options)


def _adaptive(pieces, kinds, lr):
    """The AdaGrad / RMSProp rule of a chain with a scaling piece, or the refusal."""
    from hogkit.rules import core as rules
    show = _show(pieces)
    scal = [k for k in kinds if k in _SCALINGS]
    if len(scal) > 1:
        raise InvalidArgument(f"chain{show} has two adaptive scalings (adagrad() and "
                              f"rmsprop()); no kernel computes both: keep one")
    k = scal[0]
    name = _MAKERS[k] + "()"
    for other in kinds:
        if other == "momentum":
            raise InvalidArgument(
                f"chain{show}: the {name} kernel has no momentum term (torch's default "
                f"has none either); drop momentum(), or use momentum() without {name}")
        if other in ("dc", "gap"):
            raise InvalidArgument(
                f"chain{show}: no kernel puts {_MAKERS[other]}()'s correction on top of "
                f"{name}'s step; use {name} alone, scale_by_staleness() before it, or "
                f"{_MAKERS[other]}() without it")
    staleness = "staleness" in kinds
    if staleness and kinds.index("staleness") > kinds.index(k):
        raise InvalidArgument(
            f"chain{show} puts scale_by_staleness() after {name}: the kernel damps the "
            f"gradient before it enters the accumulator; put scale_by_staleness() first")
    cls = rules.AdaGrad if k == "adagrad" else rules.RMSProp
    return cls(lr, scale_by_staleness=staleness, **pieces[kinds.index(k)].options)


def _show(pieces):
    return "(" + ", ".join(repr(p) for p in pieces) + ")"
