"""Keep your own training loop: ``hogkit.spawn`` + a ``hogkit.optim`` optimizer.

The torch Hogwild! recipe, with hogkit underneath: ``hogkit.spawn(fn, model,
nprocs=...)`` shares the model's parameters (one shared-memory segment, cleaned up on
every exit path), runs ``fn(worker, model)`` in each process, and supervises them.
Each ``opt.step()`` updates the shared parameters with hogkit's rule, ticks the clocks,
records how stale the gradient was and waits as the policy says. A torch
``lr_scheduler`` drives the optimizer as usual.

    python examples/own_loop.py
    python examples/own_loop.py --nprocs 4 --policy ssp --rule gap
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import hogkit

torch.manual_seed(0)
X = torch.randn(8000, 16)
Y = torch.sin(X @ torch.linspace(-1, 1, 16)).unsqueeze(1) + 0.05 * torch.randn(8000, 1)

OPTIMIZERS = {"sgd": hogkit.optim.SGD, "staleness": hogkit.optim.StalenessAware,
              "dc": hogkit.optim.DelayCompensated, "gap": hogkit.optim.GapAware}


def loop(worker, model, steps, rule):
    """Runs in each worker process: an ordinary torch loop."""
    g = torch.Generator().manual_seed(worker.rank)
    opt = OPTIMIZERS[rule](model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    for _ in range(steps):
        idx = torch.randint(0, len(X), (32,), generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(X[idx]), Y[idx]).backward()
        opt.step()
        sched.step()


@torch.no_grad()
def full_loss(model):
    """The loss on all the data, evaluated by the parent on the live shared weights."""
    return float(nn.functional.mse_loss(model(X), Y))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--steps", type=int, default=1500, help="steps per worker")
    p.add_argument("--policy", choices=("async", "ssp", "bsp"), default="async")
    p.add_argument("--rule", choices=sorted(OPTIMIZERS), default="sgd")
    args = p.parse_args(argv)

    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    policy = {"async": hogkit.Async(), "ssp": hogkit.SSP(2), "bsp": hogkit.BSP()}[args.policy]
    run = hogkit.spawn(loop, model, nprocs=args.nprocs,
                       outputs=hogkit.Outputs(progress=False), args=(args.steps, args.rule),
                       policy=policy, eval_fn=full_loss)
    gap = run.staleness["update_gap"]
    print(f"{args.nprocs} processes, {run.updates} updates in {run.wall_s:.2f} s, "
          f"loss {run.initial_loss:.4f} -> {run.final_loss:.4f}; update gap mean "
          f"{gap['mean']:.2f}, max {gap['max']}")
    print(f"the model holds the trained weights: loss {full_loss(model):.4f}")


if __name__ == "__main__":
    main()
