"""The engine core's control-array layouts: which slot of which array means what.

The compiled step core (``step.py``), the simulator's event loop (``sim.py``) and the
Python drivers around them (``hogkit.engine``) talk through small int64/float64 arrays;
this module is the one place that names their slots, each block with who writes it and
who reads it. The clock's own layouts (the slot matrix ``SLOT`` columns, the policy's
encoded row ``P_*`` and a worker's admission state ``A_*``) stay in ``clock.py``: they
belong to the admission state machine that reads them, and the policy room encodes them.

The argument groups the drivers hand the compiled code are named here too
(:class:`RuleArgs`, :class:`DensityCfg`, :class:`DensityArgs`, :class:`Bufs`): numba
types a ``NamedTuple`` like a tuple (unpacking one costs nothing), and a reader of a
driver sees names, not slot numbers. Plain integers and classes only: nothing here
compiles, so importing the layout loads no numba.
"""

from typing import NamedTuple

import numpy as np


class RuleArgs(NamedTuple):
    """A step's rule as the compiled code takes it (``hogkit.engine.step.encode_rule``):
    its configuration (``kernels.rule``: the class picks the kernels), per parameter its
    first and second state arrays (empty where unused), the parameters' step counts;
    ``clock``: the engine's update clock counts every writer of the parameters, so a
    step whose gap is 0 is *fresh* (``step.apply_update``); ``shared``: the state is
    every worker's, so the rule's update count ``t`` counts every worker's updates
    (else the worker's own)."""
    cfg: tuple
    S1: tuple
    S2: tuple
    K: np.ndarray
    clock: bool
    shared: bool


class DensityCfg(NamedTuple):
    """Update density's settings (``kernels.density``): the filter, the fraction kept,
    the threshold, keep a residual, apply every k-th step, the random masks' seed."""
    how: int
    fraction: float
    threshold: float
    residual: bool
    every: int
    seed: int


class DensityArgs(NamedTuple):
    """Update density as the compiled code takes it: its settings (scalars only: the
    step loop unpacks them once), per parameter the residual rows, and the mask
    buffer."""
    cfg: DensityCfg
    D: tuple
    mask: np.ndarray


class Bufs(NamedTuple):
    """A worker's step buffers (``hogkit.workloads.base.KernelCtx.bufs``): per parameter
    the gradient rows ``G`` (views of the flat ``GF``), their row indices ``R``, the
    read copies ``RD``, the rows filled ``cnt``; the sample ids ``idx``; the
    workload's fused-SGD ``scratch``."""
    G: tuple
    R: tuple
    RD: tuple
    cnt: np.ndarray
    idx: np.ndarray
    GF: tuple
    scratch: tuple

# --- the live step core (step.run_steps) -------------------------------------------------

#: ``cfg`` (int64, one per worker): written by the Python driver
#: (``hogkit.engine.step.CompiledStep``) before and between calls, read by
#: ``step.run_steps``. ME the rank, BATCH the minibatch, KEEP_READ keep the read rows
#: (DC-ASGD, Gap-Aware), SKIP skip non-finite gradients (else return NONFINITE), STRIDE
#: the event ring's stride (the worker loop adapts it), LOCAL_H local SGD's h (0: none),
#: QUOTA the iterations to stop at (-1: none), TIMING stamp iteration times (DSSP),
#: RECORD record events, FUSED run the workload's fused SGD kernel, STEP0 added to the
#: step index density's random masks and every-k phase use (a resumed segment goes on
#: with the whole run's sequence), LANE the step's lane (LANE_BATCH: the exact
#: minibatch step; LANE_SAMPLE: per-sample Hogwild! through the workload's gradient and
#: the rule, one sample at a time; LANE_FUSED: the workload's own per-sample kernel),
#: MERGE_CORE a local phase's merge runs in the core (``step.merge_phase``; 0: the core
#: returns MERGE and Python merges), DIVISOR what the merge divides a phase's change by,
#: COUNT_STEPS a merge counts its phase's steps as updates (replicas; else one).
(ME, BATCH, KEEP_READ, SKIP, STRIDE, LOCAL_H, QUOTA, TIMING, RECORD, FUSED,
 STEP0, LANE, MERGE_CORE, DIVISOR, COUNT_STEPS) = range(15)
NCFG = 15
LANE_BATCH, LANE_SAMPLE, LANE_FUSED = 0, 1, 2

#: ``rt`` (int64, one row of RT columns per worker) counters: written by the worker
#: only (the step core, or the Python engine's loop), read by the parent's summary
#: (``hogkit.engine.live``): ns waiting on the policy and busy in the loop, gradients
#: skipped as non-finite, samples processed, monotonic ns it left the start barrier /
#: finished, ns of compute and of straggler pauses (realised slowdown), steps held back
#: by temporal density, the largest event-ring stride used.
(RT_WAIT, RT_BUSY, RT_NONFINITE, RT_SAMPLES, RT_T0, RT_T1, RT_COMPUTE, RT_PAUSED,
 RT_HELD, RT_STRIDE) = range(10)
RT = 16

#: return codes of ``step.run_steps``, read by the worker loop
#: (``hogkit.engine.worker_loop``): the chunk ran, the stop flag, the quota reached, a
#: policy wait (bound in ``adm[clock.A_WAIT]``), a local-SGD merge due, a long straggler
#: pause to sleep (``io[IO_PAUSE_NS]``), a non-finite gradient.
CHUNK, STOPPED, QUOTA_DONE, BLOCKED, MERGE, PAUSE, NONFINITE = range(7)

#: ``io`` (int64) results of ``step.run_steps``, written by the core, read by the
#: driver: the steps run by the call, the long pause it asks for (ns); with
#: ``cfg[MERGE_CORE]`` also the local phase's read, written by both (the driver before a
#: call, the core at each merge): others' updates and the clock lag when the phase
#: pulled the shared model, and the worker's steps merged so far.
IO_DONE, IO_PAUSE_NS, IO_OTHERS, IO_LAG, IO_MERGED = range(5)
NIO = 8

#: pacer kinds, the first entry of a straggler's pacer row ``[kind, a, b, t0_ns]``:
#: written by the straggler models (``hogkit.engine.delays``: ``Slowdown``, ``Pauses``,
#: ``Load``), read by ``pacer.pace_ns`` (the live core and the Python pacer).
PACE_NONE, PACE_SLOWDOWN, PACE_PAUSES, PACE_LOAD = 0, 1, 2, 3

# --- the simulator's event loop (sim.run_events) ------------------------------------------

class FusedStep(NamedTuple):
    """The fused engine's step, for ``sim.run_events`` (None: the Python engine hands
    each half back): the workload's arrays, the workers' generators (a typed list, or
    None when the sampler draws nothing) and cursors, the parameters, the per-worker
    stacks of the step buffers, the rule's configuration, the per-worker stacks of its
    state ``(S1, S2, K)`` (stacks of one: one state for every worker), density's
    settings, the per-worker stacks of its residuals and the mask buffer."""
    wl: tuple
    rngs: object
    cursors: np.ndarray
    params: tuple
    wbufs: tuple
    rule: tuple
    wrule: tuple
    dens: tuple
    wdens: tuple
    mask: np.ndarray


class EventLoop(NamedTuple):
    """The event loop's own state, for ``sim.run_events`` (both engines): the clock
    slots, the staleness log's arrays, the step times ``(base, pause, speed, amp,
    period)``, the per-worker state ``ist``/``fst``, the globals ``gi``, the loop's
    ``cfg`` and the policy ``(encoded row, DSSP grants)``."""
    slots: np.ndarray
    log: tuple
    times: tuple
    ist: np.ndarray
    fst: np.ndarray
    gi: np.ndarray
    cfg: np.ndarray
    policy: tuple


#: event kinds of ``ist[w, I_KIND]``: ``(time, kind, seq)`` orders events, so a FINISH at
#: t comes before a START at t (updates that finish at t are visible to reads at t).
FINISH, START, EV_NONE = 0, 1, -1

#: ``ist`` (int64, one row per virtual worker) state: initialised by
#: ``hogkit.engine.simulator`` (quota, kind, seq, admission state), then written by the
#: event loop; the Python engine writes I_BAD / I_HELD when the loop hands it a half
#: step; the simulator reads I_SKIPPED / I_HELD for the summary. I_ADM is the first of
#: the worker's ``clock.NADM`` admission-state columns (``clock.A_*``).
(I_STARTED, I_QUOTA, I_OREAD, I_LAG, I_KIND, I_SEQ, I_BLOCKED, I_FILLED, I_SKIPPED,
 I_BAD, I_ADM) = range(11)
#: ``clock.NADM``, written out so that this module loads no numba (``sim.py`` checks
#: that the two agree at import)
ADM_WIDTH = 3
#: steps held back by temporal density; the half step the Python engine owes (1: the
#: loop handed back R_BEGIN / R_END and resumes after it)
I_HELD, I_PHASE = I_ADM + ADM_WIDTH, I_ADM + ADM_WIDTH + 1
NI = I_PHASE + 1

#: ``fst`` (float64, one row per virtual worker): written by the event loop, read by the
#: simulator's summary: the pending event's time, when a block began, the seconds spent
#: blocked, the last finish.
F_T, F_WAIT_SINCE, F_WAIT, F_LAST = range(4)
NF = 4

#: ``gi`` (int64) globals: written by the loop (the Python engine adds its updates to
#: G_TOTAL): the next event's sequence number, the updates applied, the worker a return
#: code is about, the workers blocked now; from G_QUEUE on, the event queue: a
#: tournament tree of ``2 P`` slots over the workers (``P`` a power of two >= W; slot
#: ``P + w`` holds w while it has a pending event, else -1; slot ``i < P`` the first of
#: its two children's by ``(time, kind, seq)``; slot 1 the next event's worker).
G_SEQ, G_TOTAL, G_WHO, G_BLOCKED = range(4)
G_QUEUE = 4
NG = G_QUEUE


#: the fewest workers that get the tree; below it the loop scans every worker for the
#: next event (no slots). Measured in one invocation, the scan and the tree alternating
#: (``hogkit bench simulate``'s ``queue`` part, benchmarks/RESULTS.md "The tree from 16
#: workers on"): the tree was never slower from 8 workers on and ahead at 64; at 512
#: the loop ran ~1.5x faster with it ("The next event from a tournament tree")
QUEUE_MIN_WORKERS = 16


def queue_slots(workers: int) -> int:
    """The event queue's ``2 P`` slots for ``workers`` (``P``: a power of two >= it);
    0 below :data:`QUEUE_MIN_WORKERS`."""
    if workers < QUEUE_MIN_WORKERS:
        return 0
    return 2 * (1 << max(0, int(workers) - 1).bit_length())


#: ``cfg`` (float64) of the event loop: written by the simulator (it moves the
#: evaluation points on), read by the loop: the next loss evaluation's virtual time and
#: update count, the time budget, skip non-finite, keep read rows, the batch. The policy
#: travels as its encoded row (``clock.P_*``).
C_EVAL_T, C_EVAL_U, C_T_STOP, C_SKIP, C_KEEP, C_BATCH = range(6)
NC = 6

#: return codes of ``sim.run_events``, read by ``hogkit.engine.simulator``'s driver
#: (the module docstring of ``sim.py`` says what each asks for).
R_DONE, R_EVAL_T, R_EVAL_U, R_REFILL, R_NONFINITE, R_BEGIN, R_END, R_RETIRE = range(8)
