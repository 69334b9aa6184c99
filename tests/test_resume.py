"""Periodic checkpoints and resume (hogkit.state.resume): a run killed with SIGKILL goes on
from its last checkpoint and ends where an uninterrupted run of the same length does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hogkit
from hogkit import SGD, Density, GapAware, train
from hogkit.report import read_events
from hogkit.state.checkpoint import read
from hogkit.errors import InvalidArgument

HOT = {"preset": "hot"}


def _types(folder):
    with open(os.path.join(folder, "events.jsonl")) as f:
        return [json.loads(line)["type"] for line in f]


@pytest.mark.process
def test_periodic_checkpoints_then_a_resumed_segment_covers_the_whole_run(tmp_path):
    out = str(tmp_path / "run")
    first = train(hogkit.workload("mf", **HOT), workers=2,
                  outputs=hogkit.Outputs(out, progress=False, checkpoint_every=0.05),
                  steps=20_000)
    arrays, meta = read(os.path.join(out, "checkpoint.npz"))
    assert meta["consistency"] == "quiesced"
    assert sum(meta["state"]["iterations"]) == 20_000 and meta["updates"] == first.updates
    assert set(arrays) == set(first.params)
    # extend the same run to 50,000 iterations
    run = train(hogkit.workload("mf", **HOT), workers=2,
                outputs=hogkit.Outputs(resume=out, progress=False), steps=50_000)
    assert run.extra["segments"] == 2 and run.config["steps"] == 50_000
    assert sum(w["iterations"] for w in run.per_worker) == 50_000
    assert run.updates == 50_000
    assert run.staleness["update_gap"]["count"] == 50_000      # histograms carried over
    assert run.initial_loss == first.initial_loss
    ts = [p["t"] for p in run.loss_curve]
    us = [p["updates"] for p in run.loss_curve]
    assert ts == sorted(ts) and us == sorted(us) and us[-1] == 50_000
    assert run.wall_s > first.wall_s
    types = _types(out)
    assert types[0] == "start" and "resume" in types and types[-1] == "end"
    with open(os.path.join(out, "summary.json")) as f:
        assert json.load(f)["updates"] == 50_000


@pytest.mark.process
def test_resume_refuses_what_it_cannot_continue(tmp_path):
    out = str(tmp_path / "run")
    train(hogkit.workload("mf", **HOT), workers=2,
          outputs=hogkit.Outputs(out, progress=False), steps=4_000)
    with pytest.raises(InvalidArgument, match="nothing left to run"):
        train(hogkit.workload("mf", **HOT), workers=2,
              outputs=hogkit.Outputs(resume=out, progress=False), steps=4_000)
    with pytest.raises(InvalidArgument, match="workers was 2, now 1"):
        train(hogkit.workload("mf", **HOT), workers=1,
              outputs=hogkit.Outputs(resume=out, progress=False), steps=8_000)
    with pytest.raises(InvalidArgument, match="workload_config"):
        train("mf", workers=2, outputs=hogkit.Outputs(resume=out, progress=False),
              steps=8_000)
    with pytest.raises(InvalidArgument, match="has no checkpoint.npz"):
        train("mf", workers=2, outputs=hogkit.Outputs(resume=str(tmp_path), progress=False),
              steps=8_000)
    with pytest.raises(InvalidArgument, match="checkpoint_every needs a results folder"):
        train("mf", workers=2, outputs=hogkit.Outputs(checkpoint_every=1.0, progress=False),
              steps=8_000)


def _hogkit(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "hogkit.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _summary(folder):
    with open(os.path.join(folder, "summary.json")) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.faults
@pytest.mark.timeout(240)
def test_sigkill_of_the_parent_then_resume_reaches_the_uninterrupted_loss(tmp_path):
    """The issue's test: kill the parent with SIGKILL mid-run, ``hogkit run --resume``,
    and reach the loss of an uninterrupted run of the same length; the dead run's
    segments are swept and its workers are gone."""
    steps = "93750"          # 384M ratings: 4,096 a lane step (was 1,500,000 at 256)
    common = ["--workload", "mf", "-o", "preset=hot", "--steps", steps, "--no-progress",
              "--checkpoint-every", "0.25"]
    whole = str(tmp_path / "whole")
    p = _hogkit("run", *common, "--out", whole)
    assert p.wait(timeout=120) == 0, p.stderr.read()
    killed = str(tmp_path / "killed")
    p = _hogkit("run", *common, "--out", killed)
    ckpt = os.path.join(killed, "checkpoint.npz")
    deadline = time.monotonic() + 60
    while not os.path.exists(ckpt) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert os.path.exists(ckpt), p.stderr.read() if p.poll() is not None else "no ckpt"
    time.sleep(0.4)
    assert p.poll() is None, "the run ended before it could be killed"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    _, meta = read(ckpt)
    assert meta["consistency"] == "fuzzy"
    done_before = sum(meta["state"]["iterations"])
    assert 0 < done_before < int(steps)
    r = _hogkit("run", "--resume", killed, "--no-progress")
    assert r.wait(timeout=120) == 0, r.stderr.read()
    a, b = _summary(whole), _summary(killed)
    assert sum(w["iterations"] for w in b["per_worker"]) == int(steps)
    assert b["segments"] == 2 and b["config"]["steps"] == int(steps)
    # the second segment starts from the checkpoint's parameters, not fresh ones ...
    assert _resume_event(killed)["initial_loss"] < 0.2 * b["initial_loss"]
    # ... and ends where an uninterrupted run ends. Two workers race on hot rows near
    # the noise floor: four uninterrupted runs ended at 0.0057-0.0076 (1.34x), so the
    # band is 2x, not 25 % (which flaked at 1.51x on a loaded CI machine)
    assert a["final_loss"] / 2 < b["final_loss"] < 2 * a["final_loss"]
    assert b["final_loss"] < 0.05 * b["initial_loss"]
    dead = f"hogkit_{p.pid}_"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(dead)]


def _resume_event(out):
    """The ``resume`` event a resumed run wrote to ``out/events.jsonl``."""
    return next(e for e in read_events(os.path.join(out, "events.jsonl"))
                if e["type"] == "resume")


@pytest.mark.process
@pytest.mark.parametrize("engine,rule,density", [
    ("compiled", SGD(lr=0.02, momentum=0.9), None),
    ("compiled", GapAware(lr=0.02), Density(0.5, how="random", every=3)),
    ("python", SGD(lr=0.02, momentum=0.9), Density(0.5)),
])
def test_one_worker_resumed_from_its_end_equals_one_uninterrupted_run(tmp_path, engine,
                                                                      rule, density):
    """A quiesced checkpoint carries each worker's whole state (rule state, residuals,
    random stream, sampler cursor, step counts): with one worker (no races) two
    segments of 301 + 301 iterations compute the same parameters as one of 602.
    Without that state this fails: momentum and residuals would restart from zero
    and the minibatches would differ. The sweep order: the block order's scheduler is
    not checkpointed, so a resumed run draws its blocks afresh (docs/algorithms.md)."""
    kw = dict(workload=hogkit.workload("mf", **{**HOT, "order": "sweep"}), workers=1,
              engine=engine, rule=rule, density=density, batch=64)
    quiet = dict(progress=False, checkpoint_every=None)
    whole = train(steps=602, outputs=hogkit.Outputs(**quiet), **kw)
    out = str(tmp_path / "run")
    train(steps=301, outputs=hogkit.Outputs(out, **quiet), **kw)
    resumed = train(steps=602, outputs=hogkit.Outputs(resume=out, **quiet), **kw)
    assert _resume_event(out)["worker_state"] > 0
    for name, a in whole.params.items():
        np.testing.assert_array_equal(resumed.params[name], a, err_msg=name)
