"""Race-test your own update code: every interleaving of its element loads and stores.

:func:`explore` runs a user's update function in several workers at once, on shared
arrays whose every element load and store is a switch point, under a deterministic
scheduler, and checks an invariant on the arrays each schedule leaves. Thread-level
explorers switch at Python bytecodes or attribute accesses; a numpy element write is
invisible to them. Here the arrays themselves are instrumented (:class:`SharedArray`),
so ``W[r, j] += lr * g[j]`` is a load, a private add and a store, and another worker
may run between the two: a lost update. A numba ``@njit`` kernel is run through its
``py_func`` (the same source) on the instrumented arrays.

Mechanics. Each worker runs ``fn(**arrays, **call)`` in a greenlet of its own (a
coroutine with its own stack); at every access it posts the access it is about to make
and returns to the scheduler. The scheduler picks which waiting worker makes its access
next; that worker then runs (private computation only) to its next access and waits
again. So a schedule is the order of the accesses, and a
run under a given order is deterministic.

Strategies:

- ``"dpor"``: every distinct outcome, by dynamic partial-order reduction (Flanagan and
  Godefroid, POPL 2005): orders that only swap accesses to different elements, or two
  loads, give the same result, so only orders that reverse a *race* (two accesses to
  one element, one of them a store, by different workers, not already ordered) are
  run. Exhaustive up to ``max_schedules``; ``result.complete`` says whether it ran
  out. Tests hold the reachable final states to those of brute-force enumeration.
- ``"bounded"``: every schedule with at most ``preemptions`` preemptions (a switch
  away from a worker that could go on), no pruning: iterative context bounding as in
  CHESS (Musuvathi and Qadeer, PLDI 2007), complete within its bound; most races need
  one or two.
- ``"random"``: ``max_schedules`` schedules, each switch point choosing a waiting
  worker uniformly (seeded).
- ``"pct"``: probabilistic concurrency testing (Burckhardt et al., ASPLOS 2010):
  random priorities and ``depth - 1`` random priority-change points per run, which
  finds a bug of depth d with probability at least 1/(n·k^(d-1)).
- ``hypothesis``: :func:`schedule_choices` draws a choice list for
  :func:`run_schedule`; hypothesis shrinks a failure towards fewer switches.

The result (:class:`Exploration`): ``holds``, ``schedules_tried``, ``complete``,
``counterexample`` (the failing schedule with the fewest preemptions found, as
:class:`hogkit.races.Step` s on the arrays flattened into one table, which
:func:`hogkit.races.replay` accepts, with each access's worker, array, index, value
and source line), ``replay()``, ``lost_updates``, ``torn_reads`` and
``assert_holds()``.
"""

from __future__ import annotations

import linecache
import random
import sys
import types
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from hogkit.errors import HogkitError, InvalidArgument, InvalidType
from hogkit.races import Step, replay as replay_steps
from hogkit.validation import check_choice, check_int

__all__ = ["explore", "run_schedule", "Exploration", "Access", "SharedArray",
           "InvariantBroken", "STRATEGIES"]

STRATEGIES = ("dpor", "bounded", "random", "pct")
LOAD, STORE = "load", "store"


class InvariantBroken(HogkitError, AssertionError):
    """:meth:`Exploration.assert_holds` found a schedule that breaks the invariant."""


@dataclass(frozen=True)
class Access:
    """One element access of a schedule: worker ``worker`` loaded or stored element
    ``index`` of array ``array`` (``value``: what it read or wrote), at ``line`` of the
    user's source (``"file:lineno: text"``)."""

    worker: int
    kind: str
    array: str
    index: tuple
    value: float
    line: str

    def __str__(self):
        what = "reads " if self.kind == LOAD else "writes"
        return (f"worker {self.worker} {what} {self.array}{list(self.index)} = "
                f"{self.value!r:<12}  {self.line}")


class _Abort(BaseException):
    """Raised inside a suspended worker to unwind it when a run ends early."""




class _Run:
    """One execution: the workers, the shared arrays' state, and the access order.

    Each worker is a greenlet (a coroutine with its own stack: the user's function
    runs unchanged and is suspended inside an array access). ``choose(run, waiting)``
    picks the next worker among ``waiting`` (sorted worker ids, each with a posted
    access in ``run.pending``); the scheduler switches into it, and it switches back
    once it has posted its next access or returned. OS threads handing off through
    locks cost 80-130 µs an access here; a switch costs about a µs."""

    def __init__(self, fn, arrays, calls, max_steps):
        self.fn, self.calls, self.max_steps = fn, calls, max_steps
        self.names = list(arrays)
        self.data = {k: np.array(v, copy=True) for k, v in arrays.items()}
        self.pending = {}              # worker -> (array, flat index, kind)
        self.trace = []                # (worker, (array, flat, kind), Access)
        self.waits = []                # sorted waiting workers before each access
        self.error = None
        self.live = set(range(len(calls)))
        self.aborted = False
        self.scheduler = None

    # -- called from a worker -------------------------------------------------------
    def point(self, w, array, flat, kind):
        """Post worker ``w``'s next access and return to the scheduler until it runs
        it."""
        self.pending[w] = (array, flat, kind)
        self.scheduler.switch()
        if self.aborted:
            raise _Abort()
        del self.pending[w]

    def record(self, w, array, flat, index, kind, value):
        self.trace.append((w, (array, flat, kind),
                           Access(w, kind, array, index,
                                  value.item() if hasattr(value, "item") else value,
                                  _user_line())))

    def _worker(self, w):
        try:
            shared = {k: SharedArray(self, w, k) for k in self.names}
            self.fn(**shared, **self.calls[w])
        except _Abort:
            return
        except BaseException as e:      # the user's code failed: reported by execute()
            if self.error is None:
                self.error = (w, e)
        self.live.discard(w)

    # -- the scheduler ----------------------------------------------------------------
    def execute(self, choose):
        greenlet = _greenlet()
        self.scheduler = greenlet.getcurrent()
        workers = [greenlet.greenlet(self._worker, parent=self.scheduler)
                   for _ in self.calls]
        try:
            for w, g in enumerate(workers):
                g.switch(w)                      # runs to its first access, or ends
            while self.error is None and self.live:
                waiting = sorted(self.pending)
                if len(self.trace) >= self.max_steps:
                    raise InvalidArgument(
                        f"a schedule ran past max_steps={self.max_steps} accesses; "
                        f"does a worker spin on a flag another never sets? Raise "
                        f"max_steps for longer programs")
                w = choose(self, waiting)
                self.waits.append(waiting)
                workers[w].switch()              # its access, then on to its next
        finally:
            self.aborted = True
            for w in list(self.pending):         # unwind the suspended workers
                workers[w].switch()
        if self.error is not None:
            w, e = self.error
            raise InvalidArgument(f"worker {w}'s call raised {type(e).__name__}: {e} "
                                  f"(calls[{w}]={self.calls[w]!r}); fix the update "
                                  f"function or its arguments") from e
        return self


def _greenlet():
    try:
        import greenlet
    except ImportError as e:               # pragma: no cover - a test extra
        raise InvalidArgument("hogkit.testing.explore needs greenlet (installed with the "
                              "test extra): pip install 'hogkit[test]'") from e
    return greenlet


def _user_line():
    """``file:lineno: source`` of the innermost frame outside this module."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    if f is None:
        return "?"
    text = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno}: {text}"


class SharedArray:
    """A shared array as one worker sees it: every element load and store goes through
    the scheduler. Integer indexing touches one element; slices, rows and fancy
    indices touch each selected element in C order (a row read is not a snapshot),
    returning a private numpy copy; assignment stores element by element. ``shape``,
    ``dtype``, ``ndim``, ``size`` and ``len()`` cost nothing; ``np.asarray(a)`` loads
    every element."""

    __slots__ = ("_run", "_w", "_name", "_arr")

    def __init__(self, run, w, name):
        self._run, self._w, self._name = run, w, name
        self._arr = run.data[name]

    shape = property(lambda self: self._arr.shape)
    dtype = property(lambda self: self._arr.dtype)
    ndim = property(lambda self: self._arr.ndim)
    size = property(lambda self: self._arr.size)
    itemsize = property(lambda self: self._arr.itemsize)
    strides = property(lambda self: self._arr.strides)

    def __len__(self):
        return len(self._arr)

    def __repr__(self):
        return f"SharedArray({self._name!r}, shape={self.shape}, dtype={self.dtype})"

    def _element(self, key):
        """``(flat index, index tuple)`` when ``key`` names one element, else None."""
        a = self._arr
        k = key if isinstance(key, tuple) else (key,)
        if len(k) != a.ndim or not all(isinstance(i, (int, np.integer)) for i in k):
            return None
        idx = tuple(int(i) + (n if int(i) < 0 else 0) for i, n in zip(k, a.shape))
        flat = 0
        for i, n in zip(idx, a.shape):
            if not 0 <= i < n:
                raise IndexError(f"index {key} is out of bounds for {self._name} of shape "
                                 f"{a.shape}")
            flat = flat * n + i
        return flat, idx

    def _selection(self, key):
        """The flat indices ``key`` selects, in C order (slices, rows, fancy indices)."""
        return np.arange(self._arr.size).reshape(self._arr.shape)[key]

    def _load(self, flat, idx):
        run = self._run
        run.point(self._w, self._name, flat, LOAD)
        v = self._arr.flat[flat]
        run.record(self._w, self._name, flat, idx, LOAD, v)
        return v

    def _store(self, flat, idx, value):
        run = self._run
        run.point(self._w, self._name, flat, STORE)
        self._arr.flat[flat] = value
        run.record(self._w, self._name, flat, idx, STORE, self._arr.flat[flat])

    def __getitem__(self, key):
        one = self._element(key)
        if one is not None:
            return self._load(*one)
        sel = self._selection(key)
        out = np.empty(sel.shape, self._arr.dtype)
        for pos, flat in enumerate(sel.reshape(-1)):
            flat = int(flat)
            out.flat[pos] = self._load(flat, self._unravel(flat))
        return out

    def __setitem__(self, key, value):
        one = self._element(key)
        if one is not None:
            self._store(*one, value)
            return
        sel = self._selection(key)
        vals = np.broadcast_to(np.asarray(value, self._arr.dtype), sel.shape)
        for flat, v in zip(sel.reshape(-1), vals.reshape(-1)):
            flat = int(flat)
            self._store(flat, self._unravel(flat), v)

    def _unravel(self, flat):
        return tuple(int(i) for i in np.unravel_index(flat, self._arr.shape))

    def __getattr__(self, name):
        if name.startswith("_"):                 # unset slots, dunder probes
            raise AttributeError(name)
        raise AttributeError(
            f"a shared array under exploration has indexing, shape, dtype, ndim, size, "
            f"itemsize and len(), not .{name}: every other use must go through element "
            f"loads, e.g. np.asarray({self._name}).{name}(...) (which loads every "
            f"element, each a switch point)")

    def __array__(self, dtype=None, copy=None):
        out = self[...]
        return out if dtype is None else out.astype(dtype)


# --- choosing: the strategies -----------------------------------------------------

def _sticky(run, waiting):
    """The worker that ran last if it is waiting, else the lowest waiting: the default
    continuation (no preemption where avoidable)."""
    last = run.trace[-1][0] if run.trace else None
    return last if last in waiting else waiting[0]


def _prefix_chooser(prefix):
    """Follow ``prefix`` (worker ids), then continue without preempting."""
    def choose(run, waiting):
        k = len(run.trace)
        if k < len(prefix):
            if prefix[k] not in waiting:
                raise InvalidArgument(
                    f"schedule step {k}: worker {prefix[k]} is not waiting (waiting: "
                    f"{waiting}): the update function did not repeat its accesses under "
                    f"the same schedule; it must depend only on its arguments and the "
                    f"shared arrays (no clocks, random numbers or global state)")
            return prefix[k]
        return _sticky(run, waiting)
    return choose


def _choices_chooser(choices):
    """Hypothesis's form: at switch point k, ``choices[k]`` (0 = keep running the
    same worker; c > 0 = the c-th other waiting worker, cyclically)."""
    def choose(run, waiting):
        k = len(run.trace)
        cur = _sticky(run, waiting)
        c = choices[k] if k < len(choices) else 0
        if c == 0 or len(waiting) == 1:
            return cur
        others = [w for w in waiting if w != cur]
        return others[(c - 1) % len(others)]
    return choose


def _random_chooser(rng):
    return lambda run, waiting: waiting[rng.randrange(len(waiting))]


def _pct_chooser(rng, workers, depth, length):
    """PCT: distinct random priorities (highest runs); at each of ``depth - 1`` random
    steps of the ``length`` expected, the running worker drops below all others."""
    prio = list(range(depth, depth + workers))
    rng.shuffle(prio)
    changes = {rng.randrange(max(length, 1)): depth - 1 - i for i in range(depth - 1)}

    def choose(run, waiting):
        k = len(run.trace)
        w = max(waiting, key=lambda q: prio[q])
        if k in changes:
            prio[w] = changes[k]
            w = max(waiting, key=lambda q: prio[q])
        return w
    return choose


def _dependent(a, b):
    """Two accesses race if they touch one element and one of them stores."""
    return a[0] == b[0] and a[1] == b[1] and (a[2] == STORE or b[2] == STORE)


def _races(run, nodes):
    """DPOR's backtracking points for the trace ``run`` just ran (Flanagan and
    Godefroid's algorithm, on the whole trace at once): for each access n of worker p,
    every earlier access i by another worker that races with it and does not happen
    before p's previous access (vector clocks over program order and earlier races)
    marks state i (:func:`_mark`). Of the racing accesses before p's access became
    pending only the last counts."""
    trace = run.trace
    workers = len(run.calls)
    clocks = []
    last_of = [-1] * workers
    for n, (p, op, _) in enumerate(trace):
        clocks.append(_race_at(trace, nodes, clocks, last_of, p, op, n, workers))
        last_of[p] = n


def _race_at(trace, nodes, clocks, last_of, p, op, n, workers):
    """The races of worker p's access ``op`` made (or pending) at position n; returns
    its vector clock."""
    c = list(clocks[last_of[p]]) if last_of[p] >= 0 else [0] * workers
    prev = c[:]                                  # p's clock when this access was posted
    cands, before = [], -1
    for i in range(n):
        q, opi, _ = trace[i]
        if q == p or not _dependent(opi, op):
            continue
        c = [max(x, y) for x, y in zip(c, clocks[i])]
        if clocks[i][q] <= prev[q]:
            continue                             # already ordered before p
        if i < last_of[p]:
            before = i                           # the last one before p's access posted
        else:
            cands.append(i)
    if before >= 0:
        cands.append(before)
    for i in cands:
        _mark(nodes[i], trace, clocks, prev, p, i, n)
    c[p] = n + 1
    return c


def _mark(node, trace, clocks, prev, p, i, n):
    """Flanagan and Godefroid's E at state i: p, and every worker with an access
    between i and n that happens before p's (one of them must run first there to
    reverse the race); all of E is added, a superset of their "any one"."""
    e = {p} | {trace[j][0] for j in range(i + 1, n)
               if clocks[j][trace[j][0]] <= prev[trace[j][0]]}
    e &= set(node["waiting"])
    node["backtrack"] |= e if e else set(node["waiting"])


# --- the result ---------------------------------------------------------------------

@dataclass
class Exploration:
    """What :func:`explore` found. ``holds``: no schedule tried broke the invariant;
    ``schedules_tried``; ``complete``: True when ``"dpor"`` ran out of distinct
    schedules (every reachable outcome was checked), None for sampling strategies;
    ``outcomes``: how many distinct final states were seen; ``counterexample``: the
    failing schedule with the fewest preemptions (a list of :class:`Access`), or None.
    """

    holds: bool
    schedules_tried: int
    complete: Optional[bool]
    outcomes: int
    counterexample: Optional[list]
    final: Optional[dict] = None
    _replayer: Optional[Callable] = field(default=None, repr=False)
    _initial: Optional[dict] = field(default=None, repr=False)   # name -> array, in order
    _seen: frozenset = field(default=frozenset(), repr=False)

    def reaches(self, arrays: Mapping) -> bool:
        """Whether ``arrays`` (name -> array, as the invariant gets them) is one of the
        final states the schedules tried left."""
        return self.reaches_bytes(tuple(np.asarray(arrays[k], v.dtype).tobytes()
                                        for k, v in self._initial.items()))

    def reaches_bytes(self, key: tuple) -> bool:
        """:meth:`reaches` for a final state given as each array's bytes, in order."""
        return key in self._seen

    @property
    def schedule(self) -> Optional[list]:
        """The counterexample's order: the worker of each access."""
        return None if self.counterexample is None else [a.worker for a in
                                                         self.counterexample]

    @cached_property
    def steps(self) -> Optional[list]:
        """The counterexample as :class:`hogkit.races.Step` s on one flat table (the
        shared arrays' elements, in ``arrays`` order): a load the same worker later
        stores back is a ``load``, one it does not a ``read``; a store is a ``write``
        of the value stored."""
        if self.counterexample is None:
            return None
        offsets, o = {}, 0
        for k, v in self._initial.items():
            offsets[k] = o
            o += v.size
        rows = [offsets[a.array] + int(np.ravel_multi_index(a.index,
                                                            self._initial[a.array].shape))
                for a in self.counterexample]
        out = []
        for n, (a, r) in enumerate(zip(self.counterexample, rows)):
            if a.kind == STORE:
                out.append(Step("write", a.worker, r, a.value))
                continue
            later = any(b.worker == a.worker and b.kind == STORE and rows[m] == r
                        for m, b in enumerate(self.counterexample[n + 1:], n + 1))
            out.append(Step("load" if later else "read", a.worker, r))
        return out

    def table(self) -> np.ndarray:
        """The initial arrays flattened into the one float64 table :attr:`steps` index."""
        return np.concatenate([v.astype(np.float64).reshape(-1)
                               for v in self._initial.values()])

    @cached_property
    def _replayed(self):
        """:func:`hogkit.races.replay` of :attr:`steps` (None without a counterexample)."""
        return None if self.steps is None else replay_steps(self.steps, self.table())

    @property
    def lost_updates(self) -> int:
        """Stores in the counterexample that overwrote another worker's store made
        since their load (:func:`hogkit.races.replay`'s ``lost``); 0 without one."""
        r = self._replayed
        return 0 if r is None else r.lost

    @property
    def torn_reads(self) -> int:
        """Vector reads in the counterexample that no single instant matches."""
        r = self._replayed
        return 0 if r is None else r.torn

    def replay(self) -> dict:
        """Run the counterexample's schedule again: the arrays it leaves (the same as
        ``final`` every time)."""
        if self._replayer is None:
            raise InvalidArgument("there is no counterexample to replay: the invariant "
                                  "held on every schedule tried")
        return self._replayer()

    def trace(self) -> str:
        """The counterexample, one access a line (worker, element, value, source)."""
        if self.counterexample is None:
            return "(no counterexample)"
        lines, last = [], None
        for n, a in enumerate(self.counterexample):
            mark = "  " if last in (None, a.worker) else "->"   # a switch
            lines.append(f"{n:>4} {mark} {a}")
            last = a.worker
        return "\n".join(lines)

    def assert_holds(self):
        """Raise :class:`InvariantBroken` with the counterexample's trace, if any."""
        if not self.holds:
            final = ", ".join(f"{k}={np.array2string(np.asarray(v), threshold=20)}"
                              for k, v in (self.final or {}).items())
            raise InvariantBroken(
                f"the invariant fails after this schedule ({len(self.counterexample)} "
                f"accesses, {_preemptions(self.schedule)} preemption(s); found in "
                f"{self.schedules_tried} schedule(s)):\n{self.trace()}\nfinal: {final}")


def _preemptions(order):
    """Switches away from a worker that still had accesses to make."""
    left = {}
    for w in order:
        left[w] = left.get(w, 0) + 1
    n = 0
    for k in range(1, len(order)):
        left[order[k - 1]] -= 1
        if order[k] != order[k - 1] and left[order[k - 1]] > 0:
            n += 1
    return n


# --- the door -----------------------------------------------------------------------

def _python_function(fn, _done=None):
    """``fn``, or for a numba dispatcher its ``py_func`` (the same source, run in Python
    on the instrumented arrays), with every dispatcher among its globals (the kernels
    it calls) swapped for its own ``py_func`` the same way, recursively."""
    py = getattr(fn, "py_func", None)
    if not callable(py):
        if not callable(fn):
            raise InvalidType(f"fn must be a function (plain Python or numba @njit), got "
                              f"{type(fn).__name__}")
        return fn
    done = {} if _done is None else _done
    if py in done:
        return done[py]
    glb = dict(py.__globals__)
    out = types.FunctionType(py.__code__, glb, py.__name__, py.__defaults__,
                             py.__closure__)
    done[py] = out
    for k, v in py.__globals__.items():
        if callable(getattr(v, "py_func", None)) and k in py.__code__.co_names:
            glb[k] = _python_function(v, done)
    return out


def _check_inputs(arrays, calls, invariant):
    if not isinstance(arrays, Mapping) or not arrays:
        raise InvalidType(f"arrays must be a non-empty dict of argument name -> numpy "
                          f"array (the shared state), got {type(arrays).__name__}")
    out = {}
    for k, v in arrays.items():
        a = np.asarray(v)
        if a.dtype == object or a.ndim == 0:
            raise InvalidArgument(f"arrays[{k!r}] must be a numeric array of at least one "
                                  f"dimension, got dtype {a.dtype} shape {a.shape}")
        out[str(k)] = a
    if isinstance(calls, Mapping) or not isinstance(calls, Sequence) or len(calls) < 1:
        raise InvalidType("calls must be a list with one dict of arguments per worker "
                          "(e.g. [{'row': 0}, {'row': 0}] for two workers)")
    calls = [dict(c) for c in calls]
    for w, c in enumerate(calls):
        both = set(c) & set(out)
        if both:
            raise InvalidArgument(f"calls[{w}] passes {sorted(both)}, which are shared "
                                  f"arrays; pass each shared array once, in arrays")
    if not callable(invariant):
        raise InvalidType("invariant must be a function of the arrays after all calls "
                          "(keyword arguments), returning True when they are right")
    return out, calls


def _holds(invariant, final):
    try:
        ok = invariant(**{k: v.copy() for k, v in final.items()})
    except AssertionError:
        return False
    if ok is None:
        return True              # an assert-style invariant that did not raise
    return bool(ok)


def run_schedule(fn, arrays, calls, choices=()):
    """Run ``fn`` once per call under one schedule: ``choices[k]`` at switch point k (0:
    keep running the current worker; c > 0: the c-th other waiting worker,
    cyclically; missing entries are 0). Returns ``(final arrays, accesses)``. The form
    hypothesis drives (:func:`hogkit.testing.schedule_choices`): it shrinks a failing
    choice list towards zeros, i.e. towards fewer switches."""
    arrays, calls = _check_inputs(arrays, calls, lambda **_: True)
    run = _Run(_python_function(fn), arrays, calls, 100_000).execute(
        _choices_chooser(list(choices)))
    return {k: v.copy() for k, v in run.data.items()}, [t[2] for t in run.trace]


def explore(fn, arrays, calls, invariant, *, max_schedules: int = 1000,
            strategy: str = "dpor", seed: int = 0, depth: int = 2,
            preemptions: int = 2, max_steps: int = 100_000) -> Exploration:
    """Explore the interleavings of ``fn(**arrays, **calls[w])`` run by ``len(calls)``
    workers on shared ``arrays``, and check ``invariant(**arrays_after)`` on each.

    fn : the update function: plain Python with numpy indexing, or a numba ``@njit``
        kernel (its ``py_func`` runs). Every element load/store of a shared array is a
        switch point; its own locals and the per-call arguments are private.
    arrays : name -> initial array, shared by all workers (copied per schedule).
    calls : one dict of the remaining arguments per worker.
    invariant : ``invariant(**arrays_after) -> bool`` (or raises AssertionError).
    strategy : ``"dpor"`` (every distinct outcome, up to ``max_schedules``),
        ``"bounded"`` (every schedule with at most ``preemptions`` switches away from
        a worker that could go on, no pruning: CHESS's context bounding),
        ``"random"`` or ``"pct"`` (``max_schedules`` sampled schedules; ``seed``;
        ``depth``: PCT's bug depth). See the module docstring.
    max_steps : accesses one schedule may make (a guard against spinning workers).
    """
    fn = _python_function(fn)
    arrays, calls = _check_inputs(arrays, calls, invariant)
    max_schedules = check_int("max_schedules", max_schedules, min_value=1)
    check_choice("strategy", strategy, STRATEGIES)
    depth = check_int("depth", depth, min_value=1)
    preemptions = check_int("preemptions", preemptions, min_value=0)
    max_steps = check_int("max_steps", max_steps, min_value=1)
    rng = random.Random(seed)
    state = {"tried": 0, "seen": set(), "best": None}

    def one(choose):
        run = _Run(fn, arrays, calls, max_steps).execute(choose)
        state["tried"] += 1
        state["seen"].add(tuple(v.tobytes() for v in run.data.values()))
        if not _holds(invariant, run.data):
            order = [t[0] for t in run.trace]
            best = state["best"]
            if best is None or _preemptions(order) < _preemptions(best[0]):
                state["best"] = (order, [t[2] for t in run.trace],
                                 {k: v.copy() for k, v in run.data.items()})
        return run

    complete = None
    if strategy == "dpor":
        complete = _dpor(one, max_schedules)
    elif strategy == "bounded":
        complete = _bounded(one, max_schedules, preemptions)
    else:
        length = len(one(_prefix_chooser([])).trace)
        while state["tried"] < max_schedules:
            one(_random_chooser(rng) if strategy == "random"
                else _pct_chooser(rng, len(calls), depth, length))
    best = state["best"]
    replayer = None
    if best is not None:
        order = best[0]

        def replayer():
            run = _Run(fn, arrays, calls, max_steps).execute(_prefix_chooser(order))
            return {k: v.copy() for k, v in run.data.items()}
    return Exploration(holds=best is None, schedules_tried=state["tried"],
                       complete=complete, outcomes=len(state["seen"]),
                       counterexample=None if best is None else best[1],
                       final=None if best is None else best[2], _replayer=replayer,
                       _initial=arrays,
                       _seen=frozenset(state["seen"]))


def _dpor(one, max_schedules):
    """The stateless DPOR loop (Flanagan and Godefroid 2005): run a schedule, add the
    backtracking points its races ask for (:func:`_races`), and re-run from the start
    with the deepest untried choice. Returns True when no choice is left (complete).

    Without sleep sets: with them (Godefroid 1996) the racy row update took a tenth of
    the schedules, but the brute-force property found 3-worker programs whose outcome
    they hid (a worker asleep at the one state where a race could be reversed; optimal
    DPOR's wakeup trees are the known cure, not built)."""
    return _depth_first(one, max_schedules, _dpor_chooser, _races)


def _depth_first(one, max_schedules, chooser, analyse=None):
    """Run schedules depth first over the nodes ``chooser(nodes, prefix)`` makes (each
    ``{"waiting", "backtrack", "done", "chosen"}``): after each run (and
    ``analyse(run, nodes)``), re-run with the deepest node's next untried choice.
    Returns True when none is left, False when ``max_schedules`` ran first."""
    nodes, prefix, tried = [], [], 0
    while True:
        run = one(chooser(nodes, prefix))
        tried += 1
        if analyse is not None:
            analyse(run, nodes)
        while nodes and not (nodes[-1]["backtrack"] - nodes[-1]["done"]):
            nodes.pop()
        if not nodes:
            return True
        if tried >= max_schedules:
            return False
        node = nodes[-1]
        w = min(node["backtrack"] - node["done"])
        node["done"].add(w)
        node["chosen"] = w
        prefix = [n["chosen"] for n in nodes]


def _dpor_chooser(nodes, prefix):
    """Follow ``prefix``; past it, make a node per state (its waiting workers) and run
    without preempting where it can."""
    del nodes[len(prefix):]
    follow = _prefix_chooser(prefix)

    def choose(run, waiting):
        w = follow(run, waiting)
        if len(run.trace) >= len(prefix):
            nodes.append({"waiting": waiting, "backtrack": {w}, "done": {w}, "chosen": w})
        return w
    return choose


def _bounded(one, max_schedules, bound):
    """Every schedule with at most ``bound`` preemptions, depth first: each state's
    choices are all its waiting workers, less those that would preempt once too
    often. Returns True when all were run."""
    return _depth_first(one, max_schedules,
                        lambda nodes, prefix: _bounded_chooser(nodes, prefix, bound))


def _cost(node, w):
    """1 when running ``w`` at ``node`` preempts the worker that ran last."""
    last = node["last"]
    return int(last is not None and w != last and last in node["waiting"])


def _bounded_chooser(nodes, prefix, bound):
    """Follow ``prefix``; past it, make a node per state whose choices are the waiting
    workers within the preemption bound, and run without preempting."""
    del nodes[len(prefix):]
    follow = _prefix_chooser(prefix)

    def choose(run, waiting):
        w = follow(run, waiting)
        k = len(run.trace)
        if k >= len(prefix):
            pre = nodes[k - 1]["pre"] + _cost(nodes[k - 1], nodes[k - 1]["chosen"]) if k else 0
            node = {"waiting": waiting, "last": run.trace[-1][0] if k else None, "pre": pre,
                    "done": {w}, "chosen": w}
            node["backtrack"] = {q for q in waiting if pre + _cost(node, q) <= bound}
            nodes.append(node)
        return w
    return choose
