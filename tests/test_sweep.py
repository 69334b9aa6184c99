"""hogkit.sweep / ``hogkit sweep``: grids into one table, resumable, checked up front."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hogkit import sweep
from hogkit.errors import InvalidArgument, InvalidType
from hogkit.sweeps import aggregate, cells, load, plot
from hogkit.sweeps import tune as sweep_tune

HOT = {"workload": "mf", "o.preset": "hot", "steps": 1500}


def test_cells_are_the_product_of_each_part_and_the_union_of_parts():
    grid = [{"rule": ["sgd"], "lr": [0.1, 0.2]}, {"rule": ["dc-asgd"], "lr": [0.1]},
            {"rule": ["sgd"], "lr": [0.1]}]                       # a repeat: once
    got = cells(grid, base={"seed": 3})
    assert got == [{"seed": 3, "rule": "sgd", "lr": 0.1}, {"seed": 3, "rule": "sgd", "lr": 0.2},
                   {"seed": 3, "rule": "dc-asgd", "lr": 0.1}]
    with pytest.raises(InvalidType, match="list of values"):
        cells({"lr": 0.1})
    with pytest.raises(InvalidType, match="list of values"):
        cells({"policy": "bsp"})


def test_every_cell_is_checked_before_the_first_runs(tmp_path):
    out = tmp_path / "t.jsonl"
    with pytest.raises(InvalidArgument, match="unknown sweep knob"):
        sweep({"seed": [0, 1]}, base={**HOT, "colour": "red"}, out=out)
    with pytest.raises(InvalidArgument, match="policy"):
        sweep({"policy": ["async", "ssp:x"]}, base=HOT, out=out)
    with pytest.raises(InvalidArgument, match="density"):
        sweep({"density": [0.5, "half"]}, base=HOT, out=out)
    with pytest.raises(InvalidArgument, match="simulated cells only"):
        sweep({"seed": [0]}, base={**HOT, "delays": "constant:1e-3"}, mode="live", out=out)
    with pytest.raises(InvalidArgument, match="engine"):
        sweep({"engine": ["python", "gpu"]}, base=HOT, out=out)
    with pytest.raises(InvalidArgument, match="RANK:load"):
        sweep({"straggler": ["1:load:2"]}, base=HOT, mode="live", out=out)
    assert not out.exists()


def test_the_engine_knob_picks_the_step_and_both_give_the_same_run():
    fused, python = sweep({"engine": ["compiled", "python"]}, base=HOT)
    assert (fused["engine"], python["engine"]) == ("compiled", "python")
    assert fused["final_loss"] == python["final_loss"]


def test_a_simulated_sweep_resumes_without_redoing_cells(tmp_path):
    out = tmp_path / "t.jsonl"
    first = sweep({"workers": [1, 4], "seed": [0, 1]}, base=HOT, out=out)
    assert [(r["workers"], r["seed"]) for r in first] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    r = first[2]
    assert r["mode"] == "sim" and r["updates"] == 1500 and r["final_loss"] < r["initial_loss"]
    assert r["gap_mean"] > 0 and first[0]["gap_mean"] == 0         # 1 worker: no staleness
    assert r["curve"][0][1] == 0 and r["curve"][-1][1] == 1500
    # the same sweep, grown by a seed: only the two new cells run and are appended
    again = sweep({"workers": [1, 4], "seed": [0, 1, 2]}, base=HOT, out=out)
    lines = out.read_text().splitlines()
    assert len(lines) == 6 and len(again) == 6
    assert [json.loads(x) for x in lines[:4]] == first
    # a torn last line (a SIGKILL mid-write) is skipped, and that cell runs again
    with open(out, "a") as f:
        f.write('{"key": "half a li')
    assert len(load(out)) == 6


def test_a_diverging_cell_is_a_row_not_a_crash(tmp_path):
    # SGD: mf's default rule (row-wise AdaGrad) scales its steps to lr, so it ends far
    # off at lr 1e6 but finite
    rows = sweep({"lr": [0.01, 1e6]}, base={**HOT, "rule": "sgd"}, out=tmp_path / "t.jsonl")
    ok, bad = rows
    assert not ok["diverged"] and ok["final_loss"] is not None
    assert bad["diverged"] and bad["final_loss"] is None and "non-finite" in bad["error"]
    # finite (or skipped) gradients, overflowing parameters: a diverged row too, never an
    # inf/nan that JSON cannot hold (it crashed a sweep once)
    over, = sweep({"lr": [1.0]}, base={**HOT, "rule": "sgd", "nonfinite": "skip"},
                  out=tmp_path / "t.jsonl")
    assert over["diverged"] and "overflowed" in over["error"]
    assert load(tmp_path / "t.jsonl")[-1] == over


@pytest.mark.process
def test_a_live_cell_whose_worker_hits_a_non_finite_gradient_is_a_diverged_row():
    """The worker's NonFiniteGradient reaches the parent as WorkerFailed; the sweep tells
    it from other failures by the worker's exception type (WorkerFailed.cause)."""
    bad, = sweep({"lr": [1e6]}, base={**HOT, "rule": "sgd", "workers": 2}, mode="live")
    assert bad["diverged"] and bad["final_loss"] is None and bad["mode"] == "live"


def test_aggregate_and_plot_mean_and_std_over_seeds(tmp_path):
    rows = [{"workers": w, "rule": r, "seed": s, "final_loss": w + s + (r == "b")}
            for w in (1, 2) for r in ("a", "b") for s in (0, 1, 2)]
    rows.append({"workers": 2, "rule": "a", "seed": 3, "final_loss": None})
    agg = aggregate(rows, "final_loss", ("rule", "workers"))
    assert agg[("a", 1)] == (2.0, 1.0, 3)
    assert agg[("b", 2)] == (4.0, 1.0, 3)
    png = tmp_path / "p.png"
    plot(rows, "workers", "final_loss", line="rule", path=str(png))
    assert png.stat().st_size > 1000


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.process
@pytest.mark.faults
@pytest.mark.timeout(120)
def test_sigint_before_any_worker_runs_stops_a_background_command(tmp_path):
    """A SIGINT while the command is still setting up (no supervisor yet), to a process
    that inherited SIGINT ignored, stops it with 130 and leaves nothing behind."""
    out = str(tmp_path / "early.jsonl")
    p = subprocess.Popen([sys.executable, "-m", "hogkit.cli", "sweep", "--mode", "live",
                          "--out", out, "--grid", "seed=0,1", "--set", "o.preset=hot",
                          "--set", "seconds=1.0", "--set", "workers=2", "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_ignore_sigint)
    header = p.stderr.readline()          # printed before the first cell is built
    assert "cells" in header, header
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=60)
    assert rc == 130, (rc, header, p.stderr.read())
    assert len(load(out)) < 2
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"hogkit_{p.pid}_")]


@pytest.mark.process
@pytest.mark.faults
@pytest.mark.timeout(240)
def test_sigint_leaves_a_valid_partial_table_and_a_rerun_finishes_it(tmp_path):
    out = str(tmp_path / "live.jsonl")
    args = [sys.executable, "-m", "hogkit.cli", "sweep", "--mode", "live", "--out", out,
            "--grid", "seed=0,1,2,3", "--set", "o.preset=hot", "--set", "seconds=1.5",
            "--set", "workers=2", "--no-progress"]
    # started as a background launcher starts it (SIGINT inherited ignored: CI's own
    # `cmd &` does that, and Python then installs no KeyboardInterrupt), so a SIGINT
    # landing between cells, outside a run's supervisor, is a real test of the CLI
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_ignore_sigint)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not load(out) and p.poll() is None:
        time.sleep(0.05)
    assert len(load(out)) >= 1, p.stderr.read() if p.poll() is not None else "no row"
    # one Ctrl-C, wherever it lands (a cell running, its workers spawning or being
    # stopped, between cells), stops the sweep with 130
    seen, finished = len(load(out)), p.poll() is not None
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=60)
    assert rc == 130, (f"rc {rc}; {seen} rows and the sweep "
                       f"{'already finished' if finished else 'running'} at the SIGINT; "
                       f"{p.stderr.read()}")
    done = load(out)
    assert 1 <= len(done) < 4 and all(r["mode"] == "live" for r in done)
    with open(out) as f:                     # every line whole
        assert [json.loads(x) for x in f] == done
    r = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    rows = load(out)
    assert [x["seed"] for x in rows] == [x["seed"] for x in done] + sorted(
        {0, 1, 2, 3} - {x["seed"] for x in done})
    assert rows[:len(done)] == done
    mine = f"hogkit_{p.pid}_"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(mine)]


def _is_bracketed(group):
    """A worse lr was tried on each side of the best (by the mean over seeds)."""
    tried = group["tried"]
    lrs = sorted(tried)
    i = lrs.index(group["lr"])
    return 0 < i < len(lrs) - 1


def test_tune_widens_the_grid_until_the_best_lr_is_bracketed(tmp_path):
    """Each group starts from two lrs next to each other; tune adds lrs past whichever
    edge holds the best until a worse lr lies on both sides, or says which edge it
    stopped at after `extend` additions. The rows of every run are in the file."""
    out = tmp_path / "tune.jsonl"
    got = sweep_tune({"rule": ["sgd", "gap-aware"], "lr": [0.0125, 0.025], "seed": [0, 1]},
                     base={**HOT, "workers": 4}, out=out, extend=4)
    assert [g["cell"]["rule"] for g in got] == ["sgd", "gap-aware"]
    for g in got:
        assert g["n"] == 2 and len(g["tried"]) >= 3
        assert g["bracketed"] == _is_bracketed(g)
        if g["bracketed"]:
            assert g["bound"] is None
            assert all(m is None or m >= g["mean"] for m in g["tried"].values())
        else:
            assert g["extended"][g["bound"]] == 4
    assert any(g["bracketed"] for g in got)
    rows = load(out)
    assert len(rows) == 2 * sum(len(g["tried"]) for g in got)
    assert {(r["rule"], r["lr"]) for r in rows} == {
        (g["cell"]["rule"], lr) for g in got for lr in g["tried"]}
    # resumable: the same call runs nothing new and gives the same answer
    again = sweep_tune({"rule": ["sgd", "gap-aware"], "lr": [0.0125, 0.025],
                        "seed": [0, 1]}, base={**HOT, "workers": 4}, out=out, extend=4)
    assert again == got and len(load(out)) == len(rows)


def test_tune_records_the_bound_it_hit_and_never_climbs_past_divergence(tmp_path):
    low = sweep_tune({"lr": [1e-5, 2e-5]}, base=HOT, extend=1)[0]
    assert not low["bracketed"] and low["bound"] == "high"
    assert sorted(low["tried"]) == [1e-5, 2e-5, 4e-5] and low["extended"]["high"] == 1
    # a grid that diverges everywhere is widened downwards only
    div = sweep_tune({"lr": [1e6]}, base={**HOT, "rule": "sgd"}, extend=2)[0]
    assert div["extended"]["high"] == 0 and min(div["tried"]) < 1e6


def test_tune_refuses_what_it_cannot_tune():
    with pytest.raises(InvalidArgument, match="numeric lr"):
        sweep_tune({"seed": [0, 1]}, base=HOT)
    with pytest.raises(InvalidArgument, match="factor"):
        sweep_tune({"lr": [0.1]}, base=HOT, factor=1.0)
    with pytest.raises(InvalidArgument, match="extend"):
        sweep_tune({"lr": [0.1]}, base=HOT, extend=-1)


def test_cli_sweep_tune_prints_each_group_and_its_bracket(tmp_path):
    out = str(tmp_path / "t.jsonl")
    r = subprocess.run([sys.executable, "-m", "hogkit.cli", "sweep", "--tune", "--out", out,
                        "--grid", "lr=0.0125,0.025", "--set", "o.preset=hot",
                        "--set", "steps=1500", "--tune-extend", "1", "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "bracketed" in r.stdout and "lrs tried" in r.stdout
    row = [x for x in r.stdout.splitlines() if x.strip() and x.split()[0][0].isdigit()]
    assert len(row) == 1 and ("yes" in row[0] or "no (" in row[0])
