"""Workloads: data, gradient and loss for each training problem.

==========  ===========================  ==============================================
name        class                        what
==========  ===========================  ==============================================
``mf``      ``MatrixFactorization``      low-rank ratings, Zipf rows/columns, sparse rows
``logreg``  ``SparseLogReg``             sparse logistic regression, Zipf features
``mlp``     ``DigitsMLP``                MLP on scikit-learn digits, dense, torch
``rnn``     ``CharRNNWorkload``          character-level RNN language model, torch
==========  ===========================  ==============================================

Your own model: :class:`~hogkit.workloads.module.TorchWorkload` (any ``nn.Module``)
or a :class:`~hogkit.workloads.base.Workload` subclass (a numba workload: see
``examples/own_workload.py``).

``get(name, **kwargs)`` (``hogkit.workload``) builds one by name. Modules load on first
use, so asking for ``mf`` never imports torch.
"""

from __future__ import annotations

import importlib
import inspect

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.workloads.base import Workload

NAMES = ("mf", "logreg", "mlp", "rnn")

_CLASSES = {
    "mf": ("hogkit.workloads.mf", "MatrixFactorization"),
    "logreg": ("hogkit.workloads.logreg", "SparseLogReg"),
    "mlp": ("hogkit.workloads.mlp", "DigitsMLP"),
    "rnn": ("hogkit.workloads.rnn", "CharRNNWorkload"),
}

__all__ = ["NAMES", "Workload", "get", "workload", "workload_class",
           "MatrixFactorization", "SparseLogReg", "DigitsMLP", "CharRNNWorkload",
           "TorchWorkload"]


def workload_class(name):
    """The class registered under ``name``."""
    if not isinstance(name, str):
        raise InvalidType(f"workload name {name!r} must be a str, got {type(name).__name__}")
    try:
        module, cls = _CLASSES[name]
    except KeyError:
        opts = ", ".join(repr(n) for n in NAMES)
        raise InvalidArgument(f"unknown workload {name!r}; choose one of {opts}") from None
    return getattr(importlib.import_module(module), cls)


def get(name, **kwargs) -> Workload:
    """The workload ``name`` built with ``kwargs``, e.g. ``get("mf", preset="large")``.

    A ``Workload`` instance passed as ``name`` (with no kwargs) is returned as is, so
    callers can accept either.
    """
    if isinstance(name, Workload):
        if kwargs:
            raise InvalidArgument(f"got a Workload instance {name!r} and settings "
                                  f"{sorted(kwargs)}; pass either a name with settings or "
                                  f"a configured instance")
        return name
    cls = workload_class(name)
    accepted = [p for p in inspect.signature(cls).parameters]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise InvalidArgument(f"workload {name!r} has no setting(s) {unknown}; its settings "
                              f"are {accepted}")
    return cls(**kwargs)


#: ``hogkit.workload("mf", preset="large")``: the face's name for :func:`get`
workload = get


def __getattr__(attr):
    if attr == "TorchWorkload":
        from hogkit.workloads.module import TorchWorkload
        return TorchWorkload
    for name, (_, cls) in _CLASSES.items():
        if attr == cls:
            value = workload_class(name)
            globals()[attr] = value
            return value
    raise AttributeError(f"module 'hogkit.workloads' has no attribute {attr!r}")
