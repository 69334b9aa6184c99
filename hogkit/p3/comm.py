"""The simulator's communication model: workers, parameter-server shards and links.

**Why.** A propagation schedule (:mod:`hogkit.p3.propagation`) changes *when* each layer's
fresh parameters are back, and so how much of the communication hides behind compute.
:func:`simulate_comm` runs a data-parallel parameter-server iteration in virtual time,
deterministically, to show it for any :class:`~hogkit.p3.profiles.Profile`, bandwidth,
latency, worker and shard count, consistency bound and schedule.

**What is modelled** (discrete events; ties broken by a global sequence number, so
the same arguments give the same result):

- Each worker computes one layer at a time: the forward pass ``F_0 .. F_{L-1}`` then
  the backward pass ``B_{L-1} .. B_0``, ``speeds[w]`` × the profile's times. When
  ``B_l`` ends, layer l's gradient is cut into the schedule's messages and queued on
  the worker's outgoing link. ``F_l`` of iteration i+1 starts only when every message
  of layer l has come back from iteration i (layer l's fresh parameters).
- A message costs a push (worker → its shard) and a pull (shard → worker, the
  updated values). Every endpoint has one outgoing link: ``network.bandwidth`` bytes/s,
  one message at a time (``size × bytes_per_param / bandwidth + overhead`` seconds),
  picked by the schedule's :meth:`~hogkit.p3.propagation.Schedule.key` when the link
  becomes free (preemption at message boundaries), delivered ``latency`` seconds after
  it leaves. Incoming links are not a bottleneck: with as many shards as workers and
  slices spread round-robin, a shard receives what a worker sends. With fewer shards
  than workers that no longer holds (every worker pushes into a shard at full rate)
  and the model is optimistic about the push half.
- A shard answers worker w's push of piece k of iteration i once it holds that push
  and every worker's pushes of k up to iteration ``i - bound``: ``bound=0`` is BSP (a
  synchronous parameter server), ``bound=s`` bounded staleness, ``bound=None`` fully
  asynchronous (each worker waits for its own update only). Applying an update costs
  nothing.

**What is not modelled**: switch contention and incast (incoming links), the shard's
update cost, compute that overlaps communication on the same device, and any effect of
staleness on convergence (that is :func:`hogkit.simulate`'s job; this model is about
time).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Optional

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.p3.profiles import Profile
from hogkit.p3.propagation import Schedule, parse_schedule
from hogkit.validation import check_float, check_int

__all__ = ["Network", "CommResult", "simulate_comm", "gains", "GBPS"]

#: bytes per second in one Gbit/s
GBPS = 1e9 / 8


@dataclass(frozen=True)
class Network:
    """Links of ``bandwidth`` bytes/s per endpoint and direction; ``latency`` seconds
    from a message leaving its link to its arrival; ``overhead`` seconds of link time
    per message (framing, per-message software cost); ``bytes_per_param`` (4: float32)."""
    bandwidth: float
    latency: float = 0.0
    overhead: float = 0.0
    bytes_per_param: int = 4

    def __post_init__(self):
        if self.bandwidth != math.inf:
            check_float("bandwidth", self.bandwidth, min_value=0.0, exclude_min=True,
                        fix="bytes per second, e.g. Network.gbps(10)")
        check_float("latency", self.latency, min_value=0.0)
        check_float("overhead", self.overhead, min_value=0.0)
        check_int("bytes_per_param", self.bytes_per_param, min_value=1)

    @classmethod
    def gbps(cls, gbit_per_s: float, **kw) -> "Network":
        """A network of ``gbit_per_s`` Gbit/s links."""
        return cls(bandwidth=check_float("gbit_per_s", gbit_per_s, min_value=0.0,
                                         exclude_min=True) * GBPS, **kw)

    def seconds(self, params: int) -> float:
        """Link time of one message of ``params`` parameters."""
        return params * self.bytes_per_param / self.bandwidth + self.overhead


@dataclass
class CommResult:
    """What :func:`simulate_comm` found. Times in virtual seconds.

    iteration_s : steady-state seconds per iteration (mean over workers of the mean
        iteration time after ``warmup`` iterations).
    compute_s : the iteration time with unlimited bandwidth (the floor): the slowest
        worker's compute time per iteration under a bound (BSP, SSP), the mean of the
        workers' under ``bound=None``.
    layer_wait_s : per layer, the mean time ``F_l`` waited for its parameters (steady
        state, mean over workers); ``layer_wait_s[0]`` is the wait for layer 1.
    worker_wait_s : the same per worker (``worker_wait_s[w][l]``).
    ends : per worker, the time each iteration's backward pass ended.
    link_busy : fraction of the steady-state span each worker's outgoing link was busy.
    sent : per link name, the messages it sent as ``(kind, worker, uid, iteration)``
        (``record=True`` only).
    """
    schedule: str
    workers: int
    servers: int
    bound: Optional[int]
    iteration_s: float
    compute_s: float
    layer_wait_s: list
    worker_wait_s: list
    ends: list
    link_busy: list
    messages_per_iteration: int
    sent: dict = field(default_factory=dict)

    @property
    def iterations_per_s(self) -> float:
        """Iterations per second of one worker (× workers × batch = samples/s)."""
        return 1.0 / self.iteration_s if self.iteration_s > 0 else math.inf

    @property
    def comm_bound(self) -> bool:
        """True when communication stretches the iteration past compute by > 1 %."""
        return self.iteration_s > 1.01 * self.compute_s

    def to_dict(self) -> dict:
        return {"schedule": self.schedule, "workers": self.workers, "servers": self.servers,
                "bound": self.bound, "iteration_s": self.iteration_s,
                "compute_s": self.compute_s, "layer_wait_s": self.layer_wait_s,
                "link_busy": self.link_busy,
                "messages_per_iteration": self.messages_per_iteration}


# event kinds, in the order they are handled at equal times: arrivals and compute ends
# queue messages before a free link picks its next one
_ARRIVE, _COMPUTE, _LINK = 0, 1, 2
_PUSH, _PULL = 0, 1
_push, _pop = heapq.heappush, heapq.heappop


class _Link:
    __slots__ = ("name", "queue", "busy", "seq", "busy_s", "sent", "kicked")

    def __init__(self, name):
        self.name, self.queue, self.busy, self.seq = name, [], False, 0
        self.busy_s, self.sent, self.kicked = [], [], False


def simulate_comm(profile: Profile, schedule="fifo", network: Optional[Network] = None, *,
                  workers: int = 1, servers: Optional[int] = None, bound: Optional[int] = 0,
                  iterations: int = 8, warmup: int = 2, speeds=None,
                  record: bool = False) -> CommResult:
    """Simulate ``iterations`` data-parallel iterations of ``profile`` on ``workers``
    workers and ``servers`` parameter-server shards (default: as many as workers)
    joined by ``network`` (default: 10 Gbit/s, no latency), sending with ``schedule``
    (a :class:`~hogkit.p3.propagation.Schedule` or its string form: ``"fifo"``,
    ``"slicing"``, ``"priority"``, ``"p3"``, ``"p3:SIZE"``); ``bound`` is the
    consistency bound (0: BSP; s: bounded staleness; None: asynchronous); ``speeds``
    per-worker compute-time factors (default all 1). See the module docstring for
    the model. Returns a :class:`CommResult`."""
    model = _Model(profile, *_checked(profile, schedule, network, workers, servers, bound,
                                      iterations, warmup, speeds), record)
    model.run()
    return model.result()


def _checked(profile, schedule, network, workers, servers, bound, iterations, warmup,
             speeds):
    """:func:`simulate_comm`'s arguments checked: ``(schedule, network, workers,
    servers, bound, iterations, warmup, speeds)``."""
    if not isinstance(profile, Profile):
        raise InvalidType(f"profile must be a hogkit.p3.profiles.Profile, got "
                          f"{type(profile).__name__}; build one with "
                          f"hogkit.p3.profiles.from_module(...) or Profile.of(...)")
    schedule = parse_schedule(schedule)
    net = network if network is not None else Network.gbps(10)
    if not isinstance(net, Network):
        raise InvalidType(f"network must be a hogkit.p3.comm.Network, got "
                          f"{type(net).__name__}")
    W = check_int("workers", workers, min_value=1)
    S = W if servers is None else check_int("servers", servers, min_value=1)
    if bound is not None:
        bound = check_int("bound", bound, min_value=0,
                          fix="0 is BSP, s bounded staleness, None asynchronous")
    iterations = check_int("iterations", iterations, min_value=1)
    warmup = check_int("warmup", warmup, min_value=0, max_value=iterations - 1,
                       fix="warm-up iterations are excluded from the steady state")
    if speeds is None:
        speeds = [1.0] * W
    if isinstance(speeds, (str, bytes)) or not hasattr(speeds, "__len__"):
        raise InvalidType(f"speeds={speeds!r} must be a list of {W} compute-time factors "
                          f"(1.0 = the profile's times), one per worker")
    speeds = [check_float(f"speeds[{w}]", s, min_value=0.0, exclude_min=True)
              for w, s in enumerate(speeds)]
    if len(speeds) != W:
        raise InvalidArgument(f"speeds has {len(speeds)} entries for {W} workers")
    return schedule, net, W, S, bound, iterations, warmup, speeds


class _Model:
    """One run of the model: the event queue, the links, the workers' and the shards'
    state, one method per event (setup in ``__init__``, the events, ``result``)."""

    def __init__(self, profile, schedule, net, W, S, bound, iterations, warmup, speeds,
                 record):
        L = len(profile.layers)
        self.profile, self.schedule, self.record = profile, schedule, record
        self.key, self.latency = schedule.key, net.latency
        self.W, self.S, self.L, self.bound = W, S, L, bound
        self.iterations, self.warmup, self.speeds = iterations, warmup, speeds
        self.fwd = [ly.forward_s for ly in profile.layers]
        self.bwd = [ly.backward_s for ly in profile.layers]
        self.plan = schedule.plan(profile.sizes, S)
        self.pieces = [m for layer in self.plan for m in layer]
        self.n_layer = [len(layer) for layer in self.plan]
        self.cost = [net.seconds(m.size) for m in self.pieces]  # size / inf = 0: overhead
        self.events = []
        self.next_seq = itertools.count(1).__next__     # ties: first scheduled, first
        self.wlinks = [_Link(f"worker{w}") for w in range(W)]
        self.slinks = [_Link(f"server{s}") for s in range(S)]
        # worker state
        self.it = [0] * W               # current iteration
        self.ph = [0] * W               # task: 0..L-1 forward of layer ph, L..2L-1 backward
        self.ver = [[-1] * L for _ in range(W)]  # newest iteration whose layer l is back
        self.got = [[0] * L for _ in range(W)]   # pieces of layer l back for ver + 1
        self.free_at = [0.0] * W        # when the worker's compute became free
        self.blocked = [-1] * W         # layer whose parameters it waits for, or -1
        self.wait = [[0.0] * L for _ in range(W)]     # steady-state waits per layer
        self.ends = [[] for _ in range(W)]
        # shard state: pushes of piece uid received from worker w (count of iterations)
        self.recv = [[0] * W for _ in self.pieces]
        self.pending = [[] for _ in self.pieces]

    def at(self, t, kind, payload):
        _push(self.events, (t, kind, self.next_seq(), payload))

    def run(self):
        """Every worker starts at 0; events in time order until none is left."""
        for w in range(self.W):
            self.start(w, 0.0)
        events = self.events
        arrive, compute_done = self.arrive, self.compute_done
        link_done, link_next = self.link_done, self.link_next
        while events:
            now, kind, _, payload = _pop(events)
            if kind == _ARRIVE:
                arrive(payload, now)
            elif kind == _COMPUTE:
                compute_done(payload, now)
            elif payload[1]:
                link_done(payload[0], now)
            else:
                link_next(payload[0], now)

    # ---- links
    def enqueue(self, link, msg_kind, w, uid, it, now):
        link.seq += 1
        _push(link.queue, (self.key(self.pieces[uid], it, link.seq), msg_kind, w, uid, it))
        if not link.busy and not link.kicked:
            link.kicked = True
            _push(self.events, (now, _LINK, self.next_seq(), (link, False)))

    def link_next(self, link, now):
        link.kicked = False
        if link.busy or not link.queue:
            return
        _, msg_kind, w, uid, it = _pop(link.queue)
        end = now + self.cost[uid]
        link.busy = True
        link.busy_s.append((now, end))
        if self.record:
            link.sent.append((msg_kind, w, uid, it))
        events, next_seq = self.events, self.next_seq
        _push(events, (end, _LINK, next_seq(), (link, True)))
        _push(events, (end + self.latency, _ARRIVE, next_seq(), (msg_kind, w, uid, it)))

    def link_done(self, link, now):
        link.busy = False
        self.link_next(link, now)

    # ---- workers
    def start(self, w, now):
        """Start worker w's next task at ``now`` if its inputs are there."""
        p = self.ph[w]
        it = self.it[w]
        if p < self.L:
            if it > 0 and self.ver[w][p] < it - 1:
                self.blocked[w] = p
                return
            self.blocked[w] = -1
            if it >= self.warmup:
                self.wait[w][p] += now - self.free_at[w]
            self.at(now + self.fwd[p] * self.speeds[w], _COMPUTE, w)
        else:
            self.at(now + self.bwd[2 * self.L - 1 - p] * self.speeds[w], _COMPUTE, w)

    def compute_done(self, w, now):
        p = self.ph[w]
        L = self.L
        if p >= L:
            for m in self.plan[2 * L - 1 - p]:
                self.enqueue(self.wlinks[w], _PUSH, w, m.uid, self.it[w], now)
        self.ph[w] += 1
        if self.ph[w] == 2 * L:
            self.ph[w] = 0
            self.ends[w].append(now)
            self.it[w] += 1
            if self.it[w] == self.iterations:
                return
        self.free_at[w] = now
        self.start(w, now)

    # ---- shards and arrivals
    def release(self, uid, now):
        """Answer the pushes of piece uid that the bound now allows."""
        low = min(self.recv[uid])
        bound = self.bound
        keep = []
        for (w, i) in self.pending[uid]:
            if bound is None or low >= i - bound + 1:
                self.enqueue(self.slinks[self.pieces[uid].server], _PULL, w, uid, i, now)
            else:
                keep.append((w, i))
        self.pending[uid] = keep

    def arrive(self, msg, now):
        msg_kind, w, uid, i = msg
        if msg_kind == _PUSH:
            self.recv[uid][w] = i + 1
            self.pending[uid].append((w, i))
            self.release(uid, now)
            return
        layer = self.pieces[uid].layer
        got = self.got[w]
        got[layer] += 1
        if got[layer] == self.n_layer[layer]:
            got[layer] = 0
            self.ver[w][layer] = i
            if self.blocked[w] == layer and self.it[w] - 1 <= i:
                self.start(w, now)

    def result(self) -> CommResult:
        """The steady state's figures (after ``warmup`` iterations)."""
        W, L, ends, warmup = self.W, self.L, self.ends, self.warmup
        if any(len(e) != self.iterations for e in ends):
            raise RuntimeError("communication model ended before every worker finished; "
                               "this is a bug in hogkit.p3.comm")     # pragma: no cover
        steady = self.iterations - warmup
        per_worker, busy = [], []
        for w in range(W):
            t0 = ends[w][warmup - 1] if warmup > 0 else 0.0
            span = ends[w][-1] - t0
            per_worker.append(span / steady)
            busy.append(_busy_fraction(self.wlinks[w].busy_s, t0, ends[w][-1]))
        iteration_s = sum(per_worker) / W
        # the floor with unlimited bandwidth: under any bound every worker goes at the
        # slowest one's pace in the long run; asynchronous workers each at their own
        speeds = self.speeds
        compute = self.profile.compute_s * (sum(speeds) / W if self.bound is None
                                            else max(speeds))
        worker_wait = [[self.wait[w][l] / steady for l in range(L)] for w in range(W)]
        layer_wait = [sum(ww[l] for ww in worker_wait) / W for l in range(L)]
        sent = {}
        if self.record:
            sent = {ln.name: ln.sent for ln in self.wlinks + self.slinks}
        return CommResult(schedule=self.schedule.spec, workers=W, servers=self.S,
                          bound=self.bound, iteration_s=iteration_s, compute_s=compute,
                          layer_wait_s=layer_wait, worker_wait_s=worker_wait, ends=ends,
                          link_busy=busy, messages_per_iteration=len(self.pieces),
                          sent=sent)


def _busy_fraction(intervals, t0, t1) -> float:
    if t1 <= t0:
        return 0.0
    busy = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in intervals)
    return busy / (t1 - t0)


def gains(profile: Profile, network: Optional[Network] = None, *, schedules=None,
          baseline="fifo", **kw) -> dict:
    """Throughput of each schedule over ``baseline`` (``iteration_s`` ratio baseline /
    schedule: 1.25 = 25 % more iterations per second), plus the raw results; keyed by
    the string given, or by :attr:`Schedule.spec` for a schedule object."""
    names = schedules if schedules is not None else ["fifo", "slicing", "priority", "p3"]
    base_sched = parse_schedule(baseline)
    base = simulate_comm(profile, base_sched, network, **kw)
    out = {"baseline": base.to_dict(), "gain": {}, "results": {}}
    for name in names:
        sched = parse_schedule(name)
        label = name if isinstance(name, str) else sched.spec
        if label in out["gain"]:
            raise InvalidArgument(f"schedule {label!r} is listed twice in schedules")
        r = base if sched == base_sched else simulate_comm(profile, sched, network, **kw)
        out["results"][label] = r.to_dict()
        out["gain"][label] = base.iteration_s / r.iteration_s
    return out
