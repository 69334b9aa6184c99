"""hogkit: lock-free, staleness-aware training on one multi-core machine.

Re-exports only, and lazily (PEP 562): importing ``hogkit`` costs nothing, so a
spawned worker can cap its threads before numpy, numba or torch load.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # errors
    "HogkitError": "hogkit.errors", "InvalidArgument": "hogkit.errors",
    "InvalidType": "hogkit.errors", "NonFiniteGradient": "hogkit.errors",
    "ShmCapacityError": "hogkit.errors", "PolicyTimeout": "hogkit.errors",
    "WorkerFailed": "hogkit.errors", "EnvironmentProblem": "hogkit.errors",
    # core
    "Grad": "hogkit.grads",
    "ParamStore": "hogkit.store",
    "Clocks": "hogkit.clocks",
    "Reader": "hogkit.reader", "StalenessLog": "hogkit.reader",
    "Async": "hogkit.policy", "BSP": "hogkit.policy", "SSP": "hogkit.policy",
    "DSSP": "hogkit.policy", "LocalSGD": "hogkit.policy",
    "FixedBatch": "hogkit.batching", "AdaptiveBatch": "hogkit.batching",
    "EpochBalancedBatch": "hogkit.batching",
    "Slowdown": "hogkit.delays", "Pauses": "hogkit.delays", "Load": "hogkit.delays",
    "Constant": "hogkit.delays", "LogNormal": "hogkit.delays", "StepTimes": "hogkit.delays",
    "simulate": "hogkit.simulator", "replay": "hogkit.races", "sweep": "hogkit.sweeps",
    "SGD": "hogkit.rules", "StalenessAware": "hogkit.rules",
    "DelayCompensated": "hogkit.rules", "GapAware": "hogkit.rules",
    "chain": "hogkit.compose",
    "Density": "hogkit.density",
    "train": "hogkit.runtime", "Run": "hogkit.run",
    # your own model and loop
    "Workload": "hogkit.workloads.base", "TorchWorkload": "hogkit.workloads.module",
    "spawn": "hogkit.spawning", "Worker": "hogkit.spawning", "Stopped": "hogkit.errors",
    # communication: propagation schedules (P3), layer profiles, the link model
    "simulate_comm": "hogkit.comm", "Network": "hogkit.comm", "Profile": "hogkit.profiles",
    "Schedule": "hogkit.propagation",
}

#: submodules reachable as attributes (``hogkit.optim.SGD``)
_SUBMODULES = ("optim", "profiles", "propagation", "comm", "p3live")

__all__ = sorted(_EXPORTS) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"hogkit.{name}")
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'hogkit' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
