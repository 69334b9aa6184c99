"""Hypothesis strategies and property helpers for testing update races.

Import it in your own tests (needs ``hypothesis``, the ``test`` extra)::

    from hypothesis import given, settings
    from hogkit.testing import schedules, replay, sparse_updates

    settings.load_profile("hogkit-ci")        # deadline=None, modest example counts

    @given(schedules(workers=2))
    def test_my_invariant(schedule):
        result = replay(schedule, initial=np.zeros(3))
        ...

Strategies (plural nouns; ``min_*``/``max_*`` bounds; impossible combinations raise
:class:`~hogkit.errors.InvalidArgument` instead of silently generating nothing):

- :func:`schedules` — race schedules for :func:`replay`: each worker runs a program
  of non-atomic updates (``load`` then ``store``) and vector reads, interleaved at
  step granularity. Shrinks towards fewer steps and towards the sequential order.
- :func:`sparse_updates` — ``(rows, values)`` sparse-row updates with duplicate rows
  (the case a fancy-indexed ``W[rows] -= G`` gets wrong).
- :func:`staleness_bounds` — SSP bounds: ints, or ``math.inf`` (Async).
- :func:`delay_models` — :class:`hogkit.engine.delays.StepTimes` compute-time models.
- :func:`layer_profiles` — :class:`hogkit.p3.profiles.Profile` s (parameters and compute
  times per layer) for the communication model, :func:`hogkit.p3.comm.simulate_comm`.
- :func:`propagation_schedules` — the four P3 schedules with any slice size.

Your own update code (:mod:`hogkit.explore`): :func:`explore` runs a function in
several workers on shared arrays, switching at every element load and store, and checks
an invariant on every distinct outcome (or on sampled schedules); :func:`race_test`
makes that a pytest test; :func:`schedule_choices` and :func:`calls_of` let hypothesis
draw the schedule (shrinking towards fewer switches) and the calls' arguments, for
:func:`run_schedule`; :func:`stress` runs the same function in real processes on
shared memory and counts what the machine does reach (``unexplained(exploration)``:
outcomes the exploration did not predict).

Helpers: :func:`replay` (re-exported from :mod:`hogkit.engine.simulator`),
:func:`assert_staleness_bounded`, :func:`sequential_sum` (the race-free result of a
schedule). The profile ``"hogkit-ci"`` is registered on import.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hogkit.errors import InvalidArgument
from hogkit.explore import Exploration, InvariantBroken, SharedArray, explore, run_schedule
from hogkit.races import ReadRecord, Replay, Step, interleave, replay
from hogkit.stress import StressResult, stress
from hogkit.validation import check_float, check_int

__all__ = ["schedules", "sparse_updates", "staleness_bounds", "delay_models", "replay",
           "layer_profiles", "propagation_schedules",
           "Step", "Replay", "ReadRecord", "interleave", "assert_staleness_bounded",
           "sequential_sum", "CI_PROFILE", "explore", "run_schedule", "race_test",
           "schedule_choices", "calls_of", "Exploration", "InvariantBroken", "SharedArray",
           "stress", "StressResult"]

#: Name of the CI profile: ``settings.load_profile(hogkit.testing.CI_PROFILE)``.
CI_PROFILE = "hogkit-ci"
settings.register_profile(CI_PROFILE, deadline=None, max_examples=40, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])


def _bounds(name, lo, hi, floor=0):
    lo = check_int(f"min_{name}", lo, min_value=floor)
    hi = check_int(f"max_{name}", hi, min_value=floor)
    if lo > hi:
        raise InvalidArgument(f"min_{name}={lo} > max_{name}={hi}; no value fits, "
                              f"raise max_{name} or lower min_{name}")
    return lo, hi


def _fixed_or_range(name, value, lo, hi, floor):
    if value is not None:
        v = check_int(name, value, min_value=floor)
        return v, v
    return _bounds(name, lo, hi, floor)


@st.composite
def _schedule(draw, wr, sr, rows, width, reads, values):
    W = draw(st.integers(*wr))
    programs = []
    for w in range(W):
        prog = []
        for _ in range(draw(st.integers(*sr))):
            if reads and draw(st.booleans()):
                k = draw(st.integers(1, min(rows, 3)))
                rs = draw(st.lists(st.integers(0, rows - 1), min_size=k, max_size=k,
                                   unique=True))
                prog += [Step("read", w, r) for r in rs]
            else:
                r = draw(st.integers(0, rows - 1))
                v = draw(values)
                v = float(v) if width == 1 else np.full(width, float(v))
                prog += [Step("load", w, r), Step("store", w, r, v)]
        programs.append(prog)
    order = [w for w, p in enumerate(programs) for _ in p]
    order = draw(st.permutations(order))
    return interleave(programs, order)


def schedules(workers=None, steps=None, *, min_workers=1, max_workers=3, min_steps=1,
              max_steps=3, rows=3, width=1, reads=True, values=None):
    """Race schedules (lists of :class:`~hogkit.races.Step`) for :func:`replay`.

    ``workers`` / ``steps`` fix the worker count / operations per worker; otherwise
    they are drawn from ``[min_workers, max_workers]`` / ``[min_steps, max_steps]``.
    An operation is a non-atomic update of one row (``load``, ``store`` with a delta
    from ``values``, default small integers so sums are exact in any order) or, when
    ``reads``, a vector read of up to 3 distinct rows. ``rows`` is the table height
    the schedule indexes, ``width`` its row width.
    """
    wr = _fixed_or_range("workers", workers, min_workers, max_workers, 1)
    sr = _fixed_or_range("steps", steps, min_steps, max_steps, 0)
    rows = check_int("rows", rows, min_value=1, fix="the table needs at least one row")
    width = check_int("width", width, min_value=1)
    if not isinstance(reads, bool):
        raise InvalidArgument(f"reads={reads!r} must be a bool")
    values = st.integers(1, 3) if values is None else values
    return _schedule(wr, sr, rows, width, reads, values)


def sparse_updates(shape, *, min_rows=1, max_rows=8, dtype=np.float64, elements=None,
                   unique=False):
    """``(rows, values)`` sparse updates of a table of ``shape``: ``rows`` int64 of
    length in ``[min_rows, max_rows]`` (duplicates likely unless ``unique``),
    ``values`` of shape ``(len(rows),) + shape[1:]`` and ``dtype``, elements from
    ``elements`` (default small integers, exact in any summation order)."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(check_int(f"shape[{i}]", s, min_value=1) for i, s in enumerate(shape))
    if not shape:
        raise InvalidArgument("shape=() has no rows; pass e.g. (4,) or (4, 2)")
    lo, hi = _bounds("rows", min_rows, max_rows)
    if unique and lo > shape[0]:
        raise InvalidArgument(f"unique=True with min_rows={lo} > shape[0]={shape[0]}: "
                              f"not enough distinct rows; lower min_rows")
    if unique:
        hi = min(hi, shape[0])
    dtype = np.dtype(dtype)
    elements = st.integers(-4, 4).map(float) if elements is None else elements
    rest = shape[1:]
    per = int(np.prod(rest)) if rest else 1

    @st.composite
    def build(draw):
        rows = draw(st.lists(st.integers(0, shape[0] - 1), min_size=lo, max_size=hi,
                             unique=unique))
        vals = draw(st.lists(elements, min_size=len(rows) * per, max_size=len(rows) * per))
        return (np.array(rows, dtype=np.int64),
                np.array(vals, dtype=dtype).reshape((len(rows),) + rest))

    return build()


def staleness_bounds(*, min_value=0, max_value=8, allow_unbounded=True):
    """SSP staleness bounds: ints in ``[min_value, max_value]``, and ``math.inf``
    (Async) when ``allow_unbounded``."""
    lo, hi = _bounds("value", min_value, max_value)
    ints = st.integers(lo, hi)
    return st.one_of(ints, st.just(math.inf)) if allow_unbounded else ints


def delay_models(*, min_seconds=1e-4, max_seconds=1e-2, max_sigma=1.0, max_workers=8,
                 stragglers=True, pauses=True, load=True):
    """:class:`hogkit.engine.delays.StepTimes` models: a Constant or LogNormal base in
    ``[min_seconds, max_seconds]`` and, optionally, a straggler (rank <
    ``max_workers``), random pauses and a time-varying load."""
    from hogkit.engine.delays import Constant, Load, LogNormal, Pauses, Slowdown, StepTimes
    a = check_float("min_seconds", min_seconds, min_value=0.0)
    b = check_float("max_seconds", max_seconds, min_value=0.0)
    if a > b:
        raise InvalidArgument(f"min_seconds={a} > max_seconds={b}; swap them")
    max_sigma = check_float("max_sigma", max_sigma, min_value=0.0)
    max_workers = check_int("max_workers", max_workers, min_value=1)
    secs = st.floats(a, b, allow_nan=False, allow_infinity=False)
    pos = st.floats(max(a, 1e-9), max(b, 1e-9), allow_nan=False, allow_infinity=False)
    base = st.one_of(secs.map(Constant),
                     st.builds(LogNormal, pos, st.floats(0.0, max_sigma)))
    none = st.just({})
    strag = (st.dictionaries(st.integers(0, max_workers - 1),
                             st.floats(1.0, 8.0).map(Slowdown), max_size=2)
             if stragglers else none)
    pz = (st.one_of(st.none(), st.builds(Pauses, st.floats(0.0, 0.2), secs))
          if pauses else st.none())
    ld = (st.one_of(st.none(), st.builds(Load, st.floats(0.0, 2.0),
                                         st.floats(1e-3, 1.0)))
          if load else st.none())
    return st.builds(lambda b_, s_, p_, l_: StepTimes(base=b_, stragglers=s_, pauses=p_,
                                                      load=l_), base, strag, pz, ld)


def layer_profiles(*, min_layers=1, max_layers=6, max_params=5000, max_seconds=1e-2):
    """:class:`hogkit.p3.profiles.Profile` s of ``min_layers..max_layers`` layers, each
    of 1..``max_params`` parameters, forward times in ``[0, max_seconds]`` and
    backward times in ``[0, 2 * max_seconds]``. Shrinks towards fewer, smaller,
    instant layers."""
    from hogkit.p3.profiles import Profile
    lo, hi = _bounds("layers", min_layers, max_layers, floor=1)
    max_params = check_int("max_params", max_params, min_value=1)
    t = check_float("max_seconds", max_seconds, min_value=0.0)

    @st.composite
    def build(draw):
        n = draw(st.integers(lo, hi))
        sizes = draw(st.lists(st.integers(1, max_params), min_size=n, max_size=n))
        fwd = draw(st.lists(st.floats(0.0, t), min_size=n, max_size=n))
        bwd = draw(st.lists(st.floats(0.0, 2 * t), min_size=n, max_size=n))
        return Profile.of(sizes, fwd, bwd, name="drawn")
    return build()


def propagation_schedules(*, max_slice=2000):
    """:class:`hogkit.p3.propagation.Schedule` s: ``fifo``, ``priority``, and ``slicing``
    and ``p3`` with slices of 1..``max_slice`` parameters."""
    from hogkit.p3.propagation import fifo, p3, priority, slicing
    sizes = st.integers(1, check_int("max_slice", max_slice, min_value=1))
    return st.one_of(st.just(fifo()), st.just(priority()), sizes.map(slicing), sizes.map(p3))


def sequential_sum(schedule, initial) -> np.ndarray:
    """The race-free result of ``schedule``: ``initial`` plus every store/add delta
    (what :func:`replay` gives with ``atomic=True``)."""
    return replay(schedule, initial, atomic=True).table


def assert_staleness_bounded(run, s, *, gap=None) -> None:
    """Assert that ``run`` (a :class:`~hogkit.engine.run.Run` or its summary) never read with
    a clock lag above ``s`` (overall and per worker), and, with ``gap``, never
    applied an update with an update gap above ``gap``. Raises AssertionError naming
    the worst worker."""
    summ = run.summary() if hasattr(run, "summary") else run
    bound = s
    lag = summ["staleness"]["clock_lag"]
    if bound != math.inf and lag["max"] > bound:
        worst = max(summ["per_worker"],
                    key=lambda p: p["staleness"]["clock_lag"]["max"])
        raise AssertionError(
            f"clock lag {lag['max']} exceeds the bound s={bound} (worker {worst['rank']}: "
            f"max {worst['staleness']['clock_lag']['max']}, histogram "
            f"{worst['staleness']['clock_lag']['histogram']})")
    if gap is not None:
        g = summ["staleness"]["update_gap"]
        if g["max"] > gap:
            raise AssertionError(f"update gap {g['max']} exceeds {gap} (histogram "
                                 f"{g['histogram']})")


def schedule_choices(*, max_switches=64, max_choice=3):
    """Choice lists for :func:`run_schedule`: ``choices[k]`` at switch point k (0 keeps
    the current worker running). Hypothesis shrinks a failing list towards fewer and
    earlier switches."""
    max_switches = check_int("max_switches", max_switches, min_value=0)
    max_choice = check_int("max_choice", max_choice, min_value=1)
    return st.lists(st.integers(0, max_choice), max_size=max_switches)


def calls_of(workers, **arguments):
    """One dict of arguments per worker for :func:`explore` / :func:`run_schedule`:
    ``calls_of(2, row=st.integers(0, 3), delta=st.floats(-1, 1))`` draws each
    worker's ``row`` and ``delta`` independently. ``workers``: an int or a strategy."""
    if not arguments:
        raise InvalidArgument("calls_of needs at least one argument strategy, e.g. "
                              "calls_of(2, row=st.integers(0, 3))")
    one = st.fixed_dictionaries(arguments)
    if isinstance(workers, st.SearchStrategy):
        return workers.flatmap(lambda n: st.lists(one, min_size=n, max_size=n))
    n = check_int("workers", workers, min_value=1)
    return st.lists(one, min_size=n, max_size=n)


def race_test(fn, arrays, calls, **options):
    """Decorate an invariant to make it a test: ``explore(fn, arrays, calls,
    invariant, **options)``, then :meth:`Exploration.assert_holds` (the failure
    message is the counterexample's trace)::

        @race_test(add_row, {"W": np.zeros((2, 3))}, [{"r": 0, "g": g}, {"r": 1, "g": g}])
        def test_rows_are_disjoint(W):
            return np.array_equal(W, expected)
    """
    def wrap(invariant):
        def test():
            explore(fn, arrays, calls, invariant, **options).assert_holds()
        test.__name__ = invariant.__name__
        test.__qualname__ = getattr(invariant, "__qualname__", invariant.__name__)
        test.__doc__ = invariant.__doc__
        test.__module__ = invariant.__module__
        return test
    return wrap
