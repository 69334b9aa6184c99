"""hogkit.workloads.text: Markov sources with a known entropy rate, the stdlib
docstring corpus, encoding, entropies and the train/validation split."""

from __future__ import annotations

import math
import sysconfig

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.workloads import text as T


def h2(p):
    """Binary entropy in bits."""
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def empirical_conditional_entropy(x, alphabet, order):
    """Plug-in H(X_t | X_{t-order..t-1}) in bits from a sample: count every
    (context, next) pair, brute force."""
    n = x.shape[0]
    ctx = np.zeros(n - order, dtype=np.int64)
    for j in range(order):
        ctx = ctx * alphabet + x[j:n - order + j]
    pairs = np.bincount(ctx * alphabet + x[order:], minlength=alphabet ** (order + 1))
    joint = pairs.reshape(-1, alphabet).astype(np.float64)
    ctx_tot = joint.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        cond = np.where(joint > 0, joint / np.where(ctx_tot > 0, ctx_tot, 1), 1.0)
    return float(-(joint * np.log2(cond)).sum() / joint.sum())


# --- Markov source -------------------------------------------------------------------


def test_two_state_chain_entropy_rate_by_hand():
    a, b = 0.1, 0.3  # P(0 -> 1), P(1 -> 0)
    src = T.MarkovSource(np.array([[1 - a, a], [b, 1 - b]]))
    assert (src.alphabet, src.order) == (2, 1)
    pi = np.array([b / (a + b), a / (a + b)])  # (0.75, 0.25)
    np.testing.assert_allclose(src.stationary, pi, atol=1e-12)
    # 0.75 h(0.1) + 0.25 h(0.3) = 0.5720698...
    assert src.entropy_rate() == pytest.approx(0.75 * h2(0.1) + 0.25 * h2(0.3), abs=1e-12)
    assert src.entropy_rate() == pytest.approx(0.5720698, abs=1e-6)
    assert src.unigram_entropy() == pytest.approx(h2(0.25), abs=1e-12)


def test_periodic_chain_has_zero_entropy_rate():
    src = T.MarkovSource(np.array([[0.0, 1.0], [1.0, 0.0]]))
    np.testing.assert_allclose(src.stationary, [0.5, 0.5], atol=1e-12)
    assert src.entropy_rate() == 0.0
    assert src.unigram_entropy() == pytest.approx(1.0)
    x = src.sample(101, 3)
    assert (np.diff(x) != 0).all()


@pytest.mark.parametrize("alphabet, order, n", [(16, 2, 1_000_000), (3, 3, 300_000)])
def test_entropy_rate_matches_empirical_estimate(alphabet, order, n):
    src = T.markov_source(0, alphabet=alphabet, order=order)
    x = src.sample(n, np.random.default_rng(1))
    assert x.dtype == np.int64 and x.shape == (n,)
    assert x.min() >= 0 and x.max() < alphabet
    est = empirical_conditional_entropy(x, alphabet, order)
    assert est == pytest.approx(src.entropy_rate(), abs=0.02)
    # the sample's average surprise under the true table: an unbiased estimate
    ctx = np.zeros(n - order, dtype=np.int64)
    for j in range(order):
        ctx = ctx * alphabet + x[j:n - order + j]
    surprise = -np.log2(src.P[ctx, x[order:]]).mean()
    assert surprise == pytest.approx(src.entropy_rate(), abs=0.02)
    assert T.unigram_entropy(x, alphabet) == pytest.approx(src.unigram_entropy(), abs=0.02)


def test_default_source_entropy_rate_clearly_below_unigram():
    src = T.markov_source(0)
    assert (src.alphabet, src.order, src.n_contexts) == (16, 2, 256)
    assert src.P.shape == (256, 16)
    np.testing.assert_allclose(src.P.sum(axis=1), 1.0)
    assert 1.5 < src.entropy_rate() < 2.6
    assert src.unigram_entropy() > 3.8
    assert src.unigram_entropy() <= 4.0 + 1e-12


def test_stationary_is_a_fixed_point():
    src = T.markov_source(5, alphabet=4, order=3, concentration=0.5)
    pi = src.stationary
    assert pi.sum() == pytest.approx(1.0)
    nxt = np.zeros_like(pi)
    for ctx in range(src.n_contexts):
        for s in range(src.alphabet):
            nxt[(ctx * src.alphabet + s) % src.n_contexts] += pi[ctx] * src.P[ctx, s]
    np.testing.assert_allclose(nxt, pi, atol=1e-12)


def test_dense_solve_and_power_iteration_agree():
    src = T.markov_source(3, alphabet=4, order=5)  # 1024 contexts
    dense = T._stationary_dense(src.P, 4)
    power = T._stationary_power(src.P, 4)
    np.testing.assert_allclose(dense, power, atol=1e-12)


def test_no_unique_stationary_distribution_is_an_error():
    src = T.MarkovSource(np.eye(2))  # two absorbing states
    with pytest.raises(InvalidArgument, match="no unique stationary"):
        src.entropy_rate()


def test_power_iteration_that_does_not_converge_is_an_error(monkeypatch):
    monkeypatch.setattr(T, "_DENSE_CONTEXTS", 1)
    monkeypatch.setattr(T, "_POWER_WORK", 0)  # the minimum, 200 iterations
    a, b = 1e-6, 2e-6  # mixes over ~1e6 steps
    src = T.MarkovSource(np.array([[1 - a, a], [b, 1 - b]]))
    with pytest.raises(InvalidArgument, match="did not converge"):
        src.entropy_rate()


def test_determinism_by_seed():
    a, b, c = T.markov_source(7), T.markov_source(7), T.markov_source(8)
    np.testing.assert_array_equal(a.P, b.P)
    assert not np.array_equal(a.P, c.P)
    assert a.entropy_rate() == b.entropy_rate()
    np.testing.assert_array_equal(a.sample(5000, 11), b.sample(5000, 11))
    np.testing.assert_array_equal(a.sample(5000, np.random.default_rng(11)),
                                  a.sample(5000, 11))
    assert not np.array_equal(a.sample(5000, 11), a.sample(5000, 12))


def test_sample_short_and_empty():
    src = T.markov_source(0, alphabet=5, order=3)
    assert src.sample(0, 0).shape == (0,)
    assert src.sample(2, 0).shape == (2,)
    assert src.sample(3, 0).shape == (3,)


def test_table_is_a_private_read_only_copy():
    P = np.array([[0.5, 0.5], [0.2, 0.8]])
    src = T.MarkovSource(P)
    P[0, 0] = 0.0
    assert src.P[0, 0] == 0.5
    with pytest.raises(ValueError):
        src.P[0, 0] = 0.1


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"alphabet": 1}, InvalidArgument, "alphabet=1 must be >= 2"),
    ({"alphabet": 2.0}, InvalidType, "alphabet"),
    ({"order": 0}, InvalidArgument, "order=0 must be >= 1"),
    ({"alphabet": 16, "order": 5}, InvalidArgument, "1048576 contexts exceeds 65536"),
    ({"concentration": 0.0}, InvalidArgument, "concentration=0.0 must be > 0"),
    ({"concentration": float("nan")}, InvalidArgument, "finite"),
    ({"concentration": "1"}, InvalidType, "concentration"),
])
def test_markov_source_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        T.markov_source(0, **kwargs)


def test_markov_source_bad_seed():
    with pytest.raises(InvalidArgument, match="seed=-1"):
        T.markov_source(-1)
    with pytest.raises(InvalidType, match="seed"):
        T.markov_source(1.5)


@pytest.mark.parametrize("P, exc, match", [
    ([[0.5, 0.5], [0.5, 0.5]], InvalidType, "numpy.ndarray"),
    (np.array([[0.5, 0.5], [0.2, 0.7]]), InvalidArgument, "sum to 1"),
    (np.array([[1.5, -0.5], [0.5, 0.5]]), InvalidArgument, "non-negative"),
    (np.full((3, 2), 0.5), InvalidArgument, "not a power"),
    (np.full((2, 1), 1.0), InvalidArgument, "columns"),
    (np.full(4, 0.25), InvalidArgument, "ndim"),
    (np.array([["a", "b"]]), InvalidType, "dtype"),
])
def test_markov_table_bad(P, exc, match):
    with pytest.raises(exc, match=match):
        T.MarkovSource(P)


def test_sample_bad_arguments():
    src = T.markov_source(0)
    with pytest.raises(InvalidArgument, match="n=-1"):
        src.sample(-1, 0)
    with pytest.raises(InvalidType, match="rng"):
        src.sample(10, "seed")
    with pytest.raises(InvalidType, match="rng"):
        src.sample(10, None)


# --- stdlib corpus -------------------------------------------------------------------


def test_stdlib_corpus_is_printable_ascii_and_cut():
    full = T.stdlib_docstrings(None)
    assert len(full) > 300_000
    assert set(full) <= set(map(chr, range(32, 127))) | {"\n"}
    assert "  " not in full and "\n\n\n" not in full
    text = T.stdlib_docstrings()
    assert text == full[:500_000]
    assert T.stdlib_docstrings(max_chars=1000) == full[:1000]
    assert T.stdlib_docstrings(max_chars=10 ** 9) == full


def test_stdlib_corpus_is_deterministic():
    root = sysconfig.get_paths()["stdlib"]
    files = ("csv.py", "textwrap.py", "no/such/module.py")
    first = T._collect(root, files)
    assert first and first == T._collect(root, files)
    assert T._collect(root, ("textwrap.py",)) in T.stdlib_docstrings(None)
    assert list(T.STDLIB_FILES) == sorted(T.STDLIB_FILES)


def test_stdlib_corpus_bad_max_chars():
    with pytest.raises(InvalidArgument, match="max_chars=0"):
        T.stdlib_docstrings(0)
    with pytest.raises(InvalidType, match="max_chars"):
        T.stdlib_docstrings(1e5)


def test_normalise_paragraphs():
    doc = "First  line\n  continues\there.\n\nSecond\u00e9 para.\n\n\n"
    assert T._normalise(doc) == "First line continues here.\nSecond para."


# --- encode / entropy / split --------------------------------------------------------


@given(st.text())
def test_encode_decode_round_trip(s):
    codes, vocab = T.encode(s)
    assert codes.dtype == np.int64 and codes.shape == (len(s),)
    assert vocab == "".join(sorted(set(s)))
    assert T.decode(codes, vocab) == s
    if s:
        H = T.unigram_entropy(codes, len(vocab))
        assert -1e-12 <= H <= math.log2(len(vocab)) + 1e-9


def test_encode_example_and_entropy():
    codes, vocab = T.encode("abracadabra")
    assert vocab == "abcdr"
    assert codes.tolist() == [0, 1, 4, 0, 2, 0, 3, 0, 1, 4, 0]
    assert T.unigram_entropy(np.array([0, 1, 0, 1]), 2) == pytest.approx(1.0)
    assert T.unigram_entropy(np.array([3, 3, 3]), 8) == 0.0
    assert T.unigram_entropy(np.arange(8), 8) == pytest.approx(3.0)


def test_encode_decode_entropy_bad_arguments():
    with pytest.raises(InvalidType, match="str"):
        T.encode(b"bytes")
    with pytest.raises(InvalidArgument, match="outside"):
        T.decode(np.array([0, 3]), "abc")
    with pytest.raises(InvalidType, match="str"):
        T.decode(np.array([0]), ["a"])
    with pytest.raises(InvalidArgument, match="outside"):
        T.unigram_entropy(np.array([0, 5]), 5)
    with pytest.raises(InvalidArgument, match="outside"):
        T.unigram_entropy(np.array([-1, 0]), 5)
    with pytest.raises(InvalidArgument, match="empty"):
        T.unigram_entropy(np.array([], dtype=np.int64), 5)
    with pytest.raises(InvalidType, match="integer"):
        T.unigram_entropy(np.array([0.0, 1.0]), 2)
    with pytest.raises(InvalidType, match="ndarray"):
        T.unigram_entropy([0, 1], 2)
    with pytest.raises(InvalidArgument, match="V=0"):
        T.unigram_entropy(np.array([0]), 0)


def test_split_is_contiguous_tail():
    codes = np.arange(1000, dtype=np.int64)
    train, valid = T.split(codes, 0.1)
    assert train.shape == (900,) and valid.shape == (100,)
    np.testing.assert_array_equal(np.concatenate([train, valid]), codes)
    assert valid[0] == 900
    train, valid = T.split(codes, 0.0015)  # rounds to 2
    assert valid.tolist() == [998, 999]


@pytest.mark.parametrize("codes, fraction, exc, match", [
    (np.arange(10), 0.0, InvalidArgument, "fraction=0.0 must be > 0"),
    (np.arange(10), 1.0, InvalidArgument, "fraction=1.0 must be < 1"),
    (np.arange(10), 0.01, InvalidArgument, "leaves 0 for validation"),
    (np.arange(10), 0.99, InvalidArgument, "0 for training"),
    (np.arange(10), "0.1", InvalidType, "fraction"),
    (list(range(10)), 0.1, InvalidType, "ndarray"),
    (np.zeros((2, 5)), 0.1, InvalidArgument, "ndim"),
])
def test_split_bad_arguments(codes, fraction, exc, match):
    with pytest.raises(exc, match=match):
        T.split(codes, fraction)
