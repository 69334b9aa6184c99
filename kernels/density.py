"""Update-density kernels: choose which entries of an update are sent, keep the rest.

A filter runs in three steps on a flat C-contiguous view ``x`` of the update:

1. fold the residual in (``fold_flat`` for dense updates, ``fold_rows`` for sparse
   rows); skipped when the unsent part is dropped;
2. build a boolean ``mask`` of the entries to send: ``topk_mask`` (exactly ``k``
   largest ``|x|``, ties broken by position), ``threshold_mask`` (``|x| > t``) or
   ``random_mask`` (exactly ``k`` entries, uniform, from an explicit seed);
3. split: sent entries stay in ``x``, unsent ones are zeroed in ``x`` and, in
   residual mode, added to the residual (``split_flat``, ``split_rows``; ``drop_flat``
   when they are dropped).

Mass is conserved exactly in residual mode: each entry of the folded update ends up
either in the sent update or in the residual, never both, never altered.
"""

import numpy as np
from numba import njit

from ._intrinsics import FASTMATH, uint_bits


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def fold_flat(g, r, x):
    """``x = g + r`` (the residual ``r`` is left as is; ``split_flat`` rewrites it)."""
    for i in range(x.shape[0]):
        x[i] = g[i] + r[i]


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def fold_rows(G, rows, R, X):
    """``X[i] = G[i] + R[rows[i]]`` then ``R[rows[i]] = 0``, in batch order.

    A duplicated row takes its residual at its first occurrence only (later ones
    find zeros), so the residual is counted once.
    """
    d = X.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(d):
            X[i, j] = G[i, j] + R[r, j]
            R[r, j] = 0


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _radix_kth(keys, m, r, nbits):
    """The ``r``-th largest (1 <= r <= m) of ``keys[:m]``, int64 in ``[0, 2**nbits)``.

    MSD radix select, 8 bits a pass from the top: a histogram of the next digit of
    the keys still in play, the digit holding the r-th largest, then a branch-free
    compaction of those keys to the front of ``keys`` (overwritten). No comparison
    branches, so no branch misses (a quickselect on random data misses about every
    other comparison and costs ~8 ns an element here); ties cost nothing extra.
    """
    hist = np.empty(256, np.int64)
    prefix = 0
    shift = nbits
    while shift > 0:
        s = max(shift - 8, 0)
        nb = 1 << (shift - s)
        dm = nb - 1
        for q in range(nb):
            hist[q] = 0
        for i in range(m):
            hist[(keys[i] >> s) & dm] += 1
        dgt = dm
        c = 0
        while c + hist[dgt] < r:
            c += hist[dgt]
            dgt -= 1
        r -= c
        nm = 0
        for i in range(m):
            kk = keys[i]
            keys[nm] = kk
            nm += ((kk >> s) & dm) == dgt
        m = nm
        prefix = (prefix << (shift - s)) | dgt
        shift = s
    return prefix


_SAMPLE = 4096          # topk_mask: sample size for the bracket of the k-th magnitude


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def _kth_largest_key(xu, k):
    """``(t, gt, eq)``: ``t`` the k-th largest magnitude key (1 <= k <= n) of the
    float bits ``xu`` (``uint_bits(x)``, w bits), i.e. the bits of the k-th largest
    ``|x|`` with the sign cleared, as an int64; ``gt`` and ``eq`` the number of keys
    above and equal to ``t``.

    A strided sample of ``_SAMPLE`` keys gives a bracket ``[lo, hi]`` that holds the
    k-th largest with high probability (the sample ranks ``k/n * m -+ (3 sigma + 2)``,
    by ``_radix_kth``). A vectorised pass counts the keys above ``hi`` and inside the
    bracket; if the k-th largest is inside (the counts say so, exactly), a
    branch-free pass copies the keys inside (a few % of n) to a scratch and
    ``_radix_kth`` finds the answer among them; if not, the bracket becomes every
    key: the same answer, slower. Deterministic (the sample is fixed by n and the
    data). Bracket tests are one unsigned compare: ``key - lo <= hi - lo``.
    """
    n = xu.shape[0]
    nbits = xu.itemsize * 8 - 1
    T = xu.dtype.type
    one = T(1)
    mx = (one << T(nbits)) - one              # clears the sign bit
    lo = 0
    hi = (1 << nbits) - 1                     # int64 (wraps to 2**63 - 1 at 64 bits)
    if n > 4 * _SAMPLE:
        m = _SAMPLE
        stride = n // m
        smp = np.empty(m, np.int64)
        q = k / n
        kr = q * m                            # expected rank from the top in the sample
        dev = 3.0 * np.sqrt(m * q * (1.0 - q)) + 2.0
        top = int(kr - dev)                   # sample rank (from the top) of hi ...
        bot = int(kr + dev) + 1               # ... and of lo
        if bot <= m:
            for i in range(m):
                smp[i] = xu[i * stride] & mx
            lo = _radix_kth(smp, m, bot, nbits)
        if top >= 1:
            for i in range(m):
                smp[i] = xu[i * stride] & mx
            hi = _radix_kth(smp, m, top, nbits)
    while True:
        lt = T(lo)
        ht = T(hi)
        wt = T(hi - lo)
        above = 0
        inside = 0
        for i in range(n):
            kk = xu[i] & mx
            above += kk > ht
            inside += (kk - lt) <= wt
        if above < k <= above + inside:
            break
        lo = 0                                # missed: every key is a candidate
        hi = (1 << nbits) - 1
    cu = np.empty(n, xu.dtype)
    nc = 0
    for i in range(n):                        # branch-free compaction
        kk = xu[i] & mx
        cu[nc] = kk
        nc += (kk - lt) <= wt
    cand = np.empty(nc, np.int64)
    for i in range(nc):
        cand[i] = cu[i]
    t = _radix_kth(cand, nc, k - above, nbits)
    tt = T(t)
    gt = above                                # entries above t, and at t
    eq = 0
    for i in range(nc):
        gt += cu[i] > tt
        eq += cu[i] == tt
    return t, gt, eq


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def topk_mask(x, k, mask):
    """``mask[i] = True`` for exactly ``min(k, n)`` entries of largest ``|x[i]|``.

    Ties at the k-th magnitude go to the lowest positions. Returns the count set.

    O(n), no sort and no ``np.partition``: on the unsigned-integer view of the
    floats (``|x|`` orders like its bits with the sign bit cleared; -0.0 ties with
    0.0), ``_kth_largest_key`` finds the k-th largest magnitude ``t`` (sampled
    bracket + radix select, which also counts the entries above and at ``t``); one
    vectorised pass sets ``mask = |x| >= t``; only when more entries tie at ``t`` than places
    are left, a second pass clears the surplus ties from the highest positions
    down. A NaN ranks above every number (by its bits); the guard keeps NaN out
    before this runs.
    """
    n = x.shape[0]
    if k >= n:
        for i in range(n):
            mask[i] = True
        return n
    if k <= 0:
        for i in range(n):
            mask[i] = False
        return 0
    xu = uint_bits(x)
    T = xu.dtype.type
    one = T(1)
    mx = (one << T(xu.itemsize * 8 - 1)) - one
    tk, gt, eq = _kth_largest_key(xu, k)
    t = T(tk)
    for i in range(n):
        mask[i] = (xu[i] & mx) >= t
    extra = gt + eq - k                       # tied entries beyond the k-th place
    i = n - 1
    while extra > 0:
        if mask[i] and (xu[i] & mx) == t:
            mask[i] = False
            extra -= 1
        i -= 1
    return k


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def threshold_mask(x, t, mask):
    """``mask[i] = |x[i]| > t``. Returns the count set."""
    c = x.dtype.type(t)
    count = 0
    for i in range(x.shape[0]):
        keep = abs(x[i]) > c
        mask[i] = keep
        if keep:
            count += 1
    return count


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def random_mask(n, k, seed, mask):
    """Exactly ``min(k, n)`` of ``n`` positions, uniformly, by selection sampling
    (Knuth, TAOCP vol. 2, Algorithm S) driven by a Park-Miller ``minstd`` generator
    started from ``seed`` (an int in [1, 2**31 - 2]). Deterministic given ``seed``,
    identical with and without JIT (int64 arithmetic that never overflows).
    Returns the count set.
    """
    modulus = 2147483647
    s = seed % modulus
    if s <= 0:
        s += modulus - 1
    for _ in range(4):                 # decorrelate nearby seeds
        s = (s * 48271) % modulus
    need = min(k, n)
    for i in range(n):
        if need == 0:
            mask[i] = False
            continue
        s = (s * 48271) % modulus
        u = s / modulus                # in (0, 1)
        if (n - i) * u < need:
            mask[i] = True
            need -= 1
        else:
            mask[i] = False
    return min(k, n)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def drop_flat(x, mask):
    """Zero the unsent entries of ``x`` (they are lost)."""
    zero = x.dtype.type(0)
    for i in range(x.shape[0]):
        x[i] = x[i] if mask[i] else zero      # a select, so the loop vectorises


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def split_flat(x, mask, r):
    """Dense residual split: ``r[i] = x[i]`` and ``x[i] = 0`` where unsent, else
    ``r[i] = 0`` (``x`` holds the folded ``g + r_old``)."""
    zero = x.dtype.type(0)
    for i in range(x.shape[0]):               # selects, so the loop vectorises
        xi = x[i]
        keep = mask[i]
        r[i] = zero if keep else xi
        x[i] = xi if keep else zero


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def split_rows(X, rows, mask, R):
    """Sparse residual split: unsent ``X[i, j]`` is added to ``R[rows[i], j]`` and
    zeroed in ``X``; ``mask`` is the flat (b*d) mask of ``X``."""
    d = X.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        base = i * d
        for j in range(d):
            if not mask[base + j]:
                R[r, j] += X[i, j]
                X[i, j] = 0


# --- the whole filter of one parameter's rows (Python's Density and the step core) ----

NONE, TOPK, THRESHOLD, RANDOM = 0, 1, 2, 3
_MINSTD = 2147483647


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def keep_count(fraction, n):
    """``k = ceil(fraction·n)`` entries to send (at least one of a non-empty update)."""
    if n == 0:
        return 0
    k = int(np.ceil(fraction * n - 1e-9 * n))
    return min(n, max(1, k))


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def mask_seed(seed, step, pos):
    """A minstd seed in [1, 2**31 - 2] from (seed, step, position of the parameter)::

        (seed·0x9E3779B1 + step·0x85EBCA77 + pos·0xC2B2AE3D + 0x27D4EB2F) mod (2**31 - 2) + 1

    computed term by term modulo m (every product < 2**63), so it equals the Python
    big-int value exactly."""
    m = _MINSTD - 1
    h = (seed % m) * (0x9E3779B1 % m) % m
    h = (h + (step % m) * (0x85EBCA77 % m)) % m
    h = (h + (pos % m) * (0xC2B2AE3D % m)) % m
    h = (h + 0x27D4EB2F % m) % m
    return h + 1


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def hold_rows(R, rows, G, n):
    """A held-back step (temporal density) in residual mode: its first ``n`` rows join
    the residual, ``R[rows[i]] += G[i]`` for i < n in batch order (duplicates add up,
    as ``np.add.at``)."""
    d = R.shape[1]
    for i in range(n):
        r = rows[i]
        for j in range(d):
            R[r, j] += G[i, j]


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def filter_rows(how, fraction, threshold, residual, seed, step, pos, R, rows, G, n, mask):
    """Thin the first ``n`` rows of ``G`` in place to what is sent (``how``: TOPK keeps
    ``keep_count(fraction, n·d)`` entries of largest magnitude, THRESHOLD those above
    ``threshold``, RANDOM a uniform ``keep_count`` from ``mask_seed(seed, step, pos)``).
    In residual mode the residual ``R`` is folded in first and absorbs the unsent part;
    else the unsent part is dropped. ``mask`` needs room for ``n·d`` booleans. Returns
    the number of entries sent. Temporal density is the caller's: on a held-back step
    it calls :func:`hold_rows` (residual mode) instead."""
    d = G.shape[1]
    total = n * d
    if residual:
        fold_rows(G[:n], rows[:n], R, G[:n])
    flat = G[:n].reshape(total)
    m = mask[:total]
    if how == TOPK:
        sent = topk_mask(flat, keep_count(fraction, total), m)
    elif how == THRESHOLD:
        sent = threshold_mask(flat, threshold, m)
    else:
        sent = random_mask(total, keep_count(fraction, total), mask_seed(seed, step, pos), m)
    if residual:
        split_rows(G[:n], rows[:n], m, R)
    else:
        drop_flat(flat, m)
    return sent
