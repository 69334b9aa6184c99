"""Scenario ``ray``: 2 nodes x 1 worker on a local Ray instance against the single-node
2-worker run on the same workload, the same machine, in the same invocation.

For each cluster setting (policy, ``sync_every``, ``backlog``, ``push_fraction``):
updates/s and its ratio to the single-node run's (the baseline, measured in the same
invocation, median over rounds), the bytes the shards moved per update, the
exchanges, and the loss per update: the cluster's final loss over the final loss of a
single-node 2-worker run with the same policy and *the same number of updates* (run
right after it). The goal the issue set on localhost: updates/s >= 0.5x shared memory
at a push period whose loss per update is within 10 %. The bounded settings are also
predicted by :mod:`hogkit.cluster.model` (its network fitted to measured round trips
of a real shard actor) and simulated at 8, 32 and 128 nodes.

Needs the ray extra (``pip install -e ".[ray]"``). One Ray instance serves every run.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import hogkit
from hogkit import BSP, SSP, Async, cluster, workloads
from hogkit.cluster.model import (exchange_messages, network_from_round_trips,
                                  predict_updates_per_s)
from hogkit.p3.comm import Network
from hogkit.engine.runtime import train

#: (label, policy, sync_every, backlog, push_fraction, model bound or "-" if the
#: model does not describe it[, {"servers": S, "schedule": spec}])
SETTINGS = [
    ("async sync=1", Async(), 1, None, 1.0, "-"),
    ("async sync=4", Async(), 4, None, 1.0, "-"),
    ("async sync=16", Async(), 16, None, 1.0, "-"),
    ("async sync=1 backlog=8", Async(), 1, 8, 1.0, None),
    ("async sync=64 backlog=128", Async(), 64, 128, 1.0, None),
    ("async sync=1024 backlog=2048", Async(), 1024, 2048, 1.0, None),
    ("async sync=4096 backlog=8192", Async(), 4096, 8192, 1.0, None),
    ("async sync=1024 backlog=2048 push=0.1", Async(), 1024, 2048, 0.1, None),
    ("ssp(4) sync=1", SSP(4), 1, None, 1.0, "-"),
    ("bsp sync=1", BSP(), 1, None, 1.0, 0),
    # the exchange cut into messages (hogkit.p3.propagation schedules), 2 shards
    ("bsp sync=1 servers=2", BSP(), 1, None, 1.0, 0, {"servers": 2}),
    ("bsp sync=1 servers=2 fifo", BSP(), 1, None, 1.0, 0,
     {"servers": 2, "schedule": "fifo"}),
    ("bsp sync=1 servers=2 p3:4096", BSP(), 1, None, 1.0, 0,
     {"servers": 2, "schedule": "p3:4096"}),
    ("async sync=1 servers=2", Async(), 1, None, 1.0, "-", {"servers": 2}),
    ("async sync=1 servers=2 p3:4096", Async(), 1, None, 1.0, "-",
     {"servers": 2, "schedule": "p3:4096"}),
]
NODES_SIMULATED = (2, 8, 32, 128)
QUICK = ("async sync=1", "async sync=1 backlog=8", "bsp sync=1 servers=2 p3:4096")


def _round_trips(ray, params, calls=40, burst=16):
    """Median exchange round trips with a real shard actor: empty, carrying every row
    of ``params`` each way, and a burst of ``burst`` empty exchanges in flight at once
    (the fixed cost of each message: what slicing multiplies)."""
    from hogkit.cluster.backend import ShardActor
    shard = ray.remote(num_cpus=0)(ShardActor).remote(0, params, 2)
    full = {k: (np.arange(v.shape[0]), np.zeros_like(v)) for k, v in params.items()}
    empty = {k: (np.arange(0), v[:0]) for k, v in params.items()}
    size = sum(a.nbytes + b.nbytes for a, b in full.values())
    out = {}
    try:
        for name, delta, n in (("empty", empty, 1), ("full", full, 1), ("burst", empty, burst)):
            times = []
            for _ in range(calls):
                t = time.perf_counter()
                ray.get([shard.exchange.remote(ShardActor.message(0, 0, 0, delta))
                         for _ in range(n)], timeout=30)
                times.append(time.perf_counter() - t)
            out[name] = statistics.median(times)
    finally:
        ray.kill(shard)
    return {"empty_s": out["empty"], "full_s": out["full"], "burst_s": out["burst"],
            "burst": burst, "bytes_each_way": size}


def _prep_s(params, rows=64, calls=200):
    """Median time the agent takes to prepare an exchange of ``params``
    (:func:`hogkit.cluster.agent.take_delta`: one pass over them), ``rows`` rows of
    each changed (on a copy: ``params`` is left as it is)."""
    from hogkit.cluster.agent import take_delta
    base = {k: v.copy() for k, v in params.items()}
    params = {k: v.copy() for k, v in params.items()}
    times = []
    for _ in range(calls):
        for v in params.values():
            v[:rows] += 1e-3
        t = time.perf_counter()
        take_delta(params, base)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(quick=False, rounds=None, seconds=None, workload="mf", only=None) -> dict:
    """``only``: the labels of :data:`SETTINGS` to run (default: all; three with
    ``quick``)."""
    from hogkit.cluster.backend import require_ray
    ray = require_ray()
    rounds = rounds or (1 if quick else 3)
    seconds = seconds or (1.5 if quick else 4.0)
    settings = ([x for x in SETTINGS if x[0] in QUICK] if quick else SETTINGS)
    if only is not None:
        settings = [x for x in SETTINGS if x[0] in only]
    wl = workloads.get(workload)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    result = {"scenario": "ray", "workload": workload, "rounds": rounds,
              "seconds_per_run": seconds, "quick": quick, "settings": {}}
    try:
        base = []
        for r in range(rounds):
            one = train(workload, workers=2,
                        outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                        policy=Async(), seconds=seconds, seed=r)
            base.append(one)
        base_rate = statistics.median(b.updates_per_s for b in base)
        one = [train(workload, workers=1,
                     outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                     policy=Async(), seconds=seconds, seed=r).updates_per_s
               for r in range(rounds)]
        step_s = 1.0 / statistics.median(one)
        params0, _ = wl.build(0)
        shapes = {k: v.shape for k, v in params0.items()}
        rt = _round_trips(ray, params0)
        net = network_from_round_trips(rt["empty_s"], rt["full_s"], rt["bytes_each_way"],
                                       burst_s=rt["burst_s"], burst=rt["burst"])
        prep_s = _prep_s(params0)
        result["calibration"] = {"one_worker_updates_per_s": one, "step_s": step_s,
                                 "prep_s": prep_s, "round_trips": rt, "network": {
                                     "bandwidth_bytes_per_s": net.bandwidth,
                                     "latency_s": net.latency,
                                     "overhead_s": net.overhead}}
        result["baseline"] = {"what": "1 node x 2 workers, Async, shared memory",
                              "updates_per_s": base_rate,
                              "all": [b.updates_per_s for b in base],
                              "final_loss": [b.final_loss for b in base]}
        for label, policy, sync, backlog, frac, bound, *more in settings:
            extra = more[0] if more else {}
            rows = []
            for r in range(rounds):
                c = cluster.train(workload, workers=1, policy=policy, seconds=seconds,
                                  seed=r, outputs=hogkit.Outputs(eval_every=None,
                                                                 keep_params=False),
                                  cluster=cluster.Cluster(2, sync_every=sync,
                                                          backlog=backlog,
                                                          push_fraction=frac, **extra))
                s = c.summary()
                # the single-node run with the same policy and the same updates
                ref = train(workload, workers=2,
                            outputs=hogkit.Outputs(eval_every=None, progress=False,
                                                   keep_params=False),
                            policy=policy, steps=c.updates, seed=r).final_loss
                rows.append({"updates_per_s": c.updates_per_s, "updates": c.updates,
                             "final_loss": c.final_loss, "baseline_loss_same_updates": ref,
                             "loss_ratio": c.final_loss / ref,
                             "bytes_per_update": s["cross_node"]["bytes_per_update"],
                             "bytes_each_way_per_exchange":
                                 s["cross_node"]["bytes"] / max(1, s["cross_node"]["exchanges"]) / 2,
                             "exchanges": s["cross_node"]["exchanges"],
                             "cross_gap_mean": s["cross_node"]["update_gap"]["mean"]})
            med = {k: statistics.median(x[k] for x in rows)
                   for k in ("updates_per_s", "loss_ratio", "bytes_per_update",
                             "exchanges", "cross_gap_mean", "bytes_each_way_per_exchange")}
            med["rate_ratio"] = med["updates_per_s"] / base_rate
            med["loss_ratio_range"] = [min(x["loss_ratio"] for x in rows),
                                       max(x["loss_ratio"] for x in rows)]
            if bound != "-":
                servers = extra.get("servers", 1)
                med["model_updates_per_s"] = predict_updates_per_s(
                    step_s, sync, med["bytes_each_way_per_exchange"], net, 2, bound=bound,
                    servers=servers, prep_s=prep_s,
                    messages=exchange_messages(shapes, servers, extra.get("schedule")))
                med["measured_over_model"] = med["updates_per_s"] / med["model_updates_per_s"]
            result["settings"][label] = {"sync_every": sync, "backlog": backlog,
                                         "push_fraction": frac, "policy": repr(policy),
                                         **extra,
                                         "model_bound": bound, "median": med,
                                         "rounds": rows}
        result["simulated"] = _extrapolate(result, step_s, net, rt["bytes_each_way"],
                                           prep_s, shapes)
    finally:
        if started:
            ray.shutdown()
    return result


def _extrapolate(result, step_s, net, full_bytes, prep_s, shapes):
    """Simulated (the communication model, not measured): updates/s at more nodes,
    for each modelled setting, on the localhost-calibrated network and on 10 and 1
    Gbit/s networks with 50 us latency and no per-message overhead, the parameters
    sharded over as many actors as nodes.
    An exchange's size grows with the nodes (a pull brings every node's changes since
    the last one): the measured 2-node size x N/2, at most the whole model."""
    out = {}
    nets = {"localhost (calibrated)": net, "10 Gbit/s, 50 us": Network.gbps(10, latency=50e-6),
            "1 Gbit/s, 50 us": Network.gbps(1, latency=50e-6)}
    for label, s in result["settings"].items():
        if s["model_bound"] == "-":
            continue
        m = s["median"]
        out[label] = {name: {str(n): predict_updates_per_s(
                                 step_s, s["sync_every"],
                                 min(full_bytes, m["bytes_each_way_per_exchange"] * n / 2),
                                 nw, n, servers=n, bound=s["model_bound"], prep_s=prep_s,
                                 messages=exchange_messages(shapes, n, s.get("schedule")))
                             for n in NODES_SIMULATED}
                      for name, nw in nets.items()}
    return out


#: the measured table's columns after the setting: headers, short headers, widths
_HEADERS = ("updates/s", "x shared memory", "loss vs 1 node, same updates",
            "bytes/update", "cross-node gap (mean)", "model", "measured/model")
_SHORT = ("updates/s", "x shm", "loss vs 1 node, same upd", "B/update", "gap", "model",
          "meas/model")
_WIDTHS = (11, 7, 28, 10, 9, 11, 11)


def _cells(m) -> list:
    """One setting's medians ``m`` as the measured table's cells (both formats)."""
    lo, hi = m["loss_ratio_range"]
    modelled = "model_updates_per_s" in m
    return [f"{m['updates_per_s']:,.0f}", f"{m['rate_ratio']:.3f}",
            f"{m['loss_ratio']:.3f} ({lo:.3f}–{hi:.3f})", f"{m['bytes_per_update']:,.0f}",
            f"{m['cross_gap_mean']:.1f}",
            f"{m['model_updates_per_s']:,.0f}" if modelled else "–",
            f"{m['measured_over_model']:.2f}" if modelled else "–"]


def format_table(result) -> str:
    b = result["baseline"]
    cal = result["calibration"]
    lines = [f"ray: {result['workload']}, 2 nodes x 1 worker vs 1 node x 2 workers "
             f"({b['updates_per_s']:,.0f} updates/s); median of {result['rounds']} x "
             f"{result['seconds_per_run']} s",
             f"calibration: step {cal['step_s'] * 1e6:.2f} us (1 worker), exchange round "
             f"trip {cal['round_trips']['empty_s'] * 1e3:.2f} ms empty, "
             f"{cal['round_trips']['full_s'] * 1e3:.2f} ms with "
             f"{cal['round_trips']['bytes_each_way'] / 1e6:.2f} MB each way"
             + (f", {cal['round_trips']['burst']} empty at once "
                f"{cal['round_trips']['burst_s'] * 1e3:.2f} ms (per-message overhead "
                f"{cal['network']['overhead_s'] * 1e6:.0f} us); exchange prepared in "
                f"{cal['prep_s'] * 1e6:.0f} us" if "burst_s" in cal["round_trips"] else ""),
             f"{'setting':<40}" + "".join(f"{h:>{w}}" for h, w in zip(_SHORT, _WIDTHS))]
    for label, s in result["settings"].items():
        lines.append(f"{label:<40}" + "".join(
            f"{c:>{w}}" for c, w in zip(_cells(s["median"]), _WIDTHS)))
    lines.append("SIMULATED (communication model), updates/s at N nodes x 1 worker:")
    for label, nets in result.get("simulated", {}).items():
        for name, by_n in nets.items():
            lines.append(f"  {label:<38}{name:<24}" + "".join(
                f"{'N=' + n:>6}{v:>12,.0f}" for n, v in by_n.items()))
    return "\n".join(lines)


def format_markdown(result) -> str:
    """The measured table and the simulated one as ``benchmarks/RESULTS.md`` shows
    them (a test checks that RESULTS.md holds exactly this for the committed JSON)."""
    cal, rt = result["calibration"], result["calibration"]["round_trips"]
    lines = [f"Shared memory: {result['baseline']['updates_per_s']:,.0f} updates/s. Step "
             f"{cal['step_s'] * 1e6:.2f} µs. Round trip {rt['empty_s'] * 1e3:.2f} ms empty, "
             f"{rt['full_s'] * 1e3:.2f} ms with the whole {rt['bytes_each_way'] / 1e6:.2f} MB "
             f"model each way, {rt['burst_s'] * 1e3:.2f} ms for {rt['burst']} empty ones at "
             f"once: {cal['network']['overhead_s'] * 1e6:.0f} µs a message. An exchange is "
             f"prepared in {cal['prep_s'] * 1e6:.0f} µs.",
             "",
             "| setting | " + " | ".join(_HEADERS) + " |",
             "|---|" + "---|" * len(_HEADERS)]
    for label, s in result["settings"].items():
        lines.append(f"| {label} | " + " | ".join(_cells(s["median"])) + " |")
    sim = result.get("simulated", {})
    if sim:
        nodes = list(next(iter(next(iter(sim.values())).values())))
        lines += ["", "| setting | network | " + " | ".join(f"{n} nodes" for n in nodes)
                  + " |", "|---|---|" + "---|" * len(nodes)]
        for label, nets in sim.items():
            for name, by_n in nets.items():
                lines.append(f"| {label} | {name} | "
                             + " | ".join(f"{by_n[n]:,.0f}" for n in nodes) + " |")
    return "\n".join(lines)
