"""The cluster run in the simulator's communication model (:mod:`hogkit.comm`): how
many updates a second N nodes make, from a step time, an exchange size and a network.

A node's exchange period is one iteration of the model: one "layer" whose backward
pass is ``sync_every`` steps of compute and whose parameters are the bytes an
exchange moves each way; the node pushes it to its shard and waits for the pull.
``bound=0`` is BSP between nodes (every node's push of period i before anyone's pull
returns), ``None`` a node that waits only for its own exchange (Async with a
backlog of about one period). What the model leaves out, so where it is pessimistic:
the agent exchanges *while* the workers compute (the model serialises them: up to 2x
slow when the two take as long), and several exchanges in flight.

:func:`network_from_round_trips` fits the model's network to two measured round trips
(an exchange carrying nothing and one carrying ``size`` bytes each way), so the model
can be checked against the measured rates before it extrapolates to more nodes.
"""

from __future__ import annotations

from hogkit.comm import Network, simulate_comm
from hogkit.profiles import Layer, Profile
from hogkit.propagation import Schedule, parse_schedule
from hogkit.validation import check_float, check_int

__all__ = ["exchange_profile", "predict_updates_per_s", "network_from_round_trips"]


def exchange_profile(step_s, sync_every, bytes_each_way) -> Profile:
    """One exchange period as a one-layer profile (float32: 4 bytes a parameter)."""
    step_s = check_float("step_s", step_s, min_value=0.0, exclude_min=True)
    sync_every = check_int("sync_every", sync_every, min_value=1)
    params = max(1, int(round(bytes_each_way / 4)))
    return Profile("exchange", (Layer("period", params, 0.0, step_s * sync_every),), 1,
                   "hogkit.cluster.model")


#: the cluster's layout: every parameter's rows cut evenly over the shards
ROWS = Schedule("rows", big_array=1)


def predict_updates_per_s(step_s, sync_every, bytes_each_way, network, nodes, *,
                          servers=1, bound=0, workers=1, schedule=None) -> float:
    """Updates per second of ``nodes`` nodes of ``workers`` workers (each worker's step
    ``step_s``; the workers of a node compute in parallel, so a period is
    ``sync_every`` steps long whatever ``workers``) over ``servers`` shards.
    ``schedule``: the exchange's messages (:func:`hogkit.cluster.agent.plan_messages`).
    Whole layers (fifo, priority) are cut over every shard as the default is, so they
    model as :data:`ROWS`; a slice size cuts each shard's share into slices (as
    ``plan_messages`` does: modelled as slices of at most one share, round-robin over
    the shards), which the links pipeline (the period's one "layer" has no input side
    to put first, so p3 models as slicing). What the model leaves out: the fixed cost
    of each message at the endpoints (a Ray call's), which slicing multiplies."""
    sched = ROWS
    if schedule is not None and parse_schedule(schedule).slice_size is not None:
        share = -(-max(1, int(round(bytes_each_way / 4))) // max(1, int(servers)))
        sched = Schedule("slicing", slice_size=min(parse_schedule(schedule).slice_size,
                                                   share))
    res = simulate_comm(exchange_profile(step_s, sync_every, bytes_each_way), sched,
                        network, workers=nodes, servers=servers, bound=bound,
                        iterations=12, warmup=3)
    return nodes * workers * sync_every * res.iterations_per_s


def network_from_round_trips(rtt_empty_s, rtt_s, size_bytes) -> Network:
    """The model's network that reproduces both round trips: latency = half the empty
    one, bandwidth from the extra time ``size_bytes`` each way took."""
    rtt_empty_s = check_float("rtt_empty_s", rtt_empty_s, min_value=0.0, exclude_min=True)
    rtt_s = check_float("rtt_s", rtt_s, min_value=0.0, exclude_min=True)
    extra = max(rtt_s - rtt_empty_s, 1e-9)
    return Network(bandwidth=2 * size_bytes / extra, latency=rtt_empty_s / 2)
