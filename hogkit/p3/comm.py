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

    L = len(profile.layers)
    fwd = [ly.forward_s for ly in profile.layers]
    bwd = [ly.backward_s for ly in profile.layers]
    plan = schedule.plan(profile.sizes, S)
    pieces = [m for layer in plan for m in layer]
    n_layer = [len(layer) for layer in plan]
    cost = [net.seconds(m.size) for m in pieces]     # size / inf = 0: overhead only

    events, seq = [], [0]

    def at(t, kind, payload):
        seq[0] += 1
        heapq.heappush(events, (t, kind, seq[0], payload))

    wlinks = [_Link(f"worker{w}") for w in range(W)]
    slinks = [_Link(f"server{s}") for s in range(S)]

    def enqueue(link, msg_kind, w, uid, it, now):
        link.seq += 1
        heapq.heappush(link.queue, (schedule.key(pieces[uid], it, link.seq),
                                    msg_kind, w, uid, it))
        if not link.busy and not link.kicked:
            link.kicked = True
            at(now, _LINK, (link, False))

    def link_next(link, now):
        link.kicked = False
        if link.busy or not link.queue:
            return
        _, msg_kind, w, uid, it = heapq.heappop(link.queue)
        end = now + cost[uid]
        link.busy = True
        link.busy_s.append((now, end))
        if record:
            link.sent.append((msg_kind, w, uid, it))
        at(end, _LINK, (link, True))
        at(end + net.latency, _ARRIVE, (msg_kind, w, uid, it))

    def link_done(link, now):
        link.busy = False
        link_next(link, now)

    # worker state
    it = [0] * W                 # current iteration
    ph = [0] * W                 # task: 0..L-1 forward of layer ph, L..2L-1 backward
    ver = [[-1] * L for _ in range(W)]      # newest iteration whose layer l is back
    got = [[0] * L for _ in range(W)]       # pieces of layer l back for iteration ver+1
    free_at = [0.0] * W          # when the worker's compute became free
    blocked = [-1] * W           # layer whose parameters it waits for, or -1
    wait = [[0.0] * L for _ in range(W)]    # steady-state waits per layer
    ends = [[] for _ in range(W)]
    # shard state: pushes of piece uid received from worker w (count of iterations)
    recv = [[0] * W for _ in pieces]
    pending = [[] for _ in pieces]

    def start(w, now):
        """Start worker w's next task at ``now`` if its inputs are there."""
        p = ph[w]
        if p < L:
            if it[w] > 0 and ver[w][p] < it[w] - 1:
                blocked[w] = p
                return
            blocked[w] = -1
            if it[w] >= warmup:
                wait[w][p] += now - free_at[w]
            at(now + fwd[p] * speeds[w], _COMPUTE, w)
        else:
            at(now + bwd[2 * L - 1 - p] * speeds[w], _COMPUTE, w)

    def compute_done(w, now):
        p = ph[w]
        if p >= L:
            layer = 2 * L - 1 - p
            for m in plan[layer]:
                enqueue(wlinks[w], _PUSH, w, m.uid, it[w], now)
        ph[w] += 1
        if ph[w] == 2 * L:
            ph[w] = 0
            ends[w].append(now)
            it[w] += 1
            if it[w] == iterations:
                return
        free_at[w] = now
        start(w, now)

    def release(uid, now):
        """Answer the pushes of piece uid that the bound now allows."""
        r = recv[uid]
        low = min(r)
        keep = []
        for (w, i) in pending[uid]:
            if bound is None or low >= i - bound + 1:
                enqueue(slinks[pieces[uid].server], _PULL, w, uid, i, now)
            else:
                keep.append((w, i))
        pending[uid] = keep

    def arrive(msg, now):
        msg_kind, w, uid, i = msg
        if msg_kind == _PUSH:
            recv[uid][w] = i + 1
            pending[uid].append((w, i))
            release(uid, now)
            return
        layer = pieces[uid].layer
        got[w][layer] += 1
        if got[w][layer] == n_layer[layer]:
            got[w][layer] = 0
            ver[w][layer] = i
            if blocked[w] == layer and it[w] - 1 <= i:
                start(w, now)

    for w in range(W):
        start(w, 0.0)
    while events:
        now, kind, _, payload = heapq.heappop(events)
        if kind == _ARRIVE:
            arrive(payload, now)
        elif kind == _COMPUTE:
            compute_done(payload, now)
        elif payload[1]:
            link_done(payload[0], now)
        else:
            link_next(payload[0], now)

    if any(len(e) != iterations for e in ends):
        raise RuntimeError("communication model ended before every worker finished; "
                           "this is a bug in hogkit.p3.comm")         # pragma: no cover
    steady = iterations - warmup
    per_worker, busy = [], []
    for w in range(W):
        t0 = ends[w][warmup - 1] if warmup > 0 else 0.0
        span = ends[w][-1] - t0
        per_worker.append(span / steady)
        busy.append(_busy_fraction(wlinks[w].busy_s, t0, ends[w][-1]))
    iteration_s = sum(per_worker) / W
    # the floor with unlimited bandwidth: under any bound every worker goes at the
    # slowest one's pace in the long run; asynchronous workers each at their own
    compute = profile.compute_s * (sum(speeds) / W if bound is None else max(speeds))
    worker_wait = [[wait[w][l] / steady for l in range(L)] for w in range(W)]
    layer_wait = [sum(ww[l] for ww in worker_wait) / W for l in range(L)]
    sent = {}
    if record:
        sent = {ln.name: ln.sent for ln in wlinks + slinks}
    return CommResult(schedule=schedule.spec, workers=W, servers=S, bound=bound,
                      iteration_s=iteration_s, compute_s=compute, layer_wait_s=layer_wait,
                      worker_wait_s=worker_wait, ends=ends, link_busy=busy, messages_per_iteration=len(pieces),
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
