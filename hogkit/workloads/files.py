"""Users' data files: ratings for ``mf``, svmlight/libsvm for ``logreg``.

``hogkit run --workload mf --data FILE`` (``-o data=FILE``) and ``--workload logreg
--data FILE`` read these; so does ``hogkit predict``. Readers are well-kept ones
(numpy's ``loadtxt`` for text, scikit-learn's ``load_svmlight_file``); what they let
through or report without a line number is checked here, and every refusal names the
file, the line and the fix, before anything is built or spawned.

- **Ratings** (LIBMF's text format): ``user item rating`` per line, whitespace-separated,
  0-based integer ids, a finite rating; or a CSV with the same first three columns
  (further columns, e.g. a timestamp, are ignored) and an optional header line. Lines
  that are blank or start with ``#`` are skipped. For ``hogkit predict`` the rating
  may be left out (``user item``).
- **svmlight / libsvm**: ``label index:value ...`` per line, 1-based feature indices,
  labels -1/+1 or 0/1 (read as 0/1).
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import numpy as np

from hogkit.errors import InvalidArgument
from hogkit.validation import check_float

__all__ = ["Ratings", "Samples", "read_ratings", "read_svmlight", "split", "held_out",
           "check_fraction"]

_INT32_MAX = 2**31 - 1


class Ratings(NamedTuple):
    """A ratings file: ids (int32), ratings (float32; None when the file has only ids)."""
    u: np.ndarray
    i: np.ndarray
    r: np.ndarray | None
    n_rows: int        # largest user id + 1
    n_cols: int        # largest item id + 1


class Samples(NamedTuple):
    """An svmlight file as CSR: ``indptr`` int64, ``indices`` int32 (0-based),
    ``values`` float32, labels ``y`` float32 in {0, 1}."""
    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    y: np.ndarray
    n_features: int    # largest feature index (1-based) in the file


def _existing(path) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidArgument(f"data file {path!r} does not exist (or is not a file); "
                              f"give the path of a ratings or svmlight file")
    return path


def _data_lines(path):
    """``(line number, text)`` of each line that holds data (not blank, not ``#``)."""
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if s and not s.startswith("#"):
                yield n, s


def _header_and_sep(path):
    """The separator (``","`` for CSV, None for whitespace) and whether the first data
    line is a header (its first field is not a number)."""
    for _, first in _data_lines(path):
        sep = "," if "," in first else None
        head = first.split(sep)[0].strip()
        try:
            float(head)
            return sep, False
        except ValueError:
            return sep, True
    raise InvalidArgument(f"data file {path!r} holds no data lines")


def _bad(path, lineno, text, why, fix):
    raise InvalidArgument(f"{path}, line {lineno}: {why}: {text[:80]!r}; {fix}")


_RATINGS_FIX = ("each line must be `user item rating` (0-based integer ids, a finite "
                "rating), separated by spaces or commas (a CSV may have a header line)")


def _scan_ratings(path, sep, header, need):
    """The first line that is not ``need`` numeric fields: raises with its number."""
    lines = _data_lines(path)
    if header:
        next(lines, None)
    for n, s in lines:
        fields = [x.strip() for x in s.split(sep)]
        if len(fields) < need:
            _bad(path, n, s, f"{len(fields)} field(s), {need} needed", _RATINGS_FIX)
        for x in fields[:need]:
            try:
                float(x)
            except ValueError:
                _bad(path, n, s, f"{x!r} is not a number", _RATINGS_FIX)


def _line_of(path, row, header):
    """The line number and text of data row ``row`` (0-based, after a header)."""
    for k, (n, s) in enumerate(_data_lines(path)):
        if k == row + int(header):
            return n, s
    return -1, ""  # pragma: no cover - rows come from the same file


def _cached(reader):
    """``reader(path, **options)`` read once per file version: a workload made by name
    is built up to three times in the parent (the CLI's check, ``train``'s plan, the
    lane defaults), and each read a whole data file again. Keyed by the file's real
    path, size and modification time (an edited file is read afresh); the arrays
    handed out are read-only, so no caller can change another's."""
    memo = {}

    @functools.wraps(reader)
    def read(path, **options):
        path = _existing(path)
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns,
               tuple(sorted(options.items())))
        if key not in memo:
            out = reader(path, **options)
            for a in out:
                if isinstance(a, np.ndarray):
                    a.setflags(write=False)
            memo.clear()                  # one file version kept: a data set's memory
            memo[key] = out
        return memo[key]
    return read


@_cached
def read_ratings(path, *, need_rating=True, shape=None) -> Ratings:
    """Read a ratings file (the module docstring); ``need_rating=False`` also takes
    ``user item`` lines (``r`` is then None when no line has a rating); ``shape``
    ``(users, items)``: ids must lie below these (a trained model's)."""
    path = _existing(path)
    sep, header = _header_and_sep(path)
    try:
        a = _loadtxt(path, sep, header, 3)
    except ValueError:
        if need_rating:
            _scan_ratings(path, sep, header, 3)
            raise                                 # pragma: no cover - the scan raises
        try:                                      # `user item` lines (hogkit predict)
            a = _loadtxt(path, sep, header, 2)
        except ValueError:
            _scan_ratings(path, sep, header, 2)
            raise                                 # pragma: no cover
    ids = a[:, :2]
    bad = np.flatnonzero(~np.all((ids >= 0) & (ids == np.floor(ids)) & (ids <= _INT32_MAX),
                                 axis=1))
    if len(bad):
        n, s = _line_of(path, int(bad[0]), header)
        _bad(path, n, s, "ids must be non-negative integers (0-based)", _RATINGS_FIX)
    if shape is not None:
        bad = np.flatnonzero((ids[:, 0] >= shape[0]) | (ids[:, 1] >= shape[1]))
        if len(bad):
            n, s = _line_of(path, int(bad[0]), header)
            _bad(path, n, s, f"an id outside the model ({shape[0]} users, {shape[1]} "
                             f"items, ids from 0)", "predict only ids the model was "
                                                    "trained on")
    r = None
    if a.shape[1] >= 3:
        r = a[:, 2]
        bad = np.flatnonzero(~np.isfinite(r) | (np.abs(r) > np.finfo(np.float32).max))
        if len(bad):
            n, s = _line_of(path, int(bad[0]), header)
            _bad(path, n, s, "the rating is not a finite float32", _RATINGS_FIX)
        r = r.astype(np.float32)
    u, i = ids[:, 0].astype(np.int32), ids[:, 1].astype(np.int32)
    return Ratings(u, i, r, int(u.max()) + 1, int(i.max()) + 1)


def _loadtxt(path, sep, header, cols):
    """The first ``cols`` columns as float64 (numpy's reader; its error's row numbers
    do not count skipped lines, so a refusal is located again by :func:`_scan_ratings`)."""
    a = np.loadtxt(path, delimiter=sep, ndmin=2, usecols=range(cols), dtype=np.float64,
                   comments="#", skiprows=_first_data_line(path) if header else 0)
    if a.shape[0] == 0:
        raise InvalidArgument(f"data file {path!r} holds no data lines")
    return a


def _first_data_line(path):
    """Lines to skip so that the header line (the first data line) is skipped."""
    for n, _ in _data_lines(path):
        return n
    return 0  # pragma: no cover


_SVM_FIX = ("each line must be `label index:value ...` with a label of -1/+1 or 0/1 and "
            "1-based increasing feature indices (the svmlight/libsvm format)")


def _scan_svmlight(path):
    """The first line sklearn's reader would refuse: raises with its number."""
    for n, s in _data_lines(path):
        fields = s.split("#")[0].split()
        try:
            float(fields[0])
        except ValueError:
            _bad(path, n, s, f"the label {fields[0]!r} is not a number", _SVM_FIX)
        last = 0
        for f in fields[1:]:
            if f.startswith("qid:"):
                continue
            idx, colon, val = f.partition(":")
            try:
                j, _ = int(idx), float(val)
            except ValueError:
                j = None
            if not colon or j is None:
                _bad(path, n, s, f"{f!r} is not index:value", _SVM_FIX)
            if j < 1:
                _bad(path, n, s, f"feature index {j} (indices are 1-based)", _SVM_FIX)
            if j <= last:
                _bad(path, n, s, f"feature index {j} after {last} (indices must increase)",
                     _SVM_FIX)
            last = j


@_cached
def read_svmlight(path, *, n_features=None) -> Samples:
    """Read an svmlight/libsvm file (the module docstring) with scikit-learn's reader;
    ``n_features``: at least this many features (a model trained on another file)."""
    from sklearn.datasets import load_svmlight_file
    path = _existing(path)
    try:
        X, y = load_svmlight_file(path, zero_based=False, n_features=n_features,
                                  dtype=np.float64)
    except ValueError as e:
        _scan_svmlight(path)
        raise InvalidArgument(f"{path}: {e}; {_SVM_FIX}") from None
    if X.shape[0] == 0:
        raise InvalidArgument(f"data file {path!r} holds no data lines")
    bad = np.flatnonzero(~np.isfinite(y) | ~np.isin(y, (-1.0, 0.0, 1.0)))
    if len(bad):
        n, s = _line_of(path, int(bad[0]), False)
        _bad(path, n, s, f"label {y[bad[0]]:g} (labels are -1/+1 or 0/1)", _SVM_FIX)
    X.sum_duplicates()
    if not np.isfinite(X.data).all():
        row = int(np.searchsorted(X.indptr, np.flatnonzero(~np.isfinite(X.data))[0],
                                  side="right") - 1)
        n, s = _line_of(path, row, False)
        _bad(path, n, s, "a feature value is not finite", _SVM_FIX)
    return Samples(X.indptr.astype(np.int64), X.indices.astype(np.int32),
                   X.data.astype(np.float32), (y > 0).astype(np.float32), int(X.shape[1]))


def check_fraction(test_fraction, data):
    """A workload's ``test_fraction``, checked: in [0, 1), and only with a ``data``
    file (it holds out part of one)."""
    f = check_float("test_fraction", test_fraction, min_value=0.0, max_value=1.0,
                    exclude_max=True, fix="0.1 holds out a tenth of the data")
    if data is None and f:
        raise InvalidArgument("test_fraction holds out part of a data file; give data= "
                              "(--data FILE) too, or drop it")
    return f


def held_out(n, fraction) -> int:
    """How many of ``n`` items :func:`split` holds out (at least one stays)."""
    return min(int(round(n * fraction)), n - 1)


def split(n, fraction, seed):
    """``(train, test)`` index arrays of ``n`` items: a ``fraction`` of them held out,
    drawn with ``seed`` (at least one item stays in training)."""
    if not 0.0 <= fraction < 1.0:
        raise InvalidArgument(f"test_fraction={fraction} must lie in [0, 1); e.g. 0.1 "
                              f"holds out a tenth of the data for the test metrics")
    k = held_out(n, fraction)
    order = np.random.default_rng(np.random.SeedSequence([seed, 0x7E57])).permutation(n)
    return np.sort(order[k:]), np.sort(order[:k])
