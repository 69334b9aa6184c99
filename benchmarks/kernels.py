"""Scenario ``kernels``: the numba sparse-row update against memory and the alternatives.

Everything is measured in the same run, single-threaded (``torch.set_num_threads(1)``;
the numba kernels are serial), interleaved round by round, and reported as the median
over rounds:

- **triad** ``a = b + s·c`` on float64 arrays far beyond L3 (numba, serial). Bytes
  counted: 3 × 8 B per element (read b, read c, write a), the STREAM convention (the
  write-allocate read of ``a`` is not counted).
- **sparse row update** ``W[idx] -= lr·G`` (``kernels.sparse.sgd_rows``, called
  directly: no validation) on a large table (1e6 × 64 float32 = 256 MB, far beyond
  L3) and a cache-sized one (1e4 × 64 = 2.5 MB), batch 256 and 4096, row indices
  uniform over the table and fresh for every call (a 2^20-index pool walked in order,
  so a batch never finds its rows in cache from an earlier call). Bytes counted per
  touched row: 768 B = read + write of the 256 B W row + read of the 256 B G row
  (again no write-allocate).
- **alternatives** on the large table, batch 4096: ``np.add.at(W, idx, G)``,
  ``torch.index_add_``, ``torch.index_put_(accumulate=True)``, and an
  ``nn.Embedding(sparse=True)`` whose ``.grad`` is set to the sparse COO tensor its
  backward produces (indices = idx, values = G) followed by ``torch.optim.SGD.step()``.
- **delayed rules** (``kernels.delayed``) and a **density filter** (top-10 % then the
  plain update), time per row over the plain update's. Staleness-aware is the plain
  loop with another scalar. DC-ASGD and Gap-Aware measure the gap ``w - w_read`` when
  the update arrives, so their row kernels make two passes: one reads every touched
  W row (and the read copy) into a (b, d) scratch of deltas, one writes; at batch
  4096 the 3 MB working set (W rows, read rows, deltas) exceeds this core's L2, so
  the second pass re-reads the W rows from L3 (AMD's L3 is a victim cache). Gap-Aware
  also keeps a second moment ``V`` shaped like W: one more random 256 B row read and
  written per touched row (768 → 1280 B counted, ×1.67 by bytes alone).
- **per-call overhead**: the kernel on an empty batch (dispatch only).

``run(quick=False, rounds=None) -> dict``; ``format_table(result) -> str``;
``python -m hogkit.benchmarks.kernels [--quick] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from numba import njit

from hogkit.kernels import delayed, density, sparse

ROW_BYTES = 768          # per touched 64-float32 row: W read + write (512) + G read (256)
TRIAD_BYTES = 24         # per element: b, c read + a written, float64
D = 64
POOL = 1 << 20

GOALS = {  # ratio key -> (comparison, target, text)
    "of_triad": (">=", 0.50, "sparse update, large table >= 50 % of triad GB/s"),
    "vs_np_add_at": (">=", 10.0, ">= 10x np.add.at"),
    "vs_torch_index_add": (">=", 3.0, ">= 3x torch.index_add_"),
    "vs_torch_index_put": (">=", None, "(no goal) vs torch.index_put_(accumulate=True)"),
    "vs_embedding_sgd": (">=", 3.5, ">= 3.5x nn.Embedding(sparse) + SGD.step"),
    "staleness_aware_cost": ("<=", 1.15, "staleness-aware <= 1.15x plain per row"),
    "dc_asgd_cost": ("<=", 1.15, "DC-ASGD <= 1.15x plain per row"),
    "gap_aware_cost": ("<=", 1.15, "Gap-Aware <= 1.15x plain (bytes floor 1.67x: V rows)"),
    "density_topk_cost": ("<=", None, "(no goal) top-10% filter + update vs update"),
    "batch256_of_4096": (">=", 0.85, "batch 256 >= 85 % of batch 4096 rows/s"),
}


@njit(cache=True, nogil=True)
def _triad(a, b, c, s):
    for i in range(a.shape[0]):
        a[i] = b[i] + s * c[i]


class _Bench:
    """One timed operation: ``fn(i)`` does call ``i``; ``rows`` rows per call."""

    def __init__(self, name, fn, rows, target_s):
        self.name, self.fn, self.rows = name, fn, rows
        self.calls = 0
        self.per_call = []
        fn(0)                                   # warm: compile, first touch
        t = time.perf_counter()
        fn(1)
        once = max(time.perf_counter() - t, 1e-7)
        self.n = max(1, int(target_s / once))
        self.i = 2

    def round(self):
        fn, i0, n = self.fn, self.i, self.n
        t = time.perf_counter()
        for i in range(i0, i0 + n):
            fn(i)
        dt = time.perf_counter() - t
        self.i += n
        self.per_call.append(dt / n)

    def median_call_s(self):
        return statistics.median(self.per_call)


def _slices(pool, b):
    """A function i -> the i-th fresh batch of b indices from the pool."""
    span = (pool.shape[0] // b) * b

    def batch(i):
        lo = (i * b) % span
        return pool[lo:lo + b]
    return batch


def run(quick=False, rounds=None) -> dict:
    import torch

    torch.set_num_threads(1)
    rounds = rounds or (3 if quick else 7)
    target = 0.04 if quick else 0.15
    rng = np.random.default_rng(0)
    n_large, n_cache = 1_000_000, 10_000
    n_triad = (1 << 23) if quick else (1 << 25)       # 64 MB / 256 MB per array
    lr = 0.01

    a = np.empty(n_triad)
    b = np.full(n_triad, 1.0)
    c = np.full(n_triad, 2.0)
    W = np.full((n_large, D), 0.5, np.float32)         # touched: no lazy pages later
    Wc = np.full((n_cache, D), 0.5, np.float32)
    V = np.full((n_large, D), 0.25, np.float32)
    M0 = np.empty((0, 0), np.float32)
    pool = rng.integers(0, n_large, POOL, dtype=np.int64)
    pool_c = rng.integers(0, n_cache, POOL, dtype=np.int64)
    G = {bs: rng.standard_normal((bs, D), dtype=np.float32) * 1e-3 for bs in (256, 4096)}
    R4096 = W[pool[:4096]] + rng.standard_normal((4096, D), dtype=np.float32) * 1e-3
    empty_rows, empty_g = np.zeros(0, np.int64), np.zeros((0, D), np.float32)

    Wt = torch.from_numpy(W)
    emb = torch.nn.Embedding(n_large, D, sparse=True, _weight=Wt)
    opt = torch.optim.SGD(emb.parameters(), lr=lr)
    Gt = torch.from_numpy(G[4096])

    b256, b4096 = _slices(pool, 256), _slices(pool, 4096)
    c256, c4096 = _slices(pool_c, 256), _slices(pool_c, 4096)
    g256, g4096 = G[256], G[4096]
    sgd_rows = sparse.sgd_rows

    def topk_then_update(i):
        x = g4096.copy()
        flat = x.reshape(-1)
        mask = np.empty(flat.shape[0], np.bool_)
        density.topk_mask(flat, flat.shape[0] // 10, mask)
        density.drop_flat(flat, mask)
        sgd_rows(W, b4096(i), x, lr)

    def embedding_step(i):
        idx = torch.from_numpy(b4096(i))
        emb.weight.grad = torch.sparse_coo_tensor(idx[None], Gt, (n_large, D),
                                                  check_invariants=False)
        opt.step()

    specs = [
        ("triad", lambda i: _triad(a, b, c, 3.0), 0),
        ("sparse_large_b4096", lambda i: sgd_rows(W, b4096(i), g4096, lr), 4096),
        ("sparse_large_b256", lambda i: sgd_rows(W, b256(i), g256, lr), 256),
        ("sparse_cache_b4096", lambda i: sgd_rows(Wc, c4096(i), g4096, lr), 4096),
        ("sparse_cache_b256", lambda i: sgd_rows(Wc, c256(i), g256, lr), 256),
        ("np_add_at", lambda i: np.add.at(W, b4096(i), g4096), 4096),
        ("torch_index_add", lambda i: Wt.index_add_(0, torch.from_numpy(b4096(i)), Gt,
                                                    alpha=-lr), 4096),
        ("torch_index_put", lambda i: Wt.index_put_((torch.from_numpy(b4096(i)),), Gt,
                                                    accumulate=True), 4096),
        ("embedding_sgd", embedding_step, 4096),
        ("staleness_aware", lambda i: delayed.staleness_aware_rows(
            W, b4096(i), g4096, lr, 3), 4096),
        ("dc_asgd", lambda i: delayed.dc_rows(W, b4096(i), g4096, R4096, lr, 0.04), 4096),
        ("gap_aware", lambda i: delayed.gap_aware_rows(
            W, M0, V, b4096(i), g4096, R4096, lr, 0.0, 0.999, lr, 10), 4096),
        ("density_topk", topk_then_update, 4096),
        ("overhead", lambda i: sgd_rows(W, empty_rows, empty_g, lr), 0),
    ]
    with torch.no_grad():
        benches = [_Bench(name, fn, rows, target) for name, fn, rows in specs]
        for _ in range(rounds):
            for bench in benches:
                bench.round()

    raw = {}
    for bench in benches:
        s = bench.median_call_s()
        entry = {"us_per_call": s * 1e6, "rounds": [x * 1e6 for x in bench.per_call]}
        if bench.rows:
            entry["rows_per_s"] = bench.rows / s
            entry["gb_per_s"] = bench.rows * ROW_BYTES / s / 1e9
            entry["ns_per_row"] = s / bench.rows * 1e9
        raw[bench.name] = entry
    raw["triad"]["gb_per_s"] = n_triad * TRIAD_BYTES / (raw["triad"]["us_per_call"] * 1e-6) / 1e9

    plain = raw["sparse_large_b4096"]
    ratios = {
        "of_triad": plain["gb_per_s"] / raw["triad"]["gb_per_s"],
        "vs_np_add_at": plain["rows_per_s"] / raw["np_add_at"]["rows_per_s"],
        "vs_torch_index_add": plain["rows_per_s"] / raw["torch_index_add"]["rows_per_s"],
        "vs_torch_index_put": plain["rows_per_s"] / raw["torch_index_put"]["rows_per_s"],
        "vs_embedding_sgd": plain["rows_per_s"] / raw["embedding_sgd"]["rows_per_s"],
        "staleness_aware_cost": raw["staleness_aware"]["ns_per_row"] / plain["ns_per_row"],
        "dc_asgd_cost": raw["dc_asgd"]["ns_per_row"] / plain["ns_per_row"],
        "gap_aware_cost": raw["gap_aware"]["ns_per_row"] / plain["ns_per_row"],
        "density_topk_cost": raw["density_topk"]["ns_per_row"] / plain["ns_per_row"],
        "batch256_of_4096": raw["sparse_large_b256"]["rows_per_s"] / plain["rows_per_s"],
    }
    goals = {}
    for key, (op, target_v, _) in GOALS.items():
        if target_v is not None:
            goals[key] = bool(ratios[key] >= target_v if op == ">=" else ratios[key] <= target_v)
    return {
        "scenario": "kernels", "quick": bool(quick), "rounds": rounds,
        "table_rows": {"large": n_large, "cache": n_cache, "d": D, "dtype": "float32"},
        "triad_elements": n_triad, "bytes_counted": {
            "triad_per_element": TRIAD_BYTES, "sparse_per_row": ROW_BYTES,
            "gap_aware_per_row_actual": ROW_BYTES + 512},
        "threads": {"torch": torch.get_num_threads(), "numba": "serial kernels"},
        "raw": raw, "ratios": ratios, "goals_met": goals,
    }


def format_table(result) -> str:
    raw, ratios = result["raw"], result["ratios"]
    lines = [f"kernels benchmark ({'quick' if result['quick'] else 'full'}, "
             f"median of {result['rounds']} rounds, 1 thread)",
             f"{'operation':<22}{'us/call':>10}{'Mrows/s':>10}{'GB/s':>8}"]
    for name, e in raw.items():
        rows = f"{e['rows_per_s'] / 1e6:10.2f}" if "rows_per_s" in e else f"{'':>10}"
        gbs = f"{e['gb_per_s']:8.2f}" if "gb_per_s" in e else f"{'':>8}"
        lines.append(f"{name:<22}{e['us_per_call']:10.2f}{rows}{gbs}")
    lines.append("")
    lines.append(f"{'ratio':<22}{'value':>8}  goal")
    for key, value in ratios.items():
        op, target, text = GOALS[key]
        met = result["goals_met"].get(key)
        mark = "" if met is None else ("  met" if met else "  NOT met")
        lines.append(f"{key:<22}{value:8.2f}  {text}{mark}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="hogkit.benchmarks.kernels",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run (< 30 s)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    args = ap.parse_args(argv)
    result = run(quick=args.quick, rounds=args.rounds)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
