"""The knobs of a run, as both entry points take them: ``train`` (live processes) and
``simulate`` (virtual time) resolve the workload, check the budget and split the steps
the same way, and describe every knob in the summary the same way."""

from __future__ import annotations

import dataclasses

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import check_float, check_int


def resolve_workload(workload, options):
    """A workload object from a registry name (with ``options``) or an object that
    follows the Workload contract."""
    from hogkit import workloads
    if isinstance(workload, str):
        return workloads.get(workload, **(options or {}))
    if options:
        raise InvalidArgument("workload_options only apply when workload is given by name")
    for attr in ("build", "setup", "gradient", "loss"):
        if not hasattr(workload, attr):
            raise InvalidArgument(
                f"workload {workload!r} has no {attr}(); pass a name from "
                f"{workloads.NAMES} or an object following hogkit.workloads.base.Workload")
    return workload


def check_knob(name, obj, methods, where):
    """``obj`` has the callable ``methods`` of its kind (policy, rule, density...)."""
    missing = [m for m in methods if not callable(getattr(obj, m, None))]
    if missing:
        raise InvalidType(f"{name}={obj!r} has no {', '.join(m + '()' for m in missing)}; "
                          f"pass an object from {where}")


def check_budget(steps, seconds, workers, *, time_unit="wall time"):
    """``(steps, seconds)`` checked: at least one given, steps a total over all workers."""
    if steps is None and seconds is None:
        raise InvalidArgument(f"give steps= (total iterations) or seconds= ({time_unit}), "
                              f"or both; the run stops at whichever comes first")
    if steps is not None:
        steps = check_int("steps", steps, min_value=workers,
                          fix=f"steps is the total over all workers; give at least {workers}")
    if seconds is not None:
        seconds = check_float("seconds", seconds, min_value=0.0, exclude_min=True,
                              fix=f"a budget in {time_unit}")
    return steps, seconds


def split_steps(steps, workers):
    """Each worker's share of ``steps`` (the first ``steps % workers`` get one more);
    ``None`` shares when there is no step budget."""
    if steps is None:
        return [None] * workers
    return [steps // workers + (1 if r < steps % workers else 0) for r in range(workers)]


def config_of(obj):
    """JSON-able settings of a knob: its ``config()``, its dataclass fields, or repr."""
    if obj is None:
        return None
    if hasattr(obj, "config"):
        return obj.config()
    if dataclasses.is_dataclass(obj):
        return {"name": type(obj).__name__, **dataclasses.asdict(obj)}
    return repr(obj)
