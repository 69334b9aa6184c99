"""One parameter shard of a cluster run: a slice of rows of every parameter, the
version vector of the updates it holds, and the nodes' clocks.

Plain Python and numpy, so it is tested without Ray; :mod:`hogkit.cluster.backend`
wraps it in a Ray actor (one process per shard, each owning its store).

Rows: with S shards, each parameter's leading axis is cut into S contiguous ranges
(:func:`row_ranges`; a 1-D parameter's elements are its rows), and shard s holds
range s of every parameter. A node exchanges with a shard in one call,
:meth:`Shard.exchange` = *push then pull*:

- **push** ``(node, clock, updates, rows → delta)``: the delta is added to the rows
  (the node's accumulated local change since it last pushed, minus what its density
  filter kept back); ``updates`` is how many of the node's updates it carries (the
  node's entry of the version vector grows by it); ``clock`` is the node's SSP clock
  (the slowest local worker's iterations, read *before* the delta was taken, so the
  delta holds every update of those iterations); ``done`` marks a node that will push
  no more (its clock stops binding anyone).
- **pull**: every row changed since this node's previous exchange, with the version
  vector and the clocks. Each row carries the sequence number of the last push that
  changed it, so a pull sends only what the node lacks; the node's own push counts
  as a change (its copy then equals the shard's, up to what it wrote meanwhile).

The push and the pull are each atomic (the actor's calls interleave only while one
waits), so a pull always includes the push it came with, and the clocks it returns are
those of pushes whose deltas it holds: the reply's ``clocks`` are a promise that every
update of those iterations is in the values. A node blocked by its bound asks the
actor to hold the pull until the other nodes have pushed the clock it needs
(:meth:`Shard.reached`): one round trip per BSP iteration instead of polling.

**Sliced exchanges** (a propagation schedule, :mod:`hogkit.p3.propagation`): a node may
cut one exchange with a shard into several messages, each pushing and pulling only a
``window`` of rows ``{name: (lo, hi)}``, sent in the schedule's order (P3: input-side
layers first). Each row remembers which push each node last pulled it after, so a
window's pull sends exactly the rows of that window the node lacks. Only one message
of the exchange carries the node's ``clock``, ``updates`` and ``done``, with
``parts`` = how many messages the exchange has; the shard publishes them once all
``parts`` have been pushed, whatever order they arrived in (an asynchronous actor may
start them out of order), so the clocks stay a promise. A node's clock in the
replies to one exchange can only grow, so the smallest clock over its replies is one
every pulled window holds.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Shard", "row_ranges", "Reply", "local_exchange"]


def row_ranges(n_rows: int, shards: int) -> list:
    """``[(lo, hi)]`` for each shard: ``n_rows`` cut into ``shards`` contiguous ranges
    whose sizes differ by at most one (trailing shards may be empty)."""
    bounds = np.linspace(0, n_rows, shards + 1).round().astype(np.int64)
    return [(int(bounds[s]), int(bounds[s + 1])) for s in range(shards)]


class Reply(dict):
    """What an exchange answers: ``rows`` ``{name: (local row ids, values)}``, and the
    shard's ``versions`` (updates held from each node), ``clocks``, ``done`` and
    ``joined`` (per node: has exchanged at all), ``seq`` (pushes applied so far)."""


class Shard:
    """Rows ``ranges[name]`` of each parameter, for ``nodes`` nodes."""

    def __init__(self, index: int, values: dict, nodes: int):
        self.index = index
        self.values = {k: np.array(v, copy=True) for k, v in values.items()}
        self.row_seq = {k: np.zeros(v.shape[0], np.int64) for k, v in self.values.items()}
        self.seq = 0
        self.versions = np.zeros(nodes, np.int64)
        self.clocks = np.zeros(nodes, np.int64)
        self.done = np.zeros(nodes, bool)
        self.joined = np.zeros(nodes, bool)        # made an exchange (workers ready)
        # per row, the seq after which each node last pulled it
        self.seen = {k: np.zeros((nodes, v.shape[0]), np.int64)
                     for k, v in self.values.items()}
        self.arrived = np.zeros(nodes, np.int64)    # messages of the current exchange
        self.pending = [None] * nodes              # its (clock, updates, done, parts)
        self.bytes_in = self.bytes_out = 0

    def exchange(self, node: int, clock, updates: int, delta: dict,
                 done: bool = False, window=None, parts: int = 1) -> Reply:
        """Push ``delta`` ``{name: (row ids, values)}`` from ``node`` at ``clock``, then
        pull what changed since its previous exchange (module docstring); with a
        ``window``, one message of a sliced exchange."""
        self.push(node, clock, updates, delta, done, parts)
        return self.pull(node, window)

    def reached(self, node: int, need: int) -> bool:
        """Whether every other node that is not done has pushed clock ``need``: what a
        node blocked by its bound waits for (the actor holds its reply until then)."""
        return all(self.done[m] or self.clocks[m] >= need
                   for m in range(len(self.clocks)) if m != node)

    def push(self, node: int, clock, updates: int, delta: dict,
             done: bool = False, parts: int = 1) -> None:
        """The push half of :meth:`exchange`; ``clock`` None: a message of a sliced
        exchange that carries rows only (its ``updates`` and ``done`` are ignored)."""
        self.seq += 1
        for name, (rows, vals) in delta.items():
            if len(rows):
                self.values[name][rows] += vals
                self.row_seq[name][rows] = self.seq
                self.bytes_in += rows.nbytes + vals.nbytes
        self.arrived[node] += 1
        if clock is not None:
            self.pending[node] = (clock, updates, done, parts)
        p = self.pending[node]
        if p is not None and self.arrived[node] >= p[3]:   # the whole exchange is in
            clock, updates, done, _ = p
            self.versions[node] += updates
            self.clocks[node] = max(self.clocks[node], clock)
            self.done[node] |= bool(done)
            self.joined[node] = True
            self.arrived[node], self.pending[node] = 0, None

    def pull(self, node: int, window=None) -> Reply:
        """The pull half of :meth:`exchange`: every row (of ``window`` ``{name: (lo,
        hi)}``, or of the whole shard) changed since ``node`` last pulled it."""
        out = {}
        for name, seqs in self.row_seq.items():
            if window is None:
                lo, hi = 0, seqs.shape[0]
            elif name in window:
                lo, hi = window[name]
            else:
                continue
            seen = self.seen[name][node, lo:hi]
            rows = lo + np.flatnonzero(seqs[lo:hi] > seen)
            seen[:] = self.seq
            vals = self.values[name][rows]
            out[name] = (rows, vals)
            self.bytes_out += rows.nbytes + vals.nbytes
        return Reply(rows=out, versions=self.versions.copy(), clocks=self.clocks.copy(),
                     done=self.done.copy(), joined=self.joined.copy(), seq=self.seq)

    def snapshot(self) -> dict:
        """Every row this shard holds (the global model's slice), and its counters."""
        return {"values": {k: v.copy() for k, v in self.values.items()},
                "versions": self.versions.copy(), "seq": self.seq,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


def local_exchange(shards, order=None):
    """The agent's exchange callable over in-process :class:`Shard` objects (tests,
    and a cluster without Ray): ``order(messages) -> indices`` delivers the messages
    of one exchange in another order (an asynchronous actor's), default as sent.
    Yields ``(index, reply)`` as each is answered."""
    def exchange(node, messages, need=None):
        for i in (range(len(messages)) if order is None else order(messages)):
            m = messages[i]
            yield i, shards[m["shard"]].exchange(node, m["clock"], m["updates"], m["delta"],
                                                 m["done"], m["window"], m["parts"])
    return exchange
