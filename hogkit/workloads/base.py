"""``Workload``: the contract every training problem of hogkit follows.

A workload is a small, picklable *config object*: it holds settings only (sizes,
seeds of nothing, regularisation), never big arrays, so the parent can send it to
spawned workers. The arrays it makes live in a shared-memory store:

============================================  =============================================
``build(seed) -> (params, data)``             parent, once. Deterministic given ``seed``.
                                              ``params``: dict of C-contiguous float32
                                              (default) or float64 arrays; ``data``: dict
                                              of int32/int64/float32/float64 arrays.
``setup(params, data, *, rank, seed) -> ctx``  worker, once, after attaching the store;
                                              ``params``/``data`` are views of shared
                                              memory. Checks them (kernels do not), and
                                              preallocates the step's buffers in ``ctx``.
``gradient(ctx, rng, batch, *, keep_read)``   worker, every step: ``list[Grad]``, the
                                              gradient of the loss (the rule does
                                              ``w -= lr * g``) on a minibatch drawn with
                                              ``rng`` (a ``numpy.random.Generator``).
                                              Reads the shared params live: racy by design.
``loss(params, data) -> float``               parent, on a snapshot.
``metrics(params, data) -> dict``             ``loss`` plus what else the workload can
                                              report cheaply (accuracy, RMSE...).
``config() -> dict``                          JSON-able settings, ``name`` included.
============================================  =============================================

Buffer ownership: to avoid allocating every step, the arrays inside the ``Grad`` s that
``gradient`` returns (``values``, ``rows``, ``read``) may be *views of buffers owned by
``ctx``*: they stay valid until the next ``gradient`` call **with the same ctx**, which
overwrites them. Apply (or copy) a step's grads before computing the next one with
that ctx; a simulator that holds several grads of one virtual worker in flight gives
each virtual worker its own ctx (``setup`` is cheap) or copies.

``read`` (filled only when ``keep_read=True``) holds exactly the parameter values the
gradient was computed from (same shape as ``values``): DC-ASGD's ``w_bak`` and
Gap-Aware's ``w_read``.

**Compiled workloads.** A workload whose gradient is a numba kernel also implements
``compiled(params, data) -> CompiledParts``: a NamedTuple of its arrays whose class is
registered with ``hogkit.kernels.step.register`` (a sampler kernel and a gradient
kernel), the parameter names in the order the kernels index them, and how many
gradient rows one sample can write per parameter. The compiled step core then runs
whole steps without Python, and :class:`KernelCtx` gives the same kernels a Python
``gradient`` (the reference path), so both paths draw the same samples and compute the
same numbers. ``mf`` and ``logreg`` are built this way; ``examples/`` has a user's own.
"""

from __future__ import annotations

import math
import os
import dataclasses
from dataclasses import dataclass
from typing import Mapping, NamedTuple, Optional

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.kernels.layout import Bufs
from hogkit.rules.grads import Grad
from hogkit.validation import check_array, check_choice, check_int

PARAM_DTYPES = ("float32", "float64")
#: passes over a data file that a run given no budget makes (LIBMF's default iterations)
DATA_PASSES = 20


@dataclass(frozen=True)
class Defaults:
    """A workload's defaults: one set, taken alike by ``train``, ``simulate``, ``hogkit
    run`` and ``hogkit sim``, a sweep, and a workload made by name or built as an
    object (:meth:`Workload.defaults`). What a run takes from them, and why, is in its
    summary (``config["chosen"]``).

    rule : the rule a run takes when none is given (None: ``SGD(lr)``).
    lr : the learning rate of a rule named without one (``hogkit run --rule NAME``).
    batch : samples a step on the batch lane (the minibatch of the exact step).
    lane : the lane a run takes where its engine and knobs allow it ("batch" or
        "sample"); the simulator and a cluster node run the batch lane, with the same
        rule.
    steps : the steps of a run given no budget, at the default lane's batch
        (:meth:`steps_at` keeps the samples for another batch).
    sample_batch : samples a step on the per-sample lane, where a step is the unit of
        the clocks and the record rather than a minibatch (None: ``batch``).
    why : what chose them, one line.
    """

    rule: object
    lr: float
    batch: int
    lane: str = "batch"
    steps: int = 10_000
    sample_batch: Optional[int] = None
    why: str = ""

    def batch_for(self, lane) -> int:
        """Samples a step on ``lane`` ("batch" or "sample")."""
        return (self.sample_batch or self.batch) if lane == "sample" else self.batch

    @property
    def samples(self) -> int:
        """The samples of a run given no budget."""
        return self.steps * self.batch_for(self.lane)

    def steps_at(self, batch) -> int:
        """The default budget in steps of ``batch`` samples (as many samples as
        :attr:`steps` of the default lane's batch)."""
        return max(1, math.ceil(self.samples / max(int(batch), 1)))


class Workload:
    """Base class of the workloads; subclasses set the class attributes and methods.

    Subclasses list their settings in ``_fields`` (attribute names); ``config``,
    ``__repr__`` and ``__eq__`` are built from them.
    """

    name: str = ""
    needs_torch: bool = False
    # --- the defaults (:meth:`defaults` collects them) -----------------------------
    #: the learning rate of a rule named without one; SGD's, when ``default_rule``
    #: gives no rule
    default_lr: float = 0.0
    #: samples a step on the batch lane (the exact step's minibatch)
    default_batch: int = 0
    #: samples a step on the per-sample lane, where a step is the unit of the clocks,
    #: the policy and the record (None: ``default_batch``)
    default_sample_batch = None
    #: a run given no budget: this many steps of the default lane's batch
    default_steps: int = 10_000
    #: the lane a run takes where the engine and knobs allow (docs/algorithms.md §1):
    #: "batch" (the exact minibatch step) or "sample" (per-sample Hogwild!, compiled)
    default_lane: str = "batch"
    #: what chose these defaults (the summary says it)
    defaults_why: str = ""
    #: "mean": the gradient is averaged over the batch (its scale does not grow with the
    #: batch); "sum": summed per-sample gradients (lr is per sample). Adaptive batching
    #: reweights mean-reduced gradients only.
    grad_reduction: str = "mean"
    #: the data arrays the workers write (a shared scheduler); the rest of the data is
    #: read-only. A warm-up works on copies of these, so it leaves no trace in the run.
    writes_data: tuple = ()
    _fields: tuple = ()

    # --- the contract -------------------------------------------------------------
    def build(self, seed: int):  # pragma: no cover - abstract
        raise NotImplementedError

    def setup(self, params: Mapping[str, np.ndarray], data: Mapping[str, np.ndarray], *,
              rank: int = 0, seed: int = 0):  # pragma: no cover - abstract
        raise NotImplementedError

    def gradient(self, ctx, rng, batch: int, *, keep_read: bool = False):  # pragma: no cover
        raise NotImplementedError

    def planned_bytes(self):
        """A lower bound of the bytes :meth:`build` will put in shared memory, known
        without building (None: not known). A live run checks /dev/shm against it
        before anything is built, and against the exact sizes after."""
        return None

    def loss(self, params, data) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def metrics(self, params, data) -> dict:
        """``{"loss": loss(params, data)}``; subclasses add more."""
        return {"loss": self.loss(params, data)}

    def export(self, params, folder) -> list:
        """Write trained ``params`` into ``folder`` for use outside hogkit: one
        ``NAME.npy`` each (``numpy.load`` reads it); returns the paths written."""
        os.makedirs(folder, exist_ok=True)
        paths = []
        for name, a in params.items():
            path = os.path.join(folder, f"{name}.npy")
            np.save(path, np.asarray(a))
            paths.append(path)
        return paths

    def default_rule(self):
        """The rule a run takes when none is given (None: ``SGD(default_lr)``)."""
        return None

    def defaults(self) -> Defaults:
        """This workload's defaults, from its ``default_*`` attributes and
        :meth:`default_rule` (the one place a workload states them); with a data file
        (``data``) the budget is :data:`DATA_PASSES` passes over its training samples
        (``n_ratings`` or ``n_samples``)."""
        d = Defaults(rule=self.default_rule(), lr=self.default_lr, batch=self.default_batch,
                     lane=self.default_lane, steps=self.default_steps,
                     sample_batch=self.default_sample_batch, why=self.defaults_why)
        n = getattr(self, "n_ratings", None) or getattr(self, "n_samples", None)
        if getattr(self, "data", None) is not None and n and d.batch:
            d = dataclasses.replace(d, steps=max(1, math.ceil(
                DATA_PASSES * n / d.batch_for(d.lane))))
        return d

    def for_workers(self, n):
        """This workload as a run of ``n`` workers takes it (mf: a block grid that
        leaves the workers free blocks); ``self`` when the count changes nothing."""
        return self

    def compiled(self, params, data):
        """The workload's compiled part for the step core (:class:`CompiledParts`), or
        None when its gradient is not a numba kernel (torch workloads)."""
        return None

    def config(self) -> dict:
        out = {"name": self.name}
        out.update({f: getattr(self, f) for f in self._fields})
        out["default_lr"] = self.default_lr
        out["default_batch"] = self.default_batch
        out["grad_reduction"] = self.grad_reduction
        return out

    # --- plumbing -----------------------------------------------------------------
    def __repr__(self):
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({args})"

    def __eq__(self, other):
        return type(self) is type(other) and self.config() == other.config()

    def __hash__(self):
        return hash((type(self).__name__,) + tuple(repr(getattr(self, f)) for f in self._fields))


# --- the contract, checked up front --------------------------------------------------

#: what every workload provides: (attribute, what it is, how to fix it)
_REQUIRED_METHODS = (
    ("build", "build(seed) -> (params, data), run once in the parent"),
    ("setup", "setup(params, data, *, rank, seed) -> ctx, run once in each worker"),
    ("gradient", "gradient(ctx, rng, batch, *, keep_read) -> list[Grad], every step"),
    ("loss", "loss(params, data) -> float, for the loss curve"),
)


def check_workload(wl, *, need_lr=True, need_batch=True, spawn=False):
    """Raise, naming the missing piece and the fix, unless ``wl`` follows the workload
    contract (the table in the module docstring). Runs in the parent before anything
    is built or spawned. ``need_lr`` / ``need_batch``: the caller did not give a rule /
    a batch, so the workload's defaults are used; ``spawn``: ``wl`` is sent to worker
    processes, so it must pickle. Returns ``wl``."""
    what = f"workload {wl!r}"
    if not isinstance(getattr(wl, "name", None), str) or not wl.name:
        raise InvalidArgument(f"{what} has no name; give its class a non-empty str "
                              f"attribute `name` (used in summaries and plots), or "
                              f"subclass hogkit.Workload")
    what = f"workload {wl.name!r}"
    for attr, role in _REQUIRED_METHODS:
        if not callable(getattr(wl, attr, None)):
            raise InvalidArgument(f"{what} has no {attr}(); a workload needs {role} "
                                  f"(see hogkit.Workload, or use hogkit.TorchWorkload for "
                                  f"an nn.Module)")
    needs_torch = getattr(wl, "needs_torch", None)
    if not isinstance(needs_torch, (bool, np.bool_)):
        raise InvalidArgument(f"{what} has needs_torch={needs_torch!r}; set the class "
                              f"attribute needs_torch = True when its gradient uses torch, "
                              f"else False (workers cap torch's threads when it is True)")
    if need_lr:
        lr = getattr(wl, "default_lr", None)
        if isinstance(lr, bool) or not isinstance(lr, (int, float, np.floating)) \
                or not lr > 0:
            raise InvalidArgument(f"{what} has default_lr={lr!r}; give rule=SGD(lr=...) "
                                  f"or set a positive class attribute default_lr")
    if need_batch:
        b = getattr(wl, "default_batch", None)
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise InvalidArgument(f"{what} has default_batch={b!r}; give batch=... or set "
                                  f"an int class attribute default_batch >= 1")
    red = getattr(wl, "grad_reduction", "mean")
    if red not in ("mean", "sum"):
        raise InvalidArgument(f"{what} has grad_reduction={red!r}; use 'mean' (the "
                              f"gradient is averaged over the batch) or 'sum'")
    if spawn:
        from hogkit.engine.mainguard import check_spawnable
        check_spawnable(what, wl)
    return wl


def metrics_of(wl, params, data) -> dict:
    """``wl.metrics(params, data)`` (``{"loss": ...}`` for a workload without
    ``metrics``) with plain floats, non-finite values as None (JSON has no NaN): what
    a run's summary reports under ``"metrics"``."""
    import math
    fn = getattr(wl, "metrics", None)
    out = fn(params, data) if callable(fn) else {"loss": wl.loss(params, data)}
    if not isinstance(out, Mapping):
        raise InvalidType(f"metrics() of workload {wl.name!r} must return a dict "
                          f"name -> number, got {type(out).__name__}")
    return {str(k): (float(v) if math.isfinite(float(v)) else None) for k, v in out.items()}


# --- shared checks used by the workloads ----------------------------------------------

def check_seed(seed, name="seed"):
    return check_int(name, seed, min_value=0, max_value=2**63 - 1)


def check_dtype(dtype):
    """'float32' / 'float64' (also accepts numpy dtypes); returns the name."""
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise InvalidType(f"dtype={dtype!r} is not a numpy dtype; use 'float32' or "
                          f"'float64'") from None
    return check_choice("dtype", name, PARAM_DTYPES)


def check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidType(f"{name}={value!r} must be True or False, got "
                          f"{type(value).__name__}")
    return bool(value)


def check_keys(what, mapping, names, workload):
    """``mapping`` (params or data) holds exactly the arrays ``names``."""
    if not isinstance(mapping, Mapping):
        raise InvalidType(f"{what} must be a mapping of name -> ndarray, got "
                          f"{type(mapping).__name__}")
    missing = [n for n in names if n not in mapping]
    if missing:
        raise InvalidArgument(f"{what} of workload {workload!r} lacks {missing}; it holds "
                              f"{sorted(mapping)}; pass what build() returned")


def check_param(name, a, shape, dtype=None):
    """A shared parameter: float32/float64, the given shape, C-contiguous, writeable."""
    check_array(name, a, dtype=dtype or tuple(np.dtype(d) for d in PARAM_DTYPES),
                shape=shape)
    if not a.flags.writeable:
        raise InvalidArgument(f"{name} is read-only; a worker's params must be writeable "
                              f"views of the shared store")
    return a


def zipf_probabilities(n, exponent, rng):
    """Popularity p of n items: p[perm[k]] proportional to (k + 1) ** -exponent.

    The permutation (drawn from ``rng``) spreads the popular items over the id space,
    so sharding by id ranges does not put every hot item in shard 0. exponent=0 is
    uniform.
    """
    weights = np.arange(1, n + 1, dtype=np.float64) ** -float(exponent)
    p = np.empty(n, dtype=np.float64)
    p[rng.permutation(n)] = weights / weights.sum()
    return p


def sample_from(p, size, rng):
    """``size`` draws of ids distributed as ``p`` (inverse-CDF; int64)."""
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    out = np.searchsorted(cdf, rng.random(size), side="right")
    np.minimum(out, len(p) - 1, out=out)
    return out.astype(np.int64, copy=False)


# --- the compiled part ----------------------------------------------------------------

class CompiledParts(NamedTuple):
    """What a compiled workload hands the step core (see the module docstring)."""

    arrays: tuple               # a NamedTuple instance of a class registered with step
    names: tuple                # parameter names in the order the kernels index them
    rows_per_sample: tuple      # per parameter: the most gradient rows one sample writes
    #: ``scratch(batch) -> tuple`` of arrays for the fused SGD kernel (``batch=0``:
    #: placeholders of the same types), or None when it needs none
    scratch: object = None
    #: False when the sampler never draws from ``rng`` (a sweep): callers pass None
    #: (typing a numpy Generator costs ~10 µs a Python-side call)
    uses_rng: bool = True


def as_rows(a):
    """``a`` viewed as 2-D ``(len(a), prod(shape[1:]))`` (no copy): how kernels see a
    parameter of any rank."""
    return a.reshape(a.shape[0], -1)


_NO_SLOTS = np.zeros((1, 8), np.int64)


class KernelCtx:
    """A worker's buffers for a compiled workload, and its Python ``gradient``.

    Holds the parameters as 2-D views (``params``, in the kernels' order), gradient
    buffers sized for ``capacity`` samples (``G``, ``R``, ``RD``, ``cnt``, ``idx``) and
    the sampler's ``cursor`` (started at a random offset drawn from ``(seed, rank)``).
    The step core uses the same object, so a worker can switch between the Python and
    the compiled path and keep drawing the same stream.
    """

    __slots__ = ("parts", "params", "names", "shapes", "G", "GF", "R", "RD", "cnt", "idx",
                 "scratch", "cursor", "capacity", "sample", "kernel", "sgd", "_begin")

    def __init__(self, parts, params, *, batch, rank, seed, n_samples):
        from hogkit.kernels import step
        kernels = step.registered(type(parts.arrays))
        if kernels is None:
            raise InvalidArgument(
                f"{type(parts.arrays).__name__} is not registered with the step core; "
                f"call hogkit.kernels.step.register(...) in the module that defines it")
        self.sample, self.kernel, self.sgd = kernels
        self._begin = (step.python_begin if step.cacheable(type(parts.arrays))
                       else step.python_begin_uncached)
        self.parts = parts
        self.names = tuple(parts.names)
        self.params = tuple(as_rows(params[n]) for n in self.names)
        self.shapes = tuple(params[n].shape[1:] for n in self.names)
        self.cursor = np.zeros(1, np.int64)
        if n_samples > 0:
            self.cursor[0] = np.random.default_rng([seed, rank, 0xC0]).integers(n_samples)
        self.capacity = 0
        self.grow(batch)

    def grow(self, batch):
        batch = check_int("batch", batch, min_value=1)
        rows = [max(1, int(k)) * batch for k in self.parts.rows_per_sample]
        self.GF = tuple(np.zeros(n * p.shape[1], p.dtype) for n, p in zip(rows, self.params))
        self.G = tuple(f.reshape(n, p.shape[1]) for f, n, p in zip(self.GF, rows, self.params))
        self.RD = tuple(np.empty((n, p.shape[1]), p.dtype) for n, p in zip(rows, self.params))
        self.R = tuple(np.empty(n, np.int64) for n in rows)
        self.cnt = np.zeros(len(rows), np.int64)
        self.idx = np.empty(batch, np.int64)
        make = self.parts.scratch
        self.scratch = make(0) if make is not None else ()  # see use_fused_scratch
        self.capacity = batch

    def use_fused_scratch(self):
        """Allocate the fused SGD kernel's scratch (the step core calls this; the
        simulator, which never fuses, keeps the placeholders)."""
        if self.parts.scratch is not None:
            self.scratch = self.parts.scratch(self.capacity)

    def bufs(self):
        """The buffers the step core takes (:class:`~hogkit.kernels.layout.Bufs`)."""
        return Bufs(self.G, self.R, self.RD, self.cnt, self.idx, self.GF, self.scratch)

    def begin(self, rng, batch, keep_read, slots=_NO_SLOTS, rank=-1):
        """Sample ``batch`` ids and compute their gradient into the buffers, in one
        compiled call (``kernels.step.python_begin``), reading worker ``rank``'s clock
        vector in ``slots`` first when ``rank >= 0``. Returns ``(others, lag,
        finite)`` (see the kernel); :meth:`grads` views the gradient."""
        if batch > self.capacity or batch < 1:
            self.grow(batch)
        return self._begin(self.parts.arrays, rng if self.parts.uses_rng else None,
                           self.cursor, self.params, self.G, self.R, self.RD, self.cnt,
                           self.idx, self.GF, keep_read, batch, slots, rank)

    def grads(self, keep_read):
        """The buffers' gradient as ``Grad`` views (valid until the next step)."""
        out = []
        cnt = self.cnt.tolist()
        for p, name in enumerate(self.names):
            n = cnt[p]
            shape = (n,) + self.shapes[p]
            out.append(Grad(name, self.G[p][:n].reshape(shape), self.R[p][:n],
                            self.RD[p][:n].reshape(shape) if keep_read else None))
        return out

    def gradient(self, rng, batch, keep_read):
        """One step's gradient through the workload's kernels, as ``Grad`` views of the
        buffers (valid until the next call)."""
        self.begin(rng, batch, keep_read)
        return self.grads(keep_read)
