"""The knobs' string forms: one parser per knob, for the command line, ``hogkit.sweep``
and Python alike.

The Python API takes objects (``SSP(2)``, ``Density(0.25, how="random")``); the command
line and a sweep's grid take short strings. Each string form is read here, by one
function, so ``hogkit run --density topk:0.5``, ``sweep({"density": ["topk:0.5"]})`` and
``parse_density("topk:0.5")`` are the same object:

===================  ===================================================================
``parse_policy``     ``async`` | ``bsp`` | ``ssp:S`` | ``dssp:LO:HI`` |
                     ``local:H[:overlap]`` | ``delay:K`` (the policies' registry)
``parse_rule``       ``sgd`` | ``staleness-aware`` | ``dc-asgd[:LAMBDA]`` |
                     ``dc-asgd-adaptive[:LAMBDA0]`` | ``gap-aware`` | ``adagrad`` |
                     ``adagrad-rowwise`` | ``rmsprop`` | ``rmsprop-rowwise`` | ``adam``
                     (the rules' registry), with a learning rate and momentum
``parse_density``    a fraction | ``topk:F`` | ``random:F`` | ``every:K``, ``:dropped``
                     appended for no residual
``parse_batch``      an int (per worker) | ``fixed[:B]`` |
                     ``adaptive[:B[:last|ema|narx]]`` | ``epoch[:B]`` (B: global)
``parse_straggler``  ``RANK:FACTOR`` | ``RANK:load:AMP:PERIOD`` |
                     ``RANK:pauses:PROB:SECONDS`` (``parse_stragglers``: several)
``parse_delays``     the simulator's step times (:mod:`hogkit.engine.delays`)
``parse_schedule``   P3's propagation schedules (:mod:`hogkit.p3.propagation`)
===================  ===================================================================

``parse_delays`` and ``parse_schedule`` are defined beside their concepts and only
gathered here: ``simulate(delays="lognormal:1e-3:0.5")``, ``simulate_comm(schedule=
"p3:4096")`` and the cluster agent take those strings in Python, and the modules that
read them sit below this one (an import from there to here would point upward).

Every error names the value, what it must be, and the forms that are accepted.
"""

from __future__ import annotations

import dataclasses

from hogkit.engine.delays import Load, Pauses, Slowdown, parse_delays
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.p3.propagation import parse_schedule
from hogkit.policy import from_string
from hogkit.rules import base as rule_base
from hogkit.rules.batching import AdaptiveBatch, EpochBalancedBatch, FixedBatch
from hogkit.rules.density import Density
from hogkit.validation import check_int

__all__ = ["parse_policy", "parse_rule", "parse_density", "parse_batch", "parse_straggler",
           "parse_stragglers", "parse_delays", "parse_schedule", "rule_names"]

# --------------------------------------------------------------------------- policy

def parse_policy(text):
    """A consistency policy from its string form: ``async`` | ``bsp`` | ``ssp:S`` |
    ``dssp:LO:HI`` | ``local:H[:overlap]`` | ``delay:K`` | any registered policy's
    spelling (case-insensitive). The policy classes register their own forms
    (:func:`hogkit.policy.from_string`, :func:`hogkit.policy.spellings`), so a new
    policy needs no edit here."""
    return from_string(text)


# --------------------------------------------------------------------------- rule

def rule_names() -> tuple:
    """The update rules by name (``hogkit run --rule``, a sweep's ``rule`` knob): every
    spelling the rules' registry holds (:func:`hogkit.rules.base.names`)."""
    return rule_base.names()


def parse_rule(name, *, lr=None, momentum=0.0, workload=None):
    """The update rule ``name`` (``NAME[:SETTING]``, one of :func:`rule_names`) with
    learning rate ``lr`` (None: ``workload.default_lr``) and ``momentum``; the rule
    classes read their own spellings (:func:`hogkit.rules.base.from_string`), e.g.
    ``adagrad-rowwise`` (one accumulator per row, as LIBMF's) or ``dc-asgd:0.2``
    (DC-ASGD's compensation strength), so a new rule needs no edit here.

    ``name=None`` is the workload's default rule (``hogkit run --lr 0.1`` with no
    ``--rule``), at ``lr`` when one is given; None when neither is (the run then takes
    its defaults)."""
    if name is None:
        return _default_rule(lr, momentum, workload)
    if lr is None:
        if workload is None:
            raise InvalidArgument(f"rule {name!r} needs lr=... (or a workload whose "
                                  f"default_lr it takes)")
        lr = workload.default_lr
    return rule_base.from_string(name, lr=lr, momentum=momentum)


def _default_rule(lr, momentum, workload):
    """The workload's default rule at ``lr`` (None: as it is, or None when ``momentum``
    is not given either)."""
    if lr is None and not momentum:
        return None
    if workload is None:
        raise InvalidArgument("lr or momentum without a rule name needs the workload whose "
                              "default rule they set; name a rule (e.g. --rule sgd)")
    d = workload.defaults()
    rule = d.rule if d.rule is not None else rule_base.from_string("sgd", lr=d.lr)
    if momentum:
        if not rule_base.has_momentum(type(rule)):
            raise InvalidArgument(f"--momentum {momentum} without --rule: "
                                  f"{workload.name}'s default rule {rule!r} has no "
                                  f"momentum term; name a rule that has one (--rule sgd)")
        rule = dataclasses.replace(rule, momentum=momentum)
    return rule if lr is None else rule.with_lr(lr)


# --------------------------------------------------------------------------- density

_DENSITY_FORMS = ('a fraction F, "topk:F", "random:F" or "every:K", with ":dropped" '
                  'for no residual (e.g. "random:0.25:dropped")')


def parse_density(spec):
    """A density from a fraction or ``"topk:F"`` | ``"random:F"`` | ``"every:K"``, with
    ``":dropped"`` appended for no residual; ``1``/``"1.0"``: None (everything sent)."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return None if float(spec) == 1.0 else Density(float(spec))
    if not isinstance(spec, str):
        raise InvalidType(f"density must be a number or a string ({_DENSITY_FORMS}), got "
                          f"{type(spec).__name__}")
    parts = [p.strip() for p in spec.strip().lower().split(":")]
    residual = True
    if parts[-1] == "dropped":
        residual, parts = False, parts[:-1]
    try:
        if len(parts) == 1:
            fraction = float(parts[0])
            if fraction == 1.0 and residual:
                return None
            return Density(fraction, residual=residual)
        if len(parts) == 2 and parts[0] in ("topk", "random"):
            return Density(float(parts[1]), how=parts[0], residual=residual)
        if len(parts) == 2 and parts[0] == "every":
            return Density(1.0, every=int(parts[1]), residual=residual)
    except ValueError:
        pass
    raise InvalidArgument(f"density {spec!r} is not {_DENSITY_FORMS}")


# --------------------------------------------------------------------------- batch

_BATCH_FORMS = ('an int (samples per worker) or "fixed[:B]" | '
                '"adaptive[:B[:last|ema|narx]]" | "epoch[:B]" (B: the global batch)')


def parse_batch(text, *, per_worker=32, workers=1):
    """A batch from its string form: digits are the samples per worker per step (an
    int); every other form takes the global batch B (default ``per_worker · workers``)."""
    if not isinstance(text, str):
        raise InvalidType(f"batch must be a string such as 'adaptive:256', got "
                          f"{type(text).__name__}")
    if text.strip().isdigit():
        return int(text)
    parts = [p.strip() for p in text.strip().lower().split(":")]
    kind, args = parts[0], parts[1:]
    arity = {"fixed": 1, "adaptive": 2, "epoch": 1}
    if kind not in arity:
        raise InvalidArgument(f"unknown batch {text!r}; expected {_BATCH_FORMS}")
    if len(args) > arity[kind]:
        raise InvalidArgument(f"batch {text!r} has too many fields; expected {_BATCH_FORMS}")
    if args:
        try:
            n = int(args[0])
        except ValueError:
            raise InvalidArgument(f"batch {text!r}: size {args[0]!r} is not an int; "
                                  f"expected {_BATCH_FORMS}") from None
    else:
        n = per_worker * workers
    if kind == "fixed":
        return FixedBatch(n)
    if kind == "epoch":
        return EpochBalancedBatch(n)
    return AdaptiveBatch(n, predictor=args[1] if len(args) > 1 else "last")


# --------------------------------------------------------------------------- stragglers

_STRAGGLER_FORMS = ('RANK:FACTOR (e.g. 1:3, worker 1 runs three times slower), '
                    'RANK:load:AMPLITUDE:PERIOD (a time-varying slowdown 1 + A(1 + '
                    'sin 2πt/P)/2) or RANK:pauses:PROB:SECONDS')


def parse_straggler(text: str):
    """``"RANK:FACTOR"`` → ``(rank, Slowdown(factor))``; ``"RANK:load:A:P"`` →
    ``(rank, Load(A, P))``; ``"RANK:pauses:PROB:S"`` → ``(rank, Pauses(PROB, S))``."""
    parts = [p.strip() for p in str(text).lower().split(":")]
    kinds = {"load": Load, "pauses": Pauses}
    if len(parts) == 2:
        kind, nums = Slowdown, parts[1:]
    elif len(parts) == 4 and parts[1] in kinds:
        kind, nums = kinds[parts[1]], parts[2:]
    else:
        raise InvalidArgument(f"straggler {text!r}: expected {_STRAGGLER_FORMS}")
    try:
        rank, args = int(parts[0]), [float(x) for x in nums]
    except ValueError:
        raise InvalidArgument(f"straggler {text!r} needs an int rank and numbers; expected "
                              f"{_STRAGGLER_FORMS}") from None
    check_int("straggler rank", rank, min_value=0)
    return rank, kind(*args)


def parse_stragglers(spec) -> dict:
    """``{rank: model}`` from one straggler string, a list of them (``hogkit run
    --straggler`` repeated), or a dict ``{rank: model}`` (returned as it is)."""
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, (list, tuple)):
        return dict(parse_straggler(s) for s in spec)
    return spec
