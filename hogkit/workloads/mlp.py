"""A small MLP on scikit-learn's digits, with torch autograd: the dense workload.

Data: ``sklearn.datasets.load_digits()`` (1797 8x8 images, ships in the wheel, no
download), split once into train/test by ``split_seed`` (the same split whatever the
``build`` seed, so runs with different seeds see the same data), standardised with
the train mean and std (constant pixels keep std 1). Arrays: ``X`` (n_train, 64) and
``X_test`` in the param dtype, ``y`` and ``y_test`` int64.

Model: ``nn.Sequential(Linear(64, hidden), ReLU(), Linear(hidden, 10))``; params keyed
by torch's names ("0.weight", "0.bias", "2.weight", "2.bias"), initialised by torch's
default init under ``torch.manual_seed(seed)`` (the caller's global torch RNG is left
as it was). Gradient: dense, of the mean cross-entropy over the minibatch (torch's
default reduction). Every gradient is dense, so every update conflicts with every
other worker's: the opposite end from sparse logistic regression.

Loss reported by ``loss``: mean cross-entropy on the train set; ``metrics`` adds
train accuracy and test loss/accuracy.

The torch machinery (binding the module to shared memory, sampling, autograd, the
snapshot for ``keep_read``) is :class:`~hogkit.workloads.module.ModuleWorkload`'s, the
same that runs a user's own module (``TorchWorkload``). torch is imported only inside
the methods: importing this module costs nothing.
"""

from __future__ import annotations

import numpy as np

from hogkit.errors import InvalidArgument
from hogkit.validation import check_array, check_float, check_int
from hogkit.workloads.base import check_dtype, check_keys, check_seed
from hogkit.workloads.module import ModuleWorkload, module_params

N_IN, N_OUT = 64, 10


def _module(hidden, dtype):
    import torch
    from torch import nn
    m = nn.Sequential(nn.Linear(N_IN, hidden), nn.ReLU(), nn.Linear(hidden, N_OUT))
    return m.to(getattr(torch, dtype))


class DigitsMLP(ModuleWorkload):
    """One-hidden-layer MLP on the scikit-learn digits; see the module docstring."""

    name = "mlp"
    default_lr = 0.1
    default_batch = 32
    default_steps = 40_000
    defaults_why = "SGD at the lr tuned on the digits, 32 samples a step"
    eval_rows = None               # the loss is over the whole train set (1437 rows)
    train_keys = ("X", "y")
    _fields = ("hidden", "test_fraction", "split_seed", "dtype")

    def __init__(self, *, hidden=64, test_fraction=0.2, split_seed=0, dtype="float32"):
        self.hidden = check_int("hidden", hidden, min_value=1, max_value=1 << 16)
        self.test_fraction = check_float("test_fraction", test_fraction, min_value=0.0,
                                         max_value=0.9,
                                         fix="keep at least 10% of the digits to train on")
        self.split_seed = check_seed(split_seed, "split_seed")
        self.dtype = check_dtype(dtype)

    def make_module(self):
        return _module(self.hidden, self.dtype)

    def step_loss(self, module, batch):
        from torch.nn.functional import cross_entropy
        return cross_entropy(module(batch["X"]), batch["y"])

    # --- parent -------------------------------------------------------------------
    def build(self, seed):
        """``({"0.weight", "0.bias", "2.weight", "2.bias"}, {"X", "y", "X_test",
        "y_test"})``; the data does not depend on ``seed``, the initial params do."""
        from sklearn.datasets import load_digits
        digits = load_digits()
        X, y = digits.data.astype(np.float64), digits.target.astype(np.int64)
        order = np.random.default_rng(self.split_seed).permutation(len(y))
        n_test = int(round(self.test_fraction * len(y)))
        test, train = order[:n_test], order[n_test:]
        mean = X[train].mean(axis=0)
        std = X[train].std(axis=0)
        std[std == 0] = 1.0
        X = (X - mean) / std
        dt = np.dtype(self.dtype)
        data = {"X": np.ascontiguousarray(X[train], dt), "y": y[train].copy(),
                "X_test": np.ascontiguousarray(X[test], dt), "y_test": y[test].copy()}
        return module_params(self._seeded_module(seed)), data

    def extra_metrics(self, module, tensors):
        """Train accuracy, and test loss/accuracy when there is a test set."""
        from torch.nn.functional import cross_entropy
        out = {"accuracy": _accuracy(module(tensors["X"]), tensors["y"])}
        if "X_test" in tensors and len(tensors["y_test"]):
            logits = module(tensors["X_test"])
            out["test_loss"] = float(cross_entropy(logits, tensors["y_test"]))
            out["test_accuracy"] = _accuracy(logits, tensors["y_test"])
        return out

    # --- worker -------------------------------------------------------------------
    def setup(self, params, data, *, rank=0, seed=0):
        """Checks the data, then binds a module to the shared ``params`` (checked
        there: :meth:`ModuleWorkload.setup`)."""
        check_keys("data", data, ("X", "y"), self.name)
        dt = np.dtype(self.dtype)
        X = check_array("data['X']", data["X"], dtype=dt, shape=(None, N_IN))
        y = check_array("data['y']", data["y"], dtype=np.int64, shape=(X.shape[0],))
        if len(y) == 0 or y.min() < 0 or y.max() >= N_OUT:
            raise InvalidArgument(f"data['y'] must hold at least one label in [0, {N_OUT}); "
                                  f"pass what build() returned")
        return super().setup(params, data, rank=rank, seed=seed)


def _accuracy(logits, y):
    return float((logits.argmax(dim=1) == y).double().mean())
