"""hogkit.explore: interleavings of a user's own update code, element by element.

The reference for "every reachable outcome" is brute force: the test's own interpreter
runs small programs (each worker a list of ``a[dst] = a[src] * k + c`` statements)
over every interleaving of their loads and stores, and the set of final states must
equal the one DPOR reaches (pruning never hides an outcome)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from hogkit import testing
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.explore import InvariantBroken, explore, run_schedule
from hogkit.kernels.delayed import dc_rows
from hogkit.kernels.sparse import sgd_rows
from hogkit.races import replay


@njit
def add_row(W, r, g):
    for j in range(W.shape[1]):
        W[r, j] += g[j]


G1, G2 = np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0])


def test_racy_row_update_is_found_shrunk_and_replays():
    res = explore(add_row, {"W": np.zeros((2, 3))}, [{"r": 0, "g": G1}, {"r": 0, "g": G2}],
                  lambda W: np.array_equal(W[0], G1 + G2))
    assert not res.holds and res.complete
    assert res.outcomes == 27                 # each element: both, or either delta alone
    assert res.schedules_tried == 600         # docs/race-testing.md quotes it
    assert testing.explore is explore
    order = res.schedule
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches == 2                      # one preemption, and back
    assert res.lost_updates >= 1
    again = res.replay()
    assert np.array_equal(again["W"], res.final["W"])
    assert np.array_equal(res.replay()["W"], again["W"])
    # the steps replay to the same table in hogkit.races
    assert np.array_equal(replay(res.steps, res.table()).table[:3], res.final["W"][0])
    with pytest.raises(InvariantBroken, match=r"worker 1 writes W\[0, \d\]"):
        res.assert_holds()
    assert "W[r, j] += g[j]" in res.trace()


def test_the_docs_example_takes_60_schedules_for_4_outcomes():
    g = np.ones(2)
    res = explore(add_row, {"W": np.zeros((2, 2))}, [{"r": 0, "g": g}, {"r": 0, "g": g}],
                  lambda W: bool((W[0] == 2).all()))
    assert (res.schedules_tried, res.outcomes, res.lost_updates) == (60, 4, 1)
    assert "->" in res.trace() and res.schedule.count(1) == 4


def _set_or_snapshot(W, R, write):
    if write:
        W[0, :] = 1.0                  # element by element: not atomic
    else:
        R[:] = W[0]                    # a row read, then a private copy stored


def test_a_row_read_can_tear_and_the_replay_says_so():
    """The writer sets W[0] to ones left to right, so W only ever holds ones then
    zeros. A snapshot of an intermediate state ([1, 1, 0]) is not torn; a read that saw
    an element old and a later one new ([0, 1, 1]) is: W never held that."""
    cells = {"W": np.zeros((1, 3)), "R": np.zeros(3)}
    calls = [{"write": True}, {"write": False}]
    snap = explore(_set_or_snapshot, cells, calls, lambda W, R: len(set(R)) == 1)
    assert not snap.holds and snap.torn_reads == 0          # [1, 1, 0]: a real state
    torn = explore(_set_or_snapshot, cells, calls,
                   lambda W, R: list(R) == sorted(R, reverse=True))
    assert not torn.holds and torn.complete
    assert torn.torn_reads == 1 and torn.lost_updates == 0
    assert list(torn.final["R"]) != sorted(torn.final["R"], reverse=True)


def test_disjoint_rows_hold_with_one_schedule():
    res = explore(add_row, {"W": np.zeros((2, 3))}, [{"r": 0, "g": G1}, {"r": 1, "g": G2}],
                  lambda W: np.array_equal(W, np.stack([G1, G2])))
    assert res.holds and res.complete and res.schedules_tried == 1 and res.outcomes == 1
    res.assert_holds()
    with pytest.raises(InvalidArgument, match="no counterexample"):
        res.replay()


def test_bounded_search_needs_one_preemption_for_the_lost_update():
    calls = [{"r": 0, "g": G1}, {"r": 0, "g": G2}]
    both = lambda W: np.array_equal(W[0], G1 + G2)          # noqa: E731
    none = explore(add_row, {"W": np.zeros((2, 3))}, calls, both, strategy="bounded",
                   preemptions=0)
    assert none.holds and none.complete and none.schedules_tried == 2   # the two orders
    one = explore(add_row, {"W": np.zeros((2, 3))}, calls, both, strategy="bounded",
                  preemptions=1)
    assert not one.holds and one.complete and one.lost_updates == 1
    disjoint = explore(add_row, {"W": np.zeros((2, 3))}, [{"r": 0, "g": G1},
                                                          {"r": 1, "g": G2}],
                       lambda W: np.array_equal(W, np.stack([G1, G2])),
                       strategy="random", max_schedules=200)
    assert disjoint.holds and disjoint.schedules_tried == 200 and disjoint.outcomes == 1


@pytest.mark.parametrize("strategy", ["random", "pct"])
def test_sampling_strategies_find_the_lost_update(strategy):
    res = explore(add_row, {"W": np.zeros((1, 1))}, [{"r": 0, "g": G1[:1]},
                                                     {"r": 0, "g": G2[:1]}],
                  lambda W: W[0, 0] == 11.0, strategy=strategy, max_schedules=60, seed=1)
    assert not res.holds and res.complete is None and res.schedules_tried == 60
    assert res.final["W"][0, 0] in (1.0, 10.0)


# --- brute force ----------------------------------------------------------------------

def _interpret(a, prog):
    for src, dst, k, c in prog:
        a[dst] = a[src] * k + c


def _brute_force(init, progs):
    """Every final state of every interleaving of the programs' accesses (each
    statement is a load of src then a store of dst), by the test's own interpreter: a
    depth-first walk over every choice of the next worker."""
    seqs = [[(op, half) for op in p for half in (0, 1)] for p in progs]
    finals = set()

    def walk(a, pos, reg):
        moved = False
        for w, seq in enumerate(seqs):
            if pos[w] == len(seq):
                continue
            moved = True
            (src, dst, k, c), half = seq[pos[w]]
            a2, reg2 = list(a), list(reg)
            if half == 0:
                reg2[w] = a[src]
            else:
                a2[dst] = reg[w] * k + c
            walk(a2, pos[:w] + (pos[w] + 1,) + pos[w + 1:], reg2)
        if not moved:
            finals.add(tuple(a))
    walk(list(init), (0,) * len(seqs), [0.0] * len(seqs))
    return finals


statements = st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from([1.0, 2.0]),
                       st.sampled_from([0.0, 1.0, 5.0]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(statements, min_size=1, max_size=2), min_size=2, max_size=3)
       .filter(lambda ps: sum(len(p) for p in ps) <= 5))
def test_dpor_reaches_exactly_the_brute_force_outcomes(progs):
    init = np.array([1.0, 2.0, 3.0])
    seen = set()

    def record(a):
        seen.add(tuple(float(x) for x in a))
        return True
    res = explore(_interpret, {"a": init}, [{"prog": p} for p in progs], record,
                  max_schedules=10_000)
    assert res.complete
    want = _brute_force(init, progs)
    assert seen == want
    assert res.outcomes == len(seen)
    seen.clear()                       # unbounded context bounding: every interleaving
    every = explore(_interpret, {"a": init}, [{"prog": p} for p in progs], record,
                    strategy="bounded", preemptions=99, max_schedules=100_000)
    assert every.complete and seen == want and every.schedules_tried >= res.schedules_tried


@settings(max_examples=20, deadline=None)
@given(testing.calls_of(2, prog=st.lists(statements, min_size=1, max_size=2)),
       testing.schedule_choices(max_switches=8))
def test_any_hypothesis_schedule_is_a_brute_force_outcome(calls, choices):
    init = np.array([1.0, 2.0, 3.0])
    final, accesses = run_schedule(_interpret, {"a": init}, calls, choices)
    assert tuple(final["a"]) in _brute_force(init, [c["prog"] for c in calls])
    assert len(accesses) == 2 * sum(len(c["prog"]) for c in calls)


# --- hogkit's own kernels, with their documented invariants ---------------------------

def _sgd_calls(rows_a, rows_b):
    return [{"rows": np.array(rows_a), "G": np.ones((2, 2)), "lr": 1.0, "n": 2},
            {"rows": np.array(rows_b), "G": 2 * np.ones((2, 2)), "lr": 1.0, "n": 2}]


def test_sparse_update_on_disjoint_rows_is_exact():
    want = -np.array([[1, 1], [1, 1], [2, 2], [2, 2.0]])
    res = explore(sgd_rows, {"W": np.zeros((4, 2))}, _sgd_calls([0, 1], [2, 3]),
                  lambda W: np.array_equal(W, want))
    assert res.holds and res.complete


def test_sparse_update_on_a_shared_row_can_lose_an_update():
    """Hogwild!'s tolerated race: a shared row may keep only one worker's delta, and
    never anything but one, the other, or both."""
    both = -np.array([[1, 1], [3, 3], [2, 2], [0, 0.0]])
    res = explore(sgd_rows, {"W": np.zeros((4, 2))}, _sgd_calls([0, 1], [1, 2]),
                  lambda W: np.array_equal(W, both))
    assert not res.holds and res.complete and res.lost_updates >= 1
    tolerated = explore(sgd_rows, {"W": np.zeros((4, 2))}, _sgd_calls([0, 1], [1, 2]),
                        lambda W: set(W[1]) <= {-1.0, -2.0, -3.0})
    assert tolerated.holds and tolerated.complete


def test_delayed_update_on_disjoint_rows_is_exact():
    calls = [{"rows": np.array([0]), "G": np.ones((1, 2)), "B": np.zeros((1, 2)),
              "lr": 1.0, "lam": 0.5, "n": 1},
             {"rows": np.array([1]), "G": np.ones((1, 2)), "B": np.zeros((1, 2)),
              "lr": 1.0, "lam": 0.5, "n": 1}]
    res = explore(dc_rows, {"W": np.zeros((2, 2))}, calls,
                  lambda W: np.array_equal(W, -np.ones((2, 2))))
    assert res.holds and res.complete


def test_delayed_update_on_rows_the_vector_code_covers_runs_its_python_source():
    """Rows 8 float32 wide, a width whose compiled kernels run ``gapvec``'s vector code:
    explored through the kernel's Python source, the vector pass answers "not covered"
    and the loop runs on the instrumented rows."""
    one = np.ones((1, 8), np.float32)
    calls = [{"rows": np.array([r]), "G": one, "B": np.zeros((1, 8), np.float32),
              "lr": 1.0, "lam": 0.5, "n": 1} for r in (0, 1)]
    res = explore(dc_rows, {"W": np.zeros((2, 8), np.float32)}, calls,
                  lambda W: np.array_equal(W, -np.ones((2, 8))))
    assert res.holds and res.complete


@testing.race_test(add_row, {"W": np.zeros((2, 3))}, [{"r": 0, "g": G1}, {"r": 1, "g": G2}])
def test_race_test_decorator_runs_the_exploration(W):
    return np.array_equal(W, np.stack([G1, G2]))


def test_race_test_fails_with_the_trace():
    @testing.race_test(add_row, {"W": np.zeros((1, 1))}, [{"r": 0, "g": G1}, {"r": 0, "g": G2}])
    def both(W):
        assert W[0, 0] == 11.0
    with pytest.raises(InvariantBroken, match="preemption"):
        both()


# --- bad input ------------------------------------------------------------------------

def test_bad_input_is_named():
    with pytest.raises(InvalidType, match="one dict of arguments per worker"):
        explore(add_row, {"W": np.zeros((1, 1))}, {"r": 0}, lambda W: True)
    with pytest.raises(InvalidArgument, match="shared arrays"):
        explore(add_row, {"W": np.zeros((1, 1))}, [{"W": 1, "r": 0, "g": G1}],
                lambda W: True)
    with pytest.raises(InvalidType, match="must be a function"):
        explore(3, {"W": np.zeros((1, 1))}, [{"r": 0, "g": G1}], lambda W: True)
    with pytest.raises(InvalidArgument, match="max_steps"):
        explore(add_row, {"W": np.zeros((1, 3))}, [{"r": 0, "g": G1}], lambda W: True,
                max_steps=0)
    with pytest.raises(InvalidArgument, match="ran past max_steps=4"):
        explore(add_row, {"W": np.zeros((1, 3))}, [{"r": 0, "g": G1}], lambda W: True,
                max_steps=4)
    with pytest.raises(InvalidArgument, match="strategy"):
        explore(add_row, {"W": np.zeros((1, 1))}, [{"r": 0, "g": G1}], lambda W: True,
                strategy="bfs")
    with pytest.raises(InvalidArgument, match=r"not \.sum: .*np\.asarray\(W\)\.sum"):
        explore(lambda W: W.sum(), {"W": np.zeros(2)}, [{}], lambda W: True)
    res = explore(lambda W: np.asarray(W).sum(), {"W": np.zeros(2)}, [{}, {}],
                  lambda W: True)
    assert res.holds and res.schedules_tried == 1           # loads only: no race
    with pytest.raises(InvalidArgument, match=r"worker 0's call raised IndexError"):
        explore(add_row, {"W": np.zeros((1, 3))}, [{"r": 5, "g": G1}], lambda W: True)


# --- real processes -------------------------------------------------------------------

@pytest.mark.process
def test_stress_sees_lost_updates_on_a_shared_row_and_none_on_disjoint_rows():
    from tests.helpers.race_kernels import add_row as kernel
    from hogkit.testing import stress
    g = np.ones(64)
    shared = [{"r": 0, "g": g, "times": 200}, {"r": 0, "g": g, "times": 200}]
    res = stress(kernel, {"W": np.zeros((2, 64))}, shared, rounds=60,
                 invariant=lambda W: bool((W[0] == 400).all()))
    assert res.rounds == 60 and res.invariant_failures == res.differs
    assert np.array_equal(res.sequential["W"][0], np.full(64, 400.0))
    for final in res.examples:                     # only ever updates lost, never made up
        assert (final["W"][0] < 400).any() and (final["W"][0] <= 400).all()
        assert (final["W"][0] >= 1).all() and (final["W"][1] == 0).all()
    disjoint = [{"r": 0, "g": g, "times": 200}, {"r": 1, "g": g, "times": 200}]
    ok = stress(kernel, {"W": np.zeros((2, 64))}, disjoint, rounds=30)
    assert ok.differs == 0 and ok.rate == 0.0 and len(ok.outcomes) == 1


@pytest.mark.process
def test_stress_outcomes_are_ones_exploration_predicts():
    from tests.helpers.race_kernels import add_row as kernel
    from hogkit.testing import stress
    calls = [{"r": 0, "g": np.ones(1), "times": 1}] * 2
    ex = explore(kernel, {"W": np.zeros((1, 1))}, calls, lambda W: True)
    assert ex.complete and ex.outcomes == 2         # 2.0, or 1.0 with an update lost
    res = stress(kernel, {"W": np.zeros((1, 1))}, calls, rounds=100, jitter_ns=0)
    assert res.unexplained(ex) == 0
    assert sum(res.outcomes.values()) == 100


@pytest.mark.process
def test_stress_names_the_failing_worker_and_leaves_nothing(tmp_path):
    import os
    from tests.helpers.race_kernels import bad_index, dies, raises
    from hogkit.errors import WorkerFailed
    from hogkit.testing import stress
    from tests.helpers.procs import own_segments
    before = own_segments()
    with pytest.raises(WorkerFailed, match=r"(?s)worker 1 .*IndexError"):
        stress(raises, {"W": np.zeros((1, 1))}, [{"r": 0}, {"r": 7}], rounds=3,
               timeout=20)
    with pytest.raises(WorkerFailed, match="exited with code 3"):
        stress(dies, {"W": np.zeros((1, 1))}, [{"r": 0}], rounds=3, timeout=20)
    assert own_segments() <= before
    with pytest.raises(InvalidArgument, match="one call after another"):
        stress(bad_index, {"W": np.zeros((1, 1))}, [{"r": 0}, {"r": 5}])
