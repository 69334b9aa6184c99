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

torch is imported only inside the methods: importing this module costs nothing, and
no other workload imports torch.
"""

from __future__ import annotations

import numpy as np

from hogkit.errors import InvalidArgument
from hogkit.grads import Grad
from hogkit.validation import check_array, check_float, check_int
from hogkit.workloads.base import (Workload, check_dtype, check_keys, check_param,
                                   check_seed)

N_IN, N_OUT = 64, 10


def _module(hidden, dtype):
    import torch
    from torch import nn
    m = nn.Sequential(nn.Linear(N_IN, hidden), nn.ReLU(), nn.Linear(hidden, N_OUT))
    return m.to(getattr(torch, dtype))


def _as_tensor(a):
    """Zero-copy torch view of a numpy array (a copy only if the array is read-only)."""
    import torch
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


class _Ctx:
    __slots__ = ("module", "names", "params", "X", "y", "n", "snap", "snap_module",
                 "snap_params")

    def __init__(self, module, X, y, snap_module, snap):
        self.module = module
        self.names = [name for name, _ in module.named_parameters()]
        self.params = [p for _, p in module.named_parameters()]
        self.X, self.y, self.n = X, y, X.shape[0]
        self.snap_module, self.snap = snap_module, snap
        self.snap_params = [p for _, p in snap_module.named_parameters()]


class DigitsMLP(Workload):
    """One-hidden-layer MLP on the scikit-learn digits; see the module docstring."""

    name = "mlp"
    needs_torch = True
    default_lr = 0.1
    default_batch = 32
    default_steps = 40_000
    _fields = ("hidden", "test_fraction", "split_seed", "dtype")

    def __init__(self, *, hidden=64, test_fraction=0.2, split_seed=0, dtype="float32"):
        self.hidden = check_int("hidden", hidden, min_value=1, max_value=1 << 16)
        self.test_fraction = check_float("test_fraction", test_fraction, min_value=0.0,
                                         max_value=0.9,
                                         fix="keep at least 10% of the digits to train on")
        self.split_seed = check_seed(split_seed, "split_seed")
        self.dtype = check_dtype(dtype)

    def _shapes(self):
        h = self.hidden
        return {"0.weight": (h, N_IN), "0.bias": (h,), "2.weight": (N_OUT, h),
                "2.bias": (N_OUT,)}

    # --- parent -------------------------------------------------------------------
    def build(self, seed):
        """``({"0.weight", "0.bias", "2.weight", "2.bias"}, {"X", "y", "X_test",
        "y_test"})``; the data does not depend on ``seed``, the initial params do."""
        import torch
        from sklearn.datasets import load_digits
        seed = check_seed(seed)
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
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = _module(self.hidden, self.dtype)
        params = {name: p.detach().numpy().copy() for name, p in module.named_parameters()}
        return params, data

    def _evaluate(self, params, X, y):
        import torch
        from torch.func import functional_call
        from torch.nn.functional import cross_entropy
        if len(y) == 0:
            return float("nan"), float("nan")
        module = _module(self.hidden, self.dtype)
        tensors = {name: _as_tensor(params[name]) for name in self._shapes()}
        with torch.no_grad():
            out = functional_call(module, tensors, (_as_tensor(X),))
            loss = cross_entropy(out, _as_tensor(y)).item()
            acc = (out.argmax(dim=1) == _as_tensor(y)).double().mean().item()
        return float(loss), float(acc)

    def loss(self, params, data):
        """Mean cross-entropy on the train set."""
        return self._evaluate(params, data["X"], data["y"])[0]

    def metrics(self, params, data):
        loss, acc = self._evaluate(params, data["X"], data["y"])
        out = {"loss": loss, "accuracy": acc}
        if "X_test" in data and len(data["y_test"]):
            out["test_loss"], out["test_accuracy"] = self._evaluate(
                params, data["X_test"], data["y_test"])
        return out

    # --- worker -------------------------------------------------------------------
    def setup(self, params, data, *, rank=0, seed=0):
        """Builds the module and rebinds each parameter's ``.data`` to a zero-copy
        torch view of ``params[name]`` (shared memory); caps torch at one thread."""
        import torch
        shapes = self._shapes()
        check_keys("params", params, tuple(shapes), self.name)
        check_keys("data", data, ("X", "y"), self.name)
        dt = np.dtype(self.dtype)
        for name, shape in shapes.items():
            check_param(f"params[{name!r}]", params[name], shape, dtype=dt)
        X = check_array("data['X']", data["X"], dtype=dt, shape=(None, N_IN))
        y = check_array("data['y']", data["y"], dtype=np.int64, shape=(X.shape[0],))
        if len(y) == 0 or y.min() < 0 or y.max() >= N_OUT:
            raise InvalidArgument(f"data['y'] must hold at least one label in [0, {N_OUT}); "
                                  f"pass what build() returned")
        torch.set_num_threads(1)
        module = _module(self.hidden, self.dtype)
        for name, p in module.named_parameters():
            p.data = torch.from_numpy(params[name])
        # keep_read=True computes from a private snapshot, so `read` is exactly what
        # the gradient saw (the live params may change mid-forward).
        snap_module = _module(self.hidden, self.dtype)
        snap = {name: np.empty(shape, dt) for name, shape in shapes.items()}
        for name, p in snap_module.named_parameters():
            p.data = torch.from_numpy(snap[name])
        return _Ctx(module, _as_tensor(X), _as_tensor(y), snap_module, snap)

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        import torch
        from torch.nn.functional import cross_entropy
        batch = check_int("batch", batch, min_value=1) if batch < 1 else batch
        idx = torch.from_numpy(rng.integers(0, ctx.n, size=batch))
        if keep_read:
            for name, p in zip(ctx.names, ctx.params):
                np.copyto(ctx.snap[name], p.data.numpy())
            module, ps = ctx.snap_module, ctx.snap_params
        else:
            module, ps = ctx.module, ctx.params
        for p in ps:
            p.grad = None  # backward then allocates fresh grads: values need no copy
        loss = cross_entropy(module(ctx.X.index_select(0, idx)), ctx.y.index_select(0, idx))
        loss.backward()
        if keep_read:
            return [Grad(name, p.grad.numpy(), read=ctx.snap[name])
                    for name, p in zip(ctx.names, ps)]
        return [Grad(name, p.grad.numpy()) for name, p in zip(ctx.names, ps)]
