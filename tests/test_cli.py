"""The command line: exit codes, results folder, summary keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import hogkit
from hogkit.cli import main

pytestmark = pytest.mark.process


def test_run_writes_results(tmp_path, capsys):
    out = tmp_path / "r"
    code = main(["run", "--workload", "logreg", "--steps", "3000", "--no-progress",
                 "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["updates"] == 3000
    assert summary["engine"] == "compiled"
    assert summary["final_loss"] < summary["initial_loss"]
    assert (out / "events.jsonl").exists() and (out / "checkpoint.npz").exists()
    assert (out / "loss.png").exists() and (out / "staleness.png").exists()
    printed = capsys.readouterr().out
    assert "update gap" in printed and str(out) in printed
    assert "compiled engine" in printed


@pytest.mark.parametrize("extra,rule,order", [
    ([], "AdaGrad lr 0.2 (initial_accumulator_value 1, rowwise)", "blocks"),
    (["--lr", "0.1"], "AdaGrad lr 0.1 (initial_accumulator_value 1, rowwise)", "blocks"),
    (["--rule", "sgd", "-o", "order=sweep"], "SGD lr 0.05", None),
])
def test_run_takes_the_lane_defaults_and_says_which(tmp_path, capsys, extra, rule, order):
    """``hogkit run`` takes mf's defaults: row-wise AdaGrad, the block order and the
    per-sample lane unless told otherwise (--lr alone sets the default rule's lr), and
    the summary's rule line says what ran, its defaults line what was taken and why."""
    out = tmp_path / "r"
    assert main(["run", "--steps", "200", "--no-progress", "-o", "preset=hot", "--out",
                 str(out), *extra]) == 0
    cfg = json.loads((out / "summary.json").read_text())["config"]
    assert cfg["lane"] == "sample"
    assert cfg["workload_config"].get("order") == order
    printed = capsys.readouterr().out
    assert f"rule         {rule}" + (f", order {order}" if order else "") + "\n" in printed
    taken = "rule, batch" if not extra else "batch"
    assert f"defaults     {taken} by default (LIBMF's row-wise AdaGrad" in printed


def test_run_takes_the_engine_asked_for(tmp_path):
    out = tmp_path / "r"
    assert main(["run", "--workload", "logreg", "--steps", "600", "--no-progress",
                 "--engine", "python", "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["engine"] == "python"
    # the compiled core cannot run per-shard staleness: asked for, that is an error
    assert main(["run", "--workload", "logreg", "--steps", "600", "--no-progress",
                 "--engine", "compiled", "--shards", "4", "--out", str(out)]) == 2


@pytest.mark.parametrize("argv", [
    ["run", "--workers", "0"],
    ["run", "--workload", "resnet"],
    ["run", "--steps", "10", "--seconds", "1"],
])
def test_bad_usage_exits_2(argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_a_flag_the_rule_cannot_use_is_refused(capsys, tmp_path):
    assert main(["run", "--rule", "dc-asgd", "--momentum", "0.9", "--steps", "10",
                 "--out", str(tmp_path)]) == 2
    assert "dc-asgd has no momentum term" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["ssp:-1", "nonsense", "dssp:5:1"])
def test_bad_policy_exits_2_with_a_clear_message(policy, capsys, tmp_path):
    assert main(["run", "--policy", policy, "--steps", "10", "--out", str(tmp_path)]) == 2
    assert "hogkit run:" in capsys.readouterr().err


def test_report_redraws_plots(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--workload", "mf", "--steps", "400", "--no-progress",
                 "--out", str(out)]) == 0
    (out / "loss.png").unlink()
    assert main(["report", str(out)]) == 0
    assert (out / "loss.png").exists()
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_console_script_help():
    res = subprocess.run([sys.executable, "-m", "hogkit.cli", "--help"], capture_output=True,
                         text=True)
    assert res.returncode == 0 and "run" in res.stdout


def test_sim_runs_64_virtual_workers(tmp_path, capsys):
    out = tmp_path / "s"
    code = main(["sim", "--workload", "logreg", "--workers", "64", "--steps", "640",
                 "--policy", "ssp:2", "--rule", "staleness-aware", "--batch", "4",
                 "--straggler", "3:4", "--delays", "lognormal:1e-3:0.5", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "64 virtual workers" in printed and "(simulated)" in printed
    s = json.loads((out / "summary.json").read_text())
    assert s["simulated"] and s["workers"] == 64
    assert s["staleness"]["clock_lag"]["max"] <= 2
    assert main(["sim", "--batch", "adaptive", "--steps", "10", "--out", str(out)]) == 2


def test_sim_is_deterministic_through_the_cli(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert main(["sim", "--workload", "mf", "--workers", "16", "--steps", "2000",
                     "--out", str(d)]) == 0
    from hogkit.engine.simulator import strip_wall
    sa, sb = (strip_wall(json.loads((d / "summary.json").read_text())) for d in (a, b))
    for s in (sa, sb):
        s["config"].pop("environment", None)
    assert sa == sb


@pytest.mark.parametrize("argv, words", [
    (["run", "--out", "/proc/nope/results", "--steps", "100"], "cannot create"),
    (["sim", "--out", "/proc/nope", "--steps", "100"], "cannot create"),
    (["run", "--workload", "rnn", "-o", "activation=gelu", "--steps", "100"], "activation"),
    (["run", "--workload", "rnn", "-o", "nonsense", "--steps", "100"], "KEY=VALUE"),
    (["run", "--policy", "ssp:-1", "--steps", "100"], "s=-1"),
])
def test_usage_errors_exit_2_with_one_line_and_create_nothing(tmp_path, argv, words,
                                                             capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from hogkit.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert "results in" not in err[0]
    assert list(tmp_path.iterdir()) == []


def test_bench_json_records_the_machine(tmp_path, capsys):
    """A benchmark's raw figures say which processor and versions made them (float
    results and speeds differ between processors)."""
    from hogkit.report import environment
    out = tmp_path / "instrumentation.json"
    assert main(["bench", "instrumentation", "--quick", "--json", str(out)]) == 0
    env = json.loads(out.read_text())["environment"]
    assert env["processor"] == environment()["processor"] and env["processor"]
    assert env["numpy"] and env["hogkit"]


def test_version_and_the_simulate_alias(capsys):
    from hogkit import __version__
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"hogkit {__version__}"
    assert main(["simulate", "--workload", "mf", "-o", "preset=hot", "--workers", "3",
                 "--steps", "60", "--no-progress"]) == 0
    assert "simulated" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "sim"])
def test_help_shows_the_defaults(command, capsys):
    """Every option with a value for a default says it in ``--help`` (once)."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("worker processes (default: 2)",
                  "the initial model and the sampling (default: 0)",
                  "gap-aware (default: 0.0)"):
        assert shown in text
    assert "(default: None)" not in text and "(default: [])" not in text
    assert "(default: mf, generated matrix factorisation) (default" not in text


@pytest.mark.parametrize("argv, words", [
    (["bench", "lane", "--presets", "tiny"], "pick from"),
    (["bench", "lane", "--presets", ","], "pick from"),
    (["bench", "kernels", "--presets", "default"], "takes no --presets"),
])
def test_bench_presets_are_checked_before_anything_runs(argv, words, capsys):
    """``--presets`` names mf presets, for the scenarios that take them; anything else
    is refused with the choices before a benchmark starts."""
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_bench_presets_reach_the_scenario(capsys):
    assert main(["bench", "lane", "--quick", "--presets", "default"]) == 0
    out = capsys.readouterr().out                 # (--quick alone takes "hot")
    assert "default" in out and "hot" not in out


@pytest.mark.parametrize("density, config", [
    ("topk:0.5", {"fraction": 0.5, "how": "topk", "residual": True, "every": 1}),
    ("0.25", {"fraction": 0.25, "how": "topk", "residual": True, "every": 1}),
    ("random:0.5", {"fraction": 0.5, "how": "random", "residual": True, "every": 1}),
    ("random:0.25:dropped", {"fraction": 0.25, "how": "random", "residual": False,
                             "every": 1}),
    ("every:4", {"fraction": 1.0, "every": 4}),
    ("1.0", None),
])
def test_run_takes_every_density_form_the_parser_takes(tmp_path, density, config):
    """``--density`` is read by :func:`hogkit.parse.parse_density`, the parser a sweep
    and Python use: every form it takes runs from the command line (``topk:0.5`` used
    to be refused by argparse, which took a float only)."""
    out = tmp_path / "r"
    assert main(["run", "--workload", "mf", "-o", "preset=hot", "--steps", "400",
                 "--density", density, "--no-progress", "--out", str(out)]) == 0
    got = json.loads((out / "summary.json").read_text())["config"]["density"]
    if config is None:
        assert got is None
    else:
        assert {k: got[k] for k in config} == config


@pytest.mark.parametrize("density", ["half", "topk", "topk:x", "every:2.5"])
def test_a_bad_density_exits_2_naming_the_forms(tmp_path, density, capsys):
    assert main(["run", "--density", density, "--steps", "10", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert density in err and "topk:F" in err


@pytest.mark.parametrize("argv, words", [
    (["--nodes", "2"], "--backend ray"),
    (["--schedule", "p3"], "--backend ray"),
    (["--backend", "ray", "--on-failure", "restart"], "--on-failure restart"),
    (["--backend", "ray", "--checkpoint-every", "5"], "--checkpoint-every"),
])
def test_cluster_flags_are_checked_before_anything_starts(tmp_path, argv, words, capsys,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--steps", "100", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_run_says_each_stage_on_stderr_when_it_is_not_a_terminal(tmp_path, capsys):
    """Into a log (stderr not a terminal) a run prints one line per stage, in order,
    each with its time; --no-progress silences them."""
    import re
    out = tmp_path / "r"
    assert main(["run", "--workload", "logreg", "--steps", "2000", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    stages = [m.group(1) for m in re.finditer(r"^\[\s*[0-9.]+ s\] (\w+)", err, re.M)]
    assert stages == ["building", "compiling", "kernels", "starting", "training",
                      "training"], err
    assert main(["run", "--workload", "logreg", "--steps", "2000", "--no-progress",
                 "--out", str(tmp_path / "q")]) == 0
    assert "[" not in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.process
def test_a_cold_first_run_says_what_it_prepares_before_it_compiles(tmp_path):
    """Issue 28: a first run (an empty numba cache) sat silent for ~40-60 s. Its first
    lines now say what it is doing before numba starts compiling (stopped there: the
    compile itself is what ``hogkit bench coldstart`` times)."""
    import os
    import signal
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hogkit.cli", "run",
         "--seconds", "1", "--out", str(tmp_path / "r")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stderr.readline() for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and "interrupted by SIGTERM" in err, err
    assert lines[0].startswith("hogkit run: mf with 2 workers"), lines
    assert "building the mf workload" in lines[1], lines
    assert "compiling" in lines[2] and "numba's cache" in lines[2], lines
    assert proc.returncode == 143    # SIGTERM while compiling: its status, no traceback


def test_an_out_folder_that_holds_a_run_is_refused_unless_overwrite(tmp_path, capsys):
    """Issue 27, item 6: a reused --out silently overwrote the summary and checkpoint and
    appended a second run to events.jsonl. Now: exit 2 with the fixes, nothing touched;
    --overwrite replaces the run (its events hold one run)."""
    out = tmp_path / "r"
    argv = ["run", "--workload", "logreg", "--steps", "2000", "--no-progress", "--out",
            str(out)]
    assert main(argv) == 0
    before = (out / "summary.json").read_text()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert (out / "summary.json").read_text() == before
    assert main(argv + ["--overwrite"]) == 0
    starts = [json.loads(x)["type"] for x in (out / "events.jsonl").read_text().splitlines()]
    assert starts.count("start") == 1


def test_a_second_run_into_a_folder_being_written_is_refused(tmp_path):
    """The lock file: while one run writes to a folder, another is refused naming the
    holder's pid (here the test holds it)."""
    import os

    from hogkit import train
    from hogkit.engine.live import out_lock
    from hogkit.errors import InvalidArgument
    out = tmp_path / "r"
    out.mkdir()
    with out_lock(str(out)):
        with pytest.raises(InvalidArgument, match=rf"another run \(pid {os.getpid()}\)"):
            train("logreg", steps=100, outputs=hogkit.Outputs(str(out), progress=False))
    assert not (out / "events.jsonl").exists()
    train("logreg", steps=100, outputs=hogkit.Outputs(str(out), progress=False))  # released


def test_bench_help_describes_every_scenario(capsys):
    """``hogkit bench --help`` lists each scenario with its one-line description (its
    module docstring's first sentence), so a newcomer can pick one."""
    from hogkit.cli import BENCH_SCENARIOS, _scenario_lines
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    lines = _scenario_lines()
    assert set(lines) == set(BENCH_SCENARIOS)
    for name, description in lines.items():
        assert len(description) > 20 and "``" not in description, name
        assert f"  {name:<16}{description}" in text


def test_library_messages_reach_the_cli_in_flag_words():
    from hogkit.cli import cli_words
    flags = {"--lane", "--engine", "--batch", "--policy"}
    assert (cli_words("lane='sample' cannot run this: x; use lane='batch' or "
                      "engine='python'", flags)
            == "--lane sample cannot run this: x; use --lane batch or --engine python")
    assert cli_words("batch=0 must be >= 1", flags) == "--batch 0 must be >= 1"
    assert cli_words("rank=0 must be >= 1", flags) == "rank=0 must be >= 1"  # not a flag
    assert cli_words("use Async() for unbounded, or SSP(3)", flags) == \
        "use --policy async for unbounded, or --policy ssp:3"


@pytest.mark.parametrize("where, name, args", [
    ("hogkit.cluster.node", "NodeFailed", (1, "node 1's process died")),
    ("hogkit.cluster.backend", "ShardFailed", ("shard 0 died",)),
    ("hogkit.cluster.backend", "ClusterTimeout", ("no answer within 60 s",)),
    ("hogkit.errors", "CheckpointDamaged", ("not a readable checkpoint",)),
    ("hogkit.errors", "OutputFailed", (28, "cannot write events.jsonl: the disk is full")),
    ("hogkit.errors", "EnvironmentProblem", ("no /dev/shm",)),
])
def test_a_failed_run_is_exit_1_and_bad_usage_exit_2(where, name, args, capsys):
    """The exit-code table's line between 1 and 2: the run failed or the machine cannot
    run it (every RunFailed, a dead Ray node included) against bad usage."""
    import argparse
    import importlib

    from hogkit.cli import EXIT_FAILED, EXIT_USAGE, _failed
    from hogkit.errors import InvalidArgument
    cmd = argparse.Namespace(command="run", argv=[])
    err = getattr(importlib.import_module(where), name)(*args)
    assert _failed(cmd, err) == EXIT_FAILED
    assert str(err) in capsys.readouterr().err
    assert _failed(cmd, InvalidArgument("lr=-1 must be > 0")) == EXIT_USAGE
