"""The character-level RNN workload: its model, its text, its metrics, and that it
learns (in the simulator here; live from the command line in a slow test)."""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

import hogkit
from hogkit.errors import InvalidArgument
from hogkit.workloads import get
from hogkit.workloads.rnn import CharRNNWorkload


def small(**kw):
    args = dict(text="markov", hidden=32, embed=16, bptt=16, chars=20_000)
    args.update(kw)
    return CharRNNWorkload(**args)


def test_registered_by_name_with_its_settings():
    wl = get("rnn", activation="relu", hidden=16)
    assert isinstance(wl, CharRNNWorkload) and wl.activation == "relu"
    assert wl.config()["name"] == "rnn"


def test_windows_are_consecutive_text_and_targets_are_shifted():
    wl = small()
    params, data = wl.build(0)
    text = torch.from_numpy(data["text"])
    batch = wl.make_batch({"text": text}, torch.tensor([0, 5, len(text) - 17]))
    assert batch["x"].shape == (3, 17)
    np.testing.assert_array_equal(batch["x"][1].numpy(), data["text"][5:22])
    assert wl.n_rows({"text": text}) == len(text) - 16


def test_the_untrained_model_is_near_uniform_and_metrics_are_in_bits():
    wl = small()
    params, data = wl.build(0)
    m = wl.metrics(params, data)
    assert abs(m["loss"] - math.log2(16)) < 0.5          # 16 symbols: ~4 bits
    assert m["val_perplexity"] == pytest.approx(2 ** m["val_bpc"])
    assert m["entropy_rate_bits"] < m["unigram_bits"] <= math.log2(16)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
def test_each_activation_gives_a_finite_gradient_for_every_parameter(activation):
    wl = small(activation=activation)
    params, data = wl.build(0)
    grads = wl.gradient(wl.setup(params, data), np.random.default_rng(0), 8)
    assert {g.name for g in grads} == set(params)
    assert all(np.isfinite(g.values).all() and np.abs(g.values).sum() > 0 for g in grads)


def test_the_activation_changes_the_model_and_nothing_else():
    a, b = small(activation="tanh"), small(activation="sigmoid")
    pa, da = a.build(0)
    pb, db = b.build(0)
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k])
    np.testing.assert_array_equal(da["text"], db["text"])
    assert a.loss(pa, da) != b.loss(pb, db)


def test_it_learns_below_the_unigram_entropy_in_the_simulator():
    run = hogkit.simulate(small(), workers=2, steps=600, rule=hogkit.SGD(1.0))
    m = run.summary()["metrics"]
    assert m["val_bpc"] < m["unigram_bits"] - 0.4
    assert run.final_loss < run.initial_loss - 0.5


def test_the_stdlib_corpus_is_text_and_the_split_holds_out_its_end():
    wl = CharRNNWorkload(text="stdlib", chars=20_000, hidden=8, embed=4)
    train, val, vocab, facts = wl.corpus()
    assert len(train) + len(val) == 20_000 and len(val) == 2_000
    assert 40 < vocab <= 100 and 3.5 < facts["unigram_bits"] < 6


def test_the_pickled_workload_leaves_its_text_behind():
    wl = CharRNNWorkload(text="stdlib", chars=100_000, hidden=8, embed=4)
    wl.build(0)
    assert len(pickle.dumps(wl)) < 10_000


@pytest.mark.parametrize("bad", [dict(activation="gelu"), dict(text="wiki"),
                                 dict(bptt=0), dict(chars=2000, bptt=200)])
def test_bad_settings_are_named(bad):
    with pytest.raises(InvalidArgument):
        CharRNNWorkload(**bad)


@pytest.mark.process
@pytest.mark.slow
def test_hogkit_run_rnn_learns_well_below_the_unigram_entropy(tmp_path):
    out = tmp_path / "rnn"
    proc = subprocess.run([sys.executable, "-m", "hogkit.cli", "run", "--workload", "rnn",
                           "--seconds", "12", "--no-progress", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "val_perplexity" in proc.stdout
    m = json.loads((out / "summary.json").read_text())["metrics"]
    assert m["val_bpc"] < m["unigram_bits"] - 1.0, m
