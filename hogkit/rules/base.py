"""The rule contract: what an update rule says about itself, said once.

An update rule is a small frozen object (a dataclass of its hyper-parameters) that

- **names its configuration**: :meth:`Rule.cfg` returns the ``NamedTuple`` the kernels
  take (``hogkit.kernels.rule``); its class picks the kernels every engine runs (the
  compiled step core, both simulator engines, :meth:`Rule.apply` and
  ``hogkit.optim``), registered beside them in ``kernels/`` with
  ``kernels.rule.register``. A configuration nothing registered is refused here, with
  the fix, and fails to compile there;
- **names its state**: :attr:`Rule.state` (a :class:`State`: the names of its first
  and second state arrays, whether it counts steps, whether the first is one value per
  row), ``init`` makes it, ``shared_state`` says whether the workers of a run keep one
  state (Adam: its moments and bias correction count every worker's updates) or one
  each;
- **declares its capabilities** instead of letting the engines ask its class:
  ``needs_read`` (the gradient's read copies: DC-ASGD, Gap-Aware), ``gap_scaled``
  (it scales by the update gap, which the per-sample lane does not measure per
  sample), ``plain_sgd`` (``w -= lr·g`` exactly: a workload's fused SGD kernel may
  stand in for it), ``counts_updates`` (its step takes the update count ``t``),
  ``lr_fields`` (the hyper-parameters that scale with the learning rate);
- **is spelled**: a class that declares ``spell`` (its names: ``"gap-aware"``,
  ``("adagrad", "adagrad-rowwise")``) joins the registry that :func:`from_string`, so
  ``hogkit.parse.parse_rule``, the CLI's ``--rule``, sweeps and ``hogkit.optim`` read:
  a new rule needs no edit there.

Apply protocol (``docs/contracts.md``)::

    rule.init(params) -> state       dict of arrays, keys "<slot>/<param name>"
    rule.apply(params, grads, state, *, staleness=0, rank=0, t=None) -> None

``apply`` validates every gradient at the Python boundary, then calls one kernel per
gradient; nothing is written until every gradient of the call has passed its checks,
so a bad input leaves parameters and state as they were. Parameters of any ndim >= 1
are accepted: a dense ``Grad`` is applied to the flat view of its parameter, a sparse
one indexes the first axis with the parameter seen as ``(n, prod(shape[1:]))`` (no
copy). Duplicate rows add up like ``np.add.at``; stateful rules process duplicates one
after the other.

State ownership: the state ``init`` returns is per worker unless the rule declares
``shared_state``; a runtime that wants shared state places the same arrays (views of a
shared store) in every worker's state dict, and the read-modify-write of the shared
state is then a Hogwild! race like the parameter update.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, NamedTuple, Optional

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.kernels import guard as _guard
from hogkit.kernels import rule as _kr
from hogkit.validation import (FLOAT_DTYPES, check_array, check_float, check_grads,
                               check_indices, check_int)

__all__ = ["Rule", "State", "from_string", "names", "spellings", "classes", "has_momentum"]

_INT64 = np.dtype(np.int64)

#: spelling -> rule class (every class that declares ``spell``), in definition order
_REGISTRY: dict = {}


class State(NamedTuple):
    """A rule's state, by name: ``first`` and ``second`` (the ``"<slot>/<name>"``
    prefixes of its state arrays, in the kernels' order ``S1``, ``S2``; None: unused),
    ``counts`` (a per-parameter int64 step count ``"k/<name>"``), ``per_row`` (the first
    array holds one value per row of the parameter's 2-D view, ``(rows, 1)``)."""
    first: Optional[str] = None
    second: Optional[str] = None
    counts: bool = False
    per_row: bool = False


# --- the registry ----------------------------------------------------------------------

def names() -> tuple:
    """Every registered spelling, in registration order (``hogkit run --rule``)."""
    return tuple(_REGISTRY)


def spellings() -> str:
    """The registered spellings for a message: ``sgd, staleness-aware, ...``."""
    return ", ".join(_REGISTRY)


def classes() -> tuple:
    """The registered rule classes, each once, in registration order."""
    return tuple(dict.fromkeys(_REGISTRY.values()))


def from_string(text, *, lr, momentum=0.0):
    """The rule a string names: ``name[:setting]`` (``dc-asgd:0.2``), case-insensitive,
    with learning rate ``lr`` and ``momentum`` (0: none; refused by a rule without
    momentum). :func:`names` lists the registered names."""
    if not isinstance(text, str):
        raise InvalidType(f"rule must be a string such as 'gap-aware', got "
                          f"{type(text).__name__}")
    name, _, arg = text.strip().lower().partition(":")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise InvalidArgument(f"unknown rule {text!r}; expected one of {spellings()}")
    if momentum and not has_momentum(cls):
        with_momentum = ", ".join(n for n, c in _REGISTRY.items() if has_momentum(c))
        raise InvalidArgument(f"--momentum {momentum} with --rule {name}: {name} has no "
                              f"momentum term; drop --momentum or pick {with_momentum}")
    return cls.from_spell(name, arg, lr=lr, momentum=momentum)


def has_momentum(cls) -> bool:
    """Whether the rule class takes a ``momentum`` hyper-parameter."""
    return "momentum" in {f.name for f in dataclasses.fields(cls)}


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


def _per_row(rule, state, slot, item):
    """A row-wise first state array for ``item``: ``(rows, 1)`` on sparse rows, flat
    (one value per row) for a dense gradient."""
    key = f"{slot}/{item.name}"
    a = state.get(key) if isinstance(state, Mapping) else None
    want = (item.param.shape[0], 1)
    if isinstance(a, np.ndarray) and a.shape != want:
        raise InvalidArgument(
            f"state[{key!r}] has shape {a.shape}; {rule!r} keeps one value per row of "
            f"parameter {item.name!r} {item.param.shape}, shape {want}; build the state "
            f"with rule.init(params)")
    a = _slot(state, slot, item, shape=want)
    return a if item.rows is not None else a.reshape(-1)


def _check_staleness(staleness):
    return check_int("staleness", staleness, min_value=0,
                     fix="staleness is the number of updates by others since the read")


def check_lr(lr):
    """A learning rate: a positive float."""
    return check_float("lr", lr, min_value=0.0, exclude_min=True,
                       fix="use a positive learning rate such as 0.01")


def check_unit(name, value, fix=""):
    """A rate in [0, 1)."""
    return check_float(name, value, min_value=0.0, max_value=1.0, exclude_max=True, fix=fix)


def check_flag(name, value):
    """A bool setting (True or False)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidType(f"{name}={value!r} must be a bool (True or False)")
    return bool(value)


_NO_K = np.zeros(1, np.int64)
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


# --- the base class -----------------------------------------------------------------------

class Rule:
    """Base of the update rules (a frozen dataclass each; see the module docstring).

    A subclass sets the class attributes it differs in, implements :meth:`cfg` (and
    :attr:`state` when it keeps any), and, to be spelled, ``spell`` and
    :meth:`from_spell`."""

    #: the names it is spelled by (``hogkit run --rule NAME``); () for none
    spell: tuple = ()
    #: the gradient's read copies (``Grad.read``) are needed
    needs_read = False
    #: one state for all the workers of a run, not one each
    shared_state = False
    #: the step takes ``t``, the update count of the state (``kernels.rule``)
    counts_updates = False
    #: the hyper-parameters that scale with the learning rate (:meth:`scaled`)
    lr_fields = ("lr",)
    #: state slot -> its name in a torch optimizer's ``state[p]`` (``hogkit.optim``)
    torch_state: dict = {"k": "step"}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for name in cls.__dict__.get("spell", ()):
            if name in _REGISTRY and _REGISTRY[name].__qualname__ != cls.__qualname__:
                raise ValueError(f"rule name {name!r} is taken by {_REGISTRY[name]!r}")
            _REGISTRY[name] = cls

    # --- what a subclass says --------------------------------------------------------
    def cfg(self) -> tuple:  # pragma: no cover - abstract
        """The kernels' configuration (a ``NamedTuple`` registered with
        ``hogkit.kernels.rule``)."""
        raise NotImplementedError

    @property
    def state(self) -> State:
        """Its state by name (none by default)."""
        return State()

    @property
    def gap_scaled(self) -> bool:
        """It scales each update by the update gap (not measured per sample)."""
        return False

    @property
    def plain_sgd(self) -> bool:
        """It is ``w -= lr·g`` exactly (a workload's fused SGD kernel may stand in)."""
        return False

    @classmethod
    def from_spell(cls, name, arg, *, lr, momentum=0.0):  # pragma: no cover - abstract
        """The rule ``name[:arg]`` (one of ``spell``) at ``lr`` and ``momentum``."""
        raise NotImplementedError

    # --- what every rule shares ----------------------------------------------------------
    def kernel_cfg(self) -> tuple:
        """:meth:`cfg`, refused with the fix when no kernels are registered for it."""
        c = self.cfg()
        if not _kr.registered(type(c)):
            raise InvalidArgument(
                f"{self!r}: no kernels are registered for its configuration "
                f"{type(c).__name__}; register them with hogkit.kernels.rule.register("
                f"{type(c).__name__}, rows=..., flat=...) in the module that defines it")
        return c

    def init(self, params):
        """Fresh state for ``params``: zeros like each parameter for every slot the
        rule uses (``"<slot>/<name>"``; a per-row first slot ``(rows, 1)``), and an int64
        ``(1,)`` step count ``"k/<name>"`` when it counts steps."""
        st = self.state
        out = {}
        if st.first:
            start = self._start()
            for k, p in params.items():
                out[f"{st.first}/{k}"] = (
                    np.full((p.shape[0] if p.ndim else 1, 1), start, p.dtype) if st.per_row
                    else np.full_like(p, start))
        if st.second:
            out.update({f"{st.second}/{k}": np.zeros_like(v) for k, v in params.items()})
        if st.counts:
            out.update({f"k/{k}": np.zeros(1, np.int64) for k in params})
        return out

    def _start(self):
        """The first state array's start value (0.0; AdaGrad's may differ)."""
        return 0.0

    def with_lr(self, lr):
        """This rule at learning rate ``lr``: every learning-rate hyper-parameter
        (:attr:`lr_fields`) that equals ``lr`` now moves to the new value, the others
        keep their ratio to it (Gap-Aware's ``lr_max``)."""
        old = self.lr
        return dataclasses.replace(self, **{
            f: lr if getattr(self, f) == old else getattr(self, f) * (lr / old)
            for f in self.lr_fields})

    def scaled(self, factor):
        """This rule with every learning-rate hyper-parameter (:attr:`lr_fields`)
        multiplied by ``factor`` (the per-sample lane's share of a batch-mean step)."""
        return dataclasses.replace(self, **{f: getattr(self, f) * factor
                                            for f in self.lr_fields})

    def config(self) -> dict:
        out = {"name": type(self).__name__}
        out.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        return out

    def apply(self, params, grads, state, *, staleness=0, rank=0, t=None):
        """Apply ``grads`` to ``params`` in place at ``staleness`` (updates applied by
        others since the gradient's read); ``rank`` (the worker's id) is accepted for
        symmetry and unused; ``t`` the update count of the state, this update included,
        for a state the workers share (an engine's clocks); None: the rule counts its
        own steps (``"k/<name>"``).
        Nothing is written unless every gradient passes its checks."""
        tau = _check_staleness(staleness)
        items = _prepare(self, params, grads, needs_read=self.needs_read)
        st = self.state
        s1 = [(_per_row(self, state, st.first, it) if st.per_row
               else _slot(state, st.first, it)) if st.first else _empty(it) for it in items]
        s2 = [_slot(state, st.second, it) if st.second else _empty(it) for it in items]
        ks = [_slot(state, "k", it, dtype=np.int64, shape=(1,)) if st.counts else _NO_K
              for it in items]
        c = self.kernel_cfg()
        for it, a, b, k in zip(items, s1, s2, ks):
            n = -1 if t is None else int(t)
            read = it.read if it.read is not None else _empty(it)
            if it.rows is None:
                _kr.flat_now(c, it.p, a, b, k, 0, it.g, read, tau, n)
            else:      # the row kernels turn the read copies into gaps in place
                read = read.copy() if it.read is not None else read
                _kr.rows_now(c, it.p, a, b, k, 0, it.rows, it.g, read, -1, tau, False, n)
