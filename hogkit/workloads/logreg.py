"""Sparse logistic regression on generated data with Zipf feature popularity.

The sparse workload of Hogwild! (Niu et al. 2011: sparse SVM / logistic models on
RCV1-like data): each update touches only the weights of the features its samples
hold, so conflicts between workers are rare unless a few features are very popular.
``zipf`` sets that: 0 draws features uniformly (almost no conflicts), 1.1 (default)
puts a handful of features in most samples (they are written by every update).

Data (CSR): sample s holds about U[min_nnz, max_nnz] distinct features drawn with
Zipf popularity (duplicates drawn for one sample are merged, so popular-heavy rows
can hold a few fewer); values are 1 (``values="binary"``) or N(0, 1)
(``values="real"``), each row scaled to unit L2 norm when ``normalize`` (off by
default; with it on, a stable ``lr`` is about max_nnz times larger).
A true weight vector w* ~ N(0, 1), rescaled so the true margins m_s = w* . x_s have
standard deviation ``margin_scale``, gives labels y_s ~ Bernoulli(sigma(m_s))
(logistic noise). Arrays: ``indptr`` int64 (n_samples + 1), ``indices`` int32,
``values`` float32, ``y`` float32 in {0, 1}.

Model: p_s = sigma(w . x_s), ``w`` (n_features,), initialised N(0, init_scale^2)
(0 by default). Gradient (kernels/logreg.py), the **mean over the batch** of the
per-sample log-loss gradient, one sparse entry per (sample, nonzero):

    g[t] = ((p_s - y_s) x_sj + reg * w_j) / batch        rows[t] = j

(L2 only on touched features, in proportion to how often they are touched, as in
Hogwild!). Loss reported by ``loss``: the mean log-loss over all samples, without
the L2 term; ``metrics`` adds ``accuracy``.

``lock`` (the baselines Hogwild! is measured against, Niu et al. 2011 §5): ``"none"``
(default, lock-free), ``"model"`` (each sample's read and write hold one lock on the
whole model) or ``"feature"`` (a lock per weight, a sample's taken in increasing
feature order). The locks are int64 words in shared memory (``data["locks"]``); they
run on the per-sample lane of the compiled engine only. A worker killed while it holds
one leaves its peers waiting until the supervisor stops the run (``wait_timeout``).
"""

from __future__ import annotations

import os

import numpy as np

from hogkit.errors import InvalidArgument
from hogkit.kernels.logreg import LogRegArrays, csr_matvec, logreg_loss
from hogkit.validation import check_array, check_choice, check_float, check_indices, check_int
from hogkit.workloads.base import (CompiledParts, KernelCtx, Workload, check_bool,
                                   check_dtype, check_keys, check_param, check_seed,
                                   sample_from, zipf_probabilities)
from hogkit.workloads.files import check_fraction, held_out, read_svmlight, split


#: the generated data's features when ``n_features`` is not given
N_FEATURES = 20_000
#: ``lock=``: lock-free Hogwild!, one lock on the model, a lock per weight
LOCKS = ("none", "model", "feature")


def _rows(f, rows, prefix):
    """The CSR rows ``rows`` of an svmlight file's samples, named with ``prefix``."""
    lens = np.diff(f.indptr)[rows]
    indptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=indptr[1:])
    take = np.arange(indptr[-1]) + np.repeat(f.indptr[rows] - indptr[:-1], lens)
    return {f"{prefix}indptr": indptr, f"{prefix}indices": f.indices[take],
            f"{prefix}values": f.values[take], f"{prefix}y": f.y[rows]}


class SparseLogReg(Workload):
    """Sparse logistic regression; see the module docstring."""

    name = "logreg"
    needs_torch = False
    default_lr = 2.0
    default_batch = 64
    #: per-sample Hogwild! (docs/algorithms.md §1; lr / batch per sample): ahead of the
    #: batch lane at 1 worker (benchmarks/RESULTS.md, the lanes)
    default_lane = "sample"
    default_steps = 200_000
    defaults_why = ("SGD at the generated data's tuned lr, 64 samples a step, per-sample "
                    "Hogwild! (hogkit bench dense, hogkit bench lane)")
    lock = "none"                   # (set per instance; the class value: lock-free)
    _fields = ("n_samples", "n_features", "min_nnz", "max_nnz", "zipf", "values",
               "normalize", "margin_scale", "reg", "init_scale", "dtype")

    def __init__(self, *, n_samples=50_000, n_features=None, min_nnz=10, max_nnz=50,
                 zipf=1.1, values="binary", normalize=False, margin_scale=4.0, reg=0.0,
                 init_scale=0.0, dtype="float32", data=None, test_fraction=0.0,
                 lock="none"):
        self.lock = check_choice("lock", lock, LOCKS)
        sizes = self._read(data, test_fraction, n_features)
        self.n_samples = check_int("n_samples", sizes.get("n_samples", n_samples),
                                   min_value=1, max_value=2**31 - 1)
        self.n_features = check_int("n_features", sizes.get("n_features", n_features
                                                            or N_FEATURES),
                                    min_value=1, max_value=2**31 - 1)
        if self.data is not None:       # generation settings: inside the file's features
            min_nnz, max_nnz = min(min_nnz, self.n_features), min(max_nnz, self.n_features)
        self.min_nnz = check_int("min_nnz", min_nnz, min_value=1, max_value=self.n_features,
                                 fix="a sample cannot hold more features than exist")
        self.max_nnz = check_int("max_nnz", max_nnz, min_value=self.min_nnz,
                                 max_value=self.n_features,
                                 fix=f"use min_nnz={self.min_nnz} <= max_nnz <= "
                                     f"n_features={self.n_features}")
        self.zipf = check_float("zipf", zipf, min_value=0.0, max_value=10.0,
                                fix="0 is uniform popularity, ~1.1 is typical")
        self.values = check_choice("values", values, ("binary", "real"))
        self.normalize = check_bool("normalize", normalize)
        self.margin_scale = check_float("margin_scale", margin_scale, min_value=0.0)
        self.reg = check_float("reg", reg, min_value=0.0)
        self.init_scale = check_float("init_scale", init_scale, min_value=0.0)
        self.dtype = check_dtype(dtype)

    def _read(self, data, test_fraction, n_features) -> dict:
        """An svmlight file (``data``: ``hogkit.workloads.files``), read once here in
        the parent: the sizes it sets (features: at least its largest index; samples:
        all but the ``test_fraction`` ``build``'s seed holds out for the test metrics).
        The arrays are kept for ``build`` (not pickled)."""
        self.data, self._file = None, None
        self.test_fraction = check_fraction(test_fraction, data)
        if data is None:
            return {}
        self.data = os.fspath(data)
        self._file = f = read_svmlight(self.data)
        n = len(f.y)
        n_test = held_out(n, self.test_fraction)
        return {"n_samples": n - n_test, "n_features": max(f.n_features, n_features or 1)}

    def __getstate__(self):
        """Pickled without a data file's arrays (workers read shared memory)."""
        return {k: v for k, v in self.__dict__.items() if k != "_file"}

    def config(self):
        out = super().config()
        if self.data is not None:       # a generated run's config stays what it was
            out.update(data=self.data, test_fraction=self.test_fraction)
        if self.lock != "none":         # (and a lock-free one's too)
            out["lock"] = self.lock
        return out

    @property
    def needs_lane(self):
        """Why only the per-sample lane can run this workload, or None."""
        if self.lock == "none":
            return None
        return (f"lock={self.lock!r} holds its locks in the per-sample lane's kernel "
                f"(the compiled engine's lane='sample'); use lock='none' elsewhere")

    def _n_locks(self) -> int:
        return {"none": 0, "model": 1, "feature": self.n_features}[self.lock]

    def _locks(self, data):
        """The lock words of ``lock`` (none for Hogwild!), zeroed: free."""
        n = self._n_locks()
        if n > 1:       # a sample's locks are taken in increasing feature order
            indptr, indices = data["indptr"], data["indices"]
            row_start = np.zeros(len(indices), bool)
            row_start[indptr[:-1][indptr[:-1] < len(indices)]] = True
            if len(indices) > 1 and ((np.diff(indices) <= 0) & ~row_start[1:]).any():
                raise InvalidArgument("lock='feature' needs each sample's features in "
                                      "increasing order without repeats (its locks are "
                                      "taken in that order); sort and merge them in the "
                                      "data file")
        return np.zeros(n, np.int64)

    def _file_data(self, seed):
        """The file's samples less those ``seed`` holds out (``test_*``: the same CSR
        arrays and labels, read only by :meth:`metrics`)."""
        f = self._file if self._file is not None else read_svmlight(self.data)
        train, test = split(len(f.y), self.test_fraction, seed)
        data = _rows(f, train, "")
        if len(test):
            data.update(_rows(f, test, "test_"))
        return data

    # --- parent -------------------------------------------------------------------
    def build(self, seed):
        """``({"w"}, {"indptr", "indices", "values", "y"})``; data and initial weights
        from independent streams of ``seed``; with a data file its samples (and the
        held-out ``test_*`` arrays)."""
        seed = check_seed(seed)
        rng, init_rng = (np.random.default_rng(s)
                         for s in np.random.SeedSequence(seed).spawn(2))
        if self.data is not None:
            w = (init_rng.standard_normal(self.n_features) * self.init_scale).astype(self.dtype)
            data = self._file_data(seed)
            if self.lock != "none":
                data["locks"] = self._locks(data)
            return {"w": w}, data
        n, d = self.n_samples, self.n_features
        p_feat = zipf_probabilities(d, self.zipf, rng)
        drawn = rng.integers(self.min_nnz, self.max_nnz + 1, n)
        sample_of = np.repeat(np.arange(n, dtype=np.int64), drawn)
        keys = sample_of * d + sample_from(p_feat, len(sample_of), rng)
        keys.sort()
        keep = np.empty(len(keys), bool)
        keep[:1] = True
        np.not_equal(keys[1:], keys[:-1], out=keep[1:])
        keys = keys[keep]
        rows_of, indices = np.divmod(keys, d)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(rows_of, minlength=n), out=indptr[1:])
        if self.values == "binary":
            vals = np.ones(len(indices), np.float64)
        else:
            vals = rng.standard_normal(len(indices))
        if self.normalize:
            norms = np.sqrt(np.add.reduceat(vals * vals, indptr[:-1]))
            vals /= np.repeat(norms, np.diff(indptr))
        indices = indices.astype(np.int32)
        values = vals.astype(np.float32)
        w_true = rng.standard_normal(d)
        m = np.empty(n, np.float64)
        csr_matvec(indptr, indices, values, w_true, m)
        std = m.std()
        m *= self.margin_scale / std if std > 0 else 0.0
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-m))).astype(np.float32)
        data = {"indptr": indptr, "indices": indices, "values": values, "y": y}
        if self.lock != "none":
            data["locks"] = self._locks(data)
        w = (init_rng.standard_normal(d) * self.init_scale).astype(self.dtype)
        return {"w": w}, data

    def loss(self, params, data):
        """Mean log-loss over all samples (stable softplus form, no L2 term)."""
        total, _ = logreg_loss(params["w"], data["indptr"], data["indices"],
                               data["values"], data["y"])
        return float(total / len(data["y"]))

    def metrics(self, params, data):
        total, right = logreg_loss(params["w"], data["indptr"], data["indices"],
                                   data["values"], data["y"])
        n = len(data["y"])
        out = {"loss": float(total / n), "accuracy": right / n}
        if "test_y" in data:            # the samples a data file's split held out
            total, right = logreg_loss(params["w"], data["test_indptr"],
                                       data["test_indices"], data["test_values"],
                                       data["test_y"])
            m = len(data["test_y"])
            out.update(test_loss=float(total / m), test_accuracy=right / m)
        return out

    @staticmethod
    def predict_file(params, path) -> tuple:
        """``(probabilities, metrics)`` for the svmlight lines of ``path`` (``hogkit
        predict``): ``sigma(w·x)`` per line, and the file's ``loss`` (mean log-loss) and
        ``accuracy`` against its labels. Features past the model's count are refused."""
        w = params["w"]
        f = read_svmlight(path)
        if f.n_features > len(w):
            raise InvalidArgument(f"{path} has feature index {f.n_features}, the model "
                                  f"{len(w)} features; predict with the features it was "
                                  f"trained on")
        m = np.empty(len(f.y), np.float64)
        csr_matvec(f.indptr, f.indices, f.values, np.asarray(w, np.float64), m)
        total, right = logreg_loss(w, f.indptr, f.indices, f.values, f.y)
        n = len(f.y)
        return 1.0 / (1.0 + np.exp(-m)), {"loss": float(total / n), "accuracy": right / n}

    # --- worker -------------------------------------------------------------------
    def compiled(self, params, data):
        """The step core's view: CSR samples, labels and ``reg``; parameter ``(w,)`` as
        ``(n_features, 1)``; up to the longest row's nonzeros per sample."""
        max_nnz = self._check(params, data)
        locks = data.get("locks") if self.lock != "none" else None
        if self.lock != "none" and (locks is None or len(locks) != self._n_locks()):
            raise InvalidArgument(f"lock={self.lock!r}: data lacks its lock words "
                                  f"(data['locks']); pass what build() returned")
        return CompiledParts(LogRegArrays(data["indptr"], data["indices"], data["values"],
                                          data["y"], float(self.reg),
                                          locks if locks is not None else
                                          np.zeros(0, np.int64)),
                             ("w",), (max_nnz,), uses_rng=False)

    def _check(self, params, data):
        check_keys("params", params, ("w",), self.name)
        check_keys("data", data, ("indptr", "indices", "values", "y"), self.name)
        check_param("params['w']", params["w"], (self.n_features,))
        y = check_array("data['y']", data["y"], dtype=(np.float32, np.float64), ndim=1)
        indptr = check_array("data['indptr']", data["indptr"], dtype=(np.int32, np.int64),
                             shape=(len(y) + 1,))
        values = check_array("data['values']", data["values"],
                             dtype=(np.float32, np.float64), ndim=1)
        indices = check_indices("data['indices']", data["indices"], self.n_features)
        lengths = np.diff(indptr)
        if (len(y) == 0 or indptr[0] != 0 or indptr[-1] != len(indices)
                or len(values) != len(indices) or (lengths < 0).any()):
            raise InvalidArgument(
                f"data is not a valid CSR matrix of {len(y)} samples (indptr must start "
                f"at 0, not decrease and end at len(indices)={len(indices)} = "
                f"len(values)={len(values)}); pass what build() returned")
        return int(lengths.max())

    def setup(self, params, data, *, rank=0, seed=0):
        return KernelCtx(self.compiled(params, data), params, batch=self.default_batch,
                         rank=rank, seed=seed, n_samples=len(data["y"]))

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        """A sweep block of ``batch`` samples from the worker's cursor (samples are
        i.i.d., so consecutive ones are a uniform sample); one sparse entry per
        (sample, nonzero). ``read`` is filled only when asked for."""
        return ctx.gradient(rng, batch, keep_read)
