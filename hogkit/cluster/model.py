"""The cluster run in the simulator's communication model (:mod:`hogkit.p3.comm`): how
many updates a second N nodes make, from a step time, an exchange size and a network.

A node's exchange period is one iteration of the model: one "layer" whose backward
pass is ``sync_every`` steps of compute plus the agent's preparation of the exchange
(``prep_s``: taking the delta, one pass over the node's parameters) and whose
parameters are the bytes an exchange moves each way, cut into the exchange's
``messages`` (one per shard, or a propagation schedule's slices:
:func:`exchange_messages`); the node pushes them to the shards and waits for the
pulls. ``bound=0`` is BSP between nodes (every node's push of period i before
anyone's pull returns), ``None`` a node that waits only for its own exchange (Async
with a backlog of about one period). What the model leaves out, so where it is
pessimistic: the agent exchanges *while* the workers compute (the model serialises
them: up to 2x slow when the two take as long), and several exchanges in flight;
where it is optimistic: the time a blocked worker takes to notice its gate opened,
and every process sharing the cores with the others.

:func:`network_from_round_trips` fits the model's network to measured round trips:
an exchange carrying nothing, one carrying ``size`` bytes each way, and a burst of
empty exchanges in flight at once. The burst gives the fixed cost of each message at
an endpoint (a Ray call's: serialising, scheduling, the actor's event loop), the
network's ``overhead``, which a sliced exchange pays once per slice; the model is
then checked against the measured rates before it extrapolates to more nodes.
"""

from __future__ import annotations

from hogkit.p3.comm import Network, simulate_comm
from hogkit.p3.profiles import Layer, Profile
from hogkit.p3.propagation import Schedule
from hogkit.validation import check_float, check_int

__all__ = ["exchange_profile", "exchange_messages", "predict_updates_per_s",
           "network_from_round_trips"]


def exchange_profile(step_s, sync_every, bytes_each_way, *, prep_s=0.0,
                     messages=1) -> Profile:
    """One exchange period as a one-layer profile (float32: 4 bytes a parameter; at
    least one parameter per message)."""
    step_s = check_float("step_s", step_s, min_value=0.0, exclude_min=True)
    sync_every = check_int("sync_every", sync_every, min_value=1)
    prep_s = check_float("prep_s", prep_s, min_value=0.0)
    messages = check_int("messages", messages, min_value=1)
    params = max(messages, int(round(bytes_each_way / 4)))
    return Profile("exchange", (Layer("period", params, 0.0,
                                      step_s * sync_every + prep_s),), 1,
                   "hogkit.cluster.model")


def exchange_messages(shapes, servers=1, schedule=None) -> int:
    """How many messages one exchange of parameters ``shapes`` ``{name: shape}`` over
    ``servers`` shards sends: :func:`hogkit.cluster.agent.plan_messages`' count (one
    per shard, or a schedule's row-window slices, which do not depend on how much
    the exchange carries)."""
    from hogkit.cluster.agent import plan_messages
    from hogkit.cluster.shard import row_ranges
    servers = check_int("servers", servers, min_value=1)
    ranges = {k: row_ranges(v[0], servers) for k, v in shapes.items()}
    return len(plan_messages(shapes, ranges, schedule))


#: the cluster's layout: every parameter's rows cut evenly over the shards
ROWS = Schedule("rows", big_array=1)


def predict_updates_per_s(step_s, sync_every, bytes_each_way, network, nodes, *,
                          servers=1, bound=0, workers=1, messages=None,
                          prep_s=0.0) -> float:
    """Updates per second of ``nodes`` nodes of ``workers`` workers (each worker's step
    ``step_s``; the workers of a node compute in parallel, so a period is
    ``sync_every`` steps long whatever ``workers``) over ``servers`` shards, each
    exchange prepared in ``prep_s`` and sent as ``messages`` messages
    (:func:`exchange_messages`; default one per shard). One per shard models as
    :data:`ROWS` (the rows cut evenly over the shards); more are slices of equal size,
    round-robin over the shards, which the links pipeline and each of which pays the
    network's per-message ``overhead``."""
    servers = check_int("servers", servers, min_value=1)
    messages = servers if messages is None else check_int("messages", messages,
                                                           min_value=1)
    profile = exchange_profile(step_s, sync_every, bytes_each_way, prep_s=prep_s,
                               messages=messages)
    sched = ROWS
    if messages > servers:
        size = profile.layers[0].params
        sched = Schedule("slicing", slice_size=-(-size // messages))
    res = simulate_comm(profile, sched, network, workers=nodes, servers=servers,
                        bound=bound, iterations=12, warmup=3)
    return nodes * workers * sync_every * res.iterations_per_s


def network_from_round_trips(rtt_empty_s, rtt_s, size_bytes, *, burst_s=None,
                             burst=1) -> Network:
    """The model's network that reproduces the measured round trips: ``rtt_empty_s``
    (one exchange carrying nothing), ``rtt_s`` (one carrying ``size_bytes`` each way)
    and ``burst_s`` (``burst`` empty exchanges in flight at once, to one shard).

    In the model one message costs ``overhead`` of link time at each end and
    ``latency`` each way, so one round trip is ``2·(overhead + latency)`` and a burst
    ``burst − 1`` overheads more (the shard answers them one after another):
    ``overhead = (burst_s − rtt_empty_s) / (burst − 1)``, ``latency = rtt_empty_s / 2 −
    overhead`` (at least 0); the bandwidth from the extra time ``size_bytes`` each way
    took. Without a burst the whole round trip is latency (overhead 0)."""
    rtt_empty_s = check_float("rtt_empty_s", rtt_empty_s, min_value=0.0, exclude_min=True)
    rtt_s = check_float("rtt_s", rtt_s, min_value=0.0, exclude_min=True)
    overhead = 0.0
    if burst_s is not None:
        burst = check_int("burst", burst, min_value=2,
                          fix="a burst is at least 2 messages in flight at once")
        burst_s = check_float("burst_s", burst_s, min_value=0.0, exclude_min=True)
        overhead = min(max(burst_s - rtt_empty_s, 0.0) / (burst - 1), rtt_empty_s / 2)
    extra = max(rtt_s - rtt_empty_s, 1e-9)
    return Network(bandwidth=2 * size_bytes / extra,
                   latency=max(rtt_empty_s / 2 - overhead, 0.0), overhead=overhead)
