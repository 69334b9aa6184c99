"""hogkit: lock-free, staleness-aware training on one multi-core machine.

Re-exports only, and lazily (PEP 562): importing ``hogkit`` costs nothing, so a
spawned worker can cap its threads before numpy, numba or torch load.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

_EXPORTS = {
    # errors
    "HogkitError": "hogkit.errors", "InvalidArgument": "hogkit.errors",
    "InvalidType": "hogkit.errors", "NonFiniteGradient": "hogkit.errors",
    "ShmCapacityError": "hogkit.errors", "PolicyTimeout": "hogkit.errors",
    "WorkerFailed": "hogkit.errors", "EnvironmentProblem": "hogkit.errors",
    # core
    "Grad": "hogkit.rules.grads",
    "ParamStore": "hogkit.state.store",
    "Clocks": "hogkit.state.clocks",
    "Reader": "hogkit.state.reader", "StalenessLog": "hogkit.state.reader",
    "Async": "hogkit.policy", "BSP": "hogkit.policy", "SSP": "hogkit.policy",
    "DSSP": "hogkit.policy", "LocalSGD": "hogkit.policy", "BoundedDelay": "hogkit.policy",
    "Policy": "hogkit.policy",
    "FixedBatch": "hogkit.rules.batching", "AdaptiveBatch": "hogkit.rules.batching",
    "EpochBalancedBatch": "hogkit.rules.batching",
    "Slowdown": "hogkit.engine.delays", "Pauses": "hogkit.engine.delays", "Load": "hogkit.engine.delays",
    "Constant": "hogkit.engine.delays", "LogNormal": "hogkit.engine.delays", "StepTimes": "hogkit.engine.delays",
    "simulate": "hogkit.engine.simulator", "replay": "hogkit.races", "sweep": "hogkit.sweeps",
    "SGD": "hogkit.rules.core", "StalenessAware": "hogkit.rules.core",
    "DelayCompensated": "hogkit.rules.core", "GapAware": "hogkit.rules.core",
    "AdaGrad": "hogkit.rules.core", "RMSProp": "hogkit.rules.core",
    "Adam": "hogkit.rules.adam",
    "chain": "hogkit.rules.compose",
    "Density": "hogkit.rules.density",
    "train": "hogkit.engine.runtime", "Run": "hogkit.engine.run",
    "Workers": "hogkit.engine.settings", "Engine": "hogkit.engine.settings",
    "Outputs": "hogkit.engine.settings", "workload": "hogkit.workloads",
    # your own model and loop
    "Workload": "hogkit.workloads.base", "TorchWorkload": "hogkit.workloads.module",
    "spawn": "hogkit.spawning", "Worker": "hogkit.spawning", "Stopped": "hogkit.errors",
    # communication: propagation schedules (P3), layer profiles, the link model
    "simulate_comm": "hogkit.p3.comm", "Network": "hogkit.p3.comm", "Profile": "hogkit.p3.profiles",
    "Schedule": "hogkit.p3.propagation",
}

#: submodules reachable as attributes (``hogkit.optim.SGD``, ``hogkit.comm.Network``)
_SUBMODULES = {"optim": "hogkit.optim", "profiles": "hogkit.p3.profiles",
               "propagation": "hogkit.p3.propagation", "comm": "hogkit.p3.comm",
               "p3live": "hogkit.p3.live", "cluster": "hogkit.cluster"}

#: modules that moved into wings (CHANGELOG.md): the old dotted path still imports, as the
#: same module object, with a DeprecationWarning that names the new one
_WINGS = {"engine": "plan step worker_loop simulator run runtime delays mainguard",
          "state": "store clocks reader worker_state checkpoint resume",
          "policy": "local_sgd", "rules": "compose density batching grads",
          "p3": "propagation profiles comm"}
_MOVED = {f"hogkit.{m}": f"hogkit.{w}.{m}" for w, ms in _WINGS.items() for m in ms.split()}
_MOVED.update({"hogkit._worker": "hogkit.engine.entry", "hogkit.p3live": "hogkit.p3.live"})

__all__ = sorted(_EXPORTS) + list(_SUBMODULES) + ["__version__"]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved module's old name and hands back the module at its new one."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = _MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (or the public "
                      f"name from hogkit)", DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module):
        """The module at the new path is already executed."""


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'hogkit' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
