"""Delay models: how long a worker's step takes.

One concept, two uses:

**Live pacers** (real processes). A model is a small picklable config;
``model.start(seed, rank)`` gives the worker a private pacer whose
``pause(compute_ns)`` sleeps after each gradient so that the step takes as long as
the model says. The slowdown is relative to the worker's own measured compute time,
so it scales with the workload and the machine.

- ``Slowdown(factor)``: every step takes ``factor`` times as long (factor ≥ 1).
- ``Pauses(prob, seconds)``: with probability ``prob`` a step pauses ``seconds``.
- ``Load(amplitude, period)``: time-varying load; the slowdown factor follows
  ``1 + amplitude · (1 + sin(2πt/period)) / 2``.

**Virtual compute times** (:mod:`hogkit.engine.simulator`). In the simulator nothing is
measured: the compute time itself comes from a model. :class:`StepTimes` combines

- a base compute time: :class:`Constant` ``(seconds)`` or :class:`LogNormal`
  ``(median, sigma)`` (``median · exp(sigma · N(0, 1))``), the same for every worker;
- per-worker speed: ``speeds`` (a slowdown factor per rank) and/or ``stragglers``
  ``{rank: Slowdown | Pauses | Load}`` — the very dict ``hogkit.train(stragglers=...)``
  takes, so a live study and its simulated twin share one description;
- a straggler probability for everyone: ``pauses=Pauses(prob, seconds)``;
- time-varying load for everyone: ``load=Load(amplitude, period)``, evaluated at the
  step's virtual start time.

Worker ``w``'s step ``k`` read at virtual time ``t`` takes::

    base_k · speed_w · load_w(t) + pause_k          (seconds)

with ``base_k`` and ``pause_k`` drawn from worker-private streams of ``(seed, w)``
(independent of the other workers and of event order, so a run is reproducible and a
change of policy does not change what the workers "are"). What is **not** modelled:
contention between workers (memory bandwidth, cache-line bouncing, the OS scheduler),
so simulated compute times never grow with the worker count; use
:func:`hogkit.calibrate.fit_delays` to calibrate a model on a real run.

``parse_delays`` reads the string form of a step-time model
(``"constant:1e-3,straggler:3:4,pauses:0.01:0.05"``), which ``simulate(delays=...)``
accepts as well as the objects (the one string form the Python API takes).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from hogkit.errors import InvalidArgument, InvalidType
# the pacer kinds: plain numbers (importing the layout loads no numba)
from hogkit.kernels.layout import PACE_LOAD, PACE_PAUSES, PACE_SLOWDOWN
from hogkit.validation import check_float, check_int

__all__ = ["Slowdown", "Pauses", "Load", "Constant", "LogNormal",
           "StepTimes", "parse_delays", "step_times", "wait_ns"]



#: pauses shorter than this are spun (time.sleep overshoots by ~60 µs, which would
#: make a 3x straggler on a 30 µs step run 5x); longer ones sleep, then spin the rest
SPIN_NS = 200_000


def wait_ns(ns: float) -> None:
    """Pause ``ns`` nanoseconds precisely: sleep all but the last ``SPIN_NS``, then
    spin on the monotonic clock (the compiled step core does the same)."""
    if ns <= 0:
        return
    end = time.monotonic_ns() + int(ns)
    if ns > SPIN_NS:
        time.sleep((ns - SPIN_NS) * 1e-9)
    while time.monotonic_ns() < end:
        pass


class _Straggler:
    """What the live straggler models share: ``pacer()`` is the model's compiled row
    ``[kind, a, b, t0]`` (``hogkit.kernels.pacer.pace_ns``); :meth:`start` makes a
    worker's Python pacer from it; :meth:`config` is its fields."""

    def start(self, seed, rank):
        return _Pacer(self.pacer(), seed, rank)

    def config(self):
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class Slowdown(_Straggler):
    kind = "slowdown"
    factor: float

    def __post_init__(self):
        check_float("factor", self.factor, min_value=1.0,
                    fix="a straggler runs factor times slower; use 1.0 for none")

    def pacer(self):
        """The compiled pacer row ``[kind, a, b, t0]`` (``hogkit.kernels.pacer.pace_ns``)."""
        return (PACE_SLOWDOWN, self.factor, 0.0, 0.0)


@dataclass(frozen=True)
class Pauses(_Straggler):
    kind = "pauses"
    prob: float
    seconds: float

    def __post_init__(self):
        check_float("prob", self.prob, min_value=0.0, max_value=1.0)
        check_float("seconds", self.seconds, min_value=0.0)

    def pacer(self):
        return (PACE_PAUSES, self.prob, self.seconds, 0.0)


@dataclass(frozen=True)
class Load(_Straggler):
    kind = "load"
    amplitude: float
    period: float = 5.0

    def __post_init__(self):
        check_float("amplitude", self.amplitude, min_value=0.0)
        check_float("period", self.period, min_value=0.0, exclude_min=True)

    def pacer(self):
        return (PACE_LOAD, self.amplitude, self.period, 0.0)


class _Pacer:
    """Per-worker, private: after each step, waits the extra time its model asks for
    (``hogkit.kernels.pacer.pace_ns``, the formula the compiled core uses, from the same
    generator ``(seed, rank, 0x5EED)``), precisely (:func:`wait_ns`). ``compute_ns`` /
    ``paused_ns`` add up what was measured and added, so the realised slowdown is
    ``(compute + paused) / compute``."""

    def __init__(self, pacer, seed, rank):
        self.row = np.array(pacer, np.float64)
        self.row[3] = time.monotonic_ns()
        self.rng = np.random.default_rng([seed, rank, 0x5EED])
        self.compute_ns = 0
        self.paused_ns = 0

    def load(self, now_ns=None) -> float:
        """The slowdown factor the model imposes now: Slowdown's factor, Load's
        ``f(t)``, 1.0 for Pauses (unpredictable by design). What a node's load monitor
        would report: the exogenous input of LB-BSP's NARX predictor."""
        kind, a, b, t0 = self.row
        if kind == PACE_SLOWDOWN:
            return float(a)
        if kind == PACE_LOAD:
            from hogkit.kernels.pacer import load_factor
            t = ((time.monotonic_ns() if now_ns is None else now_ns) - t0) * 1e-9
            return float(load_factor(a, b, t))
        return 1.0

    def pause(self, busy_ns: int) -> int:
        """Wait the extra time for a step that was busy ``busy_ns``; returns it."""
        from hogkit.kernels.pacer import pace_ns
        extra = int(pace_ns(self.row, self.rng, int(busy_ns), time.monotonic_ns()))
        self.compute_ns += int(busy_ns)
        self.paused_ns += extra
        wait_ns(extra)
        return extra


# --------------------------------------------------------------------------- virtual time

@dataclass(frozen=True)
class Constant:
    """Every step computes for ``seconds`` of virtual time (≥ 0; 0 = instantaneous)."""

    seconds: float = 1e-3

    def __post_init__(self):
        check_float("seconds", self.seconds, min_value=0.0,
                    fix="a step's compute time in seconds, e.g. 1e-3")

    def config(self):
        return {"kind": "constant", "seconds": self.seconds}


@dataclass(frozen=True)
class LogNormal:
    """Compute time ``median · exp(sigma · z)``, z ~ N(0, 1) per step (heavy right tail:
    the usual shape of measured step times)."""

    median: float = 1e-3
    sigma: float = 0.5

    def __post_init__(self):
        check_float("median", self.median, min_value=0.0, exclude_min=True,
                    fix="the median step time in seconds, e.g. 1e-3")
        check_float("sigma", self.sigma, min_value=0.0,
                    fix="sigma=0 is Constant(median); 0.5 is a moderate spread")

    def config(self):
        return {"kind": "lognormal", "median": self.median, "sigma": self.sigma}


#: Chunk of per-worker draws made at once (both simulator engines use the same size,
#: so the streams are identical whatever the engine).
CHUNK = 256


class _TimeStream:
    """Worker-private draws of ``base_k`` and ``pause_k`` (see :class:`StepTimes`)."""

    __slots__ = ("model", "rank", "base_rng", "pause_rng", "base", "pause", "lo")

    def __init__(self, model, seed, rank):
        self.model, self.rank = model, rank
        self.base_rng = np.random.default_rng([seed, rank, 0x5EED, 0])
        self.pause_rng = np.random.default_rng([seed, rank, 0x5EED, 1])
        self.base = np.empty(0)
        self.pause = np.empty(0)
        self.lo = 0

    def fill(self, n=CHUNK):
        """Draw the next ``n`` steps: returns ``(base, pause)`` float64 arrays."""
        b = self.model.base
        if isinstance(b, Constant):
            base = np.full(n, b.seconds)
        else:
            base = b.median * np.exp(b.sigma * self.base_rng.standard_normal(n))
        prob, secs = self.model._pause_of(self.rank)
        if prob > 0.0:
            pause = np.where(self.pause_rng.random(n) < prob, secs, 0.0)
        else:
            pause = np.zeros(n)
        return base, pause

    def at(self, k):
        """``(base_k, pause_k)`` for step ``k`` (steps asked for in increasing order)."""
        i = k - self.lo
        if i >= len(self.base):
            self.lo = k
            self.base, self.pause = self.fill()
            i = 0
        return float(self.base[i]), float(self.pause[i])


@dataclass(frozen=True)
class StepTimes:
    """The simulator's compute-time model (see the module docstring for the formula).

    ``base``: :class:`Constant` or :class:`LogNormal`. ``speeds``: a slowdown factor
    per rank (a sequence; ranks beyond it run at 1.0), ``stragglers``: ``{rank:
    Slowdown | Pauses | Load}`` as for ``hogkit.train``; ``pauses`` and ``load`` apply
    to every worker (a straggler's own Pauses/Load replaces them for that rank).
    """

    base: object = Constant()
    speeds: tuple = ()
    stragglers: tuple = ()          # ((rank, model), ...), normalised from a dict
    pauses: object = None
    load: object = None

    def __post_init__(self):
        if not isinstance(self.base, (Constant, LogNormal)):
            raise InvalidType(f"base={self.base!r} must be Constant(seconds) or "
                              f"LogNormal(median, sigma)")
        speeds = tuple(check_float(f"speeds[{i}]", f, min_value=0.0, exclude_min=True,
                                   fix="a slowdown factor (2.0 = twice as slow)")
                       for i, f in enumerate(self.speeds))
        object.__setattr__(self, "speeds", speeds)
        st = self.stragglers
        items = sorted(st.items()) if isinstance(st, dict) else sorted(tuple(st))
        for r, m in items:
            check_int("straggler rank", r, min_value=0)
            if not isinstance(m, (Slowdown, Pauses, Load)):
                raise InvalidType(f"stragglers[{r}]={m!r} must be Slowdown, Pauses or "
                                  f"Load from hogkit.engine.delays")
        object.__setattr__(self, "stragglers", tuple((int(r), m) for r, m in items))
        if self.pauses is not None and not isinstance(self.pauses, Pauses):
            raise InvalidType(f"pauses={self.pauses!r} must be Pauses(prob, seconds)")
        if self.load is not None and not isinstance(self.load, Load):
            raise InvalidType(f"load={self.load!r} must be Load(amplitude, period)")

    def _pause_of(self, rank):
        p = self.pauses
        for r, m in self.stragglers:
            if r == rank and isinstance(m, Pauses):
                p = m
        return (0.0, 0.0) if p is None else (float(p.prob), float(p.seconds))

    def arrays(self, workers):
        """Per-rank ``(speed, load_amplitude, load_period)`` float64 arrays (period
        ``inf`` and amplitude 0 where no load applies)."""
        W = workers
        for r, _ in self.stragglers:
            if r >= W:
                raise InvalidArgument(f"straggler rank {r} is outside [0, {W}) for "
                                      f"workers={W}; use a rank below {W}")
        speed = np.ones(W)
        n = min(W, len(self.speeds))
        speed[:n] = self.speeds[:n]
        amp = np.zeros(W)
        period = np.full(W, math.inf)
        if self.load is not None:
            amp[:] = self.load.amplitude
            period[:] = self.load.period
        for r, m in self.stragglers:
            if isinstance(m, Slowdown):
                speed[r] *= m.factor
            elif isinstance(m, Load):
                amp[r], period[r] = m.amplitude, m.period
        return speed, amp, period

    def stream(self, seed, rank):
        """Worker ``rank``'s private stream of ``(base_k, pause_k)`` draws."""
        return _TimeStream(self, seed, rank)

    def mean(self, rank=0):
        """Expected step time of ``rank`` ignoring load (for sizing and reports)."""
        b = self.base
        base = b.seconds if isinstance(b, Constant) else b.median * math.exp(b.sigma ** 2 / 2)
        speed = self.speeds[rank] if rank < len(self.speeds) else 1.0
        for r, m in self.stragglers:
            if r == rank and isinstance(m, Slowdown):
                speed *= m.factor
        prob, secs = self._pause_of(rank)
        return base * speed + prob * secs

    def config(self):
        return {"kind": "step_times", "base": self.base.config(),
                "speeds": list(self.speeds),
                "stragglers": {str(r): m.config() for r, m in self.stragglers},
                "pauses": None if self.pauses is None else self.pauses.config(),
                "load": None if self.load is None else self.load.config()}


def step_times(delays=None, stragglers=None) -> StepTimes:
    """Normalise what ``simulate(delays=..., stragglers=...)`` accepts into a
    :class:`StepTimes`: None (``Constant(1e-3)``), a string for :func:`parse_delays`,
    ``Constant``/``LogNormal``, or a ``StepTimes``; ``stragglers`` (``{rank: model}``)
    are added to it."""
    if delays is None:
        st = StepTimes()
    elif isinstance(delays, str):
        st = parse_delays(delays)
    elif isinstance(delays, (Constant, LogNormal)):
        st = StepTimes(base=delays)
    elif isinstance(delays, StepTimes):
        st = delays
    else:
        raise InvalidType(f"delays={delays!r} must be a string such as 'constant:1e-3', "
                          f"Constant, LogNormal or StepTimes from hogkit.engine.delays")
    if stragglers:
        merged = dict(st.stragglers)
        for r, m in dict(stragglers).items():
            if r in merged:
                raise InvalidArgument(f"rank {r} has a straggler model in delays and in "
                                      f"stragglers; give it once")
            merged[r] = m
        st = StepTimes(base=st.base, speeds=st.speeds, stragglers=merged,
                       pauses=st.pauses, load=st.load)
    return st


_DELAY_FORMS = ('"constant:SECONDS" | "lognormal:MEDIAN:SIGMA" | "straggler:RANK:FACTOR" | '
                '"pauses:PROB:SECONDS" | "load:AMPLITUDE:PERIOD", joined by commas')


def parse_delays(text) -> StepTimes:
    """Parse the simulator's ``--delays``: comma-separated parts, each one of
    ``constant:SECONDS``, ``lognormal:MEDIAN:SIGMA`` (at most one base; default
    constant:1e-3), ``straggler:RANK:FACTOR`` (repeatable), ``pauses:PROB:SECONDS``
    and ``load:AMPLITUDE:PERIOD`` (for every worker). Example:
    ``"lognormal:1e-3:0.5,straggler:3:4,pauses:0.01:0.05"``."""
    if not isinstance(text, str):
        raise InvalidType(f"delays must be a string such as 'constant:1e-3', got "
                          f"{type(text).__name__}")
    base, stragglers, pauses, load = None, {}, None, None
    arity = {"constant": 1, "lognormal": 2, "straggler": 2, "pauses": 2, "load": 2}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind, *args = [a.strip() for a in part.lower().split(":")]
        if kind not in arity:
            raise InvalidArgument(f"delays part {part!r}: unknown kind {kind!r}; "
                                  f"expected {_DELAY_FORMS}")
        if len(args) != arity[kind]:
            raise InvalidArgument(f"delays part {part!r} has {len(args)} field(s), "
                                  f"{kind} takes {arity[kind]}; expected {_DELAY_FORMS}")
        try:
            nums = [float(a) for a in args]
        except ValueError:
            raise InvalidArgument(f"delays part {part!r}: fields must be numbers; "
                                  f"expected {_DELAY_FORMS}") from None
        if kind in ("constant", "lognormal"):
            if base is not None:
                raise InvalidArgument(f"delays {text!r} gives two base compute times "
                                      f"({base!r} and {part!r}); keep one")
            base = Constant(nums[0]) if kind == "constant" else LogNormal(*nums)
        elif kind == "straggler":
            if nums[0] != int(nums[0]):
                raise InvalidArgument(f"delays part {part!r}: RANK must be an int")
            r = check_int("straggler rank", int(nums[0]), min_value=0)
            if r in stragglers:
                raise InvalidArgument(f"delays {text!r} names straggler rank {r} twice")
            stragglers[r] = Slowdown(nums[1])
        elif kind == "pauses":
            pauses = Pauses(*nums)
        else:
            load = Load(*nums)
    return StepTimes(base=base or Constant(), stragglers=stragglers, pauses=pauses,
                     load=load)
