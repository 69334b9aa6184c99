"""A user's own model, data and training loops, as a test defines them (not hogkit's
built-ins). Importable from spawned workers because tests/ is on sys.path."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import torch
from torch import nn

import hogkit


class TinyNet(nn.Module):
    """A user's module: 8 -> 16 -> 1 with tanh."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(x))).squeeze(-1)


class BagOfIds(nn.Module):
    """A sparse-embedding model: the mean of an id's embedding, scaled by a buffer."""

    def __init__(self, n=40, d=4):
        super().__init__()
        self.emb = nn.Embedding(n, d, sparse=True)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, ids):
        return self.emb(ids).sum(-1) * self.scale


def regression(n=2000, seed=0):
    """``X`` (n, 8) float32 and ``y`` (n,) from a fixed smooth function plus noise."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 8)).astype(np.float32)
    w = np.linspace(-1, 1, 8).astype(np.float32)
    y = (np.sin(X @ w) + 0.05 * rng.standard_normal(n)).astype(np.float32)
    return X, y


def mse(module, batch):
    return ((module(batch["x"]) - batch["y"]) ** 2).mean()


def id_mse(module, batch):
    return ((module(batch["ids"]) - batch["t"]) ** 2).mean()


def make_tiny():
    return TinyNet()


# --- loops for hogkit.spawn ------------------------------------------------------------

_X, _Y = (torch.from_numpy(a) for a in regression())


def full_mse(model):
    with torch.no_grad():
        return float(((model(_X) - _Y) ** 2).mean())


def train_loop(worker, model, steps, lr=0.05, optimizer="SGD", kill_rank=-1, kill_at=-1):
    """Minibatch SGD on the regression data; worker ``kill_rank`` SIGKILLs itself at
    step ``kill_at``."""
    g = torch.Generator().manual_seed(1000 + worker.rank)
    opt = getattr(hogkit.optim, optimizer)(model.parameters(), lr=lr)
    for k in range(steps(worker.rank) if callable(steps) else steps):
        if worker.rank == kill_rank and k == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        idx = torch.randint(0, len(_X), (32,), generator=g)
        opt.zero_grad()
        ((model(_X[idx]) - _Y[idx]) ** 2).mean().backward()
        opt.step()


def uneven(rank):
    """Rank 0 stops early: its peers must not wait for it (it is DONE)."""
    return 10 if rank == 0 else 200


def until_stopped(worker, model, lr=0.01):
    """A loop that never ends by itself: only the run's stop ends it (Stopped)."""
    g = torch.Generator().manual_seed(worker.rank)
    opt = hogkit.optim.SGD(model.parameters(), lr=lr)
    while True:
        idx = torch.randint(0, len(_X), (16,), generator=g)
        opt.zero_grad()
        ((model(_X[idx]) - _Y[idx]) ** 2).mean().backward()
        opt.step()
        time.sleep(0.001)


def make_classifier():
    """Four classes from four features: labels must lie in 0..3."""
    torch.manual_seed(0)
    return nn.Linear(4, 4)


def cross_entropy(module, batch):
    return nn.functional.cross_entropy(module(batch["x"]), batch["y"])
