"""Users' data files (``hogkit.workloads.files``, ``--data``, ``hogkit predict``): the
readers against numpy/scikit-learn references, malformed lines refused with their line
number before anything runs, and whole runs on files whose exact minimiser is known."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hogkit.cli import main
from hogkit.errors import InvalidArgument
from hogkit.workloads import files, get
import hogkit


def _write(path, text):
    path.write_text(text)
    return str(path)


# --- the readers -------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6),
                               st.floats(-1e6, 1e6, width=32)), min_size=1, max_size=40),
       csv=st.booleans())
def test_ratings_read_back_what_was_written(tmp_path_factory, rows, csv):
    """Whitespace (LIBMF's format) and CSV with a header and an extra column both read
    back the written ids and ratings exactly (ratings as float32)."""
    path = tmp_path_factory.mktemp("r") / ("r.csv" if csv else "r.txt")
    head = "user,item,rating,timestamp\n" if csv else "# a comment\n\n"
    body = "".join((f"{u},{i},{r!r},7\n" if csv else f"{u} {i} {r!r}\n")
                   for u, i, r in rows)
    f = files.read_ratings(_write(path, head + body))
    u, i, r = (np.array(c) for c in zip(*rows))
    np.testing.assert_array_equal(f.u, u.astype(np.int32))
    np.testing.assert_array_equal(f.i, i.astype(np.int32))
    np.testing.assert_array_equal(f.r, r.astype(np.float32))
    assert (f.n_rows, f.n_cols) == (u.max() + 1, i.max() + 1)


@pytest.mark.parametrize("text, line, words", [
    ("0 1 3.5\n2 x 1\n", 2, "'x' is not a number"),
    ("0 1 3.5\n\n# c\n2 1\n", 4, "2 field(s), 3 needed"),
    ("0 1 3.5\n-1 1 2\n", 2, "non-negative integers"),
    ("0 1 3.5\n1.5 1 2\n", 2, "non-negative integers"),
    ("0 1 3.5\n1 1 nan\n", 2, "not a finite float32"),
    ("0 1 3.5\n1 1 1e39\n", 2, "not a finite float32"),
    ("u,i,r\n0,1,2\n0;1;2\n", 3, "field(s)"),
])
def test_a_malformed_ratings_line_is_refused_with_its_number(tmp_path, text, line, words):
    path = _write(tmp_path / "bad.txt", text)
    with pytest.raises(InvalidArgument, match=rf"line {line}: .*{re.escape(words)}") as e:
        files.read_ratings(path)
    assert "user item rating" in str(e.value)          # and the fix


def test_svmlight_reads_what_scikit_learn_wrote(tmp_path):
    """1-based indices, labels -1/+1 read as 0/1, against the CSR that was dumped."""
    import scipy.sparse as sp
    from sklearn.datasets import dump_svmlight_file
    X = sp.random(50, 30, density=0.2, random_state=0, format="csr", dtype=np.float64)
    y = np.where(np.arange(50) % 3 == 0, 1, -1)
    path = str(tmp_path / "d.svm")
    dump_svmlight_file(X, y, path, zero_based=False)
    s = files.read_svmlight(path)
    got = sp.csr_matrix((s.values, s.indices, s.indptr), shape=(50, s.n_features))
    np.testing.assert_allclose(got.toarray(), X.toarray()[:, :s.n_features], rtol=1e-6)
    np.testing.assert_array_equal(s.y, (y > 0).astype(np.float32))


@pytest.mark.parametrize("text, line, words", [
    ("+1 1:0.5 3:1\n-1 0:1\n", 2, "indices are 1-based"),
    ("+1 1:0.5 3:1\n2 2:1\n", 2, "labels are -1/+1 or 0/1"),
    ("+1 1:0.5 3:1\n1 2:x\n", 2, "is not index:value"),
    ("+1 3:0.5 1:1\n", 1, "indices must increase"),
    ("+1 1:0.5\nyes 2:1\n", 2, "is not a number"),
    ("+1 1:0.5\n0 2:nan\n", 2, "not finite"),
])
def test_a_malformed_svmlight_line_is_refused_with_its_number(tmp_path, text, line, words):
    path = _write(tmp_path / "bad.svm", text)
    with pytest.raises(InvalidArgument, match=rf"line {line}: .*{re.escape(words)}"):
        files.read_svmlight(path)


def test_split_holds_out_its_fraction_deterministically():
    train, test = files.split(1000, 0.2, seed=3)
    assert len(test) == 200 and len(np.intersect1d(train, test)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1000))
    np.testing.assert_array_equal(files.split(1000, 0.2, seed=3)[1], test)
    assert not np.array_equal(files.split(1000, 0.2, seed=4)[1], test)
    with pytest.raises(InvalidArgument, match="test_fraction"):
        files.split(10, 1.0, 0)


# --- workloads on files --------------------------------------------------------------

def _low_rank_file(path, n_rows=120, n_cols=80, k=3, n=4000, seed=0):
    """Ratings of an exact rank-k matrix: the minimiser of the mean squared error at
    rank >= k is known (MSE 0)."""
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((n_rows, k)) * 0.6
    V = rng.standard_normal((n_cols, k)) * 0.6
    cells = rng.choice(n_rows * n_cols, n, replace=False)
    u, i = cells // n_cols, cells % n_cols
    r = np.einsum("nk,nk->n", U[u], V[i])
    path.write_text("".join(f"{a} {b} {c:.7f}\n" for a, b, c in zip(u, i, r)))
    return str(path), u, i, r


def test_mf_from_a_file_takes_its_sizes_and_holds_out_the_test_ratings(tmp_path):
    path, u, i, r = _low_rank_file(tmp_path / "r.txt")
    wl = get("mf", data=path, test_fraction=0.25, rank=3, order="blocks", blocks=4)
    assert (wl.n_rows, wl.n_cols, wl.n_ratings) == (u.max() + 1, i.max() + 1, 3000)
    params, data = wl.build(0)
    assert len(data["r"]) == 3000 and len(data["test_r"]) == 1000
    seen = set(zip(data["u"].tolist(), data["i"].tolist()))
    assert not seen & set(zip(data["test_u"].tolist(), data["test_i"].tolist()))
    assert {"test_mse", "test_rmse"} <= set(wl.metrics(params, data))
    assert wl.config()["data"] == path
    with pytest.raises(InvalidArgument, match="n_ratings"):
        get("mf", data=path, n_ratings=10)
    with pytest.raises(InvalidArgument, match="data="):
        get("mf", test_fraction=0.1)


@pytest.mark.slow
@pytest.mark.process
def test_mf_data_round_trip_reaches_the_known_minimiser_and_predicts(tmp_path, capsys):
    """``hogkit run --data`` on an exact rank-3 file at rank 3 drives the held-out MSE
    to ~0, writes P.npy/Q.npy and LIBMF's model text, and ``hogkit predict`` gives
    exactly P[u]·Q[i] of the written factors."""
    path, u, i, r = _low_rank_file(tmp_path / "r.txt")
    out = tmp_path / "run"
    assert main(["run", "--workload", "mf", "--data", path, "--test-fraction", "0.1",
                 "-o", "rank=3", "--seconds", "3", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["test_mse"] < 1e-3
    P, Q = np.load(out / "params" / "P.npy"), np.load(out / "params" / "Q.npy")
    lines = (out / "params" / "model.txt").read_text().splitlines()
    assert lines[:5] == ["f 0", f"m {len(P)}", f"n {len(Q)}", "k 3", "b 0"]
    p0 = np.array(lines[5].split()[2:], np.float32)
    np.testing.assert_array_equal(p0, P[0])
    capsys.readouterr()
    pred_file = tmp_path / "pred.txt"
    assert main(["predict", str(out), path, "--out", str(pred_file)]) == 0
    assert "rmse" in capsys.readouterr().err
    got = np.loadtxt(pred_file)
    want = np.einsum("nk,nk->n", P[u].astype(np.float64), Q[i].astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _one_hot_file(path, d=40, per=60, seed=0):
    """Each sample holds one feature (value 1): the log-loss minimiser is known,
    ``w_j = logit(share of positive labels among feature j's samples)``."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.15, 0.85, d)
    lines, feats, ys = [], [], []
    for j in range(d):
        y = (np.arange(per) < round(p[j] * per)).astype(int)
        for label in y:
            lines.append(f"{'+1' if label else '-1'} {j + 1}:1")
            feats.append(j)
            ys.append(label)
    order = rng.permutation(len(lines))       # shuffled, as a data file should be: a
    path.write_text("\n".join(lines[k] for k in order) + "\n")   # sorted one makes
    feats, ys = np.array(feats), np.array(ys)               # SGD's last steps one-sided
    share = np.array([ys[feats == j].mean() for j in range(d)])
    best = -np.mean(ys * np.log(share[feats]) + (1 - ys) * np.log(1 - share[feats]))
    return str(path), np.log(share / (1 - share)), best


@pytest.mark.slow
@pytest.mark.process
def test_logreg_data_reaches_the_known_minimiser(tmp_path):
    path, w_star, best = _one_hot_file(tmp_path / "d.svm")
    run = hogkit.train(hogkit.workload("logreg", data=path), workers=2,
                       outputs=hogkit.Outputs(progress=False), rule=hogkit.SGD(0.5),
                       steps=40_000, batch=8, seed=0)
    assert run.final_loss - best < 2e-3
    # at a constant lr the weights keep moving around w*: each sample steps a weight by
    # lr / batch = 0.0625, so a weight's spread is ~0.2, and the largest of 40 (two
    # racing workers make it vary run to run) can reach 0.4; the mean error is small
    err = np.abs(run.params["w"] - w_star)
    assert err.mean() < 0.15 and err.max() < 0.6, err


def test_a_bad_data_file_is_refused_before_anything_runs(tmp_path, capsys):
    bad = _write(tmp_path / "bad.txt", "0 1 2\n0 1\n")
    out = tmp_path / "run"
    assert main(["run", "--workload", "mf", "--data", bad, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and not out.exists()
    assert main(["run", "--workload", "mlp", "--data", bad]) == 2
    assert "--data is read by --workload mf" in capsys.readouterr().err


def test_a_data_file_is_read_once_per_version(tmp_path):
    """The parent builds a workload made by name up to three times; the file is read
    once (read-only arrays shared), and read afresh once it changes."""
    import os
    path = _write(tmp_path / "r.txt", "0 1 2.5\n1 0 1.5\n")
    a, b = files.read_ratings(path), files.read_ratings(path)
    assert a is b and not a.r.flags.writeable
    _write(tmp_path / "r.txt", "0 1 2.5\n1 0 1.5\n2 2 3.0\n")
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 1))
    assert len(files.read_ratings(path).r) == 3
