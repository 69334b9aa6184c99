"""Faults on real processes. After each: no hogkit_* segment and no orphan (the
autouse fixture in conftest.py checks both), parameters finite."""

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
from hogkit import WorkerFailed, train
from hogkit import workloads
from helpers.faulty import Faulty, poisoned_mf
from hogkit.procfs import spawned

pytestmark = [pytest.mark.process, pytest.mark.faults]


def hot():
    return workloads.get("mf", preset="hot")


@pytest.mark.timeout(120)               # liveness: a hang fails here, not in CI's limit
@pytest.mark.parametrize("policy", ["async", "bsp", "ssp:2", "dssp:1:4"])
def test_sigkill_of_a_worker_mid_run(policy):
    from hogkit.parse import parse_policy
    with pytest.raises(WorkerFailed) as info:
        train(Faulty(hot(), rank=1, step=200, fault="sigkill"), workers=2,
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=100_000,
              policy=parse_policy(policy))
    assert info.value.rank == 1
    assert info.value.signal == "SIGKILL"
    assert "worker 1 was killed by SIGKILL" in str(info.value)


def test_exception_in_a_worker_carries_its_traceback():
    with pytest.raises(WorkerFailed) as info:
        train(Faulty(hot(), rank=0, step=50, fault="raise"), workers=2,
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=100_000)
    assert info.value.rank == 0 and info.value.step == 50
    assert info.value.exitcode == 1
    assert "planted failure at step 50" in info.value.traceback
    assert "(at step 50)" in str(info.value)
    assert "RuntimeError" in str(info.value)
    assert info.value.cause == "RuntimeError"


def test_workers_are_capped_and_mf_workers_never_import_torch():
    with pytest.raises(WorkerFailed) as info:
        train(Faulty(hot(), rank=1, step=3, fault="inspect"), workers=2,
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=1000)
    tb = info.value.traceback
    assert "INSPECT torch_loaded=False omp=1 numba_threads=1" in tb


def test_under_bsp_the_root_cause_is_blamed_not_the_blocked_peer():
    from hogkit.policy import BSP
    for _ in range(3):
        with pytest.raises(WorkerFailed) as info:
            train(Faulty(hot(), rank=1, step=40, fault="raise"), workers=2,
                  outputs=hogkit.Outputs(progress=False, eval_every=None), steps=100_000,
                  policy=BSP())
        assert info.value.rank == 1 and "planted failure" in info.value.traceback


@pytest.mark.timeout(120)               # liveness: 10**7 steps would take far longer
def test_a_hung_worker_is_detected_by_its_heartbeat():
    with pytest.raises(WorkerFailed, match="no heartbeat") as info:
        train(Faulty(hot(), rank=0, step=20, fault="sigstop"),
              workers=hogkit.Workers(2, wait_timeout=1.5),
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=10**7)
    assert info.value.rank == 0


def test_worker_exit_code_is_reported():
    with pytest.raises(WorkerFailed) as info:
        train(Faulty(hot(), rank=1, step=10, fault="exit"), workers=2,
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=100_000)
    assert info.value.rank == 1 and info.value.exitcode == 7


def test_nan_gradient_raise_names_rank_and_step():
    with pytest.raises(WorkerFailed) as info:
        train(Faulty(hot(), rank=1, step=30, fault="nan"), workers=2,
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=100_000)
    assert info.value.rank == 1
    assert "NonFiniteGradient" in info.value.traceback
    assert "step 30" in info.value.traceback
    assert info.value.cause == "hogkit.errors.NonFiniteGradient"   # what sweeps key on


def test_nan_gradient_skip_keeps_parameters_finite():
    from hogkit.errors import RunNotice
    with pytest.warns(RunNotice, match=r"dropped 970 of 2000 steps \(48.5 %\)"):
        run = train(Faulty(hot(), rank=1, step=30, fault="nan", every=True), workers=2,
                    engine=hogkit.Engine(nonfinite="skip"),
                    outputs=hogkit.Outputs(progress=False, eval_every=None), steps=2000)
    assert run.extra["nonfinite_skipped"] == 1000 - 30
    assert run.extra["nonfinite_skipped_share"] == 0.485
    assert run.updates == 2000 - (1000 - 30)
    assert all(np.isfinite(v).all() for v in run.params.values())


def test_nan_data_on_the_compiled_engine_raises_or_skips():
    """The compiled core's guard, live: every 50th rating is NaN, so some gradients
    are; "raise" stops the run naming the worker, "skip" drops exactly those updates
    and the parameters stay finite."""
    kw = dict(workers=2, steps=4000,
              outputs=hogkit.Outputs(progress=False, eval_every=None))
    for lane in ("batch", "sample"):
        with pytest.raises(WorkerFailed) as info:
            train(poisoned_mf(preset="hot"), engine=hogkit.Engine("compiled", lane=lane),
                  **kw)
        assert "NonFiniteGradient" in info.value.traceback
        run = train(poisoned_mf(preset="hot"),
                    engine=hogkit.Engine("compiled", lane=lane, nonfinite="skip"), **kw)
        assert run.extra["engine"] == "compiled" and run.extra["nonfinite_skipped"] > 0
        assert all(np.isfinite(v).all() for v in run.params.values())
        if lane == "batch":                 # a skipped minibatch is not an update
            assert run.updates + run.extra["nonfinite_skipped"] == 4000
        else:                               # one NaN rating in 50 is left out of its step
            assert run.updates == 4000
            assert run.extra["nonfinite_skipped"] == pytest.approx(
                run.extra["samples"] / 50, rel=0.2)
            assert run.extra["nonfinite_skipped_share"] == round(
                run.extra["nonfinite_skipped"] / run.extra["samples"], 6)


# --- signals to the parent: run the CLI in a subprocess --------------------------

def _start_cli(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hogkit.cli", "run", "--workload", "mf", "--seconds", "60",
         "--no-progress", "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    # Wait until both workers are running: two children of the CLI process that are
    # spawned workers (the resource tracker is a child too).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = spawned(proc.pid)
        segs = [n for n in os.listdir("/dev/shm") if n.startswith(f"hogkit_{proc.pid}_")]
        if len(workers) == 2 and len(segs) == 4:
            time.sleep(0.5)
            return proc, workers
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode())
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("workers did not start")


def _gone(pids, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def _segments_of(pid):
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"hogkit_{pid}_")]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_parent_shuts_down_in_order(tmp_path, sig):
    proc, workers = _start_cli(tmp_path)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err.decode()     # 130 SIGINT, 143 SIGTERM
    assert "interrupted" in err.decode()
    assert _gone(workers)
    assert _segments_of(proc.pid) == []
    # the ending is kept: a final checkpoint and a summary, labelled with the signal's
    from hogkit.state.checkpoint import read
    how = "interrupted" if sig == signal.SIGINT else "terminated"
    _, meta = read(tmp_path / "out" / "checkpoint.npz")
    assert meta["ended"] == how and meta["consistency"] == "quiesced"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ended"]["how"] == how
    assert "kept: the parameters at the end" in err.decode()


@pytest.mark.slow
def test_sigkill_of_the_parent_leaves_nothing(tmp_path):
    proc, workers = _start_cli(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert _gone(workers), "workers outlived a SIGKILLed parent"
    deadline = time.monotonic() + 15
    while _segments_of(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _segments_of(proc.pid) == [], "segments outlived a SIGKILLed parent"


@pytest.mark.timeout(180)               # liveness: a restart must not deadlock BSP/SSP
@pytest.mark.parametrize("policy, replication", [("async", "shared"), ("bsp", "shared"),
                                                 ("ssp:2", "shared"), ("async", "worker:8")])
def test_a_killed_worker_is_restarted_and_the_run_finishes(policy, replication, tmp_path):
    """on_failure="restart": worker 1 is SIGKILLed once at its 300th step; a fresh
    process takes its place on the same stores, goes on from the shared clocks, and
    the run does all its steps; the restart is in the summary and the events. With
    replicas the fresh worker pulls the shared copy and merges from there (the killed
    replica's unmerged steps are lost, as a Hogwild! write in flight is)."""
    from hogkit.parse import parse_policy
    out = str(tmp_path / "run")
    run = train(Faulty(hot(), rank=1, step=300, fault="sigkill",
                       once=str(tmp_path / "fired")),
                workers=hogkit.Workers(2, on_failure="restart", max_restarts=1),
                engine=hogkit.Engine(replication=replication),
                outputs=hogkit.Outputs(out, progress=False, eval_every=None,
                                       checkpoint_every=None),
                steps=6000, policy=parse_policy(policy))
    assert sum(w["iterations"] for w in run.per_worker) == 6000
    assert [w["iterations"] for w in run.per_worker] == [3000, 3000]
    assert len(run.extra["restarts"]) == 1
    r = run.extra["restarts"][0]
    assert r["rank"] == 1 and r["signal"] == "SIGKILL" and r["step"] >= 0
    import json
    with open(f"{out}/events.jsonl") as f:
        kinds = [json.loads(line)["type"] for line in f]
    assert "restart" in kinds
    assert np.isfinite(run.final_loss) and run.final_loss < run.initial_loss


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_restarted_compiled_replica_merges_every_step_it_runs():
    """replication="worker" on the compiled engine: a worker SIGKILLed mid-run loses
    the steps its replica had not merged (the restart record says how many), and the
    fresh process that takes its place merges every step it runs, its last phase
    included: at the end each worker's iterations minus its updates are exactly the
    steps lost at the kill (0 for the worker never killed). Merges every 1000 steps, so
    the last phase almost surely holds steps when the run ends."""
    import threading
    killed = []

    def killer():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kids = spawned(os.getpid())
            if len(kids) >= 2:
                time.sleep(3.0)                # both well inside their steps (warm)
                os.kill(kids[0], signal.SIGKILL)
                killed.append(kids[0])
                return
            time.sleep(0.05)

    # compiled (and cached) first, so the kill lands while the workers step
    train(hot(), workers=2, engine=hogkit.Engine(replication="worker:1000"),
          outputs=hogkit.Outputs(progress=False, eval_every=None), steps=100)
    t = threading.Thread(target=killer, daemon=True)
    t.start()
    run = train(hot(), workers=hogkit.Workers(2, on_failure="restart", max_restarts=1),
                engine=hogkit.Engine(replication="worker:1000"),
                outputs=hogkit.Outputs(progress=False, eval_every=None), seconds=10.0)
    t.join()
    assert killed and len(run.extra["restarts"]) == 1
    r = run.extra["restarts"][0]
    assert r["iterations"] > 0                 # killed mid-run, not while compiling
    lost = r["iterations"] - r["updates"]
    assert 0 <= lost < 1000
    gaps = [w["iterations"] - w["updates"] for w in run.per_worker]
    assert gaps[r["rank"]] == lost
    assert gaps[1 - r["rank"]] == 0
    assert run.per_worker[r["rank"]]["iterations"] > r["iterations"]   # it went on


@pytest.mark.timeout(120)
def test_restarts_run_out_and_then_the_run_stops(tmp_path):
    """Every incarnation of worker 1 dies at its 50th step: one restart, then the
    second death stops the run with the usual error."""
    with pytest.raises(WorkerFailed) as info:
        train(Faulty(hot(), rank=1, step=50, fault="sigkill"),
              workers=hogkit.Workers(2, on_failure="restart", max_restarts=1),
              outputs=hogkit.Outputs(progress=False, eval_every=None), steps=100_000)
    assert info.value.rank == 1 and info.value.signal == "SIGKILL"
    assert "restart budget (1) used up" in str(info.value)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_shutdown_is_held_then_raised_not_lost(sig):
    from hogkit.errors import Interrupted
    from hogkit.engine.supervisor import signals_deferred
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as e:
        with signals_deferred():
            os.kill(os.getpid(), sig)
            time.sleep(0.01)                 # the handler runs; the block goes on
            finished = True
    assert finished and e.value.signum == sig
    assert signal.getsignal(sig) is before


def test_an_exception_already_leaving_wins_over_a_held_signal():
    from hogkit.engine.supervisor import signals_deferred
    with pytest.raises(WorkerFailed):
        try:
            raise WorkerFailed(1, reason="boom")
        finally:
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)


_SCRIPT = """
import hogkit
if __name__ == "__main__":
    hogkit.train("mf", workers=2, seconds=60,
                 outputs=hogkit.Outputs({out!r}, progress=False))
    print("not reached")
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_script_that_does_not_catch_the_interrupt_ends_like_hogkit_run(tmp_path, sig):
    """A user's script stopped by a signal: one line, status 128 + signal, no traceback
    (``Interrupted`` is a KeyboardInterrupt subclass, which Python itself ended with a
    traceback and status 1), the workers gone and no segment left."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(out=str(tmp_path / "out")))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    workers = []
    while time.monotonic() < deadline and proc.poll() is None:
        workers = spawned(proc.pid)
        if len(workers) == 2 and len(_segments_of(proc.pid)) == 4:
            break
        time.sleep(0.1)
    assert len(workers) == 2, proc.stderr.read().decode() if proc.poll() is not None else ""
    time.sleep(0.5)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err.decode()
    assert "Traceback" not in err.decode() and "interrupted by" in err.decode()
    assert b"not reached" not in out
    assert _gone(workers)
    assert _segments_of(proc.pid) == []


class _NaNData(type(workloads.get("mf", preset="hot"))):
    """mf (hot preset) whose data or initial factors hold one NaN/inf."""

    def __init__(self, where, **kw):
        super().__init__("hot", **kw)
        self.where = where

    def build(self, seed):
        params, data = super().build(seed)
        if self.where == "data":
            data["r"][3] = np.nan
        else:
            params["Q"][2, 1] = np.inf
        return params, data


@pytest.mark.parametrize("where, words", [
    ("data", "the data: r[3] is nan (1 non-finite of"),
    ("params", "the initial parameters: Q[2, 1] is inf"),
])
def test_non_finite_data_or_weights_are_refused_before_anything_starts(where, words):
    """Issue 27, item 5: NaN in the data or inf in the initial weights was blamed on
    the learning rate after the workers started. Now: refused in the parent, naming the
    array and the first bad index, before a kernel compiles or a segment exists."""
    from hogkit.errors import InvalidArgument
    before = {n for n in os.listdir("/dev/shm") if n.startswith(f"hogkit_{os.getpid()}_")}
    with pytest.raises(InvalidArgument) as e:
        train(_NaNData(where), workers=2, outputs=hogkit.Outputs(progress=False), steps=100)
    assert words in str(e.value) and "learning rate" not in str(e.value)
    assert {n for n in os.listdir("/dev/shm")
            if n.startswith(f"hogkit_{os.getpid()}_")} == before


def test_a_finished_run_keeps_no_mapping_of_its_segments(tmp_path):
    """The stores' views are dropped before the stores close, so the unlinked segments'
    memory (and the descriptor Python's mmap keeps for each) goes with the run, not
    with a later garbage collection: a process that trains many times holds none."""
    def mapped():
        out = []
        for f in os.listdir("/proc/self/fd"):
            try:
                out.append(os.readlink(f"/proc/self/fd/{f}"))
            except OSError:
                pass
        with open("/proc/self/maps") as m:
            out += [line.split()[-2] for line in m if "/dev/shm/hogkit_" in line]
        return [x for x in out if "/dev/shm/hogkit_" in x]
    before = set(mapped())      # an earlier test's objects may still hold theirs
    for k in range(2):
        train(hot(), workers=2,
              outputs=hogkit.Outputs(str(tmp_path / str(k)), progress=False, checkpoint_every=0.2),
              steps=3000)
        assert set(mapped()) <= before
