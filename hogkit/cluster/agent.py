"""A node's agent: moves its workers' accumulated updates up to the parameter shards
and the other nodes' updates down into its shared-memory store, as Bösen's process
cache does, and holds the node's workers to the cluster's consistency bound.

It runs as a thread of the node's parent process (:mod:`hogkit.cluster.node`) next
to the supervisor, on the same views the workers write, with no lock:

- ``base`` is the agent's private copy of what the node last received from the
  shards (plus what it has sent since), so ``params − base`` is exactly the node's
  local change not yet sent. One **exchange** (:meth:`Agent.cycle`):

  1. read the node clock ``c`` (slowest local worker's iterations) and the update
     count, *then* read the parameters (so what is read holds every update of those
     ``c`` iterations);
  2. ``delta = params − base`` over the rows that changed, each element read once
     (:func:`take_delta`, one compiled pass); with ``fraction`` < 1 only the
     largest-magnitude ``fraction`` of its non-zero entries is sent, the rest stays
     in ``params − base`` and goes with a later push (error feedback: nothing is
     lost); ``base += sent``;
  3. push ``(node, c, updates, sent rows)`` to every shard and pull the rows that
     changed since the last exchange (:meth:`hogkit.cluster.shard.Shard.exchange`):
     one message per shard or, with a propagation ``schedule``, the slices of
     :func:`plan_messages` in the schedule's order (P3: input side first), all in
     flight at once;
  4. merge each reply as it arrives: ``params[r] += pulled[r] − base[r]; base[r] =
     pulled[r]`` for every pulled row (racy like any Hogwild! write: a worker's
     write to the same entry in between may be lost);
  5. only then publish the slowest remote node's clock (the smallest over the
     replies: a window pulled earlier may lack a later push) in the node's **gate row**
     (``worker_loop.control_specs(gate=1)``): the admission test every worker
     already runs now bounds it against the other nodes, with every update of
     those remote iterations already in the store. A remote node that is done no
     longer binds (the gate row goes DONE when every remote node is).

- **When** to exchange: every ``sync_every`` iterations of the node clock; under a
  bounded policy (SSP, BSP, DSSP) also whenever a local worker is blocked by the
  gate, or at the bound's edge with the node clock moved since the last exchange
  (so a bound never waits for a period). A blocked node's exchange asks the shards
  to hold the pull until the other nodes have pushed the clock its slowest worker
  needs (one round trip per BSP iteration, not polling). After an exchange that
  brought nothing new it backs off (50 µs doubling to 2 ms).

- **Start**: the gate row is IDLE until every node has made its first exchange
  (which a node makes once its own workers are ready), so every node's workers
  leave their start barrier together and a budget in seconds covers the same time
  on every node.

- **Backlog** (``backlog=b``, under Async only): no other node binds this one, but
  the gate row follows this node's *own* clock at its last exchange and the workers
  run SSP(b) against it, so a node runs at most ``b`` iterations ahead of what it
  has sent: a bounded send queue, not a consistency bound between nodes. Without
  it, a node whose steps are much faster than an exchange trains almost alone
  between exchanges.

- **Cross-node staleness** (from the shards' version vectors): each exchange tells
  how many remote updates reached the shards since the previous one; that is what
  the node's copy lacked when it was replaced, so every local read made from it
  (counted from the local iteration counters) records that gap, an upper bound on
  the remote updates it could have seen. The clock lag each worker records at its
  reads includes the gate row: it is the lag against the whole cluster.

Plain Python over an ``exchange(node, messages, need)`` callable that yields
``(message index, Reply)`` as each is answered (``need``: the remote clock a blocked
worker waits for, which the shard actors hold the pull for), so it is tested with
in-process shards (:func:`hogkit.cluster.shard.local_exchange`).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np

from hogkit.state.clocks import DONE, IDLE, RUNNING
from hogkit.kernels import clock as _kc
from hogkit.kernels import exchange as _kx
from hogkit.kernels import staleness as _ks
from hogkit.p3.propagation import parse_schedule
from hogkit.state.reader import StalenessLog

__all__ = ["Agent", "plan_messages", "take_delta"]

_BACKOFF_MIN, _BACKOFF_MAX = 50e-6, 2e-3
#: longest sleep between two looks at whether an exchange is due (doubling from
#: _BACKOFF_MIN after each look that found none due)
_IDLE_MAX = 1e-3


class Agent:
    """The agent of node ``node`` of ``nodes`` (module docstring).

    ``params``: the node's shared views; ``clocks``: its :class:`~hogkit.state.clocks.Clocks`
    with ``workers`` worker rows and the gate row after them; ``ranges``: ``{name:
    [(lo, hi) per shard]}``; ``bound``: the policy's bound (``math.inf`` or negative:
    none); ``fraction``: share of each push's non-zero entries sent (1: all)."""

    def __init__(self, node, nodes, params, clocks, workers, ranges, exchange, *,
                 sync_every=1, bound=math.inf, fraction=1.0, backlog=None, schedule=None):
        self.node, self.nodes = node, nodes
        self.params, self.clocks, self.workers = params, clocks, workers
        self.ranges, self.exchange = ranges, exchange
        self.sync_every, self.fraction = max(1, int(sync_every)), float(fraction)
        self.bound = bound if bound is not None and 0 <= bound < math.inf else None
        # Async with a backlog: the gate follows this node's own clock at its last
        # exchange (the workers' SSP(backlog) admission then bounds the unsent work)
        self.backlog = backlog
        if backlog is not None:
            self.bound = backlog
        self.base = {k: np.array(v, copy=True) for k, v in params.items()}
        self.schedule = schedule
        self.plan = plan_messages({k: v.shape for k, v in params.items()}, ranges, schedule)
        self.gate = workers                           # the gate row's index
        self.remote = [m for m in range(nodes) if m != node]
        self.last_clock = 0
        self.pushed_updates = 0
        self.remote_seen = 0
        self.reads_seen = 0
        self.exchanges = 0
        self.bytes_up = self.bytes_down = 0
        self.remote_done = False
        self.log = StalenessLog({k: np.zeros(shape, dtype)
                                 for k, (shape, dtype) in StalenessLog.specs(1, ring=1).items()})
        self.error = None
        self._halt = threading.Event()
        self._thread = None
        slots = clocks.slots
        slots[self.gate, _kc.ITER] = 0
        # IDLE holds this node's workers at their start barrier until every node has
        # joined (the cluster starts together, so budgets in seconds line up)
        self.joined = not self.remote
        slots[self.gate, _kc.STATE] = IDLE if self.remote else DONE
        slots[self.gate, _kc.BEAT] = self._advanced_ns = time.monotonic_ns()

    # ------------------------------------------------------------------ one exchange

    def cycle(self, done=False) -> bool:
        """One push-pull-merge (module docstring); True if it brought remote news."""
        W, slots = self.workers, self.clocks.slots
        it = slots[:W, _kc.ITER].copy()           # one read: the clock and the need agree
        clock = int(it.min())
        updates = int(slots[:W, _kc.UPD].sum())
        reads = int(it.sum())
        sent = take_delta(self.params, self.base, self.fraction)
        self.bytes_up += sum(rows.nbytes + vals.nbytes for rows, vals in sent.values())
        messages = self._messages(sent, clock, updates - self.pushed_updates, done)
        replies = []
        for i, reply in self.exchange(self.node, messages, None if done else self._need(it)):
            self._merge(messages[i]["shard"], reply)       # as each arrives (P3: input side first)
            replies.append(reply)
        if len(replies) != len(messages):
            raise RuntimeError(f"node {self.node}'s exchange answered {len(replies)} of "
                               f"{len(messages)} messages")
        self.pushed_updates = updates
        self.last_clock = clock
        self.exchanges += 1
        versions = np.min([r["versions"] for r in replies], axis=0)
        clocks = np.min([r["clocks"] for r in replies], axis=0)
        finished = np.all([r["done"] for r in replies], axis=0)
        remote_updates = int(versions[self.remote].sum()) if self.remote else 0
        news = remote_updates > self.remote_seen
        # every read since the previous exchange came from a copy lacking these
        gap, n = remote_updates - self.remote_seen, reads - self.reads_seen
        if n > 0:
            self._record(gap, n)
        self.remote_seen, self.reads_seen = remote_updates, reads
        live = [m for m in self.remote if not finished[m]]
        if not self.joined and np.all([r["joined"] for r in replies]):
            self.joined = True
            slots[self.gate, _kc.STATE] = RUNNING
        if self.backlog is not None:
            slots[self.gate, _kc.ITER] = max(int(slots[self.gate, _kc.ITER]), clock)
            slots[self.gate, _kc.BEAT] = time.monotonic_ns()
        elif self.remote and not live:
            slots[self.gate, _kc.STATE] = DONE
            self.remote_done = True
        elif live:
            c = int(min(clocks[m] for m in live))
            old = int(slots[self.gate, _kc.ITER])
            now = time.monotonic_ns()
            if c > old:       # DSSP reads the gate's timing: time per remote iteration
                slots[self.gate, _kc.INTERVAL] = (now - self._advanced_ns) // (c - old)
                slots[self.gate, _kc.ITER] = c
                self._advanced_ns = now
                news = True
            slots[self.gate, _kc.BEAT] = now
        return news

    def _messages(self, sent, clock, updates, done):
        """The exchange's messages, in the order they are sent: one per shard, or the
        schedule's slices (:func:`plan_messages`), the last to each shard carrying the
        clock (the shard publishes it once every part is in)."""
        out = []
        for s, window, parts in self.plan:
            delta = {}
            if window is None:                  # the whole shard
                window_ = {n: (0, r[s][1] - r[s][0]) for n, r in self.ranges.items()}
            else:
                window_ = window
            for name, (lo, hi) in window_.items():
                off = self.ranges[name][s][0]
                rows, vals = sent[name]
                a, b = np.searchsorted(rows, (off + lo, off + hi))
                delta[name] = (rows[a:b] - off, vals[a:b])
            last = parts is not None
            out.append({"shard": s, "clock": clock if last else None,
                        "updates": updates if last else 0, "done": bool(done) and last,
                        "delta": delta, "window": window, "parts": parts or 1})
        return out

    def _merge(self, s, reply):
        """``params[r] += pulled[r] − base[r]; base[r] = pulled[r]`` for shard ``s``'s
        pulled rows."""
        for name, (rows, vals) in reply["rows"].items():
            if len(rows):
                g = rows + self.ranges[name][s][0]
                self.params[name][g] += vals - self.base[name][g]
                self.base[name][g] = vals
                self.bytes_down += rows.nbytes + vals.nbytes

    def _need(self, it):
        """When a local worker is blocked: the remote clock that lets the *slowest*
        local worker go on (the shards hold the pull until the other nodes have pushed
        it), else None. Asking for the slowest's need, never more than this node's own
        clock minus the bound, is what keeps two blocked nodes from holding each other:
        the node that is ahead asks for no more than the other has pushed."""
        if self.bound is None or self.backlog is not None or self.remote_done:
            return None
        g = self._gate_clock()
        need = int(it.min()) - self.bound
        return need if int(it.max()) - g > self.bound and need > g else None

    def _gate_clock(self):
        return int(self.clocks.slots[self.gate, _kc.ITER])

    def _record(self, gap, n):
        """``n`` reads with cross-node gap ``gap`` (the lag histogram stays empty: the
        workers record their clock lag against the whole cluster themselves)."""
        self.log.gap_hist[0, _ks.bucket(gap, self.log.bins - 1)] += n
        st = self.log.stats[0]
        st[_ks.GAP_SUM] += gap * n
        st[_ks.GAP_MAX] = max(int(st[_ks.GAP_MAX]), gap)
        st[_ks.COUNT] += n

    # ------------------------------------------------------------------ the thread

    def due(self) -> bool:
        """Whether an exchange is due now (module docstring, *when*): a period is
        over; or a worker is blocked by the gate; or one is at the bound's edge and
        the node clock has moved since the last exchange (so the exchange overlaps
        the worker's last admitted iteration)."""
        it = self.clocks.slots[:self.workers, _kc.ITER]
        low = int(it.min())
        if low - self.last_clock >= self.sync_every:
            return True
        if self.bound is None or (self.remote_done and self.backlog is None):
            return False
        ahead = int(it.max()) - self._gate_clock()
        return ahead > self.bound or (ahead == self.bound and low > self.last_clock)

    def start(self):
        self._thread = threading.Thread(target=self._loop, name=f"hogkit-agent-{self.node}",
                                        daemon=True)
        self._thread.start()

    def _join(self):
        """Once this node's workers are ready, exchange until every node has joined;
        then the gate row goes RUNNING and the workers leave their start barrier."""
        slots = self.clocks.slots
        while not self._halt.is_set() and not self.joined:
            if (slots[:self.workers, _kc.STATE] == IDLE).any():
                self._halt.wait(1e-3)
            else:
                self.cycle()
                if not self.joined:
                    self._halt.wait(1e-3)

    def _loop(self):
        wait = idle = _BACKOFF_MIN
        try:
            self._join()
            while not self._halt.is_set():
                if self.clocks.stopping() or not self.due():
                    self._halt.wait(idle)
                    idle = min(2 * idle, _IDLE_MAX)
                    continue
                idle = _BACKOFF_MIN
                if self.cycle():
                    wait = _BACKOFF_MIN
                else:
                    self._halt.wait(wait)
                    wait = min(2 * wait, _BACKOFF_MAX)
        except BaseException as e:                  # noqa: BLE001 - reported by finish()
            self.error = e
            self.clocks.request_stop()          # the workers stop; finish() raises it

    def halt(self):
        """Stop the thread soon (no last exchange): every exit path of the node."""
        self._halt.set()

    def finish(self, *, push=True):
        """Stop the thread; then, unless it failed, one last exchange marked done (the
        node's final updates reach the shards, its clock stops binding the others).
        Raises what the thread raised."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise self.error
        if push:
            self.cycle(done=True)

    def summary(self) -> dict:
        """Cross-node update gap (a run's ``update_gap`` shape) and traffic."""
        return {"update_gap": self.log.summary()["gap"],
                "exchanges": self.exchanges, "bytes_up": int(self.bytes_up),
                "bytes_down": int(self.bytes_down)}


def plan_messages(shapes, ranges, schedule=None) -> list:
    """The messages of one exchange as ``[(shard, window, parts)]`` in sending order
    (``window`` ``{name: (lo, hi)}`` in the shard's own row ids, None: the whole shard;
    ``parts``: set on the last message to each shard, how many that shard gets).

    ``schedule`` None: one message per shard. Otherwise (a
    :class:`~hogkit.p3.propagation.Schedule` or its string form): one message per parameter and shard, cut into
    slices of whole rows of about ``slice_size`` parameters (at least one row), sent
    layer by layer (the parameters' order is the forward order: input side first)
    from the output side (the order a backward pass produces them: fifo, slicing) or,
    prioritized, from the input side (priority, p3); within a layer, slice by slice
    across the shards, so every shard works at once."""
    S = len(next(iter(ranges.values())))
    if schedule is None:
        return [(s, None, 1) for s in range(S)]
    schedule = parse_schedule(schedule)
    names = list(shapes)
    out = []
    for name in (names if schedule.prioritized else names[::-1]):
        shape = shapes[name]
        width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        pieces = []
        for s, (lo, hi) in enumerate(ranges[name]):
            n = hi - lo                 # 0: a shard with none of this parameter's rows
            k = max(1, n if schedule.slice_size is None else schedule.slice_size // width)
            pieces.append([(s, {name: (a, min(a + k, n))}) for a in range(0, n, k)])
        for j in range(max(len(p) for p in pieces)):
            out += [p[j] for p in pieces if j < len(p)]
    for s in range(S):                     # every shard hears the clock
        if not any(m[0] == s for m in out):
            out.append((s, {}, None))
    count = [sum(m[0] == s for m in out) for s in range(S)]
    marked, plan = set(), []
    for s, window in reversed([m[:2] for m in out]):
        plan.append((s, window, None if s in marked else count[s]))
        marked.add(s)
    return plan[::-1]


def take_delta(params, base, fraction=1.0) -> dict:
    """What an exchange sends: ``{name: (rows, values)}``, the rows where ``params −
    base`` is non-zero and that change, and ``base += values`` (so ``params − base``
    stays exactly what is unsent). Read after the node clock, so it holds every update
    of those iterations. ``fraction`` < 1: only the largest-magnitude ``fraction`` of
    the non-zero entries (the rest stays in ``params − base``: error feedback).

    With every entry sent it is one compiled pass over each parameter
    (:func:`hogkit.kernels.exchange.take_changed_rows`, racy against the workers'
    writes as its docstring says); a top-k needs the whole delta first (numpy)."""
    sent = {}
    for name, cur in params.items():
        b = base[name]
        if fraction < 1.0:
            d = _keep_largest(cur - b, fraction)
            rows = np.flatnonzero(d if d.ndim == 1 else d.reshape(d.shape[0], -1).any(axis=1))
            vals = d[rows]
            b[rows] += vals
        else:
            n = cur.shape[0]
            m = cur.size // n if n else 1
            rows = np.empty(n, np.int64)
            out = np.empty(cur.size, cur.dtype)
            k = _kx.take_changed_rows(cur.reshape(-1), b.reshape(-1), m, rows, out)
            rows, vals = rows[:k], out[:k * m].reshape((k,) + cur.shape[1:])
        sent[name] = (rows, vals)
    return sent


def _keep_largest(d, fraction):
    """``d`` with only the ``ceil(fraction · nnz)`` largest-magnitude non-zero entries."""
    flat = d.reshape(-1)
    nz = np.flatnonzero(flat)
    k = math.ceil(fraction * nz.size)
    if k >= nz.size:
        return d
    out = np.zeros_like(flat)
    keep = nz[np.argpartition(np.abs(flat[nz]), nz.size - k)[nz.size - k:]]
    out[keep] = flat[keep]
    return out.reshape(d.shape)
