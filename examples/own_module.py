"""Your own ``nn.Module`` under hogkit: a small classifier on generated data.

``hogkit.TorchWorkload(module, loss_fn, data)`` is all it takes: the module (or a
function that builds one), a loss ``loss_fn(module, batch) -> scalar tensor`` where
``batch`` holds the data's tensors at the sampled rows, and the data as a dict of
arrays with a common first dimension. Every hogkit knob then applies: policies,
rules, density, batching, stragglers, the simulator.

    python examples/own_module.py
    python examples/own_module.py --workers 4 --steps 8000 --policy ssp
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn

import hogkit


class Classifier(nn.Module):
    """Two hidden layers, GELU; 20 features in, 4 classes out."""

    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, hidden), nn.GELU(),
                                 nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, 4))

    def forward(self, x):
        return self.net(x)


def cross_entropy(model, batch):
    """The mean loss over the batch (a scalar tensor)."""
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


def accuracy(model, tensors):
    """More metrics for the summary: accuracy on the held-out rows."""
    logits = model(tensors["eval/x"])
    return {"test_accuracy": float((logits.argmax(1) == tensors["eval/y"]).float().mean())}


def make_data(n=6000, seed=0):
    """Four Gaussian blobs in 20 dimensions, labels from the nearest centre."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((4, 20)) * 0.5
    y = rng.integers(0, 4, n)
    x = (centres[y] + rng.standard_normal((n, 20))).astype(np.float32)
    return x, y


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--policy", choices=("async", "ssp"), default="async")
    args = p.parse_args(argv)

    x, y = make_data()
    workload = hogkit.TorchWorkload(
        Classifier(), cross_entropy, data={"x": x[:5000], "y": y[:5000]},
        eval_data={"x": x[5000:], "y": y[5000:]}, metrics_fn=accuracy, lr=0.05, batch=32)
    policy = hogkit.SSP(2) if args.policy == "ssp" else hogkit.Async()
    run = hogkit.train(workload, workers=args.workers,
                       outputs=hogkit.Outputs(progress=False), steps=args.steps,
                       policy=policy)
    m = run.summary()["metrics"]
    print(f"{workload.name}: {run.workers} workers, {run.updates} updates, "
          f"loss {run.initial_loss:.4f} -> {run.final_loss:.4f}, "
          f"test accuracy {m['test_accuracy']:.3f}, "
          f"mean update gap {run.staleness['update_gap']['mean']:.2f}")

    # the same workload on 32 simulated workers (virtual time, deterministic)
    sim = hogkit.simulate(workload, workers=32, steps=args.steps, policy=policy)
    print(f"simulated 32 workers: loss {sim.initial_loss:.4f} -> {sim.final_loss:.4f}, "
          f"mean update gap {sim.staleness['update_gap']['mean']:.2f}")

    model = workload.module_with(run.params)      # the trained weights, as a module
    with torch.no_grad():
        logits = model(torch.from_numpy(x[5000:]))
    print(f"trained module: {type(model).__name__}, "
          f"accuracy {float((logits.argmax(1).numpy() == y[5000:]).mean()):.3f}")


if __name__ == "__main__":
    main()
