"""The experiment scripts keep working: every committed result re-plots from its JSON,
and one experiment runs end to end on its quick grid."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ["density_staleness", "staleness_rules", "sim_vs_real", "hogwild_sparsity"]


@pytest.fixture(scope="module")
def experiments_on_path():
    sys.path.insert(0, str(ROOT / "experiments"))
    yield
    sys.path.remove(str(ROOT / "experiments"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_committed_results_replot(name, tmp_path, experiments_on_path):
    pytest.importorskip("matplotlib")
    shutil.copy(ROOT / "docs" / "experiments" / name / "results.json", tmp_path)
    mod = importlib.import_module(name)
    results = mod.main(["--replot", "--out", str(tmp_path)])
    assert results == json.loads((tmp_path / "results.json").read_text())
    assert list(tmp_path.glob("*.png"))


@pytest.mark.slow
def test_density_experiment_runs_on_its_quick_grid(tmp_path, experiments_on_path):
    pytest.importorskip("matplotlib")
    mod = importlib.import_module("density_staleness")
    results = mod.main(["--quick", "--out", str(tmp_path)])
    cells = results["cells"]
    assert len(cells) == 2 + 2 * 2          # d=1 once; d=0.25 with and without residual
    assert all(c["final_loss"] > 0 for c in cells)
    assert (tmp_path / "density_staleness.png").exists()
