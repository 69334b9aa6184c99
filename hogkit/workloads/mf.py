"""Matrix factorisation on generated low-rank ratings with Zipf-skewed popularity.

The Hogwild! matrix-completion workload (Niu et al. 2011, section 5; the model of
Koren, Bell & Volinsky 2009). Data: true factors U (n_rows, k_true) and V (n_cols,
k_true) with N(0, k_true^-1/2) entries, so a true rating U[u].V[i] has variance ~1;
``n_ratings`` *distinct* (u, i) cells are observed, rows and columns drawn with Zipf
popularity (``zipf`` exponent; 0 = uniform; the most popular ids are spread over the
id space by a random permutation), each rating r_ui = U[u].V[i] + noise * N(0, 1).

Model: r_ui ~ p_u . q_i with P (n_rows, rank) and Q (n_cols, rank), initialised
N(0, init_scale^2). Popular rows and columns are where Hogwild workers collide: a
higher ``zipf`` means more conflicting writes.

Gradient, per rating in the batch, of 1/2 (e_ui^2 + reg (|p_u|^2 + |q_i|^2)) with
e_ui = r_ui - p_u . q_i (kernels/mf.py):

    gP[u] = -e_ui q_i + reg p_u        gQ[i] = -e_ui p_u + reg q_i

over a minibatch of ``batch`` consecutive ratings: each worker sweeps the order
``build`` shuffled once, from its own random start (wrapping), so every rating is
visited once per pass (SGD epochs without replacement, the order LIBMF and a plain
per-sample loop use) and read sequentially - and returned as sparse rows (one row per rating, duplicates left for the apply rule to
add up) and **not divided by the batch size**: a step of ``lr`` is then exactly the
classic per-rating SGD step applied to ``batch`` ratings at once, so ``lr`` keeps its
meaning whatever the batch (the batch only sets how many ratings one update carries).
The default lr 0.05 sits 4x below where sequential SGD diverges (~0.2).

Loss reported by ``loss``: plain mean squared error over all ratings, mean(e_ui^2),
without the 1/2 and without the L2 term. ``metrics`` adds ``rmse``.

``order="blocks"`` (FPSG, Chin et al. 2013; DSGD, Gemulla et al. 2011): the ratings are
stored grouped by the blocks of a ``blocks x blocks`` grid (row ranges x column ranges)
and each worker reads only blocks whose row range and column range no other worker
holds, claimed lock-free in a scheduler array the workers share (``kernels/blocks.py``;
docs/algorithms.md, "The block order"). ``build`` then adds ``blk_off`` (the block
offsets) and ``blk_sched`` (the scheduler) to the data; the parameters, the ratings'
set and the loss are the sweep's. ``metrics`` adds the scheduler's counts.

The defaults (one set, however the workload is reached: by name, as an object, from
the CLI, in the simulator): row-wise AdaGrad from 1 at lr 0.2, 4,096 ratings a step,
the block order and the per-sample lane where the run allows it (the simulator models
the batch lane with the same rule, batch and order), measured fastest to the target by
``hogkit bench peers`` (docs/algorithms.md §1, "The defaults").
"""

from __future__ import annotations

import copy
import os
import warnings
import weakref

import numpy as np

from hogkit.errors import InvalidArgument, RunNotice, user_stacklevel
from hogkit.procfs import cache_bytes
from hogkit.kernels import blocks as _kb
from hogkit.kernels.mf import MFArrays, mf_predict, mf_scratch, mf_sse
from hogkit.rules.core import AdaGrad
from hogkit.validation import check_array, check_choice, check_float, check_int, check_indices
from hogkit.workloads.base import (CompiledParts, KernelCtx, Workload, check_dtype,
                                   check_keys, check_param, check_seed, sample_from,
                                   zipf_probabilities)
from hogkit.workloads.files import check_fraction, held_out, read_ratings, split

PRESETS = {
    # 2 x 5000 x 32 float32 factors (1.3 MB), 500k ratings (6 MB). Sequential SGD at
    # the default lr/batch: MSE 0.99 -> 0.15 in 5000 steps; diverges from lr ~0.2.
    "default": dict(n_rows=5000, n_cols=5000, rank=32, k_true=16, n_ratings=500_000),
    # small and hot: 200 x 200, a quarter of the cells observed, strong skew -> many
    # conflicting writes per step.
    "hot": dict(n_rows=200, n_cols=200, rank=8, k_true=4, n_ratings=10_000, zipf=1.5),
    # benchmarks: 2 x 200k x 64 float32 factors = 102.4 MB, 4M ratings = 48 MB of data.
    "large": dict(n_rows=200_000, n_cols=200_000, rank=64, k_true=16, n_ratings=4_000_000),
}

_INT32_MAX = 2**31 - 1
#: the block order's least grid side when ``blocks`` is not given; a run of ``W``
#: workers takes at least ``2W + 1`` (:meth:`MatrixFactorization.for_workers`: a worker
#: holds up to two blocks across a step, so a smaller grid leaves the workers circling
#: on the few blocks that are free; LIBMF warns below ``2 x threads`` bins); capped by
#: the rows and columns
DEFAULT_GRID = 8
#: the per-sample lane's prefetch distance (ratings ahead) when the factor tables
#: outgrow one core's L2 cache (``prefetch=None``); on the large preset (98 MiB of
#: factors) it takes SGD from 1.09x to 0.62x the plain loop's time, on the default
#: preset (1.2 MiB, inside L2) it would cost (1.21x -> 1.46x; benchmarks/lane.json)
PREFETCH_AHEAD = 32
#: ``order``: "blocks" where the ratings allow a grid (the default), else "sweep"
ORDERS = ("sweep", "blocks")


def _sorted_unique(a):
    """np.unique for int64 keys by sort + neighbour compare (numpy's hash-based unique
    is several times slower at millions of keys)."""
    a.sort()
    keep = np.empty(len(a), bool)
    keep[:1] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


class MatrixFactorization(Workload):
    """Matrix factorisation ``r_ui ~ P[u] . Q[i]``; see the module docstring.

    ``preset`` ("default", "hot", "large") fills the sizes (and ``zipf`` for "hot")
    that are not given explicitly. Everything else keeps its keyword default.
    """

    name = "mf"
    needs_torch = False
    #: a rule named without an lr (``--rule gap-aware``) steps at SGD's scale
    default_lr = 0.05
    #: the batch lane's minibatch: the compiled step core's best for SGD at
    #: ``default_lr`` (a summed gradient: a larger minibatch needs a smaller lr)
    default_batch = 64
    #: 4,096 ratings a step on the per-sample lane: the unit of its clocks and record
    #: (its clock reads, tick and record paid once a step)
    default_sample_batch = 4096
    #: per-sample Hogwild! where the run allows it (docs/algorithms.md §1)
    default_lane = "sample"
    #: a run given no budget: 15,625 steps of 4,096 ratings, 64 M ratings (~2-3 s of
    #: training on 2 cores)
    default_steps = 15_625
    #: AdaGrad's lr (the rule is :meth:`default_rule`)
    default_rule_lr = 0.2
    defaults_why = ("LIBMF's row-wise AdaGrad, its block order and 4,096-rating steps: "
                    "the fastest to the target of hogkit bench peers")
    grad_reduction = "sum"
    _fields = ("preset", "n_rows", "n_cols", "rank", "k_true", "n_ratings", "zipf",
               "noise", "reg", "init_scale", "dtype")

    def default_rule(self):
        """Row-wise AdaGrad from 1 (LIBMF's FPSG step, PAKDD 2015) at ``default_rule_lr``:
        on the default preset it reaches the target in half the epochs of SGD at its best
        lr (benchmarks/RESULTS.md)."""
        return AdaGrad(self.default_rule_lr, rowwise=True, initial_accumulator_value=1.0)

    def __init__(self, preset="default", *, n_rows=None, n_cols=None, rank=None,
                 k_true=None, n_ratings=None, zipf=None, noise=0.1, reg=0.0,
                 init_scale=0.1, dtype="float32", order=None, blocks=None,
                 prefetch=None, data=None, test_fraction=0.0):
        self.preset = check_choice("preset", preset, tuple(PRESETS))
        base = dict(zipf=1.1)
        base.update(PRESETS[preset])
        given = dict(n_rows=n_rows, n_cols=n_cols, rank=rank, k_true=k_true,
                     n_ratings=n_ratings, zipf=zipf)
        given.update(self._read(data, test_fraction, n_rows, n_cols, n_ratings))
        s = {k: (v if v is not None else base[k]) for k, v in given.items()}
        self.n_rows = check_int("n_rows", s["n_rows"], min_value=1, max_value=_INT32_MAX)
        self.n_cols = check_int("n_cols", s["n_cols"], min_value=1, max_value=_INT32_MAX)
        small = min(self.n_rows, self.n_cols)
        self.rank = check_int("rank", s["rank"], min_value=1, max_value=small,
                              fix=f"the rank must lie in [1, min(n_rows, n_cols)={small}]")
        self.k_true = check_int("k_true", s["k_true"], min_value=1, max_value=small,
                                fix=f"the true rank must lie in [1, min(n_rows, n_cols)={small}]")
        cells = self.n_rows * self.n_cols
        self.n_ratings = check_int(
            "n_ratings", s["n_ratings"], min_value=1,
            max_value=cells if self.data is not None else max(1, cells // 2),
            fix=f"ratings are distinct cells; at most half of the {self.n_rows} x "
                f"{self.n_cols} cells may be observed")
        self.zipf = check_float("zipf", s["zipf"], min_value=0.0, max_value=10.0,
                                fix="0 is uniform popularity, ~1.1 is typical")
        self.noise = check_float("noise", noise, min_value=0.0)
        self.reg = check_float("reg", reg, min_value=0.0)
        self.init_scale = check_float("init_scale", init_scale, min_value=0.0,
                                      exclude_min=True,
                                      fix="zero factors are a saddle point SGD cannot leave")
        self.dtype = check_dtype(dtype)
        self.order, self.blocks = self._check_order(order, blocks)
        self._grid_given = blocks is not None
        self.prefetch = None if prefetch is None else check_int(
            "prefetch", prefetch, min_value=0, max_value=4096,
            fix="ratings ahead whose rows the per-sample lane prefetches: 0 never, "
                f"None (the default) {PREFETCH_AHEAD} when the factors outgrow the L2 "
                f"cache")

    def _read(self, data, test_fraction, n_rows, n_cols, n_ratings) -> dict:
        """A ratings file (``data``: ``hogkit.workloads.files``), read once here in the
        parent: the sizes it sets (rows and columns at least its largest ids + 1; the
        training ratings: all but ``test_fraction`` of them, held out by ``build``'s
        seed for the test metrics). The arrays are kept for ``build`` (not pickled)."""
        self.data, self._file = None, None
        self.test_fraction = check_fraction(test_fraction, data)
        if data is None:
            return {}
        if n_ratings is not None:
            raise InvalidArgument("n_ratings is the generated data's size; a data file "
                                  "sets its own: drop n_ratings")
        self.data = os.fspath(data)
        self._file = f = read_ratings(self.data)
        rows = max(f.n_rows, n_rows or 0)
        cols = max(f.n_cols, n_cols or 0)
        n_test = held_out(len(f.r), self.test_fraction)
        return dict(n_rows=rows, n_cols=cols, n_ratings=len(f.r) - n_test)

    def __getstate__(self):
        """Pickled without a data file's arrays (a worker gets the data from shared
        memory, not from the workload object)."""
        return {k: v for k, v in self.__dict__.items() if k != "_file"}

    def for_workers(self, n):
        """This workload for a run of ``n`` workers: the block order's grid, when not
        given, grows to ``2n + 1`` (:data:`DEFAULT_GRID` at least; capped by the rows,
        columns and ``blocks.MAX_GRID``). A grid given smaller than that is kept, with
        a :class:`~hogkit.errors.RunNotice`."""
        if self.order != "blocks":
            return self
        want = 2 * n + 1
        if self._grid_given:
            if self.blocks < want:
                warnings.warn(f"hogkit: blocks={self.blocks} with {n} workers: a worker "
                              f"holds up to two blocks across a step, so the workers "
                              f"circle on the few free blocks and some are never trained; "
                              f"use blocks>={want} (or leave blocks out)", RunNotice,
                              stacklevel=user_stacklevel())
            return self
        grid = min(max(DEFAULT_GRID, want), self.n_rows, self.n_cols, _kb.MAX_GRID)
        if grid == self.blocks:
            return self
        other = copy.copy(self)
        other.blocks = grid
        return other

    @property
    def writes_data(self) -> tuple:
        """The block order's workers write its scheduler (claims, passes)."""
        return ("blk_sched",) if self.order == "blocks" else ()

    def _check_order(self, order, blocks):
        """``(order, grid side or None)``; see the module docstring. ``order=None`` is
        the block order where the ratings allow a grid (at least 2 rows and 2 columns,
        at most ``blocks.MAX_RATINGS`` ratings), else the sweep."""
        if order is None:
            fits = (min(self.n_rows, self.n_cols) >= 2
                    and self.n_ratings <= _kb.MAX_RATINGS)
            order = "blocks" if fits else "sweep"
        order = check_choice("order", order, ORDERS,
                             fix="'sweep' reads the shuffled ratings in turn; 'blocks' "
                                 "gives each worker blocks no other worker holds")
        if order == "sweep":
            if blocks is not None:
                raise InvalidArgument(f"blocks={blocks!r} is the block order's grid; it "
                                      f"needs order='blocks' (-o order=blocks), or drop it")
            return order, None
        small = min(self.n_rows, self.n_cols, _kb.MAX_GRID)
        if small < 2:
            raise InvalidArgument(
                f"order='blocks' needs at least 2 rows and 2 columns to cut into blocks, "
                f"got {self.n_rows} x {self.n_cols}; use order='sweep'")
        if self.n_ratings > _kb.MAX_RATINGS:
            raise InvalidArgument(f"order='blocks' addresses at most {_kb.MAX_RATINGS} "
                                  f"ratings, got n_ratings={self.n_ratings}; use "
                                  f"order='sweep'")
        if blocks is None:
            return order, min(DEFAULT_GRID, small)
        return order, check_int(
            "blocks", blocks, min_value=2, max_value=small,
            fix=f"the grid side must lie in [2, min(n_rows, n_cols, {_kb.MAX_GRID})="
                f"{small}] and should exceed the number of workers")

    def config(self):
        out = super().config()
        if self.order != "sweep":       # a sweep's config stays what it always was
            out.update(order=self.order, blocks=self.blocks)
        if self.data is not None:       # as does a generated one's
            out.update(data=self.data, test_fraction=self.test_fraction)
        return out

    def __repr__(self):
        text = super().__repr__()
        if self.order != "sweep":
            text = f"{text[:-1]}, order={self.order!r}, blocks={self.blocks!r})"
        if self.data is not None:
            text = f"{text[:-1]}, data={self.data!r}, test_fraction={self.test_fraction!r})"
        return text

    # --- parent -------------------------------------------------------------------
    def build(self, seed):
        """``({"P", "Q"}, {"u", "i", "r"})``: factors (dtype) and ratings (int32, int32,
        float32). The data and the initial factors come from independent streams of
        ``seed``. The block order stores the same ratings grouped by block (stably:
        shuffled within a block) and adds ``blk_off`` and ``blk_sched`` (int64)."""
        seed = check_seed(seed)
        data_rng, init_rng = (np.random.default_rng(s)
                              for s in np.random.SeedSequence(seed).spawn(2))
        if self.data is not None:
            return self._params(init_rng), self._file_data(seed)
        u, i = self._cells(data_rng)
        k = self.k_true
        U = data_rng.standard_normal((self.n_rows, k)) * k ** -0.25
        V = data_rng.standard_normal((self.n_cols, k)) * k ** -0.25
        r = np.empty(len(u), np.float64)
        mf_predict(U, V, u, i, r)
        r += self.noise * data_rng.standard_normal(len(r))
        data = {"u": u, "i": i, "r": r.astype(np.float32)}
        params = self._params(init_rng)
        if self.order == "blocks":
            data = self._blocked(data)
        return params, data

    def planned_bytes(self):
        """The factors' bytes exactly, and the generated ratings' (``n_ratings`` cells
        of int32, int32, float32; a data file's are not counted)."""
        n = (self.n_rows + self.n_cols) * self.rank * np.dtype(self.dtype).itemsize
        return n + (12 * self.n_ratings if self.data is None else 0)

    def _params(self, init_rng):
        dt = np.dtype(self.dtype)
        return {
            "P": (init_rng.standard_normal((self.n_rows, self.rank)) * self.init_scale).astype(dt),
            "Q": (init_rng.standard_normal((self.n_cols, self.rank)) * self.init_scale).astype(dt),
        }

    def _file_data(self, seed):
        """The data file's ratings in file order (the workers' sweeps start at random
        places in it), less the test ratings ``seed`` holds out (``test_u``, ``test_i``,
        ``test_r``, read only by :meth:`metrics`)."""
        f = self._file if self._file is not None else read_ratings(self.data)
        train, test = split(len(f.r), self.test_fraction, seed)
        data = {"u": f.u[train], "i": f.i[train], "r": f.r[train]}
        if self.order == "blocks":
            data = self._blocked(data)
        if len(test):
            data.update(test_u=f.u[test], test_i=f.i[test], test_r=f.r[test])
        return data

    def _blocked(self, data):
        """``data`` grouped by block, with the block offsets and a fresh scheduler."""
        perm, off = _kb.block_layout(data["u"], data["i"], self.n_rows, self.n_cols,
                                     self.blocks)
        out = {k: data[k][perm] for k in ("u", "i", "r")}
        out["blk_off"] = off
        out["blk_sched"] = _kb.new_sched(self.blocks)
        return out

    def _cells(self, rng):
        """``n_ratings`` distinct (u, i) cells, Zipf-popular rows and columns, shuffled."""
        n, nc = self.n_ratings, self.n_cols
        p_row = zipf_probabilities(self.n_rows, self.zipf, rng)
        p_col = zipf_probabilities(self.n_cols, self.zipf, rng)
        keys = np.empty(0, np.int64)
        for rounds in range(64):
            missing = n - len(keys)
            if missing <= 0:
                break
            want = 2 * missing + 64
            if rounds < 6:
                uu, ii = sample_from(p_row, want, rng), sample_from(p_col, want, rng)
            else:  # the popular cells are used up (both axes skewed): top up uniformly
                uu, ii = rng.integers(0, self.n_rows, want), rng.integers(0, nc, want)
            keys = _sorted_unique(np.concatenate([keys, uu * nc + ii]))
        keys = rng.permutation(keys)[:n]
        return (keys // nc).astype(np.int32), (keys % nc).astype(np.int32)

    def loss(self, params, data):
        """Mean squared error over all ratings (no 1/2, no L2 term)."""
        P, Q = params["P"], params["Q"]
        return float(mf_sse(P, Q, data["u"], data["i"], data["r"]) / len(data["r"]))

    def metrics(self, params, data):
        """``loss``, ``mse``, ``rmse``; the block order adds its scheduler's counts:
        ``block_claims``, ``block_fallbacks`` (sample calls that found no free block
        and took the sweep's ratings) and the fewest and most passes of a block."""
        mse = self.loss(params, data)
        out = {"loss": mse, "mse": mse, "rmse": float(np.sqrt(mse))}
        if "test_r" in data:            # the ratings a data file's split held out
            P, Q = params["P"], params["Q"]
            t = float(mf_sse(P, Q, data["test_u"], data["test_i"], data["test_r"])
                      / len(data["test_r"]))
            out.update(test_mse=t, test_rmse=float(np.sqrt(t)))
        if self.order == "blocks" and "blk_sched" in data:
            sched, off = data["blk_sched"], data["blk_off"]
            done = _kb.passes(sched).ravel()[np.diff(off) > 0]
            out.update(block_claims=int(sched[_kb.CLAIMS]),
                       block_fallbacks=int(sched[_kb.FALLBACKS]),
                       block_passes_min=int(done.min()), block_passes_max=int(done.max()))
        return out

    def export(self, params, folder) -> list:
        """``P.npy``, ``Q.npy`` and ``model.txt``, LIBMF's text model (``mf_save_model``
        of LIBMF 0.9.2/2.x: ``f 0``, ``m``, ``n``, ``k``, ``b``, then ``p<u> T <k values>``
        and ``q<i> T ...`` per row; ``b`` 0, the prediction for an id outside the model)."""
        paths = super().export(params, folder)
        P, Q = params["P"], params["Q"]
        path = os.path.join(folder, "model.txt")
        with open(path, "w") as f:
            f.write(f"f 0\nm {P.shape[0]}\nn {Q.shape[0]}\nk {P.shape[1]}\nb 0\n")
            for prefix, A in (("p", P), ("q", Q)):
                for row, vals in enumerate(A):
                    f.write(f"{prefix}{row} T " + " ".join(f"{v:.9g}" for v in vals)
                            + " \n")
        return paths + [path]

    @staticmethod
    def predict_file(params, path) -> tuple:
        """``(predictions, metrics)`` for the ``user item [rating]`` lines of ``path``
        (``hogkit predict``): ``P[u]·Q[i]`` per line; with ratings, their ``mse`` and
        ``rmse``. An id outside the model is refused with its line."""
        P, Q = params["P"], params["Q"]
        f = read_ratings(path, need_rating=False, shape=(P.shape[0], Q.shape[0]))
        out = np.empty(len(f.u), np.float64)
        mf_predict(P, Q, f.u, f.i, out)
        metrics = {}
        if f.r is not None:
            mse = float(np.mean((out - f.r) ** 2))
            metrics = {"mse": mse, "rmse": float(np.sqrt(mse))}
        return out, metrics

    # --- worker -------------------------------------------------------------------
    def compiled(self, params, data):
        """The step core's view: ratings and ``reg``; parameters ``(P, Q)``; one row of
        each per rating."""
        self._check(params, data)
        arrays = MFArrays(data["u"], data["i"], data["r"], float(self.reg),
                          prefetch=self.prefetch_ahead(params))
        if self.order == "blocks":
            arrays = arrays._replace(blk_off=data["blk_off"], blk_sched=data["blk_sched"])
        return CompiledParts(arrays, ("P", "Q"), (1, 1),
                             mf_scratch(self.n_rows, self.n_cols), uses_rng=False)

    def prefetch_ahead(self, params) -> int:
        """How many ratings ahead the per-sample lane prefetches rows: ``prefetch``
        when given, else :data:`PREFETCH_AHEAD` when P and Q together exceed one core's
        L2 cache (``procfs.cache_bytes``) and 0 when they fit. A hint to the CPU: the
        numbers computed are the same either way."""
        if self.prefetch is not None:
            return self.prefetch
        size = params["P"].nbytes + params["Q"].nbytes
        return PREFETCH_AHEAD if size > cache_bytes(2) else 0

    def _check(self, params, data):
        check_keys("params", params, ("P", "Q"), self.name)
        check_keys("data", data, ("u", "i", "r"), self.name)
        P = check_param("params['P']", params["P"], (self.n_rows, self.rank))
        check_param("params['Q']", params["Q"], (self.n_cols, self.rank), dtype=P.dtype)
        r = check_array("data['r']", data["r"], dtype=(np.float32, np.float64), ndim=1)
        u = check_indices("data['u']", data["u"], self.n_rows)
        i = check_indices("data['i']", data["i"], self.n_cols)
        if not (len(u) == len(i) == len(r)) or len(r) == 0:
            raise InvalidArgument(
                f"data['u'], data['i'], data['r'] must have one common nonzero length, "
                f"got {len(u)}, {len(i)}, {len(r)}; pass what build() returned")
        if self.order == "blocks":
            self._check_blocks(data, u, i)

    def _check_blocks(self, data, u, i):
        """The block order's data: offsets over the ratings, every rating inside its
        block, a scheduler of this grid that workers can write."""
        G = self.blocks
        again = f"; pass what build() of {self!r} returned"
        check_keys("data", data, ("blk_off", "blk_sched"), self.name)
        off = check_array("data['blk_off']", data["blk_off"], dtype=np.int64,
                          shape=(G * G + 1,))
        sched = check_array("data['blk_sched']", data["blk_sched"], dtype=np.int64,
                            shape=(_kb.sched_size(G),))
        if off[0] != 0 or off[-1] != len(u) or (np.diff(off) < 0).any():
            raise InvalidArgument(f"data['blk_off'] must rise from 0 to the {len(u)} "
                                  f"ratings{again}")
        if sched[_kb.GRID] != G or not sched.flags.writeable:
            raise InvalidArgument(f"data['blk_sched'] must be a writeable scheduler of "
                                  f"the {G} x {G} grid (its word 0 is "
                                  f"{int(sched[_kb.GRID])}){again}")
        bad = _kb.layout_error(u, i, off, self.n_rows, self.n_cols, G)
        if bad >= 0:
            raise InvalidArgument(f"rating {bad} (row {int(u[bad])}, column "
                                  f"{int(i[bad])}) is stored outside its block{again}")

    def setup(self, params, data, *, rank=0, seed=0):
        ctx = KernelCtx(self.compiled(params, data), params, batch=self.default_batch,
                        rank=rank, seed=seed, n_samples=len(data["r"]))
        if self.order == "blocks":
            _release_when_gone(ctx, data["blk_sched"])
        return ctx

    def gradient(self, ctx, rng, batch, *, keep_read=False):
        """A sweep block of ``batch`` ratings from the worker's cursor (the ratings are
        stored in the random order ``build`` drew, so consecutive blocks are uniform
        samples without replacement, read sequentially); their gradient rows."""
        return ctx.gradient(rng, batch, keep_read)


def _release_when_gone(ctx, sched):
    """Give ``ctx``'s cursor a finaliser that frees the blocks it still holds when the
    context goes away (a warm-up's context, a worker that ends), so no block stays
    held by nobody. The cursor becomes a view of a base array the finaliser keeps: it
    reads the last cursor value without keeping the view alive."""
    base = ctx.cursor.copy()
    ctx.cursor = base[:]
    weakref.finalize(ctx.cursor, _release, base, sched)


def _release(base, sched):
    _kb.release_cursor(sched, int(base[0]))
