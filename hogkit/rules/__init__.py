"""The rules wing: what one update does to the parameters.

``base`` (the rule contract: ``Rule``, its state and capabilities, the spelling
registry), ``core`` (``SGD``, ``StalenessAware``, ``DelayCompensated``, ``GapAware``,
``AdaGrad``, ``RMSProp``), ``adam`` (``Adam``), ``compose`` (optax-style pieces resolved
to a fused rule: ``chain``), ``density`` (apply a fraction of each update, keep the
rest as a residual), ``batching`` (fixed and worker-adaptive batches), ``grads``
(``Grad``: the seam between compute and apply).
"""

from hogkit.rules.base import Rule
from hogkit.rules.core import (SGD, AdaGrad, DelayCompensated, GapAware, RMSProp,
                               StalenessAware)
from hogkit.rules.adam import Adam          # (after core: the registry lists the built-ins first)
from hogkit.rules.batching import AdaptiveBatch, EpochBalancedBatch, FixedBatch
from hogkit.rules.compose import chain
from hogkit.rules.density import Density
from hogkit.rules.grads import Grad

__all__ = ["Rule", "SGD", "StalenessAware", "DelayCompensated", "GapAware", "AdaGrad",
           "RMSProp", "Adam", "chain", "Density", "FixedBatch", "AdaptiveBatch",
           "EpochBalancedBatch", "Grad"]
