"""Every `hogkit bench` scenario imports and has the scenario interface (timing itself
is measured in benchmarks/, never asserted in tests)."""

from __future__ import annotations

import importlib

import pytest

from hogkit.cli import BENCH_SCENARIOS


@pytest.mark.parametrize("name", BENCH_SCENARIOS)
def test_scenario_has_run_and_format_table(name):
    mod = importlib.import_module(f"hogkit.benchmarks.{name}")
    assert callable(mod.run) and callable(mod.format_table)
    assert mod.__doc__


@pytest.mark.slow
@pytest.mark.process
def test_own_loop_quick_runs_both_sides_and_both_train():
    """``hogkit bench own_loop --quick``: torch's recipe and hogkit.spawn took turns
    running the loop with 2 and 1 processes, every worker timed itself, and both sides
    trained (no assertion on speed)."""
    from hogkit.benchmarks import own_loop
    r = own_loop.run(quick=True)
    assert r["scenario"] == "own_loop" and r["quick"] and r["rounds"] >= 1
    assert r["sizes"] and set(r["ratios"]) == {f"{n}_{p}proc_hogkit_over_torch"
                                                for n in r["sizes"] for p in (1, 2)}
    assert own_loop.plan(2) == ["hogkit", "torch", "torch", "hogkit"]
    for s in r["sizes"].values():
        init, steps = s["initial_loss"], s["steps_per_segment"]
        assert set(s["processes"]) == {"1", "2"}
        for p, f in s["processes"].items():
            nprocs = int(p)
            assert len(f["rounds"]) == r["rounds"] and f["ratio"] > 0
            for g in f["rounds"]:
                assert sorted(g["order"]) == ["hogkit", "torch"]
                assert g["ratio"] == pytest.approx(g["hogkit"]["steps_per_s"]
                                                   / g["torch"]["steps_per_s"])
                for side in ("hogkit", "torch"):
                    x = g[side]
                    assert len(x["per_worker_steps_per_s"]) == nprocs
                    assert all(v > 0 for v in x["per_worker_steps_per_s"])
                    assert x["steps_per_s"] == pytest.approx(
                        sum(x["per_worker_steps_per_s"]))
            for side in ("hogkit", "torch"):
                assert f["final_loss"][side] < init          # it trained
            # hogkit recorded every step's staleness
            assert f["hogkit_run"]["updates"] == steps * nprocs * r["rounds"]
            assert f["hogkit_run"]["update_gap_mean"] is not None
        c = s["step_cost"]
        for side in ("hogkit", "torch", "train"):
            assert c[f"{side}_iteration_us"] > 0
            assert c[f"{side}_final_loss"] < init
            # every part of the profile was timed, and together they are the iteration
            parts = c["parts_us"][side]
            assert list(parts) == list(own_loop.PARTS[side]) + ["iteration"]
            assert all(v > 0 for v in parts.values())
            assert sum(parts.values()) - parts["iteration"] == pytest.approx(
                parts["iteration"], rel=0.5)
        assert c["train_whole_iteration_us"] > 0
        assert c["overhead_us"] == pytest.approx(c["hogkit_step_us"] - c["torch_step_us"])
    assert "own loop" in own_loop.format_table(r)


def test_p3_table_and_plot_from_the_committed_figures(tmp_path):
    """``hogkit bench p3``'s table and plot render from its committed JSON, and the
    JSON has the keys the issue asks for (gain per model at the reference bandwidth,
    and the full sweep)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import p3
    pytest.importorskip("matplotlib")
    r = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "p3.json")
                   .read_text())
    assert set(r["gain"]) == {"vgg19", "resnet50", "sockeye"}
    for name, rows in r["simulated"]["sweep"].items():
        assert [x["gbps"] for x in rows] == list(p3.BANDWIDTHS_GBPS)
        ref = next(x for x in rows if x["gbps"] == r["reference_gbps"])
        assert r["gain"][name] == ref["p3"]["gain"]
    text = p3.format_table(r)
    assert "vgg19" in text and "live:" in text
    assert Path(p3.plot(r, str(tmp_path / "p3.png"))).stat().st_size > 0


def test_soak_verdict_flags_growth_and_unanswered_kills():
    """The soak's verdict on planted data: flat memory passes; memory that keeps
    growing from one run of a policy and rule to the next fails, and so does a kill
    without a restart or a segment left behind."""
    from hogkit.benchmarks import soak

    def samples(growth):
        out = []
        for i in range(6):                       # six runs of 10 s, two combinations
            for k in range(5):
                out.append({"t": i * 10 + k * 2 + 0.5, "workers": 8,
                            "parent_rss_mb": 200 * growth ** i, "worker_rss_mb": [50] * 8,
                            "parent_fds": 30})
        return out
    runs = [{"segment": i, "combo": i % 2, "t": i * 10, "t_end": i * 10 + 10, "ok": True,
             "restarts": 1} for i in range(6)]
    kills = [{"t": i * 10 + 5} for i in range(6)]
    good = soak.verdict(runs, kills, samples(1.0), 0)
    assert good["pass"] and good["parent_memory_flat"] is True
    leak = soak.verdict(runs, kills, samples(1.05), 0)
    assert not leak["pass"] and leak["parent_memory_flat"] is False
    assert leak["worker_memory_flat"] is True
    assert not soak.verdict(runs, kills + [{"t": 59}], samples(1.0), 0)["pass"]
    assert not soak.verdict(runs, kills, samples(1.0), 3)["pass"]


# peers --quick: every contender (LIBMF when it can be built) at one lr on small data
QUICK = ["kernels", "lane", "scaling", "dense", "instrumentation", "policies", "simulate",
         "rules", "peers", "explore", "rowvec"]


@pytest.mark.slow
@pytest.mark.parametrize("name", QUICK)
def test_every_scenario_runs_in_quick_mode(name, tmp_path):
    """``hogkit bench NAME --quick`` end to end (own_loop, p3 and soak have their own
    tests): a JSON-able result with its ratios, each a
    finite number measured in the same run (an overhead may come out negative on a
    noisy machine), and a table. Speed itself is never asserted."""
    import json
    import math
    mod = importlib.import_module(f"hogkit.benchmarks.{name}")
    r = mod.run(quick=True)
    assert r["ratios"], r
    for key, value in r["ratios"].items():
        assert isinstance(value, (int, float)) and math.isfinite(value), key
    json.dumps(r, default=float)
    assert mod.format_table(r)


@pytest.mark.parametrize("name", ["ray.json", "ray_mlp.json"])
def test_ray_tables_in_results_are_rendered_from_the_committed_figures(name):
    """Every Ray figure in RESULTS.md comes from the committed JSON through
    ``format_markdown`` (no hand-typed number)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import ray as bench
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / name).read_text())
    assert bench.format_markdown(r) in (root / "RESULTS.md").read_text()


def test_lane_tables_in_results_are_rendered_from_the_committed_figures():
    """The per-sample lane's mf tables in RESULTS.md are ``peers.format_markdown`` of
    the committed ``peers_lanes.json`` (no hand-typed number)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_lanes.json").read_text())
    assert peers.format_markdown(r) in (root / "RESULTS.md").read_text()


def test_mf_lane_defaults_are_the_benchmarks_fastest():
    """What ``train("mf")`` takes on the per-sample lane is what ``bench peers`` measured
    fastest to the target (benchmarks/peers_defaults.json, both presets, 2 workers as
    ``hogkit run``): the defaults' row ran at ``default_rule_lr`` and reached the target
    well before hogkit's SGD rows on either lane (LIBMF is not held here: RESULTS.md
    says where it is ahead)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    from hogkit.workloads.mf import MatrixFactorization as MF
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_defaults.json").read_text())
    assert peers.format_markdown(r) in (root / "RESULTS.md").read_text()
    assert r["mf"].keys() == {"default", "large"}
    for preset, m in r["mf"].items():
        c = m["contenders"]
        mine = c["hogkit_default_2"]
        assert mine["lr"] == MF.default_rule_lr, preset
        assert "AdaGrad row-wise" in mine["label"] and "block order" in mine["label"]
        t = mine["time_to_target"]
        assert t is not None, preset
        for other in ("hogkit_sample_2", "hogkit_compiled_2"):
            theirs = c[other]["time_to_target"]
            assert theirs is None or theirs > 1.5 * t, (preset, other)


def test_lane_kernel_table_in_results_is_rendered_from_the_committed_figures():
    import json
    from pathlib import Path

    from hogkit.benchmarks import lane
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "lane.json").read_text())
    assert lane.format_markdown(r) in (root / "RESULTS.md").read_text()


def test_own_loop_tables_in_results_are_rendered_from_the_committed_figures():
    import json
    from pathlib import Path

    from hogkit.benchmarks import own_loop
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "own_loop.json").read_text())
    assert own_loop.format_markdown(r) in (root / "RESULTS.md").read_text()
    old = json.loads((root / "own_loop_before_issue31.json").read_text())
    text = (root / "RESULTS.md").read_text()
    for size in ("small", "medium"):
        assert (f"{old['sizes'][size]['processes']['1']['ratio']:.3f} / "
                f"{old['sizes'][size]['processes']['2']['ratio']:.3f} {size}") in text


def test_user_recipe_tables_in_results_are_rendered_from_the_committed_figures():
    """Issue 31's section: the tables are ``peers.format_markdown`` of the committed
    JSON, and what its text says of the rounds holds there (hogkit ahead of the
    private-data recipe in every round; the same loss after the same steps)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_mlp_user_recipe.json").read_text())
    assert peers.format_markdown(r) in (root / "RESULTS.md").read_text()
    for got in r["mlp"]["rates"].values():
        assert len(got["rounds"]) == 6
        assert all(x["ratio_private"] > 1.0 for x in got["rounds"])
        losses = [x[k]["loss"] for x in got["rounds"]
                  for k in ("hogkit", "torch_private", "torch_shared")]
        assert 0.00135 <= min(losses) and max(losses) < 0.00155
    hits = {c["curve"][-1]["epochs"] for c in r["mlp"]["contenders"].values()}
    assert hits == {4}                     # everyone at the same point of the grid


def test_the_readmes_torch_figures_come_from_the_committed_json():
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    text = " ".join((root / "README.md").read_text().split())
    r = json.loads((root / "benchmarks" / "peers_mlp_user_recipe.json").read_text())
    one, two = (r["mlp"]["rates"][w]["median"]["ratio_private"] for w in ("1", "2"))
    assert (f"`hogkit.train` runs {one:.2f}× the steps/s of torch's own `share_memory()` "
            f"Hogwild! recipe as its users write it with 1 process and {two:.2f}× with 2"
            ) in text
    o = json.loads((root / "benchmarks" / "own_loop.json").read_text())["sizes"]

    def pair(size):
        return " / ".join(f"{o[size]['processes'][p]['ratio']:.2f}×" for p in ("1", "2"))
    assert f"{pair('small')} (64 hidden, 1 / 2 processes) and {pair('medium')}" in text


def test_inlined_lane_figures_in_results_come_from_the_committed_json():
    """Issue 25's inlined-lane section: its tables are the committed JSON's, and the
    figures its text compares with the run before come from both JSONs."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    new = json.loads((root / "peers_defaults_inlined.json").read_text())
    old = json.loads((root / "peers_defaults.json").read_text())
    text = _results_words()
    assert peers.format_markdown(new) in (root / "RESULTS.md").read_text()
    a, b = (r["mf"]["default"]["contenders"] for r in (new, old))
    rate = a["hogkit_sample_1"]["samples_per_s"] / b["hogkit_sample_1"]["samples_per_s"]
    assert (f"now runs at {a['hogkit_sample_1']['samples_per_s'] / 1e6:.1f} M ratings/s, "
            f"{rate:.2f}x the {b['hogkit_sample_1']['samples_per_s'] / 1e6:.1f} M") in text
    assert (f"whose plain loop ran at {b['plain']['samples_per_s'] / 1e6:.1f} M/s "
            f"({a['plain']['samples_per_s'] / 1e6:.1f} M/s in this run): the ratio is "
            f"{new['ratios']['mf_default_sample1_over_plain']:.2f} "
            f"({old['ratios']['mf_default_sample1_over_plain']:.2f} then)") in text
    t2 = a["hogkit_default_2"]["time_to_target"]
    assert (f"reach the target in {t2:.3f} s, "
            f"{t2 / a['libmf_2']['time_to_target']:.2f}x LIBMF's two threads' time and "
            f"{new['ratios']['mf_default_plain_time_over_default2_time']:.2f}x sooner") in text


def test_rate_rounds_figures_in_results_and_readme_come_from_the_committed_json():
    """Issue 25's rate-rounds section and the README quote benchmarks/peers_rounds.json:
    the tables are its rendering, and each bar's figure in the text is its value."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_rounds.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert peers.format_markdown(r) in results
    text = " ".join(results.split())
    rr, d = r["ratios"], r["mf"]["default"]
    lo, hi = d["rates"]["ratio_range"]
    assert (f"large preset **{rr['mf_large_rounds_sample1_over_plain']:.2f}** in the rounds "
            f"(met); default preset **{rr['mf_default_rounds_sample1_over_plain']:.2f}** "
            f"(rounds {lo:.2f}–{hi:.2f}), not met") in text
    assert rr["mf_default_rounds_sample1_over_plain"] < 0.9 <= rr["mf_large_rounds_sample1_over_plain"]
    assert f"and this run {rr['mf_default_sample1_over_plain']:.2f}" in text
    cd, cl = d["contenders"], r["mf"]["large"]["contenders"]
    t2d, t2l = cd["hogkit_default_2"]["time_to_target"], cl["hogkit_default_2"]["time_to_target"]
    assert (f"the defaults reach it in {t2d:.3f} s, "
            f"{t2d / cd['libmf_2']['time_to_target']:.2f}x LIBMF's, and in {t2l:.3f} s on "
            f"the large preset, {t2l / cl['libmf_2']['time_to_target']:.2f}x") in text
    assert t2d < cd["plain"]["time_to_target"] and cl["plain"]["time_to_target"] is None
    assert f"the defaults {rr['mf_large_default2_over_default1']:.2f} (met)" in text



def test_torch_lane_figures_in_results_come_from_the_committed_json():
    """The torch-lane section of RESULTS.md quotes benchmarks/peers_mlp_torch_lane.json
    (every rate, time and ratio it shows)."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_mlp_torch_lane.json").read_text())
    text = (root / "RESULTS.md").read_text()
    for v in r["mlp"]["contenders"].values():
        assert (f"| {v['label']} | {v['lr']} | {v['samples_per_s'] / 1e3:.1f} | "
                f"{v['time_to_target']:.3f} s |") in text
    for key in ("mlp_hogkit1_over_torch1_rate", "mlp_hogkit2_over_torch2_rate"):
        assert f"{r['ratios'][key]:.2f}x" in text


def test_simulator_speed_section_comes_from_the_committed_json():
    """Issue 26's simulator section: its table renders the two committed JSONs, and the
    bar's figures in the text are theirs."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import simulate
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "simulate_issue26.json").read_text())
    o = json.loads((root / "simulate_issue26_before.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert simulate.format_markdown(r, o) in results
    now, then = r["ssp"]["evals"]["updates_per_s"], o["ssp"]["evals"]["updates_per_s"]
    text = " ".join(results.split())
    assert (f"{now:,.0f} with the default evaluation points ({now / then:.2f}x before), "
            f"{r['ssp']['no_evals']['updates_per_s']:,.0f} without") in text
    assert now < 300_000 <= r["ssp"]["no_evals"]["updates_per_s"]    # "at the line"


def test_the_commands_own_simulator_figure_comes_from_the_committed_json():
    """The section on ``hogkit sim``'s own engine figure renders its two committed
    JSONs, and the bar's figures in its text are theirs."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import simulate
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "simulate_cli.json").read_text())
    o = json.loads((root / "simulate_cli_before.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert simulate.format_markdown(r, o) in results
    now, then = r["cli"]["median"], o["cli"]["median"]
    assert "engine_setup_s" in now and "engine_setup_s" not in then
    text = " ".join(results.split())
    assert (f"the command, second run): **{now['engine_updates_per_s']:,.0f}** with its "
            f"default evaluation points ({then['engine_updates_per_s']:,.0f} before)") in text
    assert now["engine_updates_per_s"] < 300_000             # "not reached" in the text


def test_the_stacks_sections_pairs_come_from_the_committed_json():
    """Both before/after pairs of the per-worker stacks section render from their
    committed JSONs, and the text's figures are theirs."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import simulate
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    results = (root / "RESULTS.md").read_text()
    text = " ".join(results.split())
    for i in (1, 2):
        r = json.loads((root / f"simulate_stacks_{i}.json").read_text())
        o = json.loads((root / f"simulate_stacks_before_{i}.json").read_text())
        assert simulate.format_markdown(r, o) in results
        b4 = (r["by_batch"]["4"]["fused_updates_per_s"]
              / o["by_batch"]["4"]["fused_updates_per_s"])
        assert f"{b4:.2f}x" in text and b4 > 1
        cli = (f"{r['cli']['median']['engine_updates_per_s']:,.0f} against "
               f"{o['cli']['median']['engine_updates_per_s']:,.0f}")
        assert cli in text
        assert f"{r['ssp']['no_evals']['updates_per_s']:,.0f}" in text
        assert r["ssp"]["no_evals"]["updates_per_s"] >= 300_000   # "over it in both"


def test_rules_section_comes_from_the_committed_json():
    """Issue 26's live-rules section: its table renders the two committed JSONs, and
    each ratio its text quotes is theirs."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "rules.json").read_text())
    o = json.loads((root / "rules_before.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert rules.format_markdown(r, o) in results
    text = " ".join(results.split())
    now = {n: r["by_workload"][n]["over_sgd"] for n in ("mf", "logreg")}
    then = {n: o["by_workload"][n]["over_sgd"] for n in ("mf", "logreg")}
    assert (f"logreg Gap-Aware {now['logreg']['gap_aware']:.2f}x and adaptive DC-ASGD "
            f"{now['logreg']['dc_adaptive']:.2f}x ({then['logreg']['gap_aware']:.2f} and "
            f"{then['logreg']['dc_adaptive']:.2f} before); mf {now['mf']['gap_aware']:.2f}x "
            f"and {now['mf']['dc_adaptive']:.2f}x ({then['mf']['gap_aware']:.2f} and "
            f"{then['mf']['dc_adaptive']:.2f} before)") in text
    assert max(now[n][k] for n in now for k in ("gap_aware", "dc_adaptive")) < 0.7  # not met


def test_final_engine_peer_rerun_is_quoted_from_its_json():
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_rounds_final.json").read_text())
    d = r["mf"]["default"]
    c, rr = d["contenders"], r["ratios"]
    lo, hi = d["rates"]["ratio_range"]
    t2 = c["hogkit_default_2"]["time_to_target"]
    text = _results_words()
    assert (f"**{rr['mf_default_rounds_sample1_over_plain']:.2f}** (rounds {lo:.2f}–{hi:.2f}); "
            f"the defaults with 2 workers reach MSE 0.012 in {t2:.3f} s, "
            f"{t2 / c['libmf_2']['time_to_target']:.2f}x LIBMF's two threads' time, and the "
            f"plain loop's time over theirs is "
            f"{rr['mf_default_plain_time_over_default2_time']:.2f}") in text


def test_coldstart_section_and_readme_come_from_the_committed_json():
    """Issue 28's cold start figures: the RESULTS table renders the two committed JSONs
    and the README quotes the after run's cold, compile and warm medians."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import coldstart
    root = Path(__file__).resolve().parent.parent
    r = json.loads((root / "benchmarks" / "coldstart.json").read_text())
    o = json.loads((root / "benchmarks" / "coldstart_before.json").read_text())
    assert coldstart.format_markdown(r, o) in (root / "benchmarks" / "RESULTS.md").read_text()
    readme = " ".join((root / "README.md").read_text().split())
    q = r["ratios"]
    assert (f"a first `hogkit run --seconds 2` took {q['cold_s']:.1f} s "
            f"({q['compile_s']:.1f} s of it compiling), later ones {q['warm_s']:.1f} s") in readme


def test_coldstart_reads_the_stage_lines():
    from hogkit.benchmarks.coldstart import stages
    err = ("hogkit run: mf with 2 workers, results in x\n"
           "[  0.0 s] building the mf workload's parameters and data\n"
           "[  0.9 s] compiling the compiled engine's kernels (...)\n"
           "[ 13.0 s] kernels ready (12.1 s)\n[ 13.1 s] starting 2 worker processes\n"
           "[ 13.9 s] training for 2 s\n[ 16.0 s] training done; evaluating\n")
    assert stages(err) == {"first_stage_s": 0.0, "compile_s": 12.1,
                           "training_starts_s": 13.9}
    assert stages("no stage lines\n") == {}


def test_session38_peer_runs_are_quoted_from_their_json():
    """The rerun of both presets on the final engine and the default-only run beside
    it: the section's table renders the JSON and its bar figures are the JSONs'."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_session38.json").read_text())
    o = json.loads((root / "peers_session38_default.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert peers.format_markdown(r) in results
    text = " ".join(results.split())
    rr, ro = r["ratios"], o["ratios"]
    d, cl = r["mf"]["default"], r["mf"]["large"]["contenders"]
    lo, hi = d["rates"]["ratio_range"]
    t2l = cl["hogkit_default_2"]["time_to_target"]
    assert (f"**{rr['mf_default_rounds_sample1_over_plain']:.2f}** on the default preset "
            f"(rounds {lo:.2f}–{hi:.2f}), not met") in text
    assert f"in {t2l:.3f} s on the large preset, " in text
    assert f"{t2l / cl['libmf_2']['time_to_target']:.2f}x; before the plain loop" in text
    assert f"against 1 on the large preset {rr['mf_large_default2_over_default1']:.2f}" in text
    assert f"one worker at **{ro['mf_default_rounds_sample1_over_plain']:.2f}**" in text
    assert rr["mf_default_rounds_sample1_over_plain"] < 0.9 <= ro[
        "mf_default_rounds_sample1_over_plain"]                    # one above, one below


def test_dense_section_comes_from_the_committed_json():
    """Every table of RESULTS.md's dense-model section renders from its JSON."""
    import json
    from pathlib import Path

    import numpy as np

    from hogkit.benchmarks import dense, scaling
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    text = (root / "RESULTS.md").read_text()
    for name in ("dense.json", "dense_16cores.json"):
        assert dense.format_markdown(json.loads((root / name).read_text())) in text, name
    assert scaling.format_markdown(json.loads(
        (root / "scaling_16cores.json").read_text())) in text
    for name in ("dense_target.json", "dense_target_replication.json"):
        assert dense.format_target_markdown(json.loads((root / name).read_text())) in text
    rep = json.loads((root / "dense_replication.json").read_text())
    assert dense.format_replication_markdown(rep) in text
    # the prose's count of runs that ended above the zero model's loss (ln 2)
    tgt = json.loads((root / "dense_target_replication.json").read_text())["target"]
    above = {k: (sum(x > np.log(2) for lr in v["by_lr"].values() for x in lr["final_loss"]),
                 sum(len(lr["final_loss"]) for lr in v["by_lr"].values()))
             for k, v in tgt["contenders"].items()}
    k16 = [a + b for a, b in zip(above["sum16_2w"], above["worker16_2w"])]
    assert (f"were\n  {above['sum256_2w'][0]} of {above['sum256_2w'][1]} at K = 256" in text
            and f"{k16[0]} of {k16[1]} at K = 16" in text), above
    # the README's line on replicas quotes the latest JSON's logreg figures
    lg = json.loads((root / "dense_replication_core.json").read_text())
    lg = lg["replication"]["workloads"]["logreg"]["cases"]
    readme = " ".join((root.parent / "README.md").read_text().split())
    assert (f"run {lg['2w_worker']['speedup']:.2f}x one worker's samples/s on replicas "
            f"against {lg['2w_shared']['speedup']:.2f}x on the shared copy") in readme
    # what the prose says auto did: the faster of shared and worker on every workload
    for label, v in rep["replication"]["workloads"].items():
        cases = v["cases"]
        faster = max(("shared", "worker"), key=lambda m: cases[f"2w_{m}"]["samples_per_s"])
        assert v["auto"]["mode"] == faster, label


def _rules_section(now_json, before_json, after_ratios):
    """A live-rules step's RESULTS.md table renders ``now_json`` against
    ``before_json``, and its text quotes the JSON's ratios followed by
    ``after_ratios``."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / now_json).read_text())
    o = json.loads((root / before_json).read_text())
    results = (root / "RESULTS.md").read_text()
    assert rules.format_markdown(r, o) in results
    now = {n: r["by_workload"][n]["over_sgd"] for n in ("mf", "logreg")}
    text = " ".join(results.split())
    assert (f"logreg Gap-Aware {now['logreg']['gap_aware']:.2f}x and adaptive DC-ASGD "
            f"{now['logreg']['dc_adaptive']:.2f}x; mf {now['mf']['gap_aware']:.2f}x and "
            f"{now['mf']['dc_adaptive']:.2f}x. {after_ratios}") in text


def test_rules_gather_section_comes_from_the_committed_json():
    """The gather step's live-rules table and the ratios its text quotes."""
    _rules_section("rules_gather.json", "rules.json", "Still not met.")


def test_rules_gaps_section_comes_from_the_committed_json():
    """The in-place gaps step's live-rules table and the ratios its text quotes."""
    _rules_section("rules_gaps.json", "rules_gather.json", "logreg is at the line")


def test_rules_one_worker_section_comes_from_the_committed_json():
    """Session 48's rules section: both tables render benchmarks/rules_session48.json,
    the first invocation's ratios and the one-worker ratios its text quotes are the
    JSONs', and the claim that one worker pays a larger share on mf holds there."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "rules_session48.json").read_text())
    o = json.loads((root / "rules_gaps.json").read_text())
    f = json.loads((root / "rules_session48_first.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert rules.format_markdown(r, o) in results
    assert rules.format_one_worker(r) in results
    text = " ".join(results.split())
    first = {n: f["by_workload"][n]["over_sgd"] for n in ("mf", "logreg")}
    assert (f"gave logreg Gap-Aware {first['logreg']['gap_aware']:.2f}x and adaptive "
            f"DC-ASGD {first['logreg']['dc_adaptive']:.2f}x, mf "
            f"{first['mf']['gap_aware']:.2f}x and {first['mf']['dc_adaptive']:.2f}x") in text
    one, live = r["one_worker"]["mf"]["over_sgd"], r["by_workload"]["mf"]["over_sgd"]
    assert (f"(mf Gap-Aware {one['gap_aware']:.2f}x, adaptive DC-ASGD "
            f"{one['dc_adaptive']:.2f}x)") in text
    for rule in ("gap_aware", "dc_adaptive"):
        assert one[rule] < live[rule] < 0.7           # "a larger share than live"
    assert "Item 3's bar is not met on this machine." in text


def test_explore_section_comes_from_the_committed_json():
    """Issue 29's section: its table renders benchmarks/explore.json, and the stress
    figures its text quotes are the JSON's."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import explore
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "explore.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert explore.format_markdown(r) in results
    st = r["stress"]
    text = " ".join(results.split())
    assert (f"{st['rounds']} rounds in {st['seconds']:.1f} s; {st['differs']} of them "
            f"({st['rate']:.0%}) lost at least one update, with {st['outcomes']} distinct "
            f"outcomes") in text
    counts = [r["by_width"][w]["dpor"]["schedules"] for w in ("2", "3", "4")]
    assert f"({counts[0]:,}, {counts[1]:,}, {counts[2]:,})" in text


def test_logreg_peers_after_the_lock_option_come_from_the_committed_json():
    """RESULTS.md's logreg table and ratios after logreg's lock= render from its JSON."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "peers_logreg_locks.json").read_text())
    text = (root / "RESULTS.md").read_text()
    ra = r["ratios"]
    assert peers.format_markdown(r) in text
    assert f"runs {ra['logreg_sample1_over_plain']:.2f}x the plain" in text
    assert f"in {1 / ra['logreg_plain_time_over_sample2_time']:.1f}x the plain" in text


def test_many_cores_section_comes_from_the_committed_figures():
    """The 16-core section's tables render from its JSON, and every diagnosis figure its
    prose quotes is in the committed outputs."""
    import re
    from pathlib import Path

    from hogkit.benchmarks import many_cores
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    text = (root / "RESULTS.md").read_text()
    folder = root / "many_cores_16"
    parts = many_cores.load(folder)
    assert set(parts) == set(many_cores.PARTS)
    assert many_cores.format_markdown(parts).rstrip("\n") in text
    t = parts["target"]["contenders"]
    assert min(v["median_s"] for k, v in t.items() if k != "sample_1w") > \
        t["sample_1w"]["median_s"]          # "no two-worker run reached it sooner"
    section = text.split("## A 16-core machine, lent")[1].split("\n## ")[0]
    diag = {p.name: p.read_text() for p in (folder / "diag").glob("*.txt")}
    lane = re.search(r"lane span\s+([\d.]+) ns\s+([\d.]+)x", diag["lanevar.txt"])
    plain = re.search(r"plain\(fm=True\)\s+([\d.]+) ns", diag["lanevar.txt"])
    assert f"{lane[2]}x the plain loop's time ({lane[1]}" in section
    assert f"against {plain[1]} ns" in section

    def rates(name, what):
        return [float(x) for x in re.findall(rf"{what} ([\d.]+) M/s", diag[name])]
    trains = [float(x) for line in diag["diag2.txt"].splitlines() if "train" in line
              for x in re.findall(r"([\d.]+)(?:,| M/s)", line.split(":", 1)[1])]
    assert f"one-worker runs {min(trains)}-{max(trains)} M/s" in section
    batch = [float(x) for line in diag["batchrate.txt"].splitlines()
             for x in re.findall(r"[\d.]+", line.split("[", 1)[1].split("]")[0])]
    assert f"{min(batch)}-{max(batch)} M/s" in section
    here = diag["diag2_2cores.txt"]
    lines = [ln for ln in here.splitlines() if ln.startswith(("parent", "child"))
             and "warm" not in ln]
    plains = [float(re.search(r"plain ([\d.]+)", ln)[1]) for ln in lines]
    lanes = [float(re.search(r"lane ([\d.]+)", ln)[1]) for ln in lines]
    assert f"loop {min(plains)}-{max(plains)} M/s, the lane's span {min(lanes)}-{max(lanes)}" \
        in " ".join(section.split())
    firsts = {}
    for ln in diag["diag2.txt"].splitlines():
        m = re.match(r"(parent private r\d|child pid \d+ shm=False)\s.*plain ([\d.]+)", ln)
        if m:
            firsts.setdefault(m[1][:6] + str(len(firsts) // 2), m[2])
    p0, c0, p1, c1 = firsts["parent0"], firsts["child 0"], firsts["parent1"], firsts["child 1"]
    assert (f"ran {p0} M/s in the parent and {c0} M/s in a child process in one round, "
            f"then {p1} and {c1} M/s in the next") in " ".join(section.split())
    assert rates("diag2.txt", "plain")  # the outputs hold the figures quoted


def test_the_event_queue_sections_pairs_come_from_the_committed_json():
    """Both before/after pairs of the event-queue section render from their committed
    JSONs, and the prose's figures are theirs."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import simulate
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    results = (root / "RESULTS.md").read_text()
    section = results.split("### The next event from a tournament tree")[1].split("\n### ")[0]
    text = " ".join(section.split())
    pairs = [(json.loads((root / f"simulate_queue_{i}.json").read_text()),
              json.loads((root / f"simulate_queue_before_{i}.json").read_text()))
             for i in (1, 2)]
    ratios, shares = [], []
    for r, o in pairs:
        assert simulate.format_markdown(r, o) in section
        now, was = (x["ssp"]["w512_no_evals"]["updates_per_s"] for x in (r, o))
        assert f"{now:,.0f}" in text and f"{was:,.0f}" in text
        ratios.append(f"{now / was:.2f}x")
        shares.append(was / o["ssp"]["no_evals"]["updates_per_s"])
        cli = (f"{r['cli']['median']['engine_updates_per_s']:,.0f} against "
               f"{o['cli']['median']['engine_updates_per_s']:,.0f}")
        assert cli in text
    assert f"({ratios[0]} and {ratios[1]})" in text
    assert f"{min(shares):.2f}-{max(shares):.2f}x the rate of 64" in text


def test_the_rate_rounds_here_beside_the_16_core_ones_come_from_their_json():
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    text = _results_words()
    got = []
    for i in (1, 2):
        g = json.loads((root / "many_cores_2cores" / f"rates_{i}.json").read_text())["rates"]
        got.append(f"{g['median']['ratio']:.2f} (rounds {g['ratio_range'][0]:.2f}-"
                   f"{g['ratio_range'][1]:.2f})")
    assert f"hogkit / plain {got[0]} and {got[1]}." in text


def _peer_rerun(name, heading):
    """A session's default-preset peer run: the JSON, its ratios, its rate rounds' range,
    its contenders and the first 120 words of its RESULTS section (whose table must
    render the JSON), and the root folder."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / name).read_text())
    results = (root / "RESULTS.md").read_text()
    assert peers.format_markdown(r) in results
    text = " ".join(results.split(heading)[1].split()[:120])
    d = r["mf"]["default"]
    return r["ratios"], d["rates"]["ratio_range"], d["contenders"], text, root


def _results_words():
    """benchmarks/RESULTS.md with its whitespace collapsed (prose wraps anywhere)."""
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "RESULTS.md"
    return " ".join(path.read_text().split())


def _peer_section(name, heading):
    """A peer run's JSON, whose tables its RESULTS section must render, and that
    section's text (from ``heading`` to the next subsection, whitespace collapsed)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / name).read_text())
    results = (root / "RESULTS.md").read_text()
    assert results.count(peers.format_markdown(r)) == 1     # once, in its own section
    rest = results.split(f"\n{heading}")[1].split("\n", 1)[0]      # the heading's line:
    assert "|" not in rest and len(heading + rest) < 120           # no table spliced in
    return r, " ".join(results.split(heading)[1].split("\n### ")[0].split())


def _assert_default_mf_prose(r, text):
    """A standing mf peer check's prose quotes its JSON: the lane's rate over the plain
    loop (with its rounds' range), hogkit's two workers' time to the target against
    LIBMF's two threads', and the plain loop's time over theirs."""
    rr, d = r["ratios"], r["mf"]["default"]
    lo, hi = d["rates"]["ratio_range"]
    assert f"**{rr['mf_default_rounds_sample1_over_plain']:.2f}** (rounds {lo:.2f}–{hi:.2f})" \
        in text
    c = d["contenders"]
    t2, l2 = c["hogkit_default_2"]["time_to_target"], c["libmf_2"]["time_to_target"]
    assert f"in {t2:.3f} s, {t2 / l2:.2f}x LIBMF's two threads' {l2:.3f} s" in text
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f}." in text


def test_session45_default_peer_run_is_quoted_from_its_json():
    """The end-of-session-45 rerun: its table renders the JSON and the prose's bar
    figures are the JSON's."""
    rr, (lo, hi), c, text, root = _peer_rerun("peers_session45_default.json",
                                              "### Rerun at the end of session 45")
    assert (f"rate rounds **{rr['mf_default_rounds_sample1_over_plain']:.2f}** "
            f"(rounds {lo:.2f}–{hi:.2f}): below the bar") in text
    assert rr["mf_default_rounds_sample1_over_plain"] < 0.9
    t2 = c["hogkit_default_2"]["time_to_target"]
    assert f"in {t2:.3f} s, {t2 / c['libmf_2']['time_to_target']:.2f}x LIBMF's" in text
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f}." in text


def test_lane_step_size_section_comes_from_its_json():
    """The step-size table renders ``benchmarks/lane_steps.json``; the prose's gain is
    each repeat's, 4,096 ratings a step ran nearer the plain loop in every repeat, and
    mf's default step is the size the section chose."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import lane_steps
    from hogkit.workloads.mf import MatrixFactorization as MF
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "lane_steps.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert lane_steps.format_markdown(r) in results
    section = " ".join(results.split("### The lane's step size")[1].split("\n### ")[0].split())
    med = {(x["batch"], x["repeat"]): x["rates"]["median"]["ratio"] for x in r["runs"]}
    gains = [med[4096, k] - med[256, k] for k in range(r["repeats"])]
    assert min(gains) > 0
    assert f"in both repeats (by {min(gains):.2f}–{max(gains):.2f})" in section
    assert MF.default_sample_batch == 4096 == max(r["batches"])


def test_session46_default_peer_run_is_quoted_from_its_json():
    """The end-of-session-46 rerun at 4,096 ratings a step: its table renders the JSON,
    the prose's bar figures are the JSON's, and the run is at the new step."""
    rr, (lo, hi), c, _, root = _peer_rerun("peers_session46_default.json",
                                           "### Rerun at the end of session 46 (default")
    results = (root / "RESULTS.md").read_text()
    section = " ".join(results.split("### Rerun at the end of session 46 (default")[1]
                       .split("\n### ")[0].split())
    assert c["hogkit_sample_1"]["batch"] == c["hogkit_default_2"]["batch"] == 4096
    assert (f"rate rounds **{rr['mf_default_rounds_sample1_over_plain']:.2f}** "
            f"(rounds {lo:.2f}–{hi:.2f}): the bar (>= 0.9) is met") in section
    assert rr["mf_default_rounds_sample1_over_plain"] >= 0.9
    t2 = c["hogkit_default_2"]["time_to_target"]
    assert f"in {t2:.3f} s, {t2 / c['libmf_2']['time_to_target']:.2f}x LIBMF's" in section
    assert t2 / c["libmf_2"]["time_to_target"] <= 0.7
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f};" in section
    assert rr["mf_default_plain_time_over_default2_time"] > 1
    assert f"run {rr['mf_default_default2_over_default1']:.2f}x one worker's" in section
    # "not across invocations": the step-size runs at 4,096, and the rates it quotes
    import json
    steps = [x["rates"]["median"] for x in json.loads(
        (root / "lane_steps.json").read_text())["runs"] if x["batch"] == 4096]
    here = json.loads((root / "peers_session46_default.json").read_text())
    here = here["mf"]["default"]["rates"]["median"]
    assert max(m["ratio"] for m in steps) < 0.9
    hog = [m["hogkit"] / 1e6 for m in steps + [here]]
    plain = [m["plain"] / 1e6 for m in steps]
    assert (f"ran {min(hog):.1f}–{max(hog):.1f} M ratings/s in all three sets of rounds; "
            f"the plain loop ran {min(plain):.1f}–{max(plain):.1f} M/s there and "
            f"{here['plain'] / 1e6:.1f} M/s here") in section


def test_session46_large_peer_run_is_quoted_from_its_json():
    """The large-preset rerun at 4,096 ratings a step renders its JSON and meets the
    issue's large-preset bars as its prose says."""
    r, section = _peer_section("peers_session46_large.json",
                               "### Rerun at the end of session 46 (large")
    rr, d = r["ratios"], r["mf"]["large"]
    c, (lo, hi) = d["contenders"], d["rates"]["ratio_range"]
    assert c["hogkit_sample_1"]["batch"] == c["hogkit_default_2"]["batch"] == 4096
    one, two = rr["mf_large_rounds_sample1_over_plain"], rr["mf_large_default2_over_default1"]
    t2 = c["hogkit_default_2"]["time_to_target"]
    vs = t2 / c["libmf_2"]["time_to_target"]
    assert one >= 0.9 and vs <= 1.0 and two >= 1.8 and c["plain"]["time_to_target"] is None
    assert f"**{one:.2f}** (rounds {lo:.2f}–{hi:.2f})" in section
    assert f"{t2:.3f} s, {vs:.2f}x LIBMF's two threads' time" in section
    assert f"2 workers run {two:.2f}x one worker's" in section


def test_the_tree_and_overlap_section_comes_from_the_committed_json():
    """The event tree's and the overlapped evaluation points' section: its tables render
    from the committed JSONs, and the prose's ratios and the bar's figures are theirs."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import simulate
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    results = (root / "RESULTS.md").read_text()
    section = results.split("### The tree from 16 workers on")[1].split("\n## ")[0]
    text = " ".join(section.split())

    def load(name):
        return json.loads((root / f"{name}.json").read_text())
    assert simulate.format_queue(load("simulate_tree_1")) in section
    for i in (1, 2):
        r, o = load(f"simulate_overlap_{i}"), load(f"simulate_overlap_before_{i}")
        assert simulate.format_markdown(r, o) in section
        for x in (r, o):
            assert f"{x['cli']['median']['engine_updates_per_s']:,.0f}" in text
        assert r["cli"]["median"]["engine_updates_per_s"] >= 300_000   # the claim "met"
    names = ["simulate_tree_1"] + [f"simulate_overlap{b}_{i}" for i in (1, 2)
                                   for b in ("", "_before")]
    at64 = sorted(load(n)["queue"]["by_workers"]["64"]["tree_over_scan"] for n in names)
    assert f"ratio was {at64[0]:.2f}-{at64[-1]:.2f}x in all five invocations" in text

    def share(n):
        s = load(n)["ssp"]
        return f"{s['evals']['updates_per_s'] / s['no_evals']['updates_per_s']:.2f}"
    assert (f"{share('simulate_overlap_before_1')} and {share('simulate_overlap_before_2')} "
            f"before, {share('simulate_overlap_1')} and {share('simulate_overlap_2')} after"
            in text)


def test_the_core_merge_section_comes_from_the_committed_json():
    """The in-core merge's section: every table renders from its JSON (this machine
    after and before, the 16-core machine's two invocations), and the prose's and the
    README's times to the target are the JSONs' medians and ranges."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import dense
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    results = (root / "RESULTS.md").read_text()
    section = results.split("## Replicas merge in the compiled core")[1].split("\n## ")[0]
    text = " ".join(section.split())
    readme = " ".join((root.parent / "README.md").read_text().split())

    def load(name):
        return json.loads((root / name).read_text())
    for name in ("dense_replication_core.json", "dense_replication_before_core.json"):
        assert dense.format_replication_markdown(load(name)) in section
        for label, v in load(name)["replication"]["workloads"].items():   # auto: faster
            c = v["cases"]
            assert v["auto"]["mode"] == max(("shared", "worker"), key=lambda m: c[
                f"2w_{m}"]["samples_per_s"]), (name, label)
    r16 = load("many_cores_16_core/replication.json")["workloads"]["logreg"]["cases"]
    assert (f"{r16['2w_worker']['speedup']:.2f}x on replicas, "
            f"{r16['2w_shared']['speedup']:.2f}x shared") in text
    after, before = load("dense_target_core.json"), load("dense_target_before_core.json")
    for t in (after, before):
        assert dense.format_target_markdown(t) in section
    for name in ("target.json", "target_2.json"):
        assert dense.format_target_markdown({"target": load(f"many_cores_16_core/{name}")}) \
            in section

    def fig(t, k):
        v = t["target"]["contenders"][k]
        return f"{v['median_s']:.2f} s [{v['range_s'][0]:.2f}-{v['range_s'][1]:.2f}]"
    for k in ("sample_1w", "sum16_2w", "worker4_2w", "worker16_2w"):
        assert fig(after, k) in text, k
    a = after["target"]["contenders"]
    one = a["sample_1w"]
    assert a["sum16_2w"]["range_s"][1] < one["range_s"][0]        # "clear of it"
    assert a["worker4_2w"]["range_s"][1] < one["range_s"][0]
    assert f"one worker {one['median_s']:.2f} s" in readme
    assert f"on replicas {a['sum16_2w']['median_s']:.2f} s (summed every 16" in readme
    both = {f"{a[k]['median_s']:.2f}" for k in ("worker4_2w", "worker16_2w")}
    assert len(both) == 1 and f"and {both.pop()} s (every 4, and" in readme
    lg = load("dense_replication_core.json")["replication"]["workloads"]["logreg"]["cases"]
    assert f"**{lg['2w_worker']['speedup']:.2f}x** one worker's samples/s" in text


def test_session47_default_peer_run_is_quoted_from_its_json():
    """The end-of-session-47 rerun (the step loop with the in-core merge): its table
    renders the JSON and the prose's figures are the JSON's."""
    rr, (lo, hi), c, text, _ = _peer_rerun("peers_session47_default.json",
                                           "### Rerun at the end of session 47")
    assert (f"rate rounds **{rr['mf_default_rounds_sample1_over_plain']:.2f}** "
            f"(rounds {lo:.2f}–{hi:.2f})") in text
    t2 = c["hogkit_default_2"]["time_to_target"]
    assert f"in {t2:.3f} s, {t2 / c['libmf_2']['time_to_target']:.2f}x LIBMF's" in text
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f};" in text
    assert f"run {rr['mf_default_default2_over_default1']:.2f}x one worker's" in text
    # "on the same side of its bar as in session 46's rerun"
    assert rr["mf_default_rounds_sample1_over_plain"] >= 0.9
    assert t2 / c["libmf_2"]["time_to_target"] <= 0.7
    assert rr["mf_default_plain_time_over_default2_time"] > 1


def test_session49_both_presets_run_is_quoted_from_its_json():
    """Session 49's run of both presets (no engine change since session 47's rerun):
    its tables render the JSON, and the prose's bar figures, the comparison with session
    47's rerun and the history since the 4,096-rating step are the JSONs'."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r, text = _peer_section("peers_session49.json", "### Both presets at the start of session 49")
    rr = r["ratios"]
    one = {p: rr[f"mf_{p}_rounds_sample1_over_plain"] for p in ("default", "large")}
    for p in one:
        lo, hi = r["mf"][p]["rates"]["ratio_range"]
        assert f"**{one[p]:.2f}** (rounds {lo:.2f}–{hi:.2f})" in text
    assert one["large"] >= 0.9 > one["default"]                  # "met" / "not met"
    for p in ("default", "large"):
        c = r["mf"][p]["contenders"]
        assert c["hogkit_sample_1"]["batch"] == c["hogkit_default_2"]["batch"] == 4096
        t2, l2 = c["hogkit_default_2"]["time_to_target"], c["libmf_2"]["time_to_target"]
        assert f"{t2:.3f} s, {t2 / l2:.2f}x LIBMF's {l2:.3f} s" in text
        assert t2 / l2 <= (0.7 if p == "default" else 1.0)
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f}" in text
    assert rr["mf_default_plain_time_over_default2_time"] > 1
    assert r["mf"]["large"]["contenders"]["plain"]["time_to_target"] is None
    assert (f"large preset**: {rr['mf_large_default2_over_default1']:.2f} (met; "
            f"{rr['mf_default_default2_over_default1']:.2f} on the default") in text
    assert rr["mf_large_default2_over_default1"] >= 1.8
    here, then = (json.loads((root / n).read_text())["mf"]["default"]["rates"]["median"]
                  for n in ("peers_session49.json", "peers_session47_default.json"))
    assert (f"Here hogkit's worker ran {here['hogkit'] / 1e6:.1f} M ratings/s, there "
            f"{then['hogkit'] / 1e6:.1f} M/s; the plain loop {here['plain'] / 1e6:.1f} and "
            f"{then['plain'] / 1e6:.1f} M/s") in text
    assert (f"(hogkit {here['hogkit'] / then['hogkit']:.2f}x, the plain loop "
            f"{here['plain'] / then['plain']:.2f}x session 47's)") in text
    s46, s47 = (json.loads((root / f"peers_session{k}_default.json").read_text())["ratios"]
                ["mf_default_rounds_sample1_over_plain"] for k in (46, 47))
    steps = sorted(x["rates"]["median"]["ratio"] for x in json.loads(
        (root / "lane_steps.json").read_text())["runs"] if x["batch"] == 4096)
    assert (f"has been {s46:.2f} (session 46), {s47:.2f} (session 47) and "
            f"{one['default']:.2f} (here) in the bar's benchmark, and {steps[0]:.2f} and "
            f"{steps[1]:.2f} in two sets of step-size rounds") in text


def test_rules_momentum_floor_section_comes_from_the_committed_json():
    """Session 49's rules section: both tables render benchmarks/rules_session49.json
    (before: session 48's), and the decomposition its text gives is the JSON's."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "rules_session49.json").read_text())
    b = json.loads((root / "rules_session48.json").read_text())
    results = (root / "RESULTS.md").read_text()
    section = results.split("### A state table's floor")[1].split("\n### ")[0]
    assert rules.format_markdown(r, b) in section
    assert rules.format_one_worker(r) in section
    text = " ".join(section.split())
    m, lg = (r["by_workload"][n]["over_sgd"] for n in ("mf", "logreg"))
    sa, mo, dc = m["staleness_aware"], m["momentum"], m["dc"]
    assert f"(staleness-aware) runs at {sa:.2f}x SGD" in text
    assert f"The state table alone (momentum) is {mo:.2f}x" in text
    assert f"(constant DC-ASGD) is {dc:.2f}x" in text
    assert f"are {m['dc_adaptive']:.2f}x and {m['gap_aware']:.2f}x" in text
    left = sa - (sa - mo) - (sa - dc)
    assert (f"the state takes {sa - mo:.2f} and the gap work {sa - dc:.2f}, which leaves "
            f"{left:.2f}") in text
    assert abs(left - m["gap_aware"]) < 0.03 and abs(left - m["dc_adaptive"]) < 0.03
    assert max(m["gap_aware"], m["dc_adaptive"]) < 0.7 <= dc          # mf below the bar
    assert (f"adaptive DC-ASGD is at {lg['dc_adaptive']:.2f}x and Gap-Aware at "
            f"{lg['gap_aware']:.2f}x") in text
    assert min(lg["gap_aware"], lg["dc_adaptive"]) < 0.7 <= max(lg["gap_aware"],
                                                                lg["dc_adaptive"])
    assert lg["momentum"] < lg["dc"]                  # "the state table costs more"
    assert f"(momentum {lg['momentum']:.2f}x, constant DC-ASGD {lg['dc']:.2f}x)" in text


def test_session50_vector_span_run_is_quoted_from_its_json():
    """Session 50's default-preset run on the vector spans: its tables render the JSON,
    and the prose's bar figures and comparisons are the JSONs'."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r, text = _peer_section("peers_session50_default.json",
                            "### mf's spans as straight-line vector code (session 50")
    rr, d = r["ratios"], r["mf"]["default"]
    lo, hi = d["rates"]["ratio_range"]
    one = rr["mf_default_rounds_sample1_over_plain"]
    assert f"**{one:.2f}** (rounds {lo:.2f}–{hi:.2f}): met, every round" in text
    assert lo >= 0.9
    med = d["rates"]["median"]
    then = json.loads((root / "peers_session49.json").read_text())["mf"]["default"][
        "rates"]["median"]
    assert (f"hogkit's worker ran {med['hogkit'] / 1e6:.1f} M ratings/s, the plain loop "
            f"{med['plain'] / 1e6:.1f} M/s (session 49: {then['hogkit'] / 1e6:.1f} and "
            f"{then['plain'] / 1e6:.1f})") in text
    c = d["contenders"]
    t2, l2 = c["hogkit_default_2"]["time_to_target"], c["libmf_2"]["time_to_target"]
    assert f"{t2:.3f} s, {t2 / l2:.2f}x LIBMF's {l2:.3f} s" in text and t2 / l2 <= 0.7
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f}. Met." in text
    t1 = c["hogkit_sample_1"]["time_to_target"]
    assert f"reaches the target in {t1:.3f} s, sooner than the defaults' two" in text
    assert t1 < t2
    s47 = json.loads((root / "peers_session47_default.json").read_text())["ratios"]
    assert (f"run {rr['mf_default_sample2_over_sample1']:.2f}x one worker's ratings/s "
            f"({s47['mf_default_sample2_over_sample1']:.2f} in session 47's rerun)") in text


def test_vector_span_rates_section_comes_from_its_json():
    """The in-process span table renders ``benchmarks/rowvec.json``, and the prose's
    ratios are its rank-32 float32 figures."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rowvec
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r = json.loads((root / "rowvec.json").read_text())
    results = (root / "RESULTS.md").read_text()
    assert rowvec.format_markdown(r) in results
    text = " ".join(results.split("### The spans in one process")[1].split("\n### ")[0]
                    .split())
    q = [s for s in r["shapes"] if (s["rank"], s["dtype"]) == (32, "float32")][0]["ratios"]
    nb = [s["ratios"]["sgd_numba"] for s in r["shapes"]]
    assert (f"({min(nb):.2f}–{max(nb):.2f}x across the shapes, {q['sgd_numba']:.2f}x at "
            f"rank 32, float32)") in text
    assert all(s["ratios"]["sgd_vector"] > max(1.0, s["ratios"]["sgd_numba"])
               for s in r["shapes"])
    assert f"The vector code runs {q['sgd_vector']:.2f}x the plain loop at rank 32" in text
    assert f"AdaGrad gains {q['rowwise_vector_over_numba']:.2f}x at rank 32" in text


def test_session50_both_presets_run_is_quoted_in_results_and_readme():
    """Session 50's run of both presets on the vector spans: its tables render the
    JSON, every bar of issue 25 the prose calls met holds in it, and the README's table
    and figures are this JSON's (and rowvec.json's)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    r, text = _peer_section("peers_session50.json", "### Both presets on the vector spans")
    rr = r["ratios"]
    for p in ("default", "large"):
        lo, hi = r["mf"][p]["rates"]["ratio_range"]
        one = rr[f"mf_{p}_rounds_sample1_over_plain"]
        assert f"{p} preset **{one:.2f}** (rounds {lo:.2f}–{hi:.2f})" in text
        assert one >= 0.9
    c = {p: r["mf"][p]["contenders"] for p in ("default", "large")}
    t = {p: (c[p]["hogkit_default_2"]["time_to_target"], c[p]["libmf_2"]["time_to_target"])
         for p in c}
    for p, bar in (("default", 0.7), ("large", 1.0)):
        mine, libmf = t[p]
        assert f"{mine:.3f} s, {mine / libmf:.2f}x LIBMF's {libmf:.3f} s" in text
        assert mine / libmf <= bar
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f} (default)" in text
    assert rr["mf_default_plain_time_over_default2_time"] > 1
    assert c["large"]["plain"]["time_to_target"] is None
    assert (f"large preset**: {rr['mf_large_default2_over_default1']:.2f} "
            f"({rr['mf_default_default2_over_default1']:.2f} on the default") in text
    assert rr["mf_large_default2_over_default1"] >= 1.8
    old = json.loads((root / "peers_session50_default.json").read_text())
    d1 = c["default"]["hogkit_default_1"]["samples_per_s"]
    before = old["mf"]["default"]["contenders"]["hogkit_default_1"]["samples_per_s"]
    assert (f"now runs {d1 / 1e6:.1f} M ratings/s with one worker on the default preset "
            f"({before / 1e6:.1f} in the run above") in text
    s1 = c["default"]["hogkit_sample_1"]["time_to_target"]
    assert f"in {t['default'][0]:.3f} s, sooner than one worker on per-sample SGD ({s1:.3f}" \
        in text
    for p in c:          # the defaults' row is the first to the target on both presets
        times = [x["time_to_target"] for x in c[p].values() if x["time_to_target"]]
        assert min(times) == t[p][0]
    readme = (root.parent / "README.md").read_text()
    assert peers.format_readme(r) in readme
    flat = " ".join(readme.split())
    q = [s for s in json.loads((root / "rowvec.json").read_text())["shapes"]
         if (s["rank"], s["dtype"]) == (32, "float32")][0]["ratios"]
    assert (f"reaches the target in {t['default'][0] / t['default'][1]:.2f}x LIBMF's two "
            f"threads' time on the default preset (and before the plain single-threaded "
            f"loop) and in {t['large'][0] / t['large'][1]:.2f}x on the large preset") in flat
    assert (f"One worker on per-sample SGD runs {rr['mf_default_rounds_sample1_over_plain']:.2f}x "
            f"the plain loop's ratings/s on the default preset and "
            f"{rr['mf_large_rounds_sample1_over_plain']:.2f}x on the large one") in flat
    assert f"runs {q['sgd_vector']:.2f}x the plain loop at rank 32" in flat


@pytest.mark.slow
def test_rowvec_benchmark_runs_small():
    """``hogkit bench rowvec --quick`` on its one small shape: every contender timed, the
    ratios finite, the table rendered. Speed itself is not asserted."""
    import math

    from hogkit.benchmarks import rowvec
    r = rowvec.run(quick=True)
    (s,) = r["shapes"]
    assert set(s["ratings_per_s"]) == set(rowvec.NAMES)
    assert all(math.isfinite(v) and v > 0 for v in s["ratios"].values())
    assert "| 8, float32 |" in rowvec.format_markdown(r)


def test_vector_spans_compile_time_section_comes_from_its_json():
    """The cold-start table of the vector spans renders its two JSONs, and the prose's
    difference and compiling time are theirs (the first cold-start table's 11.9 s is
    benchmarks/coldstart.json's)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import coldstart
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    after, before, old = (json.loads((root / n).read_text()) for n in (
        "coldstart_session50.json", "coldstart_session50_16widths.json", "coldstart.json"))
    a, b, first = after["ratios"], before["ratios"], old["ratios"]
    results = (root / "RESULTS.md").read_text()
    assert coldstart.format_markdown(after, before=before) in results
    text = " ".join(results.split("### The vector spans' compile time")[1].split("\n## ")[0]
                    .split())
    assert f"the cold run compiled {b['compile_s'] - a['compile_s']:.1f} s longer" in text
    assert f"in the first table above ({first['compile_s']:.1f} s)" in text
    assert f"at most 20 s: {a['cold_s']:.1f} s." in text and a["cold_s"] <= 20


def test_session50_final_default_run_is_quoted_from_its_json():
    """The end-of-session default-preset rerun: its tables render the JSON, and the
    prose's bar figures are the JSON's and hold."""
    r, text = _peer_section("peers_session50_final_default.json",
                            "### The default preset on the final engine")
    rr, d = r["ratios"], r["mf"]["default"]
    lo, hi = d["rates"]["ratio_range"]
    one = rr["mf_default_rounds_sample1_over_plain"]
    assert f"**{one:.2f}** (rounds {lo:.2f}–{hi:.2f})" in text and lo >= 0.9
    c = d["contenders"]
    t2, l2 = c["hogkit_default_2"]["time_to_target"], c["libmf_2"]["time_to_target"]
    assert f"in {t2:.3f} s, {t2 / l2:.2f}x LIBMF's two threads' {l2:.3f} s" in text
    assert t2 / l2 <= 0.7
    assert f"theirs is {rr['mf_default_plain_time_over_default2_time']:.2f}." in text
    assert rr["mf_default_plain_time_over_default2_time"] > 1


def test_rules_session51_section_comes_from_the_committed_jsons():
    """Session 51's rules section: both tables render benchmarks/rules_session51.json
    (against the session's first invocation), its text quotes the ratios of the three
    steps' JSONs, the one-worker figures it names, and the unrounded logreg ratio."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    _rules_section("rules_session51.json", "rules_session51_start.json",
                   "mf is over the line; logreg is on it.")
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    j = {k: json.loads((root / f"rules_session51{k}.json").read_text())
         for k in ("", "_start", "_passes", "_grad")}
    text = _results_words()
    assert rules.format_one_worker(j[""]) in (root / "RESULTS.md").read_text()

    def q(k, w, rule):
        return f"{j[k]['by_workload'][w]['over_sgd'][rule]:.2f}"
    assert (f"mf {q('_start', 'mf', 'gap_aware')} and {q('_start', 'mf', 'dc_adaptive')} "
            f"became {q('_passes', 'mf', 'gap_aware')} and "
            f"{q('_passes', 'mf', 'dc_adaptive')}") in text
    assert f"mf {q('_grad', 'mf', 'gap_aware')} and {q('_grad', 'mf', 'dc_adaptive')}" in text
    ns = {k: j[k]["one_worker"] for k in j}
    assert (f"from {ns['_start']['mf']['ns_per_sample']['gap_aware']:.1f} to "
            f"{ns['_grad']['mf']['ns_per_sample']['gap_aware']:.1f} ns a sample") in text
    assert (f"{ns['_start']['logreg']['ns_per_sample']['sgd']:.1f} ns a sample at the start, "
            f"{ns['']['logreg']['ns_per_sample']['sgd']:.1f} now") in text
    assert (f"first invocation read {q('_start', 'logreg', 'gap_aware')}x and "
            f"{q('_start', 'logreg', 'dc_adaptive')}x and the next two "
            f"{q('_passes', 'logreg', 'gap_aware')}x / {q('_passes', 'logreg', 'dc_adaptive')}x "
            f"and {q('_grad', 'logreg', 'gap_aware')}x / "
            f"{q('_grad', 'logreg', 'dc_adaptive')}x") in text
    f = json.loads((root / "rules_session51_final.json").read_text())["by_workload"]
    assert (f"mf {f['mf']['over_sgd']['gap_aware']:.2f}x and "
            f"{f['mf']['over_sgd']['dc_adaptive']:.2f}x, logreg "
            f"{f['logreg']['over_sgd']['gap_aware']:.2f}x and "
            f"{f['logreg']['over_sgd']['dc_adaptive']:.2f}x") in text
    ga = j[""]["by_workload"]["logreg"]["over_sgd"]["gap_aware"]
    assert f"unrounded Gap-Aware ratio is {ga:.3f}" in text and ga < 0.7
    assert all(j[""]["by_workload"]["mf"]["over_sgd"][r] >= 0.7
               for r in ("gap_aware", "dc_adaptive"))


def test_session51_peer_checks_are_quoted_from_their_jsons():
    """Session 51's standing peer checks: the mf and logreg tables render their JSONs,
    and every figure the prose quotes is theirs (or the lock option's run's)."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import peers
    heading = "### The peers after session 51's hot-path changes"
    r, text = _peer_section("peers_session51_default.json", heading)
    _assert_default_mf_prose(r, text)
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    lg = json.loads((root / "peers_logreg_session51.json").read_text())
    assert peers.format_markdown(lg) in (root / "RESULTS.md").read_text()
    la = lg["ratios"]
    assert (f"runs {la['logreg_sample1_over_plain']:.2f}x the plain loop's samples/s, and the "
            f"batch lane's one worker (the fused SGD kernel) "
            f"{la['logreg_compiled1_over_plain']:.2f}x") in text
    assert f"in {1 / la['logreg_plain_time_over_sample2_time']:.1f}x the plain" in text
    old = json.loads((root / "peers_logreg_locks.json").read_text())["ratios"]
    assert (f"had {old['logreg_sample1_over_plain']:.2f}x and "
            f"{old['logreg_compiled1_over_plain']:.2f}x") in text


def test_rules_session52_section_comes_from_the_committed_jsons():
    """Session 52's rules section (the AMD host): its three tables render
    benchmarks/rules_session52_amd.json and rules_session52_repeat.json, and its text
    quotes their ranges, the same-mode rounds' ratios and the one-worker ratios."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    a = json.loads((root / "rules_session52_amd.json").read_text())
    r = json.loads((root / "rules_session52_repeat.json").read_text())
    s51 = json.loads((root / "rules_session51_final.json").read_text())
    results = (root / "RESULTS.md").read_text()
    for table in (rules.format_markdown(a), rules.format_one_worker(a),
                  rules.format_repeat(r)):
        assert table in results
    text = " ".join(results.split())

    def span(values):
        return f"{min(values):.2f}–{max(values):.2f}"
    live = {w: [g["sgd"] / 1e6 for g in a["by_workload"][w]["rounds"]] for w in ("mf", "logreg")}
    assert (f"SGD's three logreg rounds ran at {span(live['logreg'])} M samples/s and mf's at "
            f"{span(live['mf'])} M") in text
    rounds = r["repeat"]["rounds"]
    each = r["repeat"]["over_sgd_each_round"]
    sgd = [g["sgd"]["samples_per_s"] / 1e6 for g in rounds]
    ga = [g["gap_aware"]["samples_per_s"] / 1e6 for g in rounds]
    assert f"SGD at {span(sgd)} M, Gap-Aware at {span(ga)} M" in text
    assert f"DC-ASGD's {rounds[3]['dc_adaptive']['samples_per_s'] / 1e6:.2f} M in round 4" in text
    ratios = [v for x in each.values() for v in x]
    assert f"({min(ratios):.2f} to {max(ratios):.2f} above)" in text
    assert (f"Gap-Aware {each['gap_aware'][1]:.2f} and adaptive DC-ASGD "
            f"{each['dc_adaptive'][1]:.2f} with both fast (round 2), {each['gap_aware'][2]:.2f} "
            f"and {each['dc_adaptive'][2]:.2f} with both slow (round 3)") in text
    assert max(each["gap_aware"][1:3] + each["dc_adaptive"][1:3]) < 0.7
    best = rules.best_over_sgd(r["repeat"])
    assert (f"gives Gap-Aware {best['gap_aware']:.2f}, adaptive DC-ASGD "
            f"{best['dc_adaptive']:.2f} and the momentum floor {best['momentum']:.2f}") in text
    ow = {w: a["one_worker"][w]["over_sgd"] for w in ("mf", "logreg")}
    assert (f"they cost {ow['logreg']['gap_aware']:.2f}x and {ow['logreg']['dc_adaptive']:.2f}x "
            f"SGD's rate (the momentum floor {ow['logreg']['momentum']:.2f}x)") in text
    mf = a["by_workload"]["mf"]["over_sgd"]
    old = s51["one_worker"]["mf"]["over_sgd"]
    assert (f"(Gap-Aware {mf['gap_aware']:.2f}x, adaptive DC-ASGD {mf['dc_adaptive']:.2f}x) "
            f"are mode draws as well; its one-worker ratios here ({ow['mf']['gap_aware']:.2f}x, "
            f"{ow['mf']['dc_adaptive']:.2f}x) are close to session 51's on the Intel host "
            f"({old['gap_aware']:.2f}x and {old['dc_adaptive']:.2f}x), whose live ratios were "
            f"{s51['by_workload']['mf']['over_sgd']['gap_aware']:.2f} and "
            f"{s51['by_workload']['mf']['over_sgd']['dc_adaptive']:.2f}") in text


@pytest.mark.slow
def test_rules_session53_section_comes_from_the_committed_jsons():
    """Session 53's section (the placements): both repeat tables render
    benchmarks/rules_session53_repeat*.json, and the text quotes the probes' two ranges,
    SGD's speed in each placement and the per-placement ratios from them."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    from hogkit.doctor import FAR_NS
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    runs = [json.loads((root / f"rules_session53_repeat{n}.json").read_text())["repeat"]
            for n in ("", "2")]
    results = (root / "RESULTS.md").read_text()
    for r in runs:
        assert rules.format_repeat({"repeat": r}) in results
        assert r["by_placement"] == rules.by_placement(r)
    text = " ".join(results.split())
    probes, sgd = [], {"near": [], "far": []}
    for r in runs:
        for g in r["rounds"]:
            for rule in g["order"]:
                probes += g[rule]["handover_ns"]
            if rules.placement(g["sgd"]) in sgd:
                sgd[rules.placement(g["sgd"])].append(g["sgd"]["samples_per_s"] / 1e6)
    near = [v for v in probes if v < FAR_NS]
    far = [v for v in probes if v > FAR_NS]
    assert len(near) + len(far) == len(probes)
    assert (f"Of the {len(probes)} probes, every one read either {min(near):.0f}–"
            f"{max(near):.0f} ns or {min(far):.0f}–{max(far):.0f} ns") in text
    assert (f"ran SGD at {min(sgd['near']):.2f}–{max(sgd['near']):.2f} M samples/s, those "
            f"with both far at {min(sgd['far']):.2f}–{max(sgd['far']):.2f} M") in text
    na = runs[0]["by_placement"]["near"]["over_sgd"]
    fb = runs[1]["by_placement"]["far"]["over_sgd"]
    assert (f"the general path {na['staleness_aware']:.2f}, the gap work {na['dc']:.2f}, the "
            f"state table {na['momentum']:.2f}, and both, adaptive DC-ASGD "
            f"{na['dc_adaptive']:.2f} and Gap-Aware {na['gap_aware']:.2f}") in text
    assert (f"adaptive DC-ASGD {fb['dc_adaptive']:.2f}, Gap-Aware {fb['gap_aware']:.2f}"
            in text)
    assert max(na["dc_adaptive"], na["gap_aware"], fb["dc_adaptive"], fb["gap_aware"]) < 0.7
    assert f"over {FAR_NS:.0f} ns (`FAR_NS`" in text


def test_gap_pass_section_comes_from_the_committed_scratch_jsons():
    """Session 53's scratch builds: the table's near-placement ratios are the
    by_placement figures of benchmarks/scratch/session53_*.json (two invocations per
    build), and the text quotes them and session 52's one-worker ratios."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    text = _results_words()

    def runs(build):
        out = []
        for suffix in ("", "_b"):
            r = json.loads((root / "scratch" / f"session53_{build}{suffix}.json").read_text())
            assert r["by_placement"] == rules.by_placement(r)
            out.append(r["by_placement"])
        return out

    def pair(got, where, rule):
        return f"{got[0][where]['over_sgd'][rule]:.2f}/{got[1][where]['over_sgd'][rule]:.2f}"
    got = {b: runs(b) for b in ("base", "undamped", "no_gap_read")}
    for build, row in got.items():
        cells = " | ".join(pair(row, "near", r)
                           for r in ("dc", "momentum", "dc_adaptive", "gap_aware"))
        assert f"(`session53_{build}*.json`) | {cells} |" in text
    n = got["no_gap_read"]
    assert (f"adaptive DC-ASGD and Gap-Aware ran at {pair(n, 'near', 'dc_adaptive')} and "
            f"{pair(n, 'near', 'gap_aware')} of SGD near, and Gap-Aware at "
            f"{pair(n, 'far', 'gap_aware')} far") in text
    assert f"without a state table) at {pair(n, 'near', 'dc')}" in text
    costs = [got["undamped"][i]["near"]["over_sgd"][r] - got["base"][i]["near"]["over_sgd"][r]
             for i in (0, 1) for r in ("dc_adaptive", "gap_aware")]
    assert f"costs little ({max(min(costs), 0):.2f}–{max(costs):.2f})" in text
    ow = json.loads((root / "rules_session52_amd.json").read_text())["one_worker"]["logreg"]
    lo, hi = sorted((ow["over_sgd"]["gap_aware"], ow["over_sgd"]["dc_adaptive"]))
    assert f"(its ratios, {lo:.2f}–{hi:.2f}, stay near the bar)" in text


def test_one_pass_section_comes_from_the_committed_scratch_jsons():
    """Session 54's A/B (one pass against two, one invocation each): each table row's
    paired ratios by placement and its arms' ratios to SGD near are the figures of its
    benchmarks/scratch/session54_*.json, and the prose quotes them."""
    import json
    import statistics
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    text = _results_words()
    two_pass = ("dc_adaptive", "gap_aware")

    def paired(r, rule, where):
        q = [g[rule]["samples_per_s"] / g[rule + "_2pass"]["samples_per_s"]
             for g in r["rounds"]
             if rules.placement(g[rule]) == where == rules.placement(g[rule + "_2pass"])]
        return f"{statistics.median(q):.2f} ({len(q)})" if q else "–"
    got = {}
    for build in ("one_pass", "one_pass_b", "blocked", "per_entry"):
        r = json.loads((root / "scratch" / f"session54_{build}.json").read_text())
        assert r["by_placement"] == rules.by_placement(r)
        assert len(r["rounds"]) == 8
        near = r["by_placement"]["near"]["over_sgd"]
        cells = ([paired(r, ru, w) for w in ("near", "far") for ru in two_pass]
                 + [f"{near[ru]:.2f}/{near[ru + '_2pass']:.2f}" for ru in two_pass])
        assert f"(`session54_{build}.json`) | {' | '.join(cells)} |" in text, build
        got[build] = cells
    for build, phrase in (("one_pass", "one pass at {} and {} of their speed"),
                          ("blocked", "blocks of 32 at {} and {}"),
                          ("per_entry", "without `X`, at {} and {}")):
        assert phrase.format(*(c.split()[0] for c in got[build][:2])) in text, build
    assert f"went the other way ({got['one_pass_b'][2].split()[0]} and " \
           f"{got['one_pass_b'][3].split()[0]})" in text
    first = got["one_pass"][4:]
    lo, hi = sorted(c.split("/")[1] for c in first)
    assert f"stay at {lo}–{hi}x SGD near (the first invocation's two-pass arms" in text


def test_session55_fresh_section_comes_from_the_committed_jsons():
    """Session 55's section (the clock decides what is fresh): its three repeat tables
    render their JSONs, and every ratio its text quotes is a placement's median there
    (or a one-worker ratio of rules_session55.json), so a rerun that moves them fails."""
    import json
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    results = (root / "RESULTS.md").read_text()
    text = _results_words()
    got = {}
    for name in ("repeat2", "repeat", "repeat_mf"):
        r = json.loads((root / f"rules_session55_{name}.json").read_text())
        assert rules.format_repeat(r) in results
        assert r["repeat"]["by_placement"] == rules.by_placement(r["repeat"])
        assert r["repeat"]["workload"] == ("mf" if name == "repeat_mf" else "logreg")
        got[name] = {w: {k: f"{v:.2f}" for k, v in g["over_sgd"].items()}
                     for w, g in r["repeat"]["by_placement"].items()}
    near, far, mf = got["repeat2"]["near"], got["repeat"]["far"], got["repeat_mf"]["near"]
    assert (f"near: adaptive DC-ASGD 0.57 → {near['dc_adaptive']}, Gap-Aware 0.56 → "
            f"{near['gap_aware']}, constant DC-ASGD 0.75 → {near['dc']}; far: 0.64 → "
            f"{far['dc_adaptive']} and 0.64 → {far['gap_aware']}.") in text
    assert min(map(float, (near["dc_adaptive"], near["gap_aware"], far["dc_adaptive"],
                           far["gap_aware"]))) >= 0.7
    assert (f"adaptive DC-ASGD {mf['dc_adaptive']} and Gap-Aware {mf['gap_aware']} near, "
            f"under the momentum floor's {mf['momentum']}") in text
    one = json.loads((root / "rules_session55.json").read_text())["ratios"]
    ow = {k: f"{one[f'mf_{k}_one_worker_over_sgd']:.2f}"
          for k in ("dc_adaptive", "gap_aware", "momentum")}
    assert (f"({ow['dc_adaptive']} and {ow['gap_aware']}; momentum {ow['momentum']})"
            in text)


def test_session56_section_comes_from_the_committed_jsons():
    """Session 56's section (a fresh step touches no gap rows): its tables render
    rules_session56.json and rules_session56_repeat_mf.json, and every figure its text
    quotes is read from them (or from session 55's JSONs), so a rerun that moves them
    fails."""
    import json
    import statistics
    from pathlib import Path

    from hogkit.benchmarks import rules
    root = Path(__file__).resolve().parent.parent / "benchmarks"
    results = (root / "RESULTS.md").read_text()
    text = _results_words()
    r = json.loads((root / "rules_session56.json").read_text())
    rep = json.loads((root / "rules_session56_repeat_mf.json").read_text())
    for table in (rules.format_one_worker(r), rules.format_markdown(r),
                  rules.format_repeat(rep)):
        assert table in results
    assert rep["repeat"]["workload"] == "mf"
    now = r["ratios"]
    was = json.loads((root / "rules_session55.json").read_text())["ratios"]
    f = {k: (f"{was[f'mf_{k}_one_worker_over_sgd']:.2f}",
             f"{now[f'mf_{k}_one_worker_over_sgd']:.2f}")
         for k in ("dc_adaptive", "gap_aware", "dc", "momentum")}
    assert (f"adaptive DC-ASGD {' → '.join(f['dc_adaptive'])}, Gap-Aware "
            f"{' → '.join(f['gap_aware'])}, constant DC-ASGD {' → '.join(f['dc'])}; "
            f"momentum stays at {f['momentum'][1]}") in text
    assert f["momentum"][0] == f["momentum"][1]
    assert (f"mf's adaptive DC-ASGD and Gap-Aware steps ran at {f['dc_adaptive'][1]}x and "
            f"{f['gap_aware'][1]}x SGD's, from {f['dc_adaptive'][0]}x and "
            f"{f['gap_aware'][0]}x") in " ".join((root.parent / "CHANGELOG.md")
                                                 .read_text().split())
    ns = r["one_worker"]["mf"]["ns_per_sample"]
    assert f"{ns['dc_adaptive']:.1f} against {ns['sgd']:.1f} ns a sample" in text
    n55 = json.loads((root / "rules_session55.json").read_text())["one_worker"]["mf"][
        "ns_per_sample"]
    d = {k: (f"{n55[k]:.1f}", f"{ns[k]:.1f}") for k in ns}
    assert (f"they took {' → '.join(d['sgd'])} and {' → '.join(d['momentum'])} ns a "
            f"sample, about 8 % slower") in text
    drift = statistics.mean(ns[k] / n55[k] for k in ("sgd", "momentum"))
    assert round(100 * (drift - 1)) == 8
    assert (f"Adaptive DC-ASGD took {' → '.join(d['dc_adaptive'])} ns and Gap-Aware "
            f"{' → '.join(d['gap_aware'])}: with the host's 8 % taken out, about "
            f"{round(n55['dc_adaptive'] * drift - ns['dc_adaptive'])} and "
            f"{round(n55['gap_aware'] * drift - ns['gap_aware'])} ns a sample saved") in text
    assert rep["repeat"]["by_placement"] == rules.by_placement(rep["repeat"])
    runs = list(rep["repeat"]["rounds"])
    sgd = [g["sgd"]["samples_per_s"] / 1e6 for g in runs]
    assert f"ranged from {min(sgd):.2f} to {max(sgd):.2f} M samples/s" in text
    where = [rules.placement(g[k]) for g in runs for k in g["order"]]
    assert f"during {where.count('moved')} of its {len(where)} runs" in text
    slow = min(min(near_all) for near_all in (
        [g[k]["samples_per_s"] / 1e6 for g in runs if rules.placement(g[k]) == "near"]
        for k in ("dc_adaptive", "gap_aware")))
    assert f"(other near runs of the same rules ran as slow as {slow:.2f})" in text

    def near(rule, rounds):
        return sorted((g[rule]["samples_per_s"] / 1e6 for g in rounds
                       if rules.placement(g[rule]) == "near"), reverse=True)
    dca, ga, sg = near("dc_adaptive", runs), near("gap_aware", runs), near("sgd", runs)
    assert (f"adaptive DC-ASGD {dca[0]:.2f} and Gap-Aware {ga[0]:.2f} and {ga[1]:.2f} "
            f"M samples/s, against SGD's {sg[0]:.2f} and {sg[1]:.2f}") in text
    old = json.loads((root / "rules_session55_repeat_mf.json").read_text())["repeat"]
    best = max(near("dc_adaptive", old["rounds"]))
    assert (f"best adaptive DC-ASGD run was {best:.2f} against "
            f"{max(near('sgd', old['rounds'])):.2f}") in text
    assert max(dca[0] / sg[0], ga[0] / sg[0]) < 0.7          # "mf's part stays open"
    mf2 = json.loads((root / "rules_session56_repeat_mf2.json").read_text())["repeat"]
    lg = json.loads((root / "rules_session56_repeat.json").read_text())
    assert rules.format_repeat({"repeat": mf2}) in results and mf2["workload"] == "mf"
    assert rules.format_repeat(lg) in results and lg["repeat"]["workload"] == "logreg"
    low = min(g["sgd"]["samples_per_s"] / 1e6 for g in mf2["rounds"])
    assert f"down to {low:.2f} M samples/s in the second invocation" in text
    med = [x["by_placement"]["near"]["over_sgd"] for x in (rep["repeat"], mf2)]
    best = [x["best_over_sgd"] for x in (rep["repeat"], mf2)]
    pair = [f"{d['dc_adaptive']:.2f} and {d['gap_aware']:.2f}" for d in med + best]
    assert (f"{pair[0]} in the first, {pair[1]} in the second" in text
            and f"steadier reading here: {pair[2]}, then {pair[3]}." in text)
    assert max(max(d["dc_adaptive"], d["gap_aware"]) for d in best) < 0.7
    assert all(0.6 <= d[k] < 0.7 for d in best for k in ("dc_adaptive", "gap_aware"))
    assert "their best runs stay at about 0.65x SGD's best" in " ".join(
        (root.parent / "CHANGELOG.md").read_text().split())      # (the line above)
    near_lg, best_lg = lg["repeat"]["by_placement"]["near"]["over_sgd"], lg["repeat"][
        "best_over_sgd"]
    assert (f"near medians {near_lg['dc_adaptive']:.2f} (adaptive DC-ASGD) and "
            f"{near_lg['gap_aware']:.2f} (Gap-Aware), best runs "
            f"{best_lg['dc_adaptive']:.2f} and {best_lg['gap_aware']:.2f}.") in text
    assert min(near_lg["dc_adaptive"], near_lg["gap_aware"], best_lg["dc_adaptive"],
               best_lg["gap_aware"]) >= 0.7


def test_rules_repeat_part_keeps_every_run():
    """``hogkit bench rules --only repeat --quick``: every round holds each rule's run
    (samples/s, one figure per worker adding up to it, a mean update gap), the
    per-round ratios are those runs' quotients, and the table renders them."""
    from hogkit.benchmarks import rules
    from hogkit.errors import InvalidArgument
    out = rules.run(quick=True, only="repeat")
    rep = out["repeat"]
    assert len(rep["rounds"]) == 2
    for i, g in enumerate(rep["rounds"]):
        assert sorted(g["order"]) == ["gap_aware", "sgd"]
        for rule in g["order"]:
            run = g[rule]
            assert run["samples_per_s"] > 0 and run["gap_mean"] >= 0
            assert len(run["per_worker"]) == rules.WORKERS
            assert abs(sum(run["per_worker"]) - run["samples_per_s"]) <= (
                1e-9 * run["samples_per_s"])
        assert rep["over_sgd_each_round"]["gap_aware"][i] == (
            g["gap_aware"]["samples_per_s"] / g["sgd"]["samples_per_s"])
    assert out["ratios"]["logreg_gap_aware_over_sgd"] == rep["over_sgd"]["gap_aware"]
    fastest = {x: max(g[x]["samples_per_s"] for g in rep["rounds"]) for x in ("sgd", "gap_aware")}
    assert rep["best_over_sgd"] == {"gap_aware": fastest["gap_aware"] / fastest["sgd"]}
    probes = []                              # a hand-over time before and after each run
    for g in rep["rounds"]:
        for rule in g["order"]:
            ns = g[rule]["handover_ns"]
            assert len(ns) == 2 and all(v is None or v > 0 for v in ns)
            probes += ns
    assert any(v is not None for v in probes)    # None only when too busy to measure
    assert rep["by_placement"] == rules.by_placement(rep)
    assert rules.format_table(out).count("\n") == 6     # + a row per placement
    with pytest.raises(InvalidArgument, match="repeat"):
        rules.run(quick=True, only="nonesuch")
    with pytest.raises(InvalidArgument, match="mf or logreg"):
        rules.run(quick=True, only="repeat", workload="rnn")
    with pytest.raises(InvalidArgument, match="--only repeat"):
        rules.run(quick=True, workload="mf")


def test_runs_are_grouped_by_the_hand_over_times_measured_around_them():
    """rules.placement: near when both probes are under FAR_NS, far when both are over,
    else moved (a probe that failed too); by_placement: each rule's median over its
    runs in one placement against SGD's median there."""
    from hogkit.benchmarks import rules
    from hogkit.doctor import FAR_NS

    def run(sps, before, after):
        return {"samples_per_s": sps, "handover_ns": [before, after]}
    near, far = FAR_NS / 2, FAR_NS * 2
    assert rules.placement(run(1, near, near)) == "near"
    assert rules.placement(run(1, far, far)) == "far"
    assert rules.placement(run(1, near, far)) == "moved"
    assert rules.placement(run(1, None, near)) == "moved"
    assert rules.placement({"samples_per_s": 1}) == "moved"      # recorded without probes
    rep = {"rounds": [
        {"order": ["sgd", "ga"], "sgd": run(10, near, near), "ga": run(6, near, near)},
        {"order": ["ga", "sgd"], "sgd": run(3, far, far), "ga": run(2, far, far)},
        {"order": ["sgd", "ga"], "sgd": run(12, near, near), "ga": run(5, near, far)},
        {"order": ["ga", "sgd"], "sgd": run(4, far, near), "ga": run(7, near, near)}]}
    got = rules.by_placement(rep)
    assert got["near"] == {"runs": {"sgd": 2, "ga": 2}, "over_sgd": {"ga": 6.5 / 11}}
    assert got["far"] == {"runs": {"sgd": 1, "ga": 1}, "over_sgd": {"ga": 2 / 3}}
    rep["rounds"] = rep["rounds"][:1]
    rep["rounds"][0]["sgd"]["handover_ns"] = [far, far]
    assert rules.by_placement(rep)["near"]["over_sgd"] == {}     # no SGD run there


def _stalling_fit(path, X, k, threads, iters, eta, send):
    """A LIBMF fit's child that deadlocks (sleeps, using no CPU) on its first ``path``
    tries, counted in the file ``path``, then answers."""
    import time
    with open(path, "a+") as f:
        f.seek(0)
        tries = len(f.read()) + 1
        f.write("x")
    if tries <= k:
        time.sleep(600)
    send.send((0.5, X, X))
    send.close()


def test_a_deadlocked_libmf_fit_is_killed_and_run_again(tmp_path, monkeypatch):
    """``LibMF.fit``'s watchdog (cjlin1/libmf#12 hung a CI run): a child whose CPU time
    stops is killed and the fit run again, and one that stalls every try raises, naming
    the bug; no child is left behind."""
    import os

    import numpy as np

    from hogkit.benchmarks import peers
    from hogkit.procfs import children
    monkeypatch.setattr(peers, "_fit_child", _stalling_fit)
    monkeypatch.setattr(peers, "STALL_S", 0.5)
    before = children(os.getpid())          # a resource tracker, say, from earlier tests
    lib = object.__new__(peers.LibMF)
    X = np.ones((3, 3), np.float32)
    lib.path, lib.label = str(tmp_path / "once"), "stub"
    dt, P, Q = lib.fit(X, k=1, threads=1, iters=1, eta=0.1)      # stalls once, then answers
    assert dt == 0.5 and (tmp_path / "once").read_text() == "xx"
    np.testing.assert_array_equal(P, X)
    lib.path = str(tmp_path / "always")
    with pytest.raises(RuntimeError, match="libmf#12"):
        lib.fit(X, k=99, threads=1, iters=1, eta=0.1)
    assert (tmp_path / "always").read_text() == "x" * peers.FIT_TRIES
    assert children(os.getpid()) == before


def test_session52_peer_check_is_quoted_from_its_json():
    """Session 52's standing mf peer check (the LIBMF watchdog, the AMD host): its table
    renders the JSON and the prose's figures are the JSON's."""
    heading = "### The peers after session 52's LIBMF watchdog"
    r, text = _peer_section("peers_session52_default.json", heading)
    _assert_default_mf_prose(r, text)


def test_session57_peer_check_is_quoted_from_its_json():
    """Session 57's standing mf peer check: its table renders the JSON and the prose's
    figures are the JSON's."""
    r, text = _peer_section("peers_session57_default.json",
                            "### The peers at session 57's end")
    _assert_default_mf_prose(r, text)


def test_session56_peer_check_is_quoted_from_its_json():
    """Session 56's standing mf peer check: its table renders the JSON and the prose's
    figures are the JSON's."""
    r, text = _peer_section("peers_session56_default.json",
                            "### The peers at session 56's end")
    _assert_default_mf_prose(r, text)


def test_session55_review_peer_check_is_quoted_from_its_json():
    """The standing mf peer check after session 55's review: its table renders the JSON
    and the prose's figures are the JSON's."""
    r, text = _peer_section("peers_session55_final_default.json",
                            "### The peers after session 55's review")
    _assert_default_mf_prose(r, text)


def test_session55_peer_check_is_quoted_from_its_json():
    """Session 55's standing mf peer check: its table renders the JSON and the prose's
    figures are the JSON's (and session 54's, which it compares against)."""
    import json
    from pathlib import Path
    r, text = _peer_section("peers_session55_default.json",
                            "### The peers at session 55's end")
    _assert_default_mf_prose(r, text)
    old = json.loads((Path(__file__).resolve().parent.parent / "benchmarks"
                      / "peers_session54_default.json").read_text())
    assert f"Session 54 measured {old['ratios']['mf_default_rounds_sample1_over_plain']:.2f}" \
        in text
    now, then = (x["mf"]["default"]["rates"]["median"] for x in (r, old))
    assert (f"(median {now['plain'] / 1e6:.1f} M ratings/s against {then['plain'] / 1e6:.1f}),"
            f" hogkit's at {now['hogkit'] / 1e6:.1f} against {then['hogkit'] / 1e6:.1f}.") in text


def test_session54_peer_check_is_quoted_from_its_json():
    """Session 54's standing mf peer check: its table renders the JSON and the prose's
    figures are the JSON's."""
    heading = "### The peers at session 54's end"
    r, text = _peer_section("peers_session54_default.json", heading)
    _assert_default_mf_prose(r, text)
    old, _ = _peer_section("peers_session52_default.json",
                           "### The peers after session 52's LIBMF watchdog")
    half = r["ratios"]["mf_default_sample2_over_sample1"]
    assert 0.45 <= half < 0.55 and "ran at half its one worker's rate" in text
    assert f"session 52's ran at {old['ratios']['mf_default_sample2_over_sample1']:.2f}" in text


def _session57_figures():
    """Session 57's JSONs: the scenario and mf's two repeat parts on the 16-core Intel
    machine, the compiled loop's three runs on the AMD host (and the first version's run
    on the Intel machine), session 56's scenario and repeat parts (the AMD host)."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "benchmarks"

    def load(name):
        return json.loads((root / name).read_text())
    floors = [(f"AMD EPYC, 2 vCPUs, run {i + 1}", load(f"rules_floor_session57{s}.json"))
              for i, s in enumerate(("", "_2", "_3"))]
    reps = [load(f"rules_16cores/{f}")["repeat"] for f in ("rules_repeat_mf.json",
                                                             "rules_repeat_mf2.json")]
    amd = [load(f)["repeat"] for f in ("rules_session56_repeat_mf.json",
                                       "rules_session56_repeat_mf2.json")]
    return {"r": load("rules_16cores/rules.json"), "reps": reps, "floors": floors,
            "intel_floor": load("rules_16cores/rules_floor.json"),
            "amd": load("rules_session56.json"), "amd_reps": amd,
            "results": (root / "RESULTS.md").read_text()}


def test_session57_section_comes_from_the_committed_jsons():
    """Session 57's section (item 3 on the 16-core machine; what a compiled loop pays):
    its tables render the committed JSONs, and every figure its text quotes is read from
    them, so a rerun that moves them fails."""
    from hogkit.benchmarks import rules, rules_floor
    f = _session57_figures()
    r, reps, floors, amd = f["r"], f["reps"], f["floors"], f["amd"]
    text = _results_words()
    assert r["environment"]["cpus"] == 16 and "Intel" in r["environment"]["processor"]
    assert all(x[1]["environment"]["cpus"] == 2 for x in floors)
    for table in (rules.format_markdown(r), rules.format_one_worker(r),
                  rules.format_repeat({"repeat": reps[0]}),
                  rules.format_repeat({"repeat": reps[1]}),
                  rules_floor.format_markdown(floors)):
        assert table in f["results"]
    assert all(x["workload"] == "mf" and x["by_placement"] == rules.by_placement(x)
               for x in reps)

    def two(d, a="dc_adaptive", b="gap_aware"):
        return f"{d[a]:.2f}", f"{d[b]:.2f}"
    rr = {k.replace("_over_sgd", ""): v for k, v in r["ratios"].items()}
    m, lg = two(rr, "mf_dc_adaptive", "mf_gap_aware"), two(rr, "logreg_dc_adaptive",
                                                            "logreg_gap_aware")
    assert (f"mf adaptive DC-ASGD {m[0]}x and Gap-Aware {m[1]}x SGD, logreg {lg[0]}x and "
            f"{lg[1]}x.") in text
    assert min(map(float, m + lg)) >= 0.7                   # "met ... by the medians"
    mf = r["by_workload"]["mf"]
    per = {k: ", ".join(f"{g[k] / g['sgd']:.2f}" for g in mf["rounds"])
           for k in ("dc_adaptive", "gap_aware")}
    per = {k: v[::-1].replace(" ,", " dna ", 1)[::-1] for k, v in per.items()}
    assert (f"adaptive DC-ASGD {per['dc_adaptive']}, Gap-Aware {per['gap_aware']}."
            in text)
    o = [two(x["over_sgd"]) for x in reps]
    b = [two(x["best_over_sgd"]) for x in reps]
    assert (f"the median of every round's ratio {o[0][0]} and {o[0][1]}, then {o[1][0]} and "
            f"{o[1][1]}; best runs over SGD's best {b[0][0]} and {b[0][1]}, then {b[1][0]} "
            f"and {b[1][1]}.") in text
    one = two(rr, "mf_dc_adaptive_one_worker", "mf_gap_aware_one_worker")
    was = two({k.replace("_over_sgd", ""): v for k, v in amd["ratios"].items()},
              "mf_dc_adaptive_one_worker", "mf_gap_aware_one_worker")
    assert (f"adaptive DC-ASGD {one[0]}x and Gap-Aware {one[1]}x SGD here, {was[0]}x and "
            f"{was[1]}x on the AMD host") in text
    ns = {h: d["one_worker"]["mf"]["ns_per_sample"] for h, d in (("i", r), ("a", amd))}
    extra = {h: [n[k] - n["sgd"] for k in ("dc_adaptive", "gap_aware")] for h, n in ns.items()}
    assert (f"each adds {extra['i'][0]:.1f} and {extra['i'][1]:.1f} ns a sample to SGD's "
            f"{ns['i']['sgd']:.1f}, there {extra['a'][0]:.1f} and {extra['a'][1]:.1f} to "
            f"{ns['a']['sgd']:.1f}") in text
    live = {h: d["by_workload"]["mf"]["workers"] * 1e9
            / d["by_workload"]["mf"]["samples_per_s"]["sgd"] for h, d in (("i", r), ("a", amd))}
    assert (f"each of two workers took {live['i']:.1f} ns a sample of SGD here against "
            f"{ns['i']['sgd']:.1f} alone, about 1.5x as long; on the AMD host "
            f"{live['a']:.1f} against {ns['a']['sgd']:.1f}") in text
    assert round(live["i"] / ns["i"]["sgd"], 1) == 1.5
    lm = two(amd["by_workload"]["mf"]["over_sgd"])
    assert f"session 56's live medians {lm[0]} and {lm[1]}, best runs about 0.65" in text
    assert all(0.6 <= x["best_over_sgd"][k] < 0.7 for x in f["amd_reps"]
               for k in ("dc_adaptive", "gap_aware"))


def test_session57_loop_figures_come_from_the_committed_jsons():
    """Session 57's section, the compiled loop's part: what it adds to SGD against what
    hogkit's rules add, its per-round ratios, the first version's Intel run."""
    f = _session57_figures()
    floors, text = f["floors"], _results_words()
    ns = f["amd"]["one_worker"]["mf"]["ns_per_sample"]
    extra = [ns[k] - ns["sgd"] for k in ("dc_adaptive", "gap_aware")]
    t1 = [x[1]["threads"]["1"]["ns_per_rating"] for x in floors]

    def adds(v):
        xs = [f"{d[v] - d['sgd']:.1f}" for d in t1]
        return f"{xs[0]}, {xs[1]} and {xs[2]}"
    assert (f"adds {adds('state_copies')} ns a rating to SGD's, and its `general` shape "
            f"{adds('general')}; hogkit's adaptive DC-ASGD and Gap-Aware add "
            f"{extra[0]:.1f} and {extra[1]:.1f} ns a sample") in text
    lo = min(d["state_copies"] - d["sgd"] for d in t1)
    hi = max(d["general"] - d["sgd"] for d in t1)
    assert lo <= min(extra) and max(extra) <= hi      # "about what ... costs"

    def top(n, v):
        return max(max(x[1]["threads"][n]["over_sgd_each_round"][v]) for x in floors)
    assert (f"`state_copies` at most {top('1', 'state_copies'):.2f}x with one thread and "
            f"{top('2', 'state_copies'):.2f}x with two, `general` {top('1', 'general'):.2f}x "
            f"and {top('2', 'general'):.2f}x (the state rows alone: {top('1', 'state'):.2f}x "
            f"and {top('2', 'state'):.2f}x)") in text
    assert max(top(n, v) for n in "12" for v in ("state_copies", "general")) < 0.7
    sgd = [d["sgd"] for d in t1]
    assert (f"The loop's SGD is {min(sgd):.1f}-{max(sgd):.1f} ns a rating against "
            f"hogkit's {ns['sgd']:.1f}") in text
    gap = [x[1]["threads"][n]["over_sgd"][v] for x in floors for n in "12"
           for v in ("state_copies", "general")]
    assert f"down to {min(gap):.2f}x-{max(gap):.2f}x of its SGD's here" in text
    for x in floors:                                     # "it changed little"
        for t in x[1]["threads"].values():
            for by in t["by_prefetch"].values():
                assert max(by.values()) / min(by.values()) < 1.1
    oi = f["intel_floor"]["threads"]
    words = "no one two three four five six seven".split()

    def each(n, v):
        return [s / x for s, x in zip(oi[n]["rounds"]["sgd"], oi[n]["rounds"][v])]
    assert (f"gave one thread {oi['1']['over_sgd']['state_copies']:.2f}x (`state_copies`) and "
            f"{oi['1']['over_sgd']['general']:.2f}x (`general`), two threads "
            f"{oi['2']['over_sgd']['state_copies']:.2f}x and "
            f"{oi['2']['over_sgd']['general']:.2f}x, "
            f"`state_copies` at or above 0.7x in "
            f"{words[sum(x >= 0.7 for x in each('2', 'state_copies'))]}"
            f" of {words[len(each('2', 'state_copies'))]} rounds") in text
    c = [f"{d['state_copies']:.1f}" for d in t1]
    assert f"moved between the three runs ({c[0]}, {c[1]} and {c[2]} ns)" in text


def test_the_floor_program_runs_every_variant_and_its_driver_reads_it(tmp_path):
    """benchmarks/rules_floor: the C++ program builds and prints a figure per variant,
    prefetch setting and round for 1 and 2 threads on mf's default preset, and the
    driver takes each variant's faster setting per round, their medians, and the
    median of the per-round ratios to SGD (not the ratio of the medians)."""
    import shutil
    import subprocess

    from hogkit.benchmarks import rules_floor as rf
    fake = ("sgd/0 10 20 30\nsgd/8 12 25 20\nstate/0 20 20 90\nstate/8 30 40 100\n"
            "state_copies/0 40 40 40\nstate_copies/8 50 50 50\ngeneral/0 5 40 60\n"
            "general/8 5 50 70\ncheck 1\n")
    s = rf.summarise(rf.parse(fake))
    assert s["best"]["sgd"] == [10, 20, 20]
    assert s["ns_per_rating"] == {"sgd": 20, "state": 20, "state_copies": 40, "general": 40}
    assert s["over_sgd_each_round"]["state"] == [0.5, 1.0, 20 / 90]
    assert s["over_sgd"] == {"state": 0.5, "state_copies": 0.5, "general": 0.5}
    assert s["by_prefetch"]["sgd"] == {"0": 20, "8": 20}
    for bad in ("sgd/0 1\n", fake.replace("general/8 5 50 70", "general/8 5 50")):
        with pytest.raises(RuntimeError, match="no figures"):
            rf.parse(bad)
    if shutil.which("g++") is None:
        pytest.skip("no g++ on PATH")
    rf._data(str(tmp_path))
    exe = str(tmp_path / "floor")
    subprocess.run(["g++", *rf.FLAGS, "-o", exe, rf.SOURCE], check=True)
    for n in (1, 2):
        out = subprocess.run([exe, str(tmp_path), str(n), "2", "50"], check=True,
                             capture_output=True, text=True, timeout=120).stdout
        got = rf.parse(out)
        assert set(got) == set(rf.VARIANTS)
        assert all(len(x) == 2 and all(t > 0 for t in x) for d in got.values()
                   for x in d.values())
    bad = subprocess.run([exe, str(tmp_path / "nowhere"), "1", "1", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_the_architecture_quotes_session57s_floor_from_its_jsons():
    """docs/architecture.md's note on mf's gap rules quotes the loop's JSONs and the
    16-core machine's live ratios."""
    import statistics
    from pathlib import Path
    f = _session57_figures()
    arch = " ".join((Path(__file__).resolve().parent.parent / "docs" / "architecture.md")
                    .read_text().split())
    spared = []
    for _, x in f["floors"]:
        best = x["threads"]["1"]["best"]
        spared.append(statistics.median(g - c for g, c in zip(best["general"],
                                                                best["state_copies"])))
    assert f"at {min(spared):.1f}-{max(spared):.1f} ns a rating with one thread" in arch
    live = sorted(f["r"]["ratios"][f"mf_{k}_over_sgd"] for k in ("dc_adaptive", "gap_aware"))
    assert f"reach {live[0]:.2f}-{live[1]:.2f}x SGD on a 16-core Intel machine" in arch
    assert "about 0.65x on the 2-vCPU AMD host" in arch       # session 56's best runs
    assert all(0.6 <= x["best_over_sgd"][k] < 0.7 for x in f["amd_reps"]
               for k in ("dc_adaptive", "gap_aware"))
