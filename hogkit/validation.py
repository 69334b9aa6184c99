"""Argument checks, in one place (as hypothesis keeps its own in internal/validation.py).

Each check raises :class:`~hogkit.errors.InvalidArgument` (a ``ValueError``) or
:class:`~hogkit.errors.InvalidType` (a ``TypeError``) whose message shows the
offending value, the constraint, and - where there is one - the fix. Kernels do no
checking at all (numba does no bounds checking), so everything a kernel relies on is
checked here first.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def _fix(fix):
    return f"; {fix}" if fix else ""


def check_int(name, value, *, min_value=None, max_value=None, fix=""):
    """An int (not bool, not float) within [min_value, max_value]; returns int(value)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidType(f"{name}={value!r} must be an int, got {type(value).__name__}"
                          f"{_fix(fix)}")
    value = int(value)
    if min_value is not None and value < min_value:
        raise InvalidArgument(f"{name}={value} must be >= {min_value}{_fix(fix)}")
    if max_value is not None and value > max_value:
        raise InvalidArgument(f"{name}={value} must be <= {max_value}{_fix(fix)}")
    return value


def check_float(name, value, *, min_value=None, max_value=None, exclude_min=False,
                exclude_max=False, fix=""):
    """A finite real number within the given bounds; returns float(value)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidType(f"{name}={value!r} must be a real number, got "
                          f"{type(value).__name__}{_fix(fix)}")
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgument(f"{name}={value} must be finite{_fix(fix)}")
    if min_value is not None and (value < min_value or (exclude_min and value == min_value)):
        op = ">" if exclude_min else ">="
        raise InvalidArgument(f"{name}={value} must be {op} {min_value}{_fix(fix)}")
    if max_value is not None and (value > max_value or (exclude_max and value == max_value)):
        op = "<" if exclude_max else "<="
        raise InvalidArgument(f"{name}={value} must be {op} {max_value}{_fix(fix)}")
    return value


def check_choice(name, value, choices, *, fix=""):
    """``value`` is one of ``choices``; returns it."""
    if value not in choices:
        opts = ", ".join(repr(c) for c in choices)
        raise InvalidArgument(f"{name}={value!r} is not one of {opts}{_fix(fix)}")
    return value


def check_array(name, a, *, dtype=None, ndim=None, shape=None, contiguous=True,
                writeable=False, min_ndim=None):
    """A numpy array of the given dtype(s), ndim and shape (None in shape = any).

    ``dtype`` may be one dtype or a tuple of accepted dtypes; ``min_ndim`` bounds the
    number of axes from below (e.g. 1: no 0-d arrays). Returns ``a``.
    """
    if not isinstance(a, np.ndarray):
        raise InvalidType(f"{name} must be a numpy.ndarray, got {type(a).__name__}; "
                          f"convert with np.asarray(...)")
    if dtype is not None:
        accepted = tuple(np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,)))
        if a.dtype not in accepted:
            names = " or ".join(str(d) for d in accepted)
            raise InvalidType(f"{name} has dtype {a.dtype}, expected {names}; "
                              f"convert with .astype(np.{accepted[0]})")
    if ndim is not None and a.ndim != ndim:
        raise InvalidArgument(f"{name} has ndim={a.ndim} (shape {a.shape}), expected "
                              f"ndim={ndim}")
    if min_ndim is not None and a.ndim < min_ndim:
        raise InvalidArgument(f"{name} has ndim={a.ndim} (shape {a.shape}), expected "
                              f"ndim >= {min_ndim}; reshape it, e.g. {name}.reshape(1)")
    if shape is not None:
        if len(shape) != a.ndim or any(s is not None and s != t for s, t in zip(shape, a.shape)):
            want = "(" + ", ".join("any" if s is None else str(s) for s in shape) + ")"
            raise InvalidArgument(f"{name} has shape {a.shape}, expected {want}")
    if contiguous and not a.flags.c_contiguous:
        raise InvalidArgument(f"{name} is not C-contiguous; pass np.ascontiguousarray({name})")
    if writeable and not a.flags.writeable:
        raise InvalidArgument(f"{name} is read-only; the update needs a writeable array")
    return a


def check_indices(name, idx, n_rows):
    """Row indices: int32/int64, 1-D, contiguous, every value in [0, n_rows).

    numba does no bounds checking, so an index outside the table would write to
    memory that is not the table's. Returns ``idx``.
    """
    if not isinstance(idx, np.ndarray):
        raise InvalidType(f"{name} must be a numpy.ndarray of int64 row indices, got "
                          f"{type(idx).__name__}; use np.asarray({name}, dtype=np.int64)")
    if idx.dtype not in INDEX_DTYPES:
        raise InvalidType(f"{name} has dtype {idx.dtype}, expected int64 (or int32) row "
                          f"indices; use {name}.astype(np.int64)")
    check_array(name, idx, ndim=1)
    if idx.size:
        check_ids_below(name, idx, n_rows, what="row index",
                        of=f"a table of {n_rows} rows")
    return idx


def check_ids_below(name, ids, n, *, what, of):
    """Every value of the non-empty integer array ``ids`` in ``[0, n)``, else an
    :class:`InvalidArgument` naming the value (``what``: "row index", "id") and the
    whole it does not fit (``of``: "a table of n rows")."""
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= n:
        bad = lo if lo < 0 else hi
        raise InvalidArgument(f"{name} holds {what} {bad}, outside [0, {n}) for {of}")


def check_all_finite(arrays, what, fix):
    """Every floating array of the mapping ``arrays`` holds only finite values, else an
    :class:`InvalidArgument` naming the array, the first bad index and value, and
    ``fix``. ``what``: "the data", "the initial parameters", "the checkpoint"."""
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.kind not in "fc" or a.size == 0:
            continue
        ok = np.isfinite(a)
        if ok.all():
            continue
        flat = int(np.argmin(ok.ravel()))
        where = np.unravel_index(flat, a.shape) if a.ndim > 1 else (flat,)
        idx = ", ".join(str(int(i)) for i in where)
        raise InvalidArgument(f"{what}: {name}[{idx}] is {a.ravel()[flat]} "
                              f"({int(a.size - ok.sum())} non-finite of {a.size}); {fix}")


def check_grads(grads):
    """``grads`` is a sequence of :class:`~hogkit.rules.grads.Grad`; returns it."""
    from hogkit.rules.grads import Grad
    if isinstance(grads, Grad):
        raise InvalidType("grads must be a sequence of Grad, got a single Grad; "
                          "pass [grad]")
    for grad in grads:
        if not isinstance(grad, Grad):
            raise InvalidType(f"grads must hold hogkit.Grad objects, got "
                              f"{type(grad).__name__}")
    return grads


def grads_finite(grads) -> bool:
    """The non-finite guard: True when every ``Grad.values`` is free of NaN and inf
    (``kernels.guard`` on contiguous float arrays). The Python step calls it before
    density or rule touch anything, so a non-finite gradient never reaches shared
    parameters (the compiled core runs the same kernel)."""
    from hogkit.kernels import guard as _guard
    for grad in grads:
        v = grad.values
        if isinstance(v, np.ndarray) and v.dtype in FLOAT_DTYPES and v.flags.c_contiguous:
            if not _guard.all_finite(v.reshape(-1)):
                return False
        elif not np.isfinite(np.asarray(v)).all():
            return False
    return True
