"""``torch.optim``-style optimizers over hogkit's update rules, for your own loop.

Each class subclasses ``torch.optim.Optimizer`` (param groups, ``zero_grad``,
``state_dict`` / ``load_state_dict``, ``torch.optim.lr_scheduler``) and applies its
rule with hogkit's kernels, in place, to the (shared) parameters::

    opt = hogkit.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hogkit.optim.StalenessAware(model.parameters(), lr=0.05)
    opt = hogkit.optim.DelayCompensated(model.parameters(), lr=0.05, lam=0.04)
    opt = hogkit.optim.GapAware(model.parameters(), lr=0.05, momentum=0.9)
    opt = hogkit.optim.Adagrad(model.parameters(), lr=0.1)      # torch.optim's names
    opt = hogkit.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.99)
    opt = hogkit.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))

Every rule of the rules' registry (``hogkit.rules.base``) is an optimizer here: the
classes below add torch's argument names where they differ; any other registered rule
is made on first use, taking its own hyper-parameters as keyword arguments
(``hogkit.optim.Adam``).

Inside :func:`hogkit.spawn`, ``step()`` is a whole hogkit step after your backward:
guard (a non-finite gradient is refused, or skipped and counted with
``nonfinite="skip"``), optional :class:`~hogkit.rules.density.Density`, the update gap τ
(updates by other workers since this worker's read), the rule at τ, the clock tick,
the staleness record, then the policy's wait before the next iteration, which is also
where the next read is marked. It is :class:`hogkit.engine.step.PythonStep`'s ``apply``:
the same code ``hogkit.train`` runs. Outside ``spawn`` it is an ordinary
single-process optimizer (τ = 0, no waiting).

Rules that need the values a gradient was computed from (DC-ASGD, Gap-Aware) keep a
private copy of the parameters taken at each read: one parameter-sized copy a step.

Like torch's, ``step()`` runs the step hooks (``register_step_pre_hook`` and the rest)
and carries the profiler's ``Optimizer.step#...`` label, and ``zero_grad()`` its label;
unlike torch's, each skips that wrapper (~5 us a call) when no hook is registered and
no profiler runs.

Sparse gradients (``nn.Embedding(..., sparse=True)``) are applied as sparse rows:
only the rows in the batch are written (the Hogwild! case).

State: per parameter, the rule's slots as tensors in ``optimizer.state[p]``, under
torch's names where the rule gives them (``rule.torch_state``: ``"step"`` the step
count, ``"sum"`` AdaGrad's and ``"square_avg"`` RMSProp's accumulator, ``"exp_avg"``
and ``"exp_avg_sq"`` Adam's moments), else its own (``"m"`` momentum, ``"v"``
Gap-Aware's second moment, ``"ms"`` DC-ASGD-adaptive's mean square, ``"r"`` a density
residual); they are private to each worker's optimizer, and a rule that counts its
updates (Adam) counts this worker's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from hogkit.rules import base as _base
from hogkit.rules import core as _rules
from hogkit.errors import InvalidArgument, InvalidType, NonFiniteGradient
from hogkit.kernels import step as _ks
from hogkit.kernels.layout import RT_HELD as _RT_HELD
from hogkit.kernels.layout import RT_NONFINITE as _RT_NONFINITE
from hogkit.validation import check_choice, grads_finite
from hogkit.workloads.module import flat_grads

__all__ = ["Optimizer", "SGD", "StalenessAware", "DelayCompensated", "GapAware", "Adagrad",
           "RMSprop", "optimizer_for"]

_FLOATS = (torch.float32, torch.float64)


class Optimizer(torch.optim.Optimizer):
    """Base of hogkit's optimizers: ``rule_class`` (a :mod:`hogkit.rules.core` class)
    built per param group from the group's hyper-parameters (rebuilt when a
    scheduler or the user changes them). ``density``: an optional
    :class:`~hogkit.rules.density.Density` applied to every update before the rule;
    ``nonfinite``: "raise" (default) or "skip"; ``worker``: the
    :class:`~hogkit.spawning.Worker` to drive (default: this process's inside
    :func:`hogkit.spawn`, else a private one)."""

    rule_class = None

    def __init__(self, params, defaults, *, density=None, nonfinite="raise", worker=None):
        self._rules = {}
        self._pstep = None
        self._lane = None
        super().__init__(params, defaults)
        self.nonfinite = check_choice("nonfinite", nonfinite, ("raise", "skip"))
        if density is not None and not callable(getattr(density, "filter", None)):
            raise InvalidType(f"density={density!r} must be a hogkit.Density or None")
        self.density = density
        for group in self.param_groups:
            self._rule_for(group)                 # bad hyper-parameters fail here
        if worker is None:
            from hogkit.spawning import Worker, current_worker
            worker = current_worker() or Worker.solo()
        self.worker = worker
        self.skipped = 0
        self._names = None
        self._read = None

    # --- rules per group ------------------------------------------------------------
    def _rule_for(self, group):
        """The rule for ``group``'s hyper-parameters now (cached while they hold)."""
        fields = _fields(self.rule_class)
        key = tuple([group.get(f) for f in fields])
        cached = self._rules.get(id(group))
        if cached is not None and cached[0] == key:
            return cached[1]
        rule = self.rule_class(**{f: v for f, v in zip(fields, key) if f in group})
        self._rules[id(group)] = (key, rule)      # (checks lr, momentum, ...)
        return rule

    # --- the step -----------------------------------------------------------------
    def step(self, closure=None):
        """Apply one update from the parameters' ``.grad`` (see the module doc);
        returns ``closure()``'s loss when a closure is given.

        torch wraps every optimizer's ``step`` in its profiler label and step hooks,
        ~5 us a call even when nothing listens. hogkit's takes that way only when
        something does: a step hook (this optimizer's or a global one) or a running
        profiler; otherwise it goes straight to the step."""
        if _listened(self):                # (hooks see step()'s call as it was made)
            return (self._profiled_step() if closure is None
                    else self._profiled_step(closure=closure))
        return self._apply_step(closure)

    def zero_grad(self, set_to_none=True):
        """torch's ``zero_grad`` (the same effect); with ``set_to_none`` and no
        profiler running, without its profiler label."""
        if not set_to_none or torch.autograd._profiler_enabled():
            return super().zero_grad(set_to_none)
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def _apply_step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        step = self._prepare_step()
        worker = self.worker
        k = worker.iterations
        lane = self._lane
        G = lane.grads(self._order) if lane is not None else None
        if G is not None:                      # one compiled call: guard .. record
            r = worker.reader
            rules = (lane.groups, lane.S1, lane.S2, lane.K, False)   # private state
            finite = _ks.dense_end(lane.params, G, lane.RD, rules, lane.log, lane.slots,
                                   (worker.rank, r.others_read(), r.lag, k, -1)) >= 0
        else:
            grads = self._grads()
            finite = grads_finite(grads) if grads else True
            if finite and grads and step.apply(grads, k) < 0:
                worker.rt[_RT_HELD] += 1
        if not finite:
            if self.nonfinite == "raise":
                raise NonFiniteGradient.at(f"worker {worker.rank}", k)
            self.skipped += 1
            worker.rt[_RT_NONFINITE] += 1
        worker.end_iteration()
        if self._read is not None:
            self._snapshot()
        return loss

    def _prepare_step(self):
        """The PythonStep (and its one-call lane) for the current groups, rules and
        state: rebuilt when the parameters or the rules' state layout change; a
        scheduler's new ``lr`` only swaps the rules' hyper-parameters."""
        rules = tuple(self._rule_for(g) for g in self.param_groups)
        if self._pstep is not None:
            ptrs = tuple([p.data_ptr() for p in self._order])   # p.data rebound?
            if ptrs == self._layout[1] and all(a is b for a, b in
                                               zip(rules, self._rules_now)):
                return self._pstep
            layout = tuple((type(r), r.state) for r in rules)
            if (layout, ptrs) == self._layout:
                self._pstep.rule.members = [(r, n) for r, (_, n) in
                                            zip(rules, self._pstep.rule.members)]
                if self._lane is not None:
                    self._lane.set_rules(self._pstep.rule)
                self._rules_now = rules
                return self._pstep
        from hogkit.engine.step import PythonStep
        self._names, self._order = {}, []
        params, members = {}, []
        for gi, g in enumerate(self.param_groups):
            names = []
            for p in g["params"]:
                name = str(len(self._names))
                self._names[p] = name
                self._order.append(p)
                params[name] = _array(p, name)
                names.append(name)
            members.append((rules[gi], names))
        rule = _Groups(members)
        self._K = np.zeros(len(params), np.int64)   # Gap-Aware's step counts, one home
        state = self._state(members, params)
        dstate = (self._slots(self.density.init(params), params)
                  if self.density is not None else None)
        self._params = params
        self._pstep = PythonStep(None, None, rank=self.worker.rank, rule=rule,
                                 rule_state=state, density=self.density,
                                 density_state=dstate, reader=self.worker.reader,
                                 clocks=self.worker.clocks, params=params,
                                 nonfinite=self.nonfinite)
        self._rules_now = rules
        self._layout = (tuple((type(r), r.state) for r in rules),
                        tuple(p.data_ptr() for p in self._order))
        if rule.needs_read and self._read is None:
            self._read = {}
            self._snapshot()
        elif not rule.needs_read:
            self._read = None
        self._lane = _Lane.build(self, rule, state, params)
        return self._pstep

    def _state(self, members, params):
        """The rules' state as one ``"<slot>/<name>"`` dict of numpy views of the
        tensors in ``self.state[p]`` (created, or taken from a loaded state dict)."""
        out = {}
        for rule, names in members:
            out.update(self._slots(rule.init({n: params[n] for n in names}), params,
                                   rule.torch_state))
        return out

    def _slots(self, fresh, params, torch_names=None):
        """For every ``"<slot>/<name>"`` array of a fresh ``init``: the tensor in
        ``self.state[p][slot]`` (named ``torch_names[slot]`` where the rule gives torch's
        name) when it exists (loaded or from earlier steps; its values converted to the
        fresh array's dtype and shape), else the fresh one."""
        torch_names = torch_names or {}
        by_name = {n: p for p, n in self._names.items()}
        out = {}
        for key, arr in fresh.items():
            slot, name = key.split("/", 1)
            if slot == "k":                    # a view of the lane's step counts
                arr = self._K[int(name):int(name) + 1]
            p = by_name[name]
            tslot = torch_names.get(slot, slot)
            st = self.state[p]
            t = st.get(tslot)
            if t is not None:
                t = torch.as_tensor(t)
                if t.numel() != arr.size:
                    raise InvalidArgument(
                        f"optimizer state {tslot!r} of parameter {name} has "
                        f"{t.numel()} values, the parameter needs {arr.size}; load a "
                        f"state_dict saved for the same model")
                np.copyto(arr, t.detach().cpu().numpy().reshape(arr.shape),
                          casting="unsafe")
            st[tslot] = torch.from_numpy(arr)
            out[key] = arr
        return out

    def _grads(self):
        """Every parameter's ``.grad`` as a ``Grad`` (none for a missing grad, as
        torch's optimizers skip it), with the read copy where the rule needs it."""
        from hogkit.workloads.module import as_grad
        read = self._read
        return [as_grad(self._names[p], p.grad, None if read is None else
                        read.get(self._names[p]))
                for g in self.param_groups for p in g["params"] if p.grad is not None]

    def _snapshot(self):
        """The values the next gradient will be computed from (DC-ASGD, Gap-Aware)."""
        for name, a in self._params.items():
            r = self._read.get(name)
            if r is None:
                self._read[name] = a.copy()
            else:
                np.copyto(r, a)

    # --- torch.optim plumbing -------------------------------------------------------
    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._pstep = None            # re-derive the numpy views from the loaded tensors

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._pstep = None


# torch's profiler label and step hooks, taken only when something listens (see step())
Optimizer._profiled_step = torch.optim.Optimizer.profile_hook_step(Optimizer._apply_step)
Optimizer.step.hooked = True          # torch's __init__ wraps a step not marked so
try:
    from torch.optim.optimizer import _global_optimizer_post_hooks as _GLOBAL_POST
    from torch.optim.optimizer import _global_optimizer_pre_hooks as _GLOBAL_PRE
except ImportError:                   # a torch without them: always torch's way
    _GLOBAL_PRE = _GLOBAL_POST = None


def _listened(opt):
    """Whether a step hook or a profiler wants this step (then torch's wrapper runs)."""
    return bool(_GLOBAL_PRE is None or _GLOBAL_PRE or _GLOBAL_POST
                or opt._optimizer_step_pre_hooks or opt._optimizer_step_post_hooks
                or torch.autograd._profiler_enabled())


_FIELDS = {}


def _fields(cls):
    """A rule class's hyper-parameter names (cached: looked up every step)."""
    f = _FIELDS.get(cls)
    if f is None:
        f = _FIELDS[cls] = tuple(x.name for x in dataclasses.fields(cls))
    return f


def _array(p, name):
    """A parameter's numpy view (no copy: the kernels write the tensor itself); CPU,
    float32/float64 and contiguous, else a clear error."""
    if p.device.type != "cpu":
        raise InvalidArgument(f"parameter {name} is on {p.device}; hogkit's optimizers run "
                              f"on CPU tensors")
    if p.dtype not in _FLOATS:
        raise InvalidType(f"parameter {name} is {p.dtype}; use float32 or float64")
    if not p.is_contiguous():
        raise InvalidArgument(f"parameter {name} is not contiguous, so an update in place "
                              f"would miss it; use p.data = p.data.contiguous() first")
    return p.detach().numpy()


class _Lane:
    """The one-call step (``kernels.step.dense_end``) for dense gradients of one
    dtype with kernel rules and no density: every array encoded once, flat."""

    @classmethod
    def build(cls, opt, rule, state, params):
        arrays = list(params.values())
        dtypes = {a.dtype for a in arrays}
        reader = opt.worker.reader
        if (opt.density is not None or len(dtypes) != 1 or reader.log is None
                or reader.per_shard
                or not all(isinstance(r, _base.Rule) for r, _ in rule.members)):
            return None
        return cls(opt, rule, state, params, dtypes.pop())

    def __init__(self, opt, rule, state, params, dtype):
        self.torch_dtype = torch.float32 if dtype == np.float32 else torch.float64
        names = list(params)
        self.params = tuple(params[n].reshape(-1) for n in names)
        empty = np.empty(0, dtype)

        def slot(i, n, which):
            s = getattr(self.rule_of[i].state, which)
            return state[f"{s}/{n}"].reshape(-1) if s else empty

        self.rule_of = [None] * len(names)
        self.set_rules(rule)
        self.S1 = tuple(slot(i, n, "first") for i, n in enumerate(names))
        self.S2 = tuple(slot(i, n, "second") for i, n in enumerate(names))
        self.K = opt._K
        self.RD = (tuple(opt._read[n].reshape(-1) for n in names)
                   if opt._read is not None else tuple(empty for _ in names))
        self.slots = opt.worker.clocks.slots
        self.log = opt.worker.reader.log.arrays()

    def set_rules(self, groups):
        """Each param group's rule configuration over its parameters (again after a
        scheduler step): ``(cfg, first, last + 1)`` a group, for ``dense_end``."""
        for r, names in groups.members:
            for n in names:
                self.rule_of[int(n)] = r
        self.groups = tuple((r.kernel_cfg(), lo, lo + len(names))
                            for (r, names), lo in zip(groups.members, _starts(groups)))

    def grads(self, order):
        """The step's gradients, flat, or None when one is missing, sparse or of
        another dtype (then the general path runs)."""
        return flat_grads(order, self.torch_dtype)


class _Groups:
    """One rule per param group, applied as one (the PythonStep's ``rule``)."""

    def __init__(self, members):
        self.members = members              # [(rule, [names])]
        self.group_of = {n: i for i, (_, names) in enumerate(members) for n in names}
        self.needs_read = any(r.needs_read for r, _ in members)
        self.counts_updates = any(r.counts_updates for r, _ in members)

    def apply(self, params, grads, state, *, staleness=0, rank=0, t=None):
        parts = [[] for _ in self.members]
        for g in grads:
            parts[self.group_of[g.name]].append(g)
        for (rule, _), part in zip(self.members, parts):
            if part:
                rule.apply(params, part, state, staleness=staleness, rank=rank, t=t)


def _starts(groups):
    """The index of each group's first parameter (parameters are numbered in group
    order)."""
    out, n = [], 0
    for _, names in groups.members:
        out.append(n)
        n += len(names)
    return out


class SGD(Optimizer):
    """SGD with optional heavy-ball momentum (:class:`hogkit.rules.core.SGD`)."""

    rule_class = _rules.SGD

    def __init__(self, params, lr, momentum=0.0, **kw):
        super().__init__(params, dict(lr=lr, momentum=momentum), **kw)


class StalenessAware(Optimizer):
    """lr / max(τ, 1) (:class:`hogkit.rules.core.StalenessAware`, Zhang et al. 2016)."""

    rule_class = _rules.StalenessAware

    def __init__(self, params, lr, momentum=0.0, **kw):
        super().__init__(params, dict(lr=lr, momentum=momentum), **kw)


class DelayCompensated(Optimizer):
    """DC-ASGD (:class:`hogkit.rules.core.DelayCompensated`, Zheng et al. 2017)."""

    rule_class = _rules.DelayCompensated

    def __init__(self, params, lr, lam=0.04, adaptive=False, lam0=2.0, m=0.95, eps=1e-7,
                 **kw):
        super().__init__(params, dict(lr=lr, lam=lam, adaptive=adaptive, lam0=lam0, m=m,
                                      eps=eps), **kw)


class GapAware(Optimizer):
    """Gap-Aware (:class:`hogkit.rules.core.GapAware`, Barkai et al. 2020)."""

    rule_class = _rules.GapAware

    def __init__(self, params, lr, momentum=0.0, gamma=0.999, lr_max=None, **kw):
        super().__init__(params, dict(lr=lr, momentum=momentum, gamma=gamma,
                                      lr_max=lr_max), **kw)

    def add_param_group(self, param_group):
        """``lr_max`` defaults to the group's lr as given (the schedule's largest), so
        a scheduler that lowers ``lr`` does not move the gap's unit."""
        super().add_param_group(param_group)
        g = self.param_groups[-1]
        if g.get("lr_max") is None:
            g["lr_max"] = g["lr"]


def _refuse(cls, **given):
    """torch's arguments a hogkit rule has no kernel for: refused unless at their
    no-op defaults (so torch code that spells the defaults out still runs)."""
    for name, (value, default) in given.items():
        if value != default:
            raise InvalidArgument(
                f"hogkit.optim.{cls}({name}={value!r}): hogkit's {cls} has no {name} "
                f"(its kernel computes torch's {cls} at {name}={default!r}); drop it, or "
                f"use torch.optim.{cls}")


class Adagrad(Optimizer):
    """AdaGrad (:class:`hogkit.rules.core.AdaGrad`, Duchi et al. 2011) with
    ``torch.optim.Adagrad``'s arguments and state name (``"sum"``); ``rowwise=True``:
    one accumulator per row (LIBMF's FPSG). ``lr_decay`` and ``weight_decay`` only at 0."""

    rule_class = _rules.AdaGrad

    def __init__(self, params, lr=0.01, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, *, rowwise=False, **kw):
        _refuse("Adagrad", lr_decay=(lr_decay, 0.0), weight_decay=(weight_decay, 0.0))
        super().__init__(params, dict(lr=lr, eps=eps, rowwise=rowwise,
                                      initial_accumulator_value=initial_accumulator_value),
                         **kw)


class RMSprop(Optimizer):
    """RMSProp (:class:`hogkit.rules.core.RMSProp`, Tieleman & Hinton 2012) with
    ``torch.optim.RMSprop``'s arguments and state name (``"square_avg"``);
    ``rowwise=True``: one accumulator per row. ``weight_decay``, ``momentum`` only at 0,
    ``centered`` only False."""

    rule_class = _rules.RMSProp

    def __init__(self, params, lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0,
                 momentum=0.0, centered=False, *, rowwise=False, **kw):
        _refuse("RMSprop", weight_decay=(weight_decay, 0.0), momentum=(momentum, 0.0),
                centered=(centered, False))
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, rowwise=rowwise), **kw)


_MADE = {}


def optimizer_for(rule_class):
    """The optimizer class of a registered rule (``hogkit.rules.base``): the one written
    here with torch's argument names, else one made from the rule's own
    hyper-parameters (its dataclass fields and their defaults, as keyword arguments
    after ``params``), named like the rule; made once, then kept."""
    for cls in (SGD, StalenessAware, DelayCompensated, GapAware, Adagrad, RMSprop):
        if cls.rule_class is rule_class:
            return cls
    made = _MADE.get(rule_class)
    if made is None:
        fields = {f.name: f.default for f in dataclasses.fields(rule_class)}

        def __init__(self, params, *, density=None, nonfinite="raise", worker=None,
                     **hyper):
            unknown = sorted(set(hyper) - set(fields))
            if unknown:
                raise InvalidArgument(
                    f"hogkit.optim.{rule_class.__name__}: no argument {unknown[0]!r}; "
                    f"its hyper-parameters are {', '.join(fields)}")
            given = {k: hyper.get(k, d) for k, d in fields.items()}
            missing = [k for k, v in given.items() if v is dataclasses.MISSING]
            if missing:
                raise InvalidArgument(f"hogkit.optim.{rule_class.__name__} needs "
                                      f"{missing[0]}=...")
            Optimizer.__init__(self, params, given, density=density, nonfinite=nonfinite,
                               worker=worker)

        made = _MADE[rule_class] = type(rule_class.__name__, (Optimizer,), {
            "rule_class": rule_class, "__init__": __init__, "__module__": __name__,
            "__doc__": f"{rule_class.__name__} (:class:`{rule_class.__module__}."
                       f"{rule_class.__name__}`) as a torch optimizer; its keyword "
                       f"arguments are the rule's hyper-parameters."})
    return made


def __getattr__(name):
    """``hogkit.optim.<Rule>`` for every registered rule without a class above."""
    for cls in _base.classes():
        if cls.__name__ == name:
            return optimizer_for(cls)
    raise AttributeError(f"module 'hogkit.optim' has no attribute {name!r}")
