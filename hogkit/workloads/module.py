"""Torch modules as workloads: ``TorchWorkload`` for your own ``nn.Module``, and the base
the built-in torch workloads (``mlp``, ``rnn``) stand on.

A torch workload trains a module whose parameters live in the shared store: each
worker builds its own copy of the module and rebinds every parameter to a zero-copy
view of shared memory (:func:`hogkit.state.store.bind_module`), so ``loss.backward()``
reads the live parameters (racy, by design) and the rule writes them in place.
Gradients (``p.grad``) stay private to the worker. The data lives in the shared data
store and each worker sees zero-copy tensors of it.

:class:`ModuleWorkload` is the machinery; a subclass says only what differs:

==============================  =======================================================
``make_module()``               a fresh module (parent and workers)
``step_loss(module, batch)``    the scalar loss tensor of one minibatch (mean over it)
``make_batch(tensors, idx)``    the minibatch for sampled row ids (default: every
                                training array at those rows)
``n_rows(tensors)``             how many rows there are to sample from
``build(seed)``                 initial parameters and the data (numpy dicts)
==============================  =======================================================

Its ``loss`` is ``step_loss`` averaged over up to ``eval_rows`` evenly spaced rows
(in chunks, no autograd), and ``metrics`` adds what ``extra_metrics`` returns.

:class:`TorchWorkload` wraps what a user has: a module (or a zero-argument factory),
``loss_fn(module, batch) -> scalar tensor`` and a dict of arrays. Everything it holds
must pickle (workers are spawned): define the module class and ``loss_fn`` at the top
level of a module or script, not as lambdas. The arrays are *not* pickled: they go
into the data store once; a module instance travels without its weights (on torch's
``meta`` device; the weights are in the parameter store).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.rules.grads import Grad
from hogkit.validation import check_float, check_int
from hogkit.workloads.base import Workload, check_keys, check_param, check_seed

__all__ = ["ModuleWorkload", "TorchWorkload", "as_grad", "as_tensor", "module_params",
           "weightless",
           "rebuild"]

_INT = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.bool_)


def as_tensor(a):
    """Zero-copy torch view of a numpy array (a copy only if it is read-only)."""
    import torch
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


def module_params(module, what="module"):
    """``{name: private numpy copy}`` of a module's parameters, checked
    (:func:`hogkit.state.store.module_arrays`)."""
    from hogkit.state.store import module_arrays
    return module_arrays(module, what)


def weightless(module):
    """``(template, buffers)``: a copy of ``module`` whose parameters are on torch's
    ``meta`` device (no storage: it pickles small, whatever the model's size; nothing
    is copied) and its buffers' values. :func:`rebuild` makes a CPU module of it."""
    import torch
    memo = {id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"),
                                      requires_grad=p.requires_grad)
            for p in module.parameters()}
    template = copy.deepcopy(module, memo)
    buffers = {k: b.detach().clone() for k, b in module.named_buffers()}
    return template.to("meta"), buffers


def rebuild(template, buffers):
    """A CPU module from :func:`weightless`'s output: parameters allocated (values
    undefined until bound or copied), buffers restored."""
    import torch
    m = copy.deepcopy(template).to_empty(device="cpu")
    with torch.no_grad():
        for name, b in m.named_buffers():
            b.copy_(buffers[name])
    return m


class _Ctx:
    """A worker's module bound to the shared params, its data tensors, and a second
    module bound to a private snapshot (``keep_read``: the exact values read)."""

    __slots__ = ("module", "names", "params", "zeros", "tensors", "n", "snap", "snap_module",
                 "snap_params")

    def __init__(self, module, tensors, n, snap_module, snap):
        self.module = module
        self.names = [name for name, _ in module.named_parameters()]
        self.params = [p for _, p in module.named_parameters()]
        self.zeros = {}
        self.tensors, self.n = tensors, n
        self.snap_module, self.snap = snap_module, snap
        self.snap_params = [p for _, p in snap_module.named_parameters()]


class ModuleWorkload(Workload):
    """A workload whose gradient is a torch module's autograd (see the module doc)."""

    needs_torch = True
    #: rows the loss is averaged over (evenly spaced; None: all of them)
    eval_rows = 4096
    #: data arrays sampled for training (None: all of them)
    train_keys = None
    #: the reported loss is ``step_loss`` times this (e.g. 1/ln 2: nats to bits)
    loss_scale = 1.0

    # --- what a subclass says -----------------------------------------------------
    def make_module(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def step_loss(self, module, batch):  # pragma: no cover - abstract
        raise NotImplementedError

    def make_batch(self, tensors, idx):
        """The minibatch at row ids ``idx`` (an int64 tensor): every training array
        at those rows."""
        return {k: tensors[k].index_select(0, idx) for k in self._train_keys(tensors)}

    def n_rows(self, tensors) -> int:
        return int(tensors[self._train_keys(tensors)[0]].shape[0])

    def extra_metrics(self, module, tensors) -> dict:
        """More metrics on the module bound to the evaluated params (default none)."""
        return {}

    def _train_keys(self, tensors):
        return list(self.train_keys) if self.train_keys is not None else list(tensors)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_eval", None)         # the parent's evaluation module stays here
        return state

    # --- parent -------------------------------------------------------------------
    def _seeded_module(self, seed):
        """``make_module()`` under ``torch.manual_seed(seed)``; the caller's global
        torch RNG is left as it was."""
        import torch
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(check_seed(seed))
            return self.make_module()

    def _bound(self, params, data):
        """A module bound to ``params`` and the data as tensors (cached per object)."""
        from hogkit.state.store import bind_module
        cache = self.__dict__.get("_eval")
        if cache is None:
            cache = self.__dict__["_eval"] = self.make_module()
        bind_module(cache, params, where="params", tensor=lambda k: as_tensor(params[k]))
        return cache, {k: as_tensor(v) for k, v in data.items()}

    def _mean_loss(self, module, tensors):
        import torch
        n = self.n_rows(tensors)
        if n <= 0:
            return float("nan")
        rows = (np.arange(n) if self.eval_rows is None or n <= self.eval_rows else
                np.linspace(0, n - 1, self.eval_rows).astype(np.int64))
        total, chunk = 0.0, 1024
        with torch.no_grad():
            for i in range(0, len(rows), chunk):
                idx = torch.from_numpy(rows[i:i + chunk])
                batch = self.make_batch(tensors, idx)
                try:
                    total += float(self.step_loss(module, batch)) * len(idx)
                except (IndexError, RuntimeError) as e:
                    raise _label_error(self.name, e, batch, rows[i:i + chunk]) or e
        return total / len(rows) * self.loss_scale

    def loss(self, params, data):
        """``step_loss`` averaged over up to ``eval_rows`` evenly spaced rows."""
        module, tensors = self._bound(params, data)
        return self._mean_loss(module, tensors)

    def metrics(self, params, data):
        import torch
        module, tensors = self._bound(params, data)
        out = {"loss": self._mean_loss(module, tensors)}
        with torch.no_grad():
            extra = self.extra_metrics(module, tensors)
        if not isinstance(extra, Mapping):
            raise InvalidType(f"metrics of workload {self.name!r} must be a dict "
                              f"name -> number, got {type(extra).__name__}")
        out.update({str(k): float(v) for k, v in extra.items()})
        return out

    # --- worker -------------------------------------------------------------------
    def setup(self, params, data, *, rank=0, seed=0):
        """A module bound to the shared ``params`` (checked against it) and a snapshot
        module for ``keep_read``."""
        from hogkit.state.store import bind_module
        module = self.make_module()
        shapes = {k: (tuple(p.shape), p.detach().numpy().dtype)
                  for k, p in module.named_parameters()}
        check_keys("params", params, tuple(shapes), self.name)
        for k, (shape, dt) in shapes.items():
            check_param(f"params[{k!r}]", params[k], shape, dtype=dt)
        train = self.train_keys if self.train_keys is not None else ()
        check_keys("data", data, tuple(train), self.name)
        module = bind_module(module, params, where="params")
        snap = {k: np.empty_like(params[k]) for k, _ in module.named_parameters()}
        snap_module = bind_module(self.make_module(), snap, where="the snapshot")
        tensors = {k: as_tensor(v) for k, v in data.items()}
        n = self.n_rows(tensors)
        if n < 1:
            raise InvalidArgument(f"workload {self.name!r} has no rows to train on; pass "
                                  f"what build() returned")
        return _Ctx(module, tensors, n, snap_module, snap)

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        return self.grads_of(ctx, self.backward(ctx, rng, batch, keep_read=keep_read),
                             keep_read=keep_read)

    def grads_of(self, ctx, ps, *, keep_read=False):
        """The ``.grad`` of the parameters ``ps`` (what :meth:`backward` returned) as
        ``Grad`` objects, with the read snapshot where ``keep_read``."""
        return [_grad(ctx, name, p, ctx.snap[name] if keep_read else None)
                for name, p in zip(ctx.names, ps)]

    def backward(self, ctx, rng, batch, *, keep_read=False):
        """The autograd half of :meth:`gradient`: sample ``batch`` rows, run the loss
        and ``backward`` (from a snapshot of the parameters with ``keep_read``); the
        gradients are left in the returned parameters' ``.grad`` (fresh tensors: the
        grads are set to None first, so nothing accumulates)."""
        import torch
        batch = check_int("batch", batch, min_value=1) if batch < 1 else batch
        idx = torch.from_numpy(rng.integers(0, ctx.n, size=batch))
        if keep_read:
            for name, p in zip(ctx.names, ctx.params):
                np.copyto(ctx.snap[name], p.data.numpy())
            module, ps = ctx.snap_module, ctx.snap_params
        else:
            module, ps = ctx.module, ctx.params
        for p in ps:
            p.grad = None      # backward then allocates fresh grads: values need no copy
        loss = self.step_loss(module, self.make_batch(ctx.tensors, idx))
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise InvalidType(f"the loss of workload {self.name!r} must be a scalar "
                              f"tensor (e.g. a mean over the batch), got "
                              f"{getattr(loss, 'shape', type(loss).__name__)}")
        loss.backward()
        return ps


def _grad(ctx, name, p, read):
    """``p``'s gradient as a ``Grad`` (:func:`as_grad`), zeros for a parameter the loss
    did not use."""
    if p.grad is None:
        z = ctx.zeros.get(name)
        if z is None:
            z = ctx.zeros[name] = np.zeros(tuple(p.shape), p.detach().numpy().dtype)
        return Grad(name, z, read=read)
    return as_grad(name, p.grad, read)


def flat_grads(ps, torch_dtype):
    """The ``.grad`` of every tensor in ``ps`` as flat numpy views (no copy), or None
    when one is missing, sparse, not contiguous or not ``torch_dtype``: what the
    one-call steps (``kernels.step.dense_end``) take; None sends the step the general
    way."""
    out = []
    for p in ps:
        g = p.grad
        if g is None or g.is_sparse or g.dtype != torch_dtype or not g.is_contiguous():
            return None
        out.append(g.numpy().reshape(-1))
    return tuple(out)


def as_grad(name, g, read=None):
    """A torch gradient tensor as a ``Grad`` (no copy where torch allows): dense, or
    sparse rows for a sparse tensor (``nn.Embedding(sparse=True)``), with ``read``
    (the whole parameter as read) cut to those rows."""
    if g.is_sparse:
        g = g.coalesce()
        rows = g.indices()[0].numpy()
        return Grad(name, np.ascontiguousarray(g.values().numpy()), rows=rows,
                    read=None if read is None else read[rows])
    return Grad(name, g.numpy() if g.is_contiguous() else g.contiguous().numpy(),
                read=read)


# --- your own module -----------------------------------------------------------------

class TorchWorkload(ModuleWorkload):
    """Train your own ``nn.Module`` under ``hogkit.train`` / ``hogkit.simulate``.

    Parameters
    ----------
    module : nn.Module, or a zero-argument callable returning one
        An instance trains from its current weights (``seed`` does not change them);
        a factory is called under ``torch.manual_seed(seed)``.
    loss_fn : callable ``(module, batch) -> scalar tensor``
        ``batch`` is a dict of the data's tensors at the sampled rows; return the mean
        loss over the batch (``grad_reduction="mean"``). Must pickle: a top-level
        function.
    data : dict name -> tensor or array, a common first dimension (the rows sampled)
        float32/float64 stay as they are; integer and bool arrays become int64.
    eval_data : optional dict of further arrays (e.g. a test set), in the data store
        under ``"eval/<name>"``, not sampled; ``metrics`` gets them.
    metrics_fn : optional ``(module, tensors) -> dict`` of more metrics, where
        ``tensors`` holds the data (and ``"eval/..."``) as tensors; run in the parent
        with no autograd.
    lr, batch : the defaults of ``train`` when no rule / batch is given.
    name : shown in summaries (default ``"torch:<module class>"``).
    eval_rows : rows the reported loss averages over (evenly spaced; None: all).
    """

    def __init__(self, module, loss_fn, data, *, eval_data=None, metrics_fn=None,
                 lr=0.05, batch=32, name=None, eval_rows=4096):
        import torch
        if isinstance(module, torch.nn.Module):
            self._factory = None
            self._template = module
            cls_name = type(module).__name__
        elif callable(module):
            self._factory, self._template = module, None
            cls_name = getattr(module, "__name__", type(module).__name__)
        else:
            raise InvalidType(f"module={module!r} must be a torch.nn.Module or a "
                              f"zero-argument function that returns one")
        if not callable(loss_fn):
            raise InvalidType(f"loss_fn={loss_fn!r} must be a function "
                              f"(module, batch) -> scalar tensor")
        if metrics_fn is not None and not callable(metrics_fn):
            raise InvalidType(f"metrics_fn={metrics_fn!r} must be a function "
                              f"(module, tensors) -> dict, or None")
        self.loss_fn, self.metrics_fn = loss_fn, metrics_fn
        self._data = _as_arrays("data", data, rows=True)
        self._eval_data = (_as_arrays("eval_data", eval_data, rows=False)
                           if eval_data is not None else {})
        self.default_lr = check_float("lr", lr, min_value=0.0, exclude_min=True,
                                      fix="the default learning rate, e.g. 0.05")
        self.default_batch = check_int("batch", batch, min_value=1)
        self.defaults_why = "the lr and batch it was built with"
        self.eval_rows = (None if eval_rows is None else
                          check_int("eval_rows", eval_rows, min_value=1))
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidType(f"name={name!r} must be a non-empty str")
        self.name = name or f"torch:{cls_name}"
        self.train_keys = tuple(self._data)
        self.n_samples = len(next(iter(self._data.values())))
        if self._template is not None:
            module_params(self._template, "module")     # checked now, not in a worker

    def make_module(self):
        import torch
        if self._factory is not None:
            m = self._factory()
            if not isinstance(m, torch.nn.Module):
                raise InvalidType(f"module factory {self._factory!r} returned "
                                  f"{type(m).__name__}, not a torch.nn.Module")
            return m
        if self.__dict__.get("_buffers") is not None:      # a template without weights
            return rebuild(self._template, self._buffers)
        return copy.deepcopy(self._template)

    def step_loss(self, module, batch):
        return self.loss_fn(module, batch)

    def module_with(self, params):
        """A fresh module holding ``params`` (e.g. ``run.params``, the trained weights),
        copied: it shares nothing with the run."""
        import torch
        m = self.make_module()
        with torch.no_grad():
            for name, p in m.named_parameters():
                p.copy_(torch.from_numpy(np.asarray(params[name])))
        return m

    def extra_metrics(self, module, tensors):
        return self.metrics_fn(module, tensors) if self.metrics_fn is not None else {}

    def build(self, seed):
        """``(params, data)``: the module's weights (an instance: as they are; a
        factory: initialised under ``seed``) and the arrays (``eval/`` prefixed for
        ``eval_data``)."""
        m = self._seeded_module(seed) if self._factory is not None else self._template
        params = module_params(m, "module")
        data = dict(self._data)
        data.update({f"eval/{k}": v for k, v in self._eval_data.items()})
        return params, data

    def config(self):
        return {"name": self.name, "module": (getattr(self._factory, "__qualname__", None)
                                              or type(self._template).__qualname__),
                "loss_fn": getattr(self.loss_fn, "__qualname__", repr(self.loss_fn)),
                "rows": self.n_samples, "data": {k: [list(v.shape), v.dtype.name]
                                                 for k, v in self._data.items()},
                "default_lr": self.default_lr, "default_batch": self.default_batch,
                "grad_reduction": self.grad_reduction}

    def __repr__(self):
        return f"TorchWorkload({self.name!r}, rows={self.n_samples})"

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__

    def __getstate__(self):
        """What a worker needs: no arrays (they are in the data store), and a module
        instance without its weights (on the ``meta`` device; buffers kept)."""
        state = super().__getstate__()
        state["_data"] = {k: _Shape(v) for k, v in self._data.items()}
        state["_eval_data"] = {}
        if self._template is not None and state.get("_buffers") is None:
            state["_template"], state["_buffers"] = weightless(self._template)
        return state


def _label_error(name, err, batch, rows):
    """An :class:`InvalidArgument` for a loss that failed on a label out of range (torch
    says "Target 10 is out of bounds"): the batch's rows, its integer arrays' ranges and
    the first bad label's row; None for any other error (raised as it is)."""
    import re
    text = str(err)
    m = re.search(r"Target (-?\d+) is out of bounds", text)
    if m is None and "out of bounds" not in text and "out of range" not in text:
        return None
    ints = {k: v for k, v in batch.items() if not v.is_floating_point() and v.numel()}
    ranges = ", ".join(f"{k!r} holds {int(v.min())}..{int(v.max())}" for k, v in ints.items())
    where = ""
    if m is not None:
        bad = int(m.group(1))
        for k, v in ints.items():
            hit = (v.reshape(len(v), -1) == bad).any(dim=1).nonzero()
            if len(hit):
                where = f"; the first is {k}={bad} at row {int(rows[int(hit[0])])}"
                break
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return InvalidArgument(
        f"the loss of workload {name!r} failed on rows {int(rows[0])}..{int(rows[-1])} "
        f"(the parent's first evaluation, before any worker starts): "
        f"{type(err).__name__}: {first}. In that batch {ranges or 'no integer array'}"
        f"{where}. A class label must lie in [0, the module's output size): fix the "
        f"labels or the module's output layer")


class _Shape:
    """Stands in for an array in a pickled workload: its shape and dtype only."""

    __slots__ = ("shape", "dtype")

    def __init__(self, a):
        self.shape, self.dtype = a.shape, a.dtype

    def __len__(self):
        return self.shape[0]


def _as_arrays(what, data, *, rows):
    """``data`` as C-contiguous numpy arrays a store can hold (checked)."""
    import torch
    if not isinstance(data, Mapping) or not data:
        raise InvalidType(f"{what} must be a non-empty dict name -> tensor or array, got "
                          f"{type(data).__name__ if not isinstance(data, Mapping) else '{}'}")
    out, n = {}, None
    for k, v in data.items():
        if not isinstance(k, str) or not k:
            raise InvalidType(f"{what} keys must be non-empty str, got {k!r}")
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().numpy()
        a = np.asarray(v)
        if a.ndim == 0:
            raise InvalidArgument(f"{what}[{k!r}] is a scalar; give arrays whose first "
                                  f"dimension indexes the samples")
        if a.dtype in (np.float32, np.float64):
            pass
        elif a.dtype.type in _INT:
            a = a.astype(np.int64)
        else:
            raise InvalidType(f"{what}[{k!r}] has dtype {a.dtype}; use float32/float64 "
                              f"for features or integers for labels")
        a = np.ascontiguousarray(a)
        if rows:
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                raise InvalidArgument(f"{what} arrays must share their first dimension "
                                      f"(the samples): {what}[{k!r}] has {a.shape[0]} rows, "
                                      f"the first array {n}")
        out[k] = a
    if rows and n == 0:
        raise InvalidArgument(f"{what} has no rows; give at least one sample")
    return out
