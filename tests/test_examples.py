"""The examples run the way a user runs them; a user's own compiled workload gets the
same guarantees as hogkit's (its compiled and Python steps compute the same numbers)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "own_workload.py"


def _example():
    spec = importlib.util.spec_from_file_location("own_workload", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("own_workload", mod)
    spec.loader.exec_module(sys.modules["own_workload"])
    return sys.modules["own_workload"]


def test_a_users_workload_runs_the_same_on_both_steps():
    """The protocol holds for a workload hogkit does not know: one worker on the
    (uncached) compiled core and on the Python step, bit-identical."""
    from test_step import run_compiled, run_python
    from hogkit.rules.core import DelayCompensated, SGD
    ex = _example()
    wl = ex.SparseRidge(n_samples=400, n_features=60, nnz=4)
    for rule in (SGD(0.05), DelayCompensated(0.05)):
        pc, log_c, _, _ = run_compiled(wl, rule, None, 50, 8)
        pp, log_p = run_python(wl, rule, None, 50, 8)
        np.testing.assert_array_equal(pc["w"], pp["w"])
        np.testing.assert_array_equal(log_c.count, log_p.count)
    params, data = wl.build(0)
    assert wl.loss(pc, data) < wl.loss(params, data)


@pytest.mark.process
@pytest.mark.slow
def test_the_own_workload_example_trains_on_the_compiled_engine():
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "3000"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "engine: compiled" in proc.stdout, proc.stdout
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", proc.stdout).groups())
    assert last < first
    assert "simulated, 32 workers" in proc.stdout


def _run_example(name, *args):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.process
def test_the_own_module_example_trains_live_and_simulated():
    out = _run_example("own_module.py", "--steps", "2000")
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < 0.7 * first, out
    assert "simulated 32 workers" in out and "trained module: Classifier" in out


@pytest.mark.process
def test_the_own_loop_example_trains_through_spawn():
    out = _run_example("own_loop.py", "--steps", "400", "--rule", "gap", "--policy", "ssp")
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < first, out
    held = float(re.search(r"holds the trained weights: loss ([\d.]+)", out).group(1))
    assert held == pytest.approx(last, abs=1e-4)
