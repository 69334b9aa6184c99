"""The supervised runtime on real processes: convergence, staleness, results, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hogkit
from hogkit import InvalidArgument, InvalidType, train
from hogkit.engine.delays import Slowdown
from hogkit.state.store import ParamStore

HOT = {"preset": "hot"}

pytestmark = pytest.mark.process


def test_two_workers_converge_and_measure_staleness(tmp_path):
    run = train(hogkit.workload("mf", **HOT), workers=2,
                outputs=hogkit.Outputs(tmp_path, progress=False, events="all"), steps=6000,
                seed=1)
    assert run.updates == 6000
    assert [w["iterations"] for w in run.per_worker] == [3000, 3000]
    assert run.final_loss < 0.5 * run.initial_loss
    gap = run.staleness["update_gap"]
    assert gap["count"] == run.updates
    assert sum(gap["histogram"].values()) == gap["count"]
    assert all(np.isfinite(v).all() for v in run.params.values())

    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("config", "workers", "updates", "updates_per_s", "final_loss", "staleness"):
        assert key in summary
    for kind in ("update_gap", "clock_lag"):
        assert {"mean", "p50", "p99", "max", "histogram"} <= set(summary["staleness"][kind])
    assert set(summary["staleness"]) == {"update_gap", "clock_lag"}    # as Run.staleness
    assert summary["staleness"] == json.loads(json.dumps(run.staleness))

    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records[0]["type"] == "start" and records[-1]["type"] == "end"
    updates = [r for r in records if r["type"] == "update"]
    # the event stream is every update, or every k-th on the compiled engine (so that
    # millions of updates a second keep a bounded log); the histograms count them all
    assert summary["engine"] == "compiled" and summary["events_stride"] >= 1
    assert len(updates) + summary["events_dropped"] == summary["events_recorded"]
    assert run.updates / summary["events_stride"] <= summary["events_recorded"] <= run.updates
    for w in range(2):
        steps = sorted(r["step"] for r in updates if r["rank"] == w)
        assert steps == sorted(set(steps)) and all(0 <= k < 3000 for k in steps)

    arrays, meta = ParamStore.read_file(tmp_path / "checkpoint.npz")
    assert meta["consistency"] == "quiesced" and meta["updates"] == run.updates
    for name, value in arrays.items():
        np.testing.assert_array_equal(value, run.params[name])


def test_the_default_event_file_is_bounded_and_says_what_it_holds(tmp_path):
    """A few seconds of millions of updates: events.jsonl keeps at most 400 update
    events a second (plus one per drain's first second), the histograms count every
    update, and the summary says what the file holds."""
    from hogkit.engine.plan import EVENTS_FILE_PER_S
    run = train(hogkit.workload("mf", **HOT), workers=2,
                outputs=hogkit.Outputs(tmp_path / "s", progress=False), seconds=3.0)
    ev = run.summary()["events"]
    lines = (tmp_path / "s" / "events.jsonl").read_text().splitlines()
    updates = [ln for ln in lines if '"type":"update"' in ln]
    assert ev["mode"] == "sampled" and ev["updates_in_file"] == len(updates)
    assert len(updates) <= EVENTS_FILE_PER_S * (run.wall_s + 2.0)
    assert ev["updates_drained"] > len(updates)
    assert run.staleness["update_gap"]["count"] == run.updates
    assert ev["file_bytes"] == (tmp_path / "s" / "events.jsonl").stat().st_size < 1_000_000
    none = train(hogkit.workload("mf", **HOT), workers=2,
                 outputs=hogkit.Outputs(tmp_path / "n", progress=False, events="none"),
                 steps=2000)
    kinds = {json.loads(ln)["type"] for ln in
             (tmp_path / "n" / "events.jsonl").read_text().splitlines()}
    assert "update" not in kinds and {"start", "end"} <= kinds
    assert none.summary()["events"]["updates_in_file"] == 0
    with pytest.raises(InvalidArgument, match="events"):
        train("mf", workers=2, outputs=hogkit.Outputs(events="some"), steps=100)


def test_one_worker_has_zero_staleness():
    run = train(hogkit.workload("mf", **HOT), workers=1,
                outputs=hogkit.Outputs(progress=False, eval_every=None), steps=500)
    assert run.staleness["update_gap"]["max"] == 0
    assert run.staleness["clock_lag"]["max"] == 0


@pytest.mark.timeout(120)               # liveness: no step budget, only the seconds
def test_seconds_budget_stops_the_run():
    run = train("logreg", workers=2,
                outputs=hogkit.Outputs(progress=False, eval_every=None), seconds=1.0)
    assert run.updates > 0 and run.config["seconds"] == 1.0
    assert run.wall_s >= 1.0 * 0.9                        # it trained for its budget


def test_straggler_is_slowed_by_its_factor():
    """The straggler's pacer adds (factor - 1) x its compute time as pauses (sleep only
    overshoots), and the summary says what it realised; the other worker is not paced.
    Behaviour, not a comparison of the two workers' speeds."""
    run = train(hogkit.workload("mf", **HOT),
                workers=hogkit.Workers(2, stragglers={1: Slowdown(4.0)}),
                outputs=hogkit.Outputs(progress=False, eval_every=None), seconds=1.0)
    fast, slow = run.per_worker
    assert "slowdown_realised" not in fast
    assert slow["slowdown_realised"] >= 4.0 * 0.95


@pytest.mark.parametrize("kwargs, error", [
    ({"workers": 0}, InvalidArgument),
    ({"workers": 2.5}, InvalidType),
    ({"steps": 1}, InvalidArgument),
    ({"engine": "gpu"}, InvalidArgument),
    ({"workers": lambda: hogkit.Workers(2, stragglers={5: Slowdown(2.0)})}, InvalidArgument),
    ({"seconds": -1.0}, InvalidArgument),
    ({"policy": "ssp:2"}, InvalidType),
    ({"rule": 0.1}, InvalidType),
    ({"workers": lambda: hogkit.Workers(2, stragglers={1: 3.0})}, InvalidType),
    ({"workers": lambda: hogkit.Workers(2, wait_timeout=0)}, InvalidArgument),
    ({"engine": lambda: hogkit.Engine(nonfinite="ignore")}, InvalidArgument),
    ({"outputs": lambda: hogkit.Outputs(events="some")}, InvalidArgument),
    ({"workers": lambda: hogkit.Workers(2, delays="constant:1")}, InvalidArgument),
])
def test_bad_settings_fail_before_spawning(kwargs, error):
    """Bad knobs, given flat or in a settings object (checked where it is built), are
    refused before anything is spawned."""
    settings = {"workers": 2, "steps": 100, "outputs": hogkit.Outputs(progress=False)}
    with pytest.raises(error):
        settings.update({k: v() if callable(v) else v for k, v in kwargs.items()})
        train(hogkit.workload("mf", **HOT), **settings)


def test_unknown_workload_names_the_choices():
    with pytest.raises(InvalidArgument, match="mf"):
        train("resnet", workers=1, steps=10)


def test_per_shard_staleness_counts_only_conflicting_updates():
    """Each worker writes only its own half of the rows; with shards=2 no update ever
    touches a shard another worker wrote, so every per-shard gap is exactly 0."""
    from helpers.faulty import Partitioned
    from hogkit import workloads
    wl = Partitioned(workloads.get("mf", preset="default"), parts=2)
    run = train(wl, workers=2, engine=hogkit.Engine(shards=2),
                outputs=hogkit.Outputs(progress=False, eval_every=None), steps=4000,
                batch=8)
    gap = run.staleness["update_gap"]
    assert gap["count"] == run.updates == 4000
    assert gap["max"] == 0
    assert run.summary()["config"]["shards"] == 2


def test_held_back_steps_are_not_updates():
    """Temporal density (every 4th step sends) writes nothing on the other steps:
    they are iterations, not updates, and nobody's staleness counts them."""
    from hogkit import Density
    run = train(hogkit.workload("mf", **HOT), workers=2,
                outputs=hogkit.Outputs(progress=False, eval_every=None), steps=800,
                density=Density(1.0, every=4))
    assert [w["iterations"] for w in run.per_worker] == [400, 400]
    assert [w["updates"] for w in run.per_worker] == [100, 100]
    assert run.staleness["update_gap"]["count"] == 200
    assert all(0.0 <= w["wait_fraction"] <= 1.0 for w in run.per_worker)


def test_adaptive_batch_with_empty_shares_is_refused():
    from hogkit.rules.batching import AdaptiveBatch
    with pytest.raises(InvalidArgument, match="min_batch"):
        train("mlp", workers=2, outputs=hogkit.Outputs(progress=False), steps=10,
              batch=AdaptiveBatch(64, min_batch=0))


@pytest.mark.parametrize("name, engine", [("mf", "compiled"), ("mf", "python"),
                                          ("logreg", "reader"), ("mlp", "python")])
def test_warm_runs_the_engines_step_without_touching_what_it_is_given(name, engine):
    """Workers call ``warm`` on the shared parameters before the start barrier (to
    load the kernels): it must leave them, and the data, exactly as they were."""
    from hogkit import workloads
    from hogkit.rules.density import Density
    from hogkit.rules.core import GapAware
    from hogkit.engine.worker_loop import warm
    wl = workloads.get(name, **({"preset": "hot"} if name == "mf" else {}))
    params, data = wl.build(0)
    before = ({k: v.copy() for k, v in params.items()}, {k: v.copy() for k, v in data.items()})
    warm(wl, GapAware(0.05), Density(0.5), params, data, 0, 8, engine)
    for now, was in zip((params, data), before):
        for k in was:
            np.testing.assert_array_equal(now[k], was[k])


def test_warm_compiles_the_loop_the_workers_run_with_the_types_they_pass():
    """A cold first run compiled the core twice (~25 s of ~60): the parent warmed the
    minibatch loop while the workers ran the per-sample lane's own loop, and a rule
    unpickled in a worker once carried a different numba type from the parent's. The
    parent must compile exactly what a worker calls."""
    import pickle
    import numba
    from hogkit import workloads
    from hogkit.engine.worker_loop import warm
    from hogkit.kernels import step as ks
    from hogkit.rules.core import AdaGrad
    rule = AdaGrad(0.2, rowwise=True)
    cfg = rule.cfg()
    shipped = pickle.loads(pickle.dumps(rule)).cfg()   # what a spawned worker holds
    assert numba.typeof(shipped) == numba.typeof(cfg)
    wl = workloads.get("mf", preset="hot")
    params, data = wl.build(0)
    before = set(ks.run_lane_steps.overloads)
    warm(wl, rule, None, params, data, 0, 256, "compiled", lane="sample")
    assert ks.run_lane_steps.overloads, "the per-sample lane's own loop was not warmed"
    assert len(set(ks.run_lane_steps.overloads) - before) <= 1
