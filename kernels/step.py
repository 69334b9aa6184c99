"""The step core: one Hogwild! step, written once, compiled, run n at a time.

A step is ``admit → sample → read clocks → gradient → guard → [pace] → density → gap →
rule → tick → record``. It is split at the seam of *compute, then apply*:

- :func:`begin` samples a minibatch, reads the clock vector (others' updates) and
  computes the gradient from the live parameters into the worker's buffers, then runs
  the non-finite guard. Nothing shared is written.
- :func:`end` thins the gradient (update density), measures the update gap (updates by
  others since the read), applies the rule, ticks the update clock and records the
  event in the staleness log.

:func:`run_steps` (the live worker) runs ``begin`` then ``end`` back to back, n steps
per call, and returns to Python only to wait on a policy, to merge a local-SGD phase,
to sleep a long straggler pause, to raise, or when the chunk is done. The simulator's
fused engine (``sim.py``) calls the same ``begin`` at a virtual START and ``end`` at the
FINISH, with other workers' steps in between: one step, two engines.

**The workload protocol.** A workload's compiled part is a ``NamedTuple`` of arrays
whose class is registered here with two njit kernels (:func:`register`):

- ``sample(wl, rng, cursor, nb, idx)``: write ``nb`` sample ids into ``idx``, drawing
  from ``rng`` (a ``numpy.random.Generator``) and/or the int64 array ``cursor``;
- ``gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt)``: from the live
  ``params`` (a tuple of 2-D views, one per parameter, in the workload's order) write,
  for each parameter ``p``, ``cnt[p]`` gradient rows into ``G[p]``, their row indices
  into ``R[p]`` and, when ``keep_read``, the parameter rows they were computed from
  into ``RD[p]`` (DC-ASGD's ``w_bak``, Gap-Aware's ``w_read``). Rows may repeat; the
  rule adds them up in order. Registered ``checks_finite=True``, it returns a bool:
  True says it checked every value it wrote finite, and the core's guard then skips its
  scan of the buffers (mf's vector rows check them in registers as they write them);
  False, or any kernel registered without it: the core scans;
- optionally ``sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch) -> bool``: the
  same gradient fused with plain SGD's apply, for the most common step (SGD without
  momentum, no density). It must give exactly what ``gradient`` then ``W[rows] -=
  lr·G`` gives (errors from the step's start values; a row repeated in the batch uses
  its saved start value), may use the buffers and its own ``scratch`` (the tuple the
  workload's ``CompiledParts.scratch(batch)`` makes), and returns False having written
  nothing when it cannot guarantee a finite update, so the general path (and its
  guard) runs instead. It skips the gradient's round trip through memory.
- optionally ``lane(wl, params, idx, nb, c, S1, skip) -> int``: the **per-sample
  lane** (Hogwild! as Niu et al. and LIBMF run it): the samples ``idx[:nb]`` one after
  another, each one's update applied at once, computed from the parameters as they are
  then (not from the step's start values), under the rule whose configuration is ``c``
  (``kernels.rule``; its state ``S1``). Registered as ``{configuration class:
  kernel}``: each kernel serves the rules it is registered for (``lane_rules``), and a
  loop is compiled with the one its rule's configuration picks. A sample whose update
  might not be finite is left out, nothing of it written; returns how many were left
  out (with ``skip`` False it stops at the first). It is called, not inlined: it
  compiles under its own flags (the workload's choice; hogkit's add FMA contraction)
  and its call is paid once per ``nb`` samples. For a rule without one, the core's
  generic lane (:func:`lane_any`) runs the workload's ``gradient`` one sample at a time
  through the rule.

The stubs :func:`sample` and :func:`gradient` dispatch on the arrays' class through
numba's ``overload`` (one per registered class, with the kernel's own fastmath flags),
so a workload's kernels are compiled *into* the core's module, where LLVM inlines them
into the step loop, and the core is cached per workload type like any kernel. Caveat, as for every numba cache: the cache of this module does not see
edits to a registered workload's kernel files; a user workload is therefore compiled
with the uncached twin :data:`run_steps_uncached` unless it is registered with
``cache=True``.

**Arithmetic.** Every per-step piece is inlined into the loop at numba-IR level (a call
that unpacks tuples of arrays costs ~100 ns of reference counting, as much as a whole
small step) and compiled under one flag set, :data:`FASTMATH` = ``{"reassoc"}``: sums
such as a gradient's dot products may be reassociated, so they vectorise, and so may a
rule's chains of products (no contraction, no NaN/inf assumptions: the guard still
sees them). The kernels the Python path calls carry the same flags, so both paths
compute the same numbers; a kernel called, not inlined, states its flags itself
(numba gives one that states none its first caller's, and caches that:
``delayed.py``).

**Arguments in groups.** The drivers hand the core the step's state as a few typed
groups, built once and named in ``layout.py``: ``bufs`` (:class:`~.layout.Bufs`, a
context's buffers), ``rule`` (:class:`~.layout.RuleArgs`: the rule's configuration,
its state, the clock flag), ``dens`` (:class:`~.layout.DensityArgs`), ``log``
(``(gap_hist, lag_hist, stats, ring)``), and :func:`begin`, :func:`end`,
:func:`python_end`, :func:`dense_end` take those. Taking a tuple of arrays apart costs reference counting (measured: ~100 ns a
step at batch 1, and the gradient's loops optimised worse), so :func:`run_steps`
unpacks every group once, before its loop, and runs ``end``'s two pieces
(:func:`thin`, :func:`apply_update`) on plain arrays and tuples of scalars. The control
arrays' slots (``cfg``, ``rt``, ``io``, the return codes, the pacer kinds) are named in
``layout.py``; a straggler's pacing is ``pacer.py``'s.

Everything the core reads or writes is an array or a scalar; nothing here imports
hogkit. Races: the gradient reads and the rule writes shared parameters with no lock
(Hogwild!); clocks and log rows have one writer each.
"""

from numba import literal_unroll, njit, types
from numba.extending import overload

from ._intrinsics import monotonic_ns, sched_yield
from .clock import (A_EXTRA, A_RELEASED, ITER, P_A, P_KIND, STEP, UPD, admit,
                    admitted_as_is, blocked, clock_lag, finish_iteration, lead_given,
                    others_updates, proceed_released, unbounded)
from .dense import merge_flat
from .density import NONE, filter_rows, hold_rows
from .guard import all_finite, finite_prefix
from .layout import (BATCH, BLOCKED, CHUNK, COUNT_STEPS, DIVISOR, FUSED, IO_DONE, IO_LAG,
                     IO_MERGED, IO_OTHERS, IO_PAUSE_NS, KEEP_READ, LANE, LOCAL_H, MERGE,
                     MERGE_CORE, ME, NONFINITE, PACE_NONE, PAUSE, QUOTA, QUOTA_DONE,
                     RECORD, RT_COMPUTE, RT_HELD, RT_NONFINITE, RT_PAUSED, RT_SAMPLES,
                     RT_WAIT, SKIP, STEP0, STOPPED, STRIDE, TIMING)
from .pacer import pace_ns
from .rule import FASTMATH, apply_flat, apply_rows
from .staleness import record_event

# --- the workload protocol -----------------------------------------------------------

_SAMPLERS = {}
_GRADIENTS = {}
_SGDS = {}
_LANES = {}
_CACHEABLE = set()
_CHECKS_FINITE = set()


def sample(wl, rng, cursor, nb, idx):  # pragma: no cover - dispatched by overload
    """Draw ``nb`` sample ids of workload ``wl`` into ``idx`` (see the docstring)."""
    return _SAMPLERS[type(wl)](wl, rng, cursor, nb, idx)


def gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt):  # pragma: no cover
    """The workload's gradient rows for the samples ``idx[:nb]`` (see the docstring)."""
    return _GRADIENTS[type(wl)](wl, params, idx, nb, keep_read, G, R, RD, cnt)


def sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):  # pragma: no cover
    """The workload's fused plain-SGD step, or False (see the docstring)."""
    fn = _SGDS.get(type(wl))
    return False if fn is None else fn(wl, params, idx, nb, lr, G, R, RD, cnt, scratch)


def lane(wl, params, idx, nb, c, S1, skip):  # pragma: no cover
    """The workload's per-sample lane kernel (see the docstring)."""
    return _LANES[type(wl)][type(c)](wl, params, idx, nb, c, S1, skip)


def lane_any(wl, params, idx, nb, keep, G, R, RD, cnt, GF, c, S1, S2, K, skip,
             t):  # pragma: no cover - dispatched by overload
    """The generic per-sample lane (see :func:`_lane_any`)."""
    return _lane_any(wl, params, idx, nb, keep, G, R, RD, cnt, GF, c, S1, S2, K, skip, t)


def _lane_any(wl, params, idx, nb, keep, G, R, RD, cnt, GF, c, S1, S2, K, skip, t):
    """The per-sample lane for any workload and rule: sample ``idx[b]``'s gradient
    from the live parameters (the workload's ``gradient`` on one sample), the guard,
    then the rule at once (``apply_rows`` at staleness 0; ``t`` the step's update
    count), for b in order. Returns the samples left out as non-finite (nothing of them
    is written; without ``skip`` it stops at the first). Compiled as its own function
    per workload class (an overload that is called, not inlined): the core then
    inlines the gradient once."""
    bad = 0
    for b in range(nb):
        if not compute(wl, params, G, R, RD, cnt, idx[b:], GF, 1, keep):
            bad += 1
            if not skip:
                return bad
            continue
        for p in range(len(G)):
            apply_rows(c, params[p], S1[p], S2[p], K, p, R[p], G[p], RD[p], cnt[p], 0,
                       False, t)
    return bad


def _no_sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
    return False


def register(arrays_cls, *, sample_kernel, gradient_kernel, sgd_kernel=None,
             lane_kernels=None, cache=False, checks_finite=False):
    """Register the compiled parts of a workload whose arrays are ``arrays_cls`` (a
    NamedTuple class): njit ``sample_kernel`` and ``gradient_kernel`` with the
    signatures of the module docstring. Each is inlined into the step loop (an overload
    per class, ``inline="always"``) and compiled there under the core's arithmetic flags
    :data:`FASTMATH`; compile the kernels themselves with the same flags so that the
    Python path (which calls them directly) computes the same numbers. Optional
    ``lane_kernels``: ``{rule configuration class: kernel}`` (``kernels.rule``), the
    per-sample lane for those rules, called, not inlined; a loop compiles only the one
    its rule picks. ``cache=True`` lets the core cache its code for this type on disk:
    only for kernels whose source changes only together with hogkit's (hogkit's own
    workloads). ``checks_finite=True``: ``gradient_kernel`` returns True only when it
    checked every value it wrote finite (the guard then skips its scan; module
    docstring)."""
    if arrays_cls in _SAMPLERS:
        if (_SAMPLERS[arrays_cls], _GRADIENTS[arrays_cls]) != (sample_kernel,
                                                                gradient_kernel):
            raise ValueError(f"{arrays_cls.__name__} is already registered with other "
                             f"kernels; give each workload its own arrays class")
        return
    _SAMPLERS[arrays_cls] = sample_kernel
    _GRADIENTS[arrays_cls] = gradient_kernel
    if sgd_kernel is not None:
        _SGDS[arrays_cls] = sgd_kernel
    per_rule = dict(lane_kernels or {})
    if per_rule:
        _LANES[arrays_cls] = per_rule
    if cache:
        _CACHEABLE.add(arrays_cls)
    if checks_finite:
        _CHECKS_FINITE.add(arrays_cls)
    s_py = getattr(sample_kernel, "py_func", sample_kernel)
    g_py = getattr(gradient_kernel, "py_func", gradient_kernel)
    f_py = getattr(sgd_kernel, "py_func", sgd_kernel) if sgd_kernel is not None else _no_sgd

    def sample_typer(wl, rng, cursor, nb, idx):
        return s_py if getattr(wl, "instance_class", None) is arrays_cls else None

    def gradient_typer(wl, params, idx, nb, keep_read, G, R, RD, cnt):
        return g_py if getattr(wl, "instance_class", None) is arrays_cls else None

    def sgd_typer(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
        return f_py if getattr(wl, "instance_class", None) is arrays_cls else None

    def lane_typer(wl, params, idx, nb, c, S1, skip):
        if getattr(wl, "instance_class", None) is not arrays_cls:
            return None
        kernel = per_rule.get(getattr(c, "instance_class", None))
        return _called(kernel) if kernel is not None else _no_lane

    def lane_any_typer(wl, params, idx, nb, keep, G, R, RD, cnt, GF, c, S1, S2, K, skip, t):
        return _lane_any if getattr(wl, "instance_class", None) is arrays_cls else None

    overload(sample, inline="always")(sample_typer)
    overload(gradient, inline="always")(gradient_typer)
    overload(sgd, inline="always")(sgd_typer)
    overload(lane, inline="always")(lane_typer)
    overload(lane_any, jit_options={"fastmath": FASTMATH, "nogil": True})(lane_any_typer)


def _no_lane(wl, params, idx, nb, c, S1, skip):
    return 0


def _called(kernel):
    """An overload body that calls the njit ``kernel`` (compiled under its own flags,
    unless the kernel is itself ``inline="always"``), instead of inlining its source
    into the core. The overload is inlined, so the core calls ``kernel`` directly: a
    call level passes every array of the workload, the parameters and the rule state,
    and their reference counts cost the lane per rating."""
    def call(wl, params, idx, nb, c, S1, skip):
        return kernel(wl, params, idx, nb, c, S1, skip)
    return call


def registered(arrays_cls):
    """``(sample_kernel, gradient_kernel, sgd_kernel or None)`` registered for
    ``arrays_cls``, or None."""
    if arrays_cls not in _SAMPLERS:
        return None
    return _SAMPLERS[arrays_cls], _GRADIENTS[arrays_cls], _SGDS.get(arrays_cls)


def lane_rules(arrays_cls) -> tuple:
    """The rule configuration classes a per-sample lane kernel is registered for with
    ``arrays_cls`` (empty: none; the generic lane runs every rule)."""
    return tuple(_LANES.get(arrays_cls, {}))


def cacheable(arrays_cls) -> bool:
    """True when the core may cache its code for ``arrays_cls`` (see :func:`register`)."""
    return arrays_cls in _CACHEABLE


# --- per-call settings (the control arrays' layouts are ``layout.py``'s) -----------------

#: above this a pause returns to Python to sleep; below it the core spins (sleep
#: overshoots by ~60 µs, so short pauses would miss their factor)
SPIN_MAX_NS = 200_000
#: a policy wait re-checks in compiled code this long before handing back to Python's
#: backoff (sleeps, liveness, timeout), yielding the core after SPIN_YIELD_NS
SPIN_WAIT_NS = 2_000_000
SPIN_YIELD_NS = 20_000


def vouched(wl, checked):  # pragma: no cover - dispatched by overload
    """True when the workload ``wl`` was registered ``checks_finite=True`` and its
    ``gradient`` returned True (a bool): it checked every value it wrote finite, so the
    guard need not scan the buffers (module docstring)."""


@overload(vouched, inline="always")
def _vouched(wl, checked):
    """The overload: trusted only from a class registered ``checks_finite=True`` (a
    kernel that returns a bool for another reason keeps the scan)."""
    if (getattr(wl, "instance_class", None) in _CHECKS_FINITE
            and isinstance(checked, types.Boolean)):
        return lambda wl, checked: checked
    return lambda wl, checked: False


@njit(cache=True, nogil=True, inline="always")
def _all_finite(G, GF, cnt):
    for p in range(len(G)):
        if not finite_prefix(GF[p], cnt[p] * G[p].shape[1]):
            return False
    return True


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def begin(wl, rng, cursor, params, bufs, slots, me, nb, keep_read):
    """Compute one step's update into the buffers ``bufs`` (``(G, R, RD, cnt, idx, GF,
    scratch)``, a workload context's ``bufs()``); returns ``(others, finite)``:
    others' updates at the read (the clock vector, summed) and whether every gradient
    value is finite. Nothing shared is written."""
    G, R, RD, cnt, idx, GF, _ = bufs
    sample(wl, rng, cursor, nb, idx)
    others = others_updates(slots, me)
    return others, compute(wl, params, G, R, RD, cnt, idx, GF, nb, keep_read)


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def compute(wl, params, G, R, RD, cnt, idx, GF, nb, keep_read):
    """The gradient of the drawn samples ``idx[:nb]`` into the buffers (the workload
    protocol's ``gradient``), then the guard (every value finite)."""
    checked = gradient(wl, params, idx, nb, keep_read, G, R, RD, cnt)
    return vouched(wl, checked) or _all_finite(G, GF, cnt)


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def end(params, bufs, rule, dens, slots, at):
    """Apply one step's update (see the module docstring) from the buffers ``bufs``:
    ``rule`` a :class:`~.layout.RuleArgs` (``kernels.rule.apply_rows``), ``dens`` a
    :class:`~.layout.DensityArgs` (``kernels.density``), ``at`` = ``(me, others,
    step)``: the worker, others' updates at its read (< 0: a local-SGD replica step:
    staleness 0, no update counted) and the step index density uses. Returns the update
    gap, or -1 when temporal density held the step back (nothing written: not an
    update). :func:`run_steps` runs the same two pieces, :func:`thin` and
    :func:`apply_update`, on the groups it unpacked before its loop."""
    G, R, RD, cnt = bufs[0], bufs[1], bufs[2], bufs[3]
    c, S1, S2, K, clock, shared = rule
    dcfg, D, mask = dens
    me, others, step = at
    if not thin(G, R, cnt, D, mask, dcfg, step):
        return -1
    return apply_update(params, G, R, RD, cnt, c, S1, S2, K, (clock, shared), slots,
                        (me, others))


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def thin(G, R, cnt, D, mask, dcfg, step):
    """Update density on the step's gradient rows (``kernels.density``; ``dcfg`` =
    ``(how, fraction, threshold, residual, every, seed)``, ``D`` the residuals):
    returns False when temporal density holds step ``step`` back (its rows go to the
    residual; nothing is applied), else filters the rows in place and returns True."""
    how, fraction, threshold, residual, every, seed = dcfg
    if every > 1 and step % every != 0:
        if residual:
            for p in range(len(G)):
                hold_rows(D[p], R[p], G[p], cnt[p])
        return False
    if how != NONE:
        for p in range(len(G)):
            filter_rows(how, fraction, threshold, residual, seed, step, p, D[p], R[p],
                        G[p], cnt[p], mask)
    return True


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def apply_update(params, G, R, RD, cnt, c, S1, S2, K, how, slots, who):
    """The update gap, the rule on every parameter (``kernels.rule.apply_rows``: the
    one place a step's rule writes the parameters, on every engine) and the update
    tick. ``who`` = ``(me, others)``: the worker and others' updates at its read (< 0:
    a local-SGD replica step: gap 0, no tick); ``how`` = ``(clock, shared)``
    (:class:`~.layout.RuleArgs`). Returns the gap. The step is *fresh* (DC-ASGD and
    Gap-Aware take their gaps as zero without reading the parameters again:
    ``kernels.rule.apply_rows``) when it is a replica step (its rows are private:
    nothing else writes them) or, with ``clock`` (an engine whose clock counts every
    writer), when its gap is 0. The rule's ``t`` is the clocks' update count, this
    update included, when its state is ``shared`` (every worker's updates move it),
    else -1 (the rule counts its own steps). Plain arrays and tuples of scalars:
    inlined in a loop, it takes no reference per step."""
    me, others = who
    clock, shared = how
    now = others_updates(slots, me) if others >= 0 else 0
    gap = 0 if others < 0 else now - others
    fresh = others < 0 or (gap == 0 and clock)
    t = now + slots[me, UPD] + 1 if shared and others >= 0 else -1
    for p in range(len(G)):
        apply_rows(c, params[p], S1[p], S2[p], K, p, R[p], G[p], RD[p], cnt[p], gap, fresh,
                   t)
    if others >= 0:
        slots[me, UPD] += 1
    return gap


@njit(cache=True, nogil=True, inline="always")
def _tick(slots, me, others):
    """A whole update's tick: returns its gap (others' updates since the read)."""
    gap = others_updates(slots, me) - others
    slots[me, UPD] += 1
    return gap


@njit(cache=True, nogil=True, inline="always", fastmath=FASTMATH)
def _lane(lane_kind, wl, params, idx, nb, keep, G, R, RD, cnt, GF, c, S1, S2, K, skip, t):
    """One step of the generic per-sample lane (:func:`lane_any`); returns the samples
    left out as non-finite. (A workload's own lane, ``LANE_FUSED``, runs in
    :data:`run_lane_steps`; compiled here too, it cost the first run its kernels'
    compile time again.)"""
    return lane_any(wl, params, idx, nb, keep, G, R, RD, cnt, GF, c, S1, S2, K, skip, t)


@njit(cache=True, nogil=True, inline="always")
def _spin_admit(slots, me, pol, adm, stop, budget_ns):
    """Re-check admission (``clock.blocked``: me's lead down to ``adm[A_WAIT]``)
    without leaving compiled code, for up to ``budget_ns``: the peer being waited for
    finishes a step within a few step times, so most waits never reach Python (whose
    backoff sleeps, and a sleeping waiter is slow to notice: two workers under a tight
    bound would convoy). Past the first ``SPIN_YIELD_NS`` every re-check yields the
    core (``sched_yield``), so with more workers than cores the peer gets to run.
    Returns ``(admitted, lag, ns waited)``, ``lag`` the clock lag once admitted; gives
    up early when the stop flag is raised."""
    t0 = monotonic_ns()
    now = t0
    while now - t0 < budget_ns and stop[0] == 0:
        if not blocked(slots, me, pol, adm):
            return True, clock_lag(slots, me), monotonic_ns() - t0
        if now - t0 > SPIN_YIELD_NS:
            sched_yield()
        now = monotonic_ns()
    return False, clock_lag(slots, me), now - t0


@njit(cache=True, nogil=True, inline="always")
def _spin_until(t):
    now = monotonic_ns()
    while now < t:
        now = monotonic_ns()
    return now


@njit(cache=True, nogil=True, inline="always")
def _pace(pacer, prng, rt, me, t0):
    """A straggler's extra time after a step begun at ``t0`` (counted in ``rt``): spun
    here when short; a long one is returned (ns) for Python to sleep, else 0."""
    t1 = monotonic_ns()
    extra = pace_ns(pacer, prng, t1 - t0, t1)
    rt[me, RT_COMPUTE] += t1 - t0
    rt[me, RT_PAUSED] += extra
    if extra > SPIN_MAX_NS:
        return extra
    _spin_until(t1 + extra)
    return 0


@njit(cache=True, nogil=True, fastmath=False)
def merge_phase(local, slots, me, k, io, log, cfg):
    """Worker ``me``'s local phase merged in the core after its step ``k``
    (``cfg[MERGE_CORE]``): what the worker loop's Python merge does, in its order, with
    no return to Python (a return and re-entry cost a replica every 16 steps ~a third of
    its samples). ``local`` holds a ``(shared, replica, base)`` triple of flat views per
    parameter (:func:`dense.merge_flat`: ``shared += (replica - base) / cfg[DIVISOR]``,
    then ``replica = base =`` the sum). The gap is others' updates since the phase's
    read (``io[IO_OTHERS]``); the merge ticks the worker's update clock by its phase's
    steps (``cfg[COUNT_STEPS]``, replicas) or by one (LocalSGD), records the event with
    the read's clock lag, and reads again: the next phase's others and lag."""
    gap = others_updates(slots, me) - io[IO_OTHERS]
    for t in literal_unroll(local):
        merge_flat(t[0], t[1], t[2], cfg[DIVISOR])
    slots[me, UPD] += max(0, k + 1 - io[IO_MERGED]) if cfg[COUNT_STEPS] != 0 else 1
    io[IO_MERGED] = k + 1
    gh, lh, stats, ring = log
    record_event(gh, lh, stats, ring, me, k, gap, io[IO_LAG], monotonic_ns(), 1)
    io[IO_OTHERS] = others_updates(slots, me)
    io[IO_LAG] = clock_lag(slots, me)


def merge_local(local, slots, me, k, io, log, cfg):  # pragma: no cover - overloaded
    """:func:`merge_phase` where the loop has merges to run; where ``local`` is empty
    (no in-core merge: :func:`hogkit.engine.step._merge_views`), nothing, and nothing
    compiled: merge_phase's own compile was ~1 s of a cold first run (scratch runs)."""


@overload(merge_local)
def _merge_local_jit(local, slots, me, k, io, log, cfg):
    if isinstance(local, types.BaseTuple) and len(local) == 0:
        return lambda local, slots, me, k, io, log, cfg: None
    return lambda local, slots, me, k, io, log, cfg: merge_phase(local, slots, me, k, io,
                                                                   log, cfg)


def _run_steps(n, wl, rng, cursor, params, bufs, rule, dens, ctl, log, cfg, io, pacer,
               prng, local):
    """Run up to ``n`` steps of worker ``cfg[ME]``; returns a code (``CHUNK`` when all
    ``n`` ran; ``io[IO_DONE]`` counts them). ``ctl`` = ``(slots, rt, stop, pol, adm,
    grants)``: the clock slots, runtime counters, stop flag, the policy's encoded
    row, this worker's admission state and DSSP grants (``clock.admit``). A wait
    spins here for ``SPIN_WAIT_NS``, then returns ``BLOCKED`` (bound in
    ``adm[A_WAIT]``); Python's backoff waits and sets ``adm[A_RELEASED]``. ``local``:
    :func:`merge_local`'s. Tuples are unpacked once, here (no reference a step)."""
    slots, rt, stop, pol, adm, grants = ctl
    G, R, RD, cnt, idx, GF, scratch = bufs
    c, S1, S2, K, clock, shared = rule
    dcfg, D, mask = dens                      # dcfg: scalars only
    fused, lane_kind, skip, lr = cfg[FUSED] != 0, cfg[LANE], cfg[SKIP] != 0, c.lr
    gh, lh, stats, ring = log
    me, nb, local_h = cfg[ME], cfg[BATCH], cfg[LOCAL_H]
    keep, timing = cfg[KEEP_READ] != 0, cfg[TIMING] != 0
    pacing = int(pacer[0]) != PACE_NONE
    free = unbounded(pol)                     # Async, LocalSGD: one compare per step
    kind_p, bound_p = pol[P_KIND], pol[P_A]
    done = 0
    io[IO_PAUSE_NS] = 0
    while done < n:
        io[IO_DONE] = done
        if stop[0] != 0:
            return STOPPED
        k = slots[me, ITER]
        if cfg[QUOTA] >= 0 and k >= cfg[QUOTA]:
            return QUOTA_DONE
        lag = clock_lag(slots, me)
        if not free and not admitted_as_is(bound_p, adm[A_EXTRA], adm[A_RELEASED],
                                           lead_given(slots, me, kind_p, lag)):
            if not admit(slots, me, pol, adm, grants, lag):  # the rest of the machine
                ok, lag, waited = _spin_admit(slots, me, pol, adm, stop, SPIN_WAIT_NS)
                rt[me, RT_WAIT] += waited
                if not ok:
                    return BLOCKED
                proceed_released(adm)
        slots[me, STEP] = k
        t0 = monotonic_ns() if pacing else 0
        sample(wl, rng, cursor, nb, idx)
        others = others_updates(slots, me)
        gap, bad = -1, 0                      # gap >= 0: an update to record
        if lane_kind != 0:                    # per sample: each applied at once
            bad = _lane(lane_kind, wl, params, idx, nb, keep, G, R, RD, cnt, GF, c, S1,
                        S2, K, skip, others + slots[me, UPD] + 1 if shared else -1)
            if local_h == 0 and bad < nb:
                gap = _tick(slots, me, others)
        elif fused and sgd(wl, params, idx, nb, lr, G, R, RD, cnt, scratch):
            gap = _tick(slots, me, others)    # the fast path: SGD, fused
        elif not compute(wl, params, G, R, RD, cnt, idx, GF, nb, keep):
            bad = 1
        elif thin(G, R, cnt, D, mask, dcfg, k + cfg[STEP0]):   # end(), groups unpacked
            gap = apply_update(params, G, R, RD, cnt, c, S1, S2, K, (clock, shared),
                               slots, (me, -1 if local_h > 0 else others))
            gap = gap if local_h == 0 else -1
        else:
            rt[me, RT_HELD] += 1
        if bad > 0:
            if not skip:
                return NONFINITE
            rt[me, RT_NONFINITE] += bad
        if gap >= 0 and cfg[RECORD] != 0:
            record_event(gh, lh, stats, ring, me, k, gap, lag, -1, cfg[STRIDE])
        rt[me, RT_SAMPLES] += nb
        long_pause = _pace(pacer, prng, rt, me, t0) if pacing else 0
        done += 1
        if local_h > 0 and (k + 1) % local_h == 0:
            if cfg[MERGE_CORE] == 0:
                io[IO_DONE] = done
                io[IO_PAUSE_NS] = long_pause      # Python merges, ticks, then pauses
                return MERGE
            merge_local(local, slots, me, k, io, log, cfg)
        finish_iteration(slots, me, monotonic_ns() if timing else 0)
        if long_pause > 0:
            io[IO_PAUSE_NS] = long_pause
            io[IO_DONE] = done
            return PAUSE
    io[IO_DONE] = done
    return CHUNK


def _run_lane_steps(n, wl, rng, cursor, params, bufs, rule, dens, ctl, log, cfg, io,
                    pacer, prng, local):
    """:func:`_run_steps` for a workload's own per-sample lane (``cfg[LANE]`` is
    ``LANE_FUSED``): the same loop, line for line, with the lane kernel as its only
    step. With the minibatch step and the generic lane beside it in one loop body,
    mf's lane ran 7-10 % slower at 256-1024 ratings a step (issue 25). The start and
    end of a step are written out here, not shared through inlined helpers: an
    inlined helper taking the step's ``gap`` (assigned in branches) received its
    initial value under numba 0.68, and the record lost every event (caught by
    the record counts of ``tests/test_step.py`` and ``tests/test_lane.py``)."""
    slots, rt, stop, pol, adm, grants = ctl
    idx = bufs[4]
    c, S1 = rule[0], rule[1]
    skip = cfg[SKIP] != 0
    gh, lh, stats, ring = log
    me, nb, local_h = cfg[ME], cfg[BATCH], cfg[LOCAL_H]
    timing = cfg[TIMING] != 0
    pacing = int(pacer[0]) != PACE_NONE
    free = unbounded(pol)
    kind_p, bound_p = pol[P_KIND], pol[P_A]
    done = 0
    io[IO_PAUSE_NS] = 0
    while done < n:
        io[IO_DONE] = done
        if stop[0] != 0:
            return STOPPED
        k = slots[me, ITER]
        if cfg[QUOTA] >= 0 and k >= cfg[QUOTA]:
            return QUOTA_DONE
        lag = clock_lag(slots, me)
        if not free and not admitted_as_is(bound_p, adm[A_EXTRA], adm[A_RELEASED],
                                           lead_given(slots, me, kind_p, lag)):
            if not admit(slots, me, pol, adm, grants, lag):
                ok, lag, waited = _spin_admit(slots, me, pol, adm, stop, SPIN_WAIT_NS)
                rt[me, RT_WAIT] += waited
                if not ok:
                    return BLOCKED
                proceed_released(adm)
        slots[me, STEP] = k
        t0 = monotonic_ns() if pacing else 0
        sample(wl, rng, cursor, nb, idx)
        others = others_updates(slots, me)
        bad = lane(wl, params, idx, nb, c, S1, skip)
        gap = _tick(slots, me, others) if local_h == 0 and bad < nb else -1
        if bad > 0:
            if not skip:
                return NONFINITE
            rt[me, RT_NONFINITE] += bad
        if gap >= 0 and cfg[RECORD] != 0:
            record_event(gh, lh, stats, ring, me, k, gap, lag, -1, cfg[STRIDE])
        rt[me, RT_SAMPLES] += nb
        long_pause = _pace(pacer, prng, rt, me, t0) if pacing else 0
        done += 1
        if local_h > 0 and (k + 1) % local_h == 0:
            if cfg[MERGE_CORE] == 0:
                io[IO_DONE] = done
                io[IO_PAUSE_NS] = long_pause
                return MERGE
            merge_local(local, slots, me, k, io, log, cfg)
        finish_iteration(slots, me, monotonic_ns() if timing else 0)
        if long_pause > 0:
            io[IO_PAUSE_NS] = long_pause
            io[IO_DONE] = done
            return PAUSE
    io[IO_DONE] = done
    return CHUNK


#: the live worker's step loop, cached per workload type (hogkit's own workloads)
run_steps = njit(cache=True, nogil=True, fastmath=FASTMATH)(_run_steps)
#: the same loop compiled per process, for user workloads whose kernels may change
run_steps_uncached = njit(nogil=True, fastmath=FASTMATH)(_run_steps)
#: a workload's own per-sample lane's loop (``cfg[LANE] == LANE_FUSED``), cached and not
run_lane_steps = njit(cache=True, nogil=True, fastmath=FASTMATH)(_run_lane_steps)
run_lane_steps_uncached = njit(nogil=True, fastmath=FASTMATH)(_run_lane_steps)


# --- the Python engine's halves --------------------------------------------------------

def _python_begin(wl, rng, cursor, params, G, R, RD, cnt, idx, GF, keep_read, nb,
                  slots, me):
    """The Python engine's compute half in one call: read the clock vector (unless
    ``me < 0``), sample ``nb`` ids, the gradient into the buffers, the guard. Returns
    ``(others, lag, finite)``: others' updates and the clock lag at the read (-1, -1
    when not read) and whether every gradient value is finite. The step core's
    :func:`begin`, plus the lag its admission check measures."""
    others, lag = -1, -1
    if me >= 0:
        others = others_updates(slots, me)
        lag = clock_lag(slots, me)
    sample(wl, rng, cursor, nb, idx)
    return others, lag, compute(wl, params, G, R, RD, cnt, idx, GF, nb, keep_read)


#: per workload type, like run_steps (and an uncached twin for user workloads)
python_begin = njit(cache=True, nogil=True, fastmath=FASTMATH)(_python_begin)
python_begin_uncached = njit(nogil=True, fastmath=FASTMATH)(_python_begin)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def python_end(params, bufs, rule, log, slots, ev):
    """The Python engine's apply half in one call, for an update that goes to the
    shared parameters whole (no density, no per-shard clocks), from the buffers
    ``bufs`` (``(G, R, RD, cnt)`` or a context's whole ``bufs()``) under ``rule`` (a
    :class:`~.layout.RuleArgs`): the gap (others' updates since the read), the rule on
    every parameter (``kernels.rule.apply_rows``, as :func:`end`), the update tick, the
    event into ``log`` = ``(gap_hist, lag_hist, stats, ring)``. ``ev`` = ``(me, others,
    lag, step, t_ns)``: the worker, others' updates and the clock lag at its read, the
    step and the event's time (< 0: now). ``others < 0``: a local-SGD replica step
    (staleness 0, nothing ticked or recorded). Returns the gap."""
    c, S1, S2, K, clock, shared = rule
    me, others, lag, step, t_ns = ev
    gap = apply_update(params, bufs[0], bufs[1], bufs[2], bufs[3], c, S1, S2, K,
                       (clock, shared), slots, (me, others))
    if others >= 0:
        gh, lh, stats, ring = log
        record_event(gh, lh, stats, ring, me, step, gap, lag, t_ns, 1)
    return gap


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def dense_end(params, G, RD, rules, log, slots, ev):
    """A torch-style optimizer's step (``hogkit.optim``) in one call, for dense
    gradients: the guard (every value finite, else nothing is written and -1 is
    returned), the gap, each parameter's rule under ``rules`` = ``(groups, S1, S2, K,
    shared)`` (``shared``: the state is every worker's, as for
    :func:`apply_update`'s ``t``): ``groups`` a tuple of ``(cfg, lo, hi)``, one per
    param group, whose rule
    configuration ``cfg`` applies to parameters ``lo`` to ``hi - 1``
    (``kernels.rule.apply_flat``, what ``rule.apply`` runs; the loop is compiled once
    per group's rule), the update tick and the event into ``log`` (``ev`` as for
    :func:`python_end`). Every array is flat; ``RD[p]`` / ``S1[p]`` / ``S2[p]`` may be
    empty where the rule does not use them. Returns the gap."""
    for p in range(len(G)):
        if not all_finite(G[p]):
            return -1
    groups, S1, S2, K, shared = rules
    me, others, lag, step, t_ns = ev
    now = others_updates(slots, me)
    gap = now - others
    t = now + slots[me, UPD] + 1 if shared else -1
    for group in literal_unroll(groups):
        c, lo, hi = group
        for p in range(lo, hi):
            apply_flat(c, params[p], S1[p], S2[p], K, p, G[p], RD[p], gap, t)
    slots[me, UPD] += 1
    gh, lh, stats, ring = log
    record_event(gh, lh, stats, ring, me, step, gap, lag, t_ns, 1)
    return gap
