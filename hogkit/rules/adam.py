"""Adam on the rule contract (``hogkit.rules.base``); its kernels are ``kernels/adam.py``.

Kingma & Ba, "Adam: a method for stochastic optimization", ICLR 2015, with
``torch.optim.Adam``'s arithmetic on dense buffers and ``torch.optim.SparseAdam``'s
laziness on sparse rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from hogkit.errors import InvalidArgument
from hogkit.kernels.adam import AdamCfg
from hogkit.rules.base import Rule, State, check_lr, check_unit
from hogkit.validation import check_float

__all__ = ["Adam"]


@dataclass(frozen=True)
class Adam(Rule):
    """Adam::

        m ← β1·m + (1 − β1)·g,    v ← β2·v + (1 − β2)·g ⊙ g
        w ← w − lr · (m / (1 − β1^t)) / (sqrt(v / (1 − β2^t)) + eps)

    with torch's defaults (``lr`` 1e-3, ``betas`` (0.9, 0.999), ``eps`` 1e-8) and its
    order of operations (``kernels/adam.py``). On sparse rows only the touched rows of
    ``m`` and ``v`` move, as ``torch.optim.SparseAdam``'s.

    **One state for every worker.** ``t`` is the number of updates the moments have
    seen, and under Hogwild! every worker's update moves them: the workers of a run
    share one ``m`` and one ``v`` (``shared_state``; one block of the run's state
    store, bound by every worker), and ``t`` is the model's update count read from the
    clocks, this update included, so the bias correction counts every worker's steps
    exactly (torch's recipe gives each process an optimizer of its own, whose step
    counts only its own updates). With a private state (``hogkit.optim`` in a worker of
    :func:`hogkit.spawn`, ``simulate(rule_state="worker")``) ``t`` counts the worker's
    own updates. ``state["k/<name>"]`` records the ``t`` of the last update;
    :meth:`apply` outside an engine counts from it.

    State: ``"m/<name>"`` and ``"v/<name>"`` (zeros like the parameter) and
    ``"k/<name>"``. Spelled ``adam``.
    """

    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8

    spell = ("adam",)
    shared_state = True
    counts_updates = True
    torch_state = {"m": "exp_avg", "v": "exp_avg_sq", "k": "step"}

    def __post_init__(self):
        object.__setattr__(self, "lr", check_lr(self.lr))
        if not (isinstance(self.betas, (tuple, list)) and len(self.betas) == 2):
            raise InvalidArgument(f"betas={self.betas!r} must be a pair (beta1, beta2), "
                                  f"e.g. (0.9, 0.999) as torch's")
        b1, b2 = (check_unit(n, b, fix="the moments' decays lie in [0, 1); torch uses "
                                       "(0.9, 0.999)")
                  for n, b in zip(("betas[0]", "betas[1]"), self.betas))
        object.__setattr__(self, "betas", (b1, b2))
        object.__setattr__(self, "eps", check_float(
            "eps", self.eps, min_value=0.0, exclude_min=True,
            fix="eps keeps the step finite where v is 0; torch uses 1e-8"))

    def cfg(self):
        return AdamCfg(self.lr, self.betas[0], self.betas[1], self.eps)

    @property
    def state(self):
        return State(first="m", second="v", counts=True)

    @classmethod
    def from_spell(cls, name, arg, *, lr, momentum=0.0):
        if arg:
            raise InvalidArgument(f"rule {name}:{arg}: adam takes no ':' setting; write "
                                  f"adam (betas and eps as torch's defaults)")
        return cls(lr=lr)
