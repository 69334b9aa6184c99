import time, statistics, numpy as np
from numba import njit
from hogkit import workloads
from hogkit.benchmarks.peers import plain_mf_epoch
from hogkit.benchmarks.lane import _aligned_copy
from hogkit.kernels.mf import _sgd_span_plain

FM = {"reassoc", "contract"}
def make(fm, guard):
    @njit(fastmath=fm, nogil=True)
    def f(P, Q, u, i, r, lr):
        K = P.shape[1]
        a = np.float32(lr)
        lim = np.float32(1e17)
        bad = 0
        for t in range(r.shape[0]):
            uu = u[t]; ii = i[t]
            pred = np.float32(0.0)
            for k in range(K):
                pred += P[uu, k] * Q[ii, k]
            e = pred - r[t]
            if guard and not abs(e) < lim:
                bad += 1
                continue
            ae = a * e
            for k in range(K):
                pk = P[uu, k]; qk = Q[ii, k]
                P[uu, k] = pk - ae * qk
                Q[ii, k] = qk - ae * pk
        return bad
    return f
wl = workloads.get("mf", preset="default")
params, data = wl.build(0)
P0, Q0 = params["P"], params["Q"]
u, i, r = data["u"], data["i"], data["r"]
print(P0.shape, Q0.shape, P0.dtype, u.dtype, len(r))
n = len(r)
lr = 0.05
cands = {
 "plain(fm=True)": lambda p, q: plain_mf_epoch(p, q, u, i, r, lr),
 "plain(fm=rc)": (lambda f: lambda p, q: f(p, q, u, i, r, lr))(make(FM, False)),
 "guard(fm=rc)": (lambda f: lambda p, q: f(p, q, u, i, r, lr))(make(FM, True)),
 "guard(fm=True)": (lambda f: lambda p, q: f(p, q, u, i, r, lr))(make(True, True)),
 "lane span": lambda p, q: _sgd_span_plain(p, q, u, i, r, 0, n, 0, 0, np.float32(lr), np.float32(0), np.float32(1e17), True),
}
res = {k: [] for k in cands}
for rnd in range(9):
    for k, f in cands.items():
        p, q = _aligned_copy(P0), _aligned_copy(Q0)
        f(p[:2].copy(), q[:2].copy()) if False else None
        t = time.perf_counter(); f(p, q); dt = time.perf_counter() - t
        if rnd: res[k].append(dt / n * 1e9)
base = statistics.median(res["plain(fm=True)"])
for k, v in res.items():
    m = statistics.median(v); print(f"{k:18s} {m:6.2f} ns  {m/base:.3f}x")
