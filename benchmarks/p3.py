"""Scenario ``p3``: prioritised sliced propagation (P3) against whole-layer FIFO, in the
communication model and on real processes.

**Simulated** (:func:`hogkit.p3.comm.simulate_comm`, deterministic): the reference profiles
built from their architectures (:func:`hogkit.p3.profiles.reference`: VGG-19 and
ResNet-50 at batch 32, a Sockeye-like RNN seq2seq at batch 64; compute times from
FLOPs at 5 TFLOP/s), 4 workers and 4 parameter-server shards, BSP, 40,000-parameter
slices, no latency, the four schedules (``fifo``, ``slicing``, ``priority``, ``p3``)
at each bandwidth of :data:`BANDWIDTHS_GBPS`. The gain of a schedule is FIFO's
iteration time over its own (1.25 = 25 % more iterations per second). ``gain.<model>``
is P3's gain at the reference bandwidth, :data:`REFERENCE_GBPS` (the paper's "≥ 10
Gbps" links); ``peak.<model>`` the largest gain over the sweep and where.

**Live** (:func:`hogkit.p3.live.run_live`): a trainer and a parameter server in two
processes, each sending on a link throttled to :data:`LIVE_BANDWIDTH` bytes/s, the
demonstration model (convolutions, then a 4096 → 2048 layer of 8.4 M parameters),
batch 32, each schedule run ``rounds`` times in rotating order (so each round sees
the same machine), plus unthrottled runs of ``fifo`` and ``p3``. Each trainer measures
its layer profile before its run; the prediction uses the per-layer medians over all
runs (one profile for every schedule) with the live link's bandwidth, 1 worker, 1
shard. ``calibrated`` predictions scale that profile's compute to the unthrottled live
iteration time of the same schedule: the emulated link's own host cost (socket copies,
Python threads sharing the trainer's interpreter) is then inside the compute, which is
what the plain prediction leaves out.
"""

from __future__ import annotations

import statistics
import time

GBPS = 1e9 / 8
BANDWIDTHS_GBPS = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 100)
REFERENCE_GBPS = 10
MODELS = ("vgg19", "resnet50", "sockeye")
SCHEDULES = ("fifo", "slicing", "priority", "p3")
LIVE_BANDWIDTH = 100e6
WORKERS = 4


def simulated(quick=False) -> dict:
    from hogkit.p3.comm import Network, gains
    from hogkit.p3.profiles import reference
    bws = (1, 5, 10, 100) if quick else BANDWIDTHS_GBPS
    out = {"workers": WORKERS, "servers": WORKERS, "bound": 0, "slice": 40_000,
           "bandwidths_gbps": list(bws), "profiles": {}, "sweep": {}}
    for name in MODELS:
        prof = reference(name)
        out["profiles"][name] = {"params": prof.params, "compute_s": prof.compute_s,
                                 "layers": len(prof.layers), "source": prof.source,
                                 "largest": max(prof.sizes), "batch": prof.batch}
        rows = []
        for g in bws:
            net = Network.gbps(g)
            row = {"gbps": g}
            res = gains(prof, net, schedules=SCHEDULES, workers=WORKERS,
                        iterations=6 if quick else 8)
            for s in SCHEDULES:
                r = res["results"][s]
                row[s] = {"iteration_s": r["iteration_s"], "layer0_wait_s": r["layer_wait_s"][0],
                          "link_busy": sum(r["link_busy"]) / len(r["link_busy"]),
                          "gain": res["gain"][s]}
            row["compute_s"] = prof.compute_s
            row["fifo_comm_bound"] = row["fifo"]["iteration_s"] > 1.01 * prof.compute_s
            rows.append(row)
        out["sweep"][name] = rows
    return out


def _median_profile(profiles):
    from hogkit.p3.profiles import Layer, Profile
    first = profiles[0]
    layers = []
    for i, ly in enumerate(first["layers"]):
        layers.append(Layer(ly["name"], ly["params"],
                            statistics.median(p["layers"][i]["forward_s"] for p in profiles),
                            statistics.median(p["layers"][i]["backward_s"] for p in profiles)))
    return Profile("p3-demo", tuple(layers), first["batch"],
                   f"measured, per-layer median over {len(profiles)} trainers")


def live(quick=False) -> dict:
    from hogkit.p3.comm import Network, simulate_comm
    from hogkit.p3.live import run_live
    rounds = 1 if quick else 3
    kw = dict(iterations=8 if quick else 16, warmup=2 if quick else 3,
              width=512 if quick else 2048, batch=8 if quick else 32)
    bw = LIVE_BANDWIDTH / 2 if quick else LIVE_BANDWIDTH
    runs = {s: [] for s in SCHEDULES}
    free = {s: [] for s in ("fifo", "p3")}
    for r in range(rounds):
        order = SCHEDULES[r % 4:] + SCHEDULES[:r % 4]
        for s in order:
            runs[s].append(run_live(s, bandwidth=bw, predict=False, **kw))
        for s in ("fifo", "p3"):
            free[s].append(run_live(s, bandwidth=1e12, predict=False, **kw))
    prof = _median_profile([x["profile"] for v in list(runs.values()) + list(free.values())
                            for x in v])
    out = {"bandwidth": bw, "rounds": rounds, **kw, "profile": prof.to_dict(),
           "schedules": {}}
    for s in SCHEDULES:
        live_it = [x["iteration_s"] for x in runs[s]]
        sim = simulate_comm(prof, s, Network(bw), workers=1, servers=1,
                            iterations=kw["iterations"], warmup=kw["warmup"] + 1)
        row = {"iteration_s": live_it, "median_iteration_s": statistics.median(live_it),
               "layer0_wait_s": [x["layer_wait_s"][0] for x in runs[s]],
               "trainer_cpu_s": [x["trainer_cpu_s"] for x in runs[s]],
               "server_cpu_s": [x["server_cpu_s"] for x in runs[s]],
               "server_agrees": all(x["server_agrees"] for x in runs[s]),
               "losses": [[x["losses"][0], x["losses"][-1]] for x in runs[s]],
               "messages_per_iteration": runs[s][0]["messages_per_iteration"],
               "predicted_iteration_s": sim.iteration_s,
               "predicted_layer0_wait_s": sim.layer_wait_s[0]}
        row["prediction_error"] = sim.iteration_s / row["median_iteration_s"] - 1.0
        if s in free:
            free_it = statistics.median(x["iteration_s"] for x in free[s])
            cal = simulate_comm(prof.scaled(free_it / prof.compute_s), s, Network(bw),
                                workers=1, servers=1, iterations=kw["iterations"],
                                warmup=kw["warmup"] + 1)
            row["unthrottled_iteration_s"] = [x["iteration_s"] for x in free[s]]
            row["calibrated_iteration_s"] = cal.iteration_s
            row["calibrated_error"] = cal.iteration_s / row["median_iteration_s"] - 1.0
        out["schedules"][s] = row
    out["live_gain_p3"] = (out["schedules"]["fifo"]["median_iteration_s"]
                           / out["schedules"]["p3"]["median_iteration_s"])
    out["predicted_gain_p3"] = (out["schedules"]["fifo"]["predicted_iteration_s"]
                                / out["schedules"]["p3"]["predicted_iteration_s"])
    return out


def run(quick=False) -> dict:
    t0 = time.perf_counter()
    sim = simulated(quick)
    gain, peak, at_ref = {}, {}, {}
    for name, rows in sim["sweep"].items():
        row = next((r for r in rows if r["gbps"] == REFERENCE_GBPS), None)
        gain[name] = row["p3"]["gain"] if row else None
        at_ref[name] = {s: row[s]["gain"] for s in SCHEDULES} if row else None
        best = max(rows, key=lambda r: r["p3"]["gain"])
        peak[name] = {"gain": best["p3"]["gain"], "gbps": best["gbps"],
                      **{s: best[s]["gain"] for s in SCHEDULES}}
    lv = live(quick)
    return {"scenario": "p3", "quick": quick, "reference_gbps": REFERENCE_GBPS,
            "gain": gain, "gain_by_schedule": at_ref, "peak": peak,
            "simulated": sim, "live": lv,
            "ratios": {"live_p3_over_fifo": lv["live_gain_p3"],
                       "predicted_p3_over_fifo": lv["predicted_gain_p3"],
                       **{f"sim_{k}_p3_over_fifo": v for k, v in gain.items()
                          if v is not None}},
            "wall_s": time.perf_counter() - t0}


def format_table(result) -> str:
    sim = result["simulated"]
    lines = [f"simulated: {sim['workers']} workers, {sim['servers']} shards, BSP, slices of "
             f"{sim['slice']:,}; gain = FIFO iteration / schedule iteration"]
    for name, rows in sim["sweep"].items():
        p = sim["profiles"][name]
        lines.append(f"  {name}: {p['params'] / 1e6:.1f} M parameters, compute "
                     f"{p['compute_s'] * 1e3:.0f} ms/iteration")
        lines.append(f"    {'Gbit/s':>7}{'fifo ms':>10}" + "".join(f"{s:>10}" for s in SCHEDULES[1:]))
        for r in rows:
            lines.append(f"    {r['gbps']:>7g}{r['fifo']['iteration_s'] * 1e3:>10.0f}"
                         + "".join(f"{r[s]['gain']:>10.3f}" for s in SCHEDULES[1:]))
    lv = result["live"]
    lines.append(f"live: trainer + server, {lv['bandwidth'] / 1e6:g} MB/s links, "
                 f"{lv['rounds']} rounds, medians")
    lines.append(f"    {'schedule':<10}{'live ms':>9}{'predicted':>11}{'error':>8}"
                 f"{'calibrated':>12}")
    for s, row in lv["schedules"].items():
        cal = row.get("calibrated_iteration_s")
        lines.append(f"    {s:<10}{row['median_iteration_s'] * 1e3:>9.0f}"
                     f"{row['predicted_iteration_s'] * 1e3:>11.0f}"
                     f"{row['prediction_error'] * 100:>7.0f}%"
                     + (f"{cal * 1e3:>9.0f} ({row['calibrated_error'] * 100:+.0f}%)"
                        if cal is not None else ""))
    lines.append("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in result["ratios"].items()))
    return "\n".join(lines)


def draw_gains(axes, result) -> None:
    """One panel per model: simulated gain over FIFO against bandwidth, one line per
    schedule (the reference bandwidth dashed). Shared with ``experiments/p3.py``."""
    sim = result["simulated"]
    for ax, name in zip(axes, sim["sweep"]):
        rows = sim["sweep"][name]
        g = [r["gbps"] for r in rows]
        for s in SCHEDULES[1:]:
            ax.plot(g, [r[s]["gain"] for r in rows], marker="o", ms=3, label=s)
        ax.axhline(1.0, color="grey", lw=1, ls=":")
        ax.axvline(result["reference_gbps"], color="grey", lw=1, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel(f"link bandwidth (Gbit/s), {sim['workers']} workers, BSP")
        ax.set_ylabel("throughput gain over FIFO (simulated)")
        ax.set_title(f"{name} ({sim['profiles'][name]['params'] / 1e6:.0f} M params)")
        ax.legend(fontsize=8)


def plot(result, path):
    """Simulated gain against bandwidth, one panel per model, one line per schedule."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(result["simulated"]["sweep"])
    fig, axes = plt.subplots(1, n, figsize=(5 * n, 4), sharey=True)
    draw_gains(axes, result)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
