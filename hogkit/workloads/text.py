"""Offline text data for a character-level RNN language model: no downloads.

Two sources of symbol sequences, and the small tools around them:

- :func:`markov_source` - a random order-k Markov chain over ``alphabet`` symbols
  whose exact entropy rate is known (:meth:`MarkovSource.entropy_rate`), so a
  model's loss can be read against the best loss any model can reach. Each
  context's next-symbol distribution is drawn from a symmetric
  Dirichlet(``concentration``): a small concentration gives peaked distributions and
  an entropy rate well below the unigram entropy (the gap is what a model must learn
  from context). The defaults (16 symbols, order 2, concentration 0.2) give
  ~2.3 bits/symbol against ~4.0 bits for the unigram entropy.
- :func:`stdlib_docstrings` - real English-like text that ships with Python: the
  docstrings of modules, classes and functions of a fixed list of standard-library
  sources, read with :mod:`ast` (never imported). Deterministic for a given Python
  version; ~590k characters of printable ASCII on CPython 3.11.
- :func:`encode` / :func:`decode` - characters to ids 0..V-1 (sorted distinct
  characters) and back; :func:`unigram_entropy` - bits/char of the empirical unigram
  distribution; :func:`split` - the last ``fraction`` of a sequence, contiguous, as
  the validation part.

Entropies are in bits. numpy only (the sampling loop is a numba kernel).
"""

from __future__ import annotations

import ast
import functools
import math
import os
import sysconfig
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from hogkit.errors import InvalidArgument, InvalidType
from hogkit.validation import check_array, check_float, check_ids_below, check_int
from hogkit.workloads.base import check_seed

__all__ = [
    "MAX_CONTEXTS",
    "STDLIB_FILES",
    "MarkovSource",
    "decode",
    "encode",
    "markov_source",
    "split",
    "stdlib_docstrings",
    "unigram_entropy",
]

#: The most contexts (``alphabet ** order``) a Markov source may have.
MAX_CONTEXTS = 65536
#: The largest alphabet of a Markov source (a byte's worth of symbols).
MAX_ALPHABET = 256

# ---------------------------------------------------------------------------------
# Markov source
# ---------------------------------------------------------------------------------


def _entropy_bits(p, axis=-1):
    """Shannon entropy in bits of the distribution(s) ``p`` along ``axis`` (0 log 0 = 0)."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis=axis)


def _order_of(n_contexts, alphabet):
    """The k with ``alphabet ** k == n_contexts``, or None."""
    k, size = 0, 1
    while size < n_contexts:
        size *= alphabet
        k += 1
    return k if size == n_contexts and k >= 1 else None


def _check_contexts(alphabet, order):
    n = alphabet ** order
    if n > MAX_CONTEXTS:
        raise InvalidArgument(
            f"alphabet**order = {alphabet}**{order} = {n} contexts exceeds "
            f"{MAX_CONTEXTS}; lower the order or the alphabet")
    return n


def _check_table(P):
    """A transition table: float64 (alphabet**order, alphabet), rows distributions."""
    check_array("P", P, dtype=np.float64, ndim=2)
    n_ctx, alphabet = P.shape
    if not 2 <= alphabet <= MAX_ALPHABET:
        raise InvalidArgument(f"P has {alphabet} columns (the alphabet); expected 2 to "
                              f"{MAX_ALPHABET}")
    order = _order_of(n_ctx, alphabet)
    if order is None:
        raise InvalidArgument(f"P has shape {P.shape}: its {n_ctx} rows are not a power "
                              f"alphabet**order (order >= 1) of its {alphabet} columns")
    _check_contexts(alphabet, order)
    if not np.isfinite(P).all() or (P < 0).any():
        raise InvalidArgument("P must hold finite, non-negative probabilities")
    worst = float(np.abs(P.sum(axis=1) - 1.0).max())
    if worst > 1e-9:
        raise InvalidArgument(f"every row of P must sum to 1; one is off by {worst:.3g}")
    return alphabet, order


def _step_contexts(pi, P, alphabet):
    """One step of the chain over contexts: context (c_1..c_k) with next symbol s goes
    to (c_2..c_k, s). Contexts are base-``alphabet`` numbers, most recent symbol last
    (least significant), so the new context is ``(ctx % alphabet**(k-1)) * alphabet + s``
    and the oldest symbol is the leading axis of the reshape."""
    flow = (pi[:, None] * P).reshape(alphabet, -1)
    return flow.sum(axis=0)


#: Up to this many contexts the stationary distribution is an exact linear solve.
_DENSE_CONTEXTS = 2048
#: Power iteration stops after about this many multiply-adds (a few seconds).
_POWER_WORK = 2_000_000_000


def _not_unique():
    return InvalidArgument(
        "the chain has no unique stationary distribution to working precision (some "
        "contexts are (nearly) unreachable from others, so the entropy rate depends on "
        "where it starts); use a larger concentration")


def _stationary_dense(P, alphabet):
    """Solve pi T = pi, sum(pi) = 1 with the dense context-transition matrix T. The
    rows of T^t - I add up to zero, so one of them is replaced by the normalisation."""
    n_ctx = P.shape[0]
    ctx = np.arange(n_ctx)[:, None]
    nxt = (ctx % (n_ctx // alphabet)) * alphabet + np.arange(alphabet)[None, :]
    T = np.zeros((n_ctx, n_ctx))
    T[ctx, nxt] = P
    M = T.T - np.eye(n_ctx)
    M[-1, :] = 1.0
    b = np.zeros(n_ctx)
    b[-1] = 1.0
    try:
        pi = np.linalg.solve(M, b)
    except np.linalg.LinAlgError:
        raise _not_unique() from None
    if not np.isfinite(pi).all() or pi.min() < -1e-9 or np.abs(pi @ T - pi).sum() > 1e-9:
        raise _not_unique()
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()


def _stationary_power(P, alphabet, *, tol=1e-12):
    """Power iteration on the slightly lazy chain 0.1 I + 0.9 T: the same stationary
    distribution, and aperiodic, so it converges for a periodic chain too.

    Stops when the L1 error, estimated from the step size d and the observed
    contraction rate r as d r / (1 - r), is below ``tol`` (a small step alone means
    little in a slowly mixing chain)."""
    n_ctx = P.shape[0]
    max_iter = max(200, _POWER_WORK // P.size)
    pi = np.full(n_ctx, 1.0 / n_ctx)
    prev = math.inf
    for _ in range(max_iter):
        new = 0.1 * pi + 0.9 * _step_contexts(pi, P, alphabet)
        new /= new.sum()
        d = float(np.abs(new - pi).sum())
        r = d / prev  # 0 at the first step (prev = inf), which does not count
        if d == 0.0 or (prev < math.inf and r < 1.0 and d * r < tol * (1.0 - r)):
            return new
        pi, prev = new, d
    raise InvalidArgument(
        f"the stationary distribution over {n_ctx} contexts did not converge in "
        f"{max_iter} power iterations (the chain mixes too slowly); use a larger "
        f"concentration, or fewer contexts (up to {_DENSE_CONTEXTS} are solved exactly)")


def _stationary(P, alphabet):
    """The stationary distribution over contexts: an exact solve for up to
    ``_DENSE_CONTEXTS`` contexts, power iteration above."""
    if P.shape[0] <= _DENSE_CONTEXTS:
        return _stationary_dense(P, alphabet)
    return _stationary_power(P, alphabet)


@njit(cache=True, nogil=True)
def _sample_chain(cum, ctx, alphabet, n_contexts, u, out, start):
    """Fill ``out[start:]``: at each step the next symbol is the first column of
    ``cum[ctx]`` (cumulative row, last entry 1) above the uniform ``u[i]``."""
    for i in range(start, out.shape[0]):
        x = u[i]
        row = cum[ctx]
        s = 0
        while s < alphabet - 1 and row[s] <= x:
            s += 1
        out[i] = s
        ctx = (ctx * alphabet + s) % n_contexts
    return ctx


def _check_rng(rng):
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, bool) or not isinstance(rng, (int, np.integer)):
        raise InvalidType(f"rng={rng!r} must be a numpy.random.Generator or an int seed, "
                          f"got {type(rng).__name__}")
    return np.random.default_rng(check_seed(rng, "rng"))


@dataclass(frozen=True, eq=False)
class MarkovSource:
    """An order-k Markov chain over symbols 0..alphabet-1.

    ``P[ctx, s]`` is the probability that symbol ``s`` follows the context ``ctx``, the
    last ``order`` symbols read as a base-``alphabet`` number with the most recent
    symbol least significant. ``P`` has shape (alphabet**order, alphabet); alphabet
    and order are read from it.
    """

    P: np.ndarray = field(repr=False)
    alphabet: int = field(init=False)
    order: int = field(init=False)

    def __post_init__(self):
        P = self.P
        if not isinstance(P, np.ndarray):
            raise InvalidType(f"P must be a numpy.ndarray, got {type(P).__name__}; "
                              f"convert with np.asarray(P, dtype=np.float64)")
        if P.dtype.kind not in "fiu":
            raise InvalidType(f"P has dtype {P.dtype}, expected float64 probabilities")
        P = np.array(P, dtype=np.float64, order="C")  # a private, read-only copy
        alphabet, order = _check_table(P)
        P.setflags(write=False)
        object.__setattr__(self, "P", P)
        object.__setattr__(self, "alphabet", alphabet)
        object.__setattr__(self, "order", order)

    @property
    def n_contexts(self) -> int:
        return self.P.shape[0]

    @functools.cached_property
    def stationary(self) -> np.ndarray:
        """The stationary distribution over the alphabet**order contexts."""
        pi = _stationary(self.P, self.alphabet)
        pi.setflags(write=False)
        return pi

    def symbol_distribution(self) -> np.ndarray:
        """The stationary distribution of a single symbol (the most recent one of a
        stationary context)."""
        return self.stationary.reshape(-1, self.alphabet).sum(axis=0)

    def entropy_rate(self) -> float:
        """Exact entropy rate in bits/symbol: sum_ctx pi(ctx) H(P[ctx])."""
        return float(self.stationary @ _entropy_bits(self.P, axis=1))

    def unigram_entropy(self) -> float:
        """Entropy in bits of the stationary symbol distribution (what a model that
        ignores context can reach at best)."""
        return float(_entropy_bits(self.symbol_distribution()))

    def sample(self, n, rng) -> np.ndarray:
        """``n`` symbols (int64) of the stationary chain: the first context is drawn
        from the stationary distribution, then each symbol from ``P[context]``.
        ``rng`` is a numpy Generator or an int seed."""
        n = check_int("n", n, min_value=0)
        rng = _check_rng(rng)
        out = np.empty(n, dtype=np.int64)
        if n == 0:
            return out
        A, k = self.alphabet, self.order
        pi = self.stationary
        ctx = int(rng.choice(self.n_contexts, p=pi / pi.sum()))
        digits = [(ctx // A ** (k - 1 - j)) % A for j in range(k)]  # oldest first
        head = min(k, n)
        out[:head] = digits[:head]
        cum = np.cumsum(self.P, axis=1)
        cum[:, -1] = 1.0
        u = rng.random(n)
        _sample_chain(cum, ctx, A, self.n_contexts, u, out, head)
        return out


def markov_source(seed, *, alphabet=16, order=2, concentration=0.2) -> MarkovSource:
    """A random order-``order`` Markov chain over ``alphabet`` symbols: each context's
    next-symbol distribution is drawn from a symmetric Dirichlet(``concentration``)
    with ``numpy.random.default_rng(seed)``. alphabet**order must be <= 65536."""
    seed = check_seed(seed)
    alphabet = check_int("alphabet", alphabet, min_value=2, max_value=MAX_ALPHABET)
    order = check_int("order", order, min_value=1)
    concentration = check_float("concentration", concentration, min_value=0.0,
                                exclude_min=True)
    n_ctx = _check_contexts(alphabet, order)
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.full(alphabet, concentration), size=n_ctx)
    P /= P.sum(axis=1, keepdims=True)
    return MarkovSource(np.ascontiguousarray(P))


# ---------------------------------------------------------------------------------
# Standard-library docstrings
# ---------------------------------------------------------------------------------

#: Standard-library sources whose docstrings make the corpus, relative to
#: ``sysconfig.get_paths()["stdlib"]``; missing ones are skipped (pathlib and zipfile
#: became packages in later Pythons, so both spellings are listed).
STDLIB_FILES = tuple(sorted([
    "_pydecimal.py", "argparse.py", "asyncio/events.py", "calendar.py",
    "collections/__init__.py", "configparser.py", "contextlib.py", "csv.py",
    "dataclasses.py", "datetime.py", "difflib.py", "doctest.py", "email/message.py",
    "enum.py", "fractions.py", "ftplib.py", "functools.py", "http/client.py",
    "http/server.py", "imaplib.py", "inspect.py", "ipaddress.py", "json/__init__.py",
    "logging/__init__.py", "logging/handlers.py", "mailbox.py", "optparse.py", "os.py",
    "pathlib.py", "pathlib/__init__.py", "pdb.py", "random.py", "shutil.py",
    "smtplib.py", "statistics.py", "subprocess.py", "tarfile.py", "textwrap.py",
    "threading.py", "typing.py", "unittest/case.py", "unittest/mock.py",
    "urllib/parse.py", "urllib/request.py", "zipfile.py", "zipfile/__init__.py",
]))

_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_PRINTABLE = frozenset(chr(c) for c in range(32, 127))


def _docstrings(tree):
    """Docstrings of the module, classes and functions in ``tree``, in source order."""
    if isinstance(tree, _DOC_NODES):
        doc = ast.get_docstring(tree)
        if doc:
            yield doc
    for child in ast.iter_child_nodes(tree):
        if not isinstance(child, ast.expr):  # no def inside an expression
            yield from _docstrings(child)


def _normalise(doc):
    """Printable ASCII only; whitespace inside a paragraph collapsed to single spaces;
    one paragraph a line."""
    doc = "".join(c if c in _PRINTABLE or c.isspace() else "" for c in doc)
    paragraphs = (" ".join(p.split()) for p in doc.replace("\r", "").split("\n\n"))
    return "\n".join(p for p in paragraphs if p)


def _collect(root, files):
    """The normalised docstrings of ``files`` (paths relative to ``root``, missing ones
    skipped), docstrings separated by a blank line."""
    docs = []
    for rel in files:
        path = os.path.join(root, *rel.split("/"))
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        docs.extend(d for d in map(_normalise, _docstrings(tree)) if d)
    return "\n\n".join(docs)


@functools.lru_cache(maxsize=1)
def _stdlib_corpus(root):
    return _collect(root, STDLIB_FILES)


def stdlib_docstrings(max_chars=500_000) -> str:
    """English-like text: the docstrings of :data:`STDLIB_FILES`, parsed with ``ast``.

    Each docstring is reduced to printable ASCII, whitespace in a paragraph collapsed,
    paragraphs one a line and docstrings separated by a blank line. Cut to the first
    ``max_chars`` characters (None: all of it; fewer if the corpus is shorter).
    """
    if max_chars is not None:
        max_chars = check_int("max_chars", max_chars, min_value=1,
                              fix="or pass None for the whole corpus")
    text = _stdlib_corpus(sysconfig.get_paths()["stdlib"])
    if not text:
        raise InvalidArgument("no standard-library source found under "
                              f"{sysconfig.get_paths()['stdlib']!r}")
    return text if max_chars is None else text[:max_chars]


# ---------------------------------------------------------------------------------
# Encoding, entropy, split
# ---------------------------------------------------------------------------------


def encode(text):
    """``(codes, vocab)``: ``vocab`` is the sorted distinct characters of ``text`` and
    ``codes`` (int64) the index of each character in it, so ``vocab[codes[i]] ==
    text[i]``."""
    if not isinstance(text, str):
        raise InvalidType(f"text must be a str, got {type(text).__name__}")
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    uniq, codes = np.unique(points, return_inverse=True)
    vocab = "".join(map(chr, uniq.tolist()))
    return codes.astype(np.int64).reshape(-1), vocab


def decode(codes, vocab) -> str:
    """The text whose :func:`encode` is ``(codes, vocab)``."""
    if not isinstance(vocab, str):
        raise InvalidType(f"vocab must be a str, got {type(vocab).__name__}")
    codes = _check_codes(codes, len(vocab), allow_empty=True)
    table = np.frombuffer(vocab.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return table[codes].astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


def _check_codes(codes, V, *, allow_empty=False):
    if not isinstance(codes, np.ndarray):
        raise InvalidType(f"codes must be a numpy.ndarray of int ids, got "
                          f"{type(codes).__name__}; use np.asarray(codes, dtype=np.int64)")
    if codes.dtype.kind not in "iu":
        raise InvalidType(f"codes has dtype {codes.dtype}, expected integer ids; use "
                          f"codes.astype(np.int64)")
    check_array("codes", codes, ndim=1, contiguous=False)
    if codes.size == 0:
        if allow_empty:
            return codes
        raise InvalidArgument("codes is empty; it needs at least one symbol")
    check_ids_below("codes", codes, V, what="id", of=f"a vocabulary of {V}")
    return codes


def unigram_entropy(codes, V) -> float:
    """Bits per symbol of the empirical unigram distribution of ``codes`` (ids in
    [0, V))."""
    V = check_int("V", V, min_value=1)
    codes = _check_codes(codes, V)
    counts = np.bincount(codes, minlength=V)
    return float(_entropy_bits(counts / codes.size))


def split(codes, fraction=0.1):
    """``(train, valid)``: ``valid`` is the last ``fraction`` of ``codes`` (rounded to
    a whole number of symbols), ``train`` the rest; contiguous slices (views), no
    shuffling. Both parts must be non-empty."""
    if not isinstance(codes, np.ndarray):
        raise InvalidType(f"codes must be a numpy.ndarray, got {type(codes).__name__}; "
                          f"use np.asarray(codes)")
    check_array("codes", codes, ndim=1, contiguous=False)
    fraction = check_float("fraction", fraction, min_value=0.0, max_value=1.0,
                           exclude_min=True, exclude_max=True)
    n = codes.shape[0]
    n_valid = round(n * fraction)
    if not 0 < n_valid < n:
        raise InvalidArgument(
            f"fraction={fraction} of {n} symbols leaves {n_valid} for validation and "
            f"{n - n_valid} for training; both need at least one (a longer sequence or "
            f"another fraction)")
    return codes[:n - n_valid], codes[n - n_valid:]
