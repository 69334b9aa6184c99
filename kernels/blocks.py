"""The block order of matrix factorisation: workers take blocks no other worker holds.

FPSG (Chin, Zhuang, Juan & Lin, "A fast parallel stochastic gradient method for matrix
factorization in shared memory systems", ACM TIST 2015 / RecSys 2013; LIBMF's
scheduler), after DSGD (Gemulla et al., KDD 2011): the rating matrix is cut into a
``G x G`` grid of blocks (row-block ``rb`` holds the rows ``u`` with ``u*G // n_rows ==
rb``, column-block ``cb`` likewise), the ratings are stored grouped by block (block
``b = rb*G + cb`` is ``off[b]:off[b+1]`` of the data, in the order ``build`` shuffled,
so a block is read sequentially), and a worker updates only the ratings of a block it
*holds*: no other worker holds a block of the same row-block or column-block, so two
workers never write the same row of P or of Q while both hold blocks (Hogwild!'s row
conflicts are gone, and a worker's rows stay in its cache for a whole block).

**Scheduler** (lock-free, in an int64 array ``sched`` that every worker process maps
writeable; the layout below): one *held* word per row-block and per column-block
(0: free, else ``b + 1``: the block that holds it, each on its own cache line) and per
block a count of completed passes. A worker whose block is used up claims a free block
(both its words free, or held by the worker's own previous block) with the fewest
completed passes, ties broken at random (a scan from a hashed start), as FPSG's
scheduler does: the row word, then the column word, each by compare-and-swap
(:func:`~._intrinsics.cas`); a failed column CAS gives the row back. Nobody ever waits
while holding a word, so there is no deadlock, and a block is held only when both CASes
succeeded, so no two workers hold one row-block or column-block.

**Hold, release and the batch.** A step's batch is ``nb`` consecutive ratings of the
held block. When the block runs out inside a batch, its pass count goes up, the rest of
the batch comes from a newly claimed block, and the old block stays held (its words
handed over to the new block where they coincide) until the worker's *next* sample:
its last ratings are applied in this step, so no one else may take its rows before
then. A block used up at the end of a batch is released at the next sample too. (A
block smaller than a batch is released as soon as a second block runs out in the same
batch.) A worker thus holds at most two blocks, and only across one step.

**Pass.** One pass is ``n`` consecutive samples of one worker (``n`` ratings in all)
from a start holding nothing: with one worker, every claim finds every block free, the
fewest-passes rule visits every non-empty block once before any block twice, and each
block is read from its first rating to its last, so every pass holds every rating
exactly once (tests/test_blocks.py). With several workers, each on a core of its own,
the passes of the blocks stay within a few of one another, as in FPSG. A worker
descheduled while it holds a block keeps that block's row- and column-blocks from the
others meanwhile, so on an oversubscribed machine (more runnable processes than cores)
those blocks can fall many passes behind the rest.

**Fallback.** When no block can be claimed after :data:`CLAIM_TRIES` scans (every free
block's row or column is held: more workers than the grid allows, or racing claimers),
the rest of the batch is the plain next ratings in storage order (the sweep) from the
worker's position, and the fallback count goes up by one (``sched[FALLBACKS]``).

**The worker's state** is its sampler cursor, one int64: bits 0-35 the position in the
stored ratings, bits 36-48 the slot (``b + 1``) of the block being read, bits 49-61
the slot of the previous block still held (0: none). A cursor from a fresh context is
a position with no slot. A cursor that names a block whose words do not name it (a
resumed run's fresh scheduler) drops it and claims anew; one whose words name it is
taken as still holding it (a restarted worker goes on with the block it published; a
block a killed worker held that its last published cursor does not name stays held).

Pure functions on arrays; nothing here imports hogkit.
"""

import numpy as np
from numba import njit

from ._intrinsics import FASTMATH, cas, sched_yield

#: ``sched`` layout: a header line, then the held words (one cache line each: row-block
#: ``rb`` at ``HELD + LINE*rb``, column-block ``cb`` at ``HELD + LINE*(G + cb)``), then
#: the passes of block ``b`` at ``HELD + 2*LINE*G + b``
GRID = 0            # G, the grid side
FALLBACKS = 1       # samples calls that fell back to the sweep
CLAIMS = 2          # successful claims
HELD = 8
LINE = 8            # int64 words per 64-byte cache line

POS_BITS = 36
SLOT_BITS = 13
POS_MASK = (1 << POS_BITS) - 1
SLOT_MASK = (1 << SLOT_BITS) - 1
#: the grid side's bound: ``G*G`` block slots (``b + 1``) must fit in SLOT_BITS
MAX_GRID = 90
#: the most ratings the cursor's position can address
MAX_RATINGS = 1 << POS_BITS
#: scans of the grid before a sample falls back to the sweep
CLAIM_TRIES = 4


def sched_size(grid):
    """Words of the scheduler array for a ``grid x grid`` block grid."""
    return HELD + 2 * LINE * grid + grid * grid


def new_sched(grid):
    """A scheduler array with every block free and no pass done."""
    s = np.zeros(sched_size(grid), np.int64)
    s[GRID] = grid
    return s


def block_layout(u, i, n_rows, n_cols, grid):
    """``(order, off)``: ``order`` sorts the ratings by block, stably (the order within
    a block is the stored order: ``build``'s shuffle), and ``off`` (int64, ``G*G + 1``)
    gives block ``b`` the ratings ``off[b]:off[b+1]`` of the sorted data."""
    key = block_keys(u, i, n_rows, n_cols, grid)
    order = np.argsort(key, kind="stable")
    off = np.zeros(grid * grid + 1, np.int64)
    np.cumsum(np.bincount(key, minlength=grid * grid), out=off[1:])
    return order, off


def block_keys(u, i, n_rows, n_cols, grid):
    """The block ``(u*G // n_rows) * G + i*G // n_cols`` of each rating (int64)."""
    rb = (np.asarray(u, np.int64) * grid) // n_rows
    cb = (np.asarray(i, np.int64) * grid) // n_cols
    return rb * grid + cb


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def layout_error(u, i, off, n_rows, n_cols, grid):
    """The first rating stored outside its block's range ``off[b]:off[b+1]``, or -1
    when every rating lies in its block (``off`` must be non-decreasing, from 0 to
    ``len(u)``; the caller checks that)."""
    b = 0
    for t in range(u.shape[0]):
        while b < grid * grid and off[b + 1] <= t:
            b += 1
        want = (np.int64(u[t]) * grid // n_rows) * grid + np.int64(i[t]) * grid // n_cols
        if want != b:
            return t
    return -1


@njit(cache=True, nogil=True, inline="always")
def _mix(x):
    """A 31-bit integer hash of the non-negative ``x`` (xor-shift-multiply rounds with
    0x45d9f3b, masked so that no product overflows: the same numbers compiled and
    interpreted): the tie-break's scan start."""
    x = (x ^ (x >> 31)) & 0x7FFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0x7FFFFFFF
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0x7FFFFFFF
    return x ^ (x >> 16)


@njit(cache=True, nogil=True, inline="always")
def fetch_add(A, j, d):
    """``A[j] += d`` atomically (a CAS loop); returns the old value."""
    while True:
        old = A[j]
        if cas(A, j, old, old + d) == old:
            return old


@njit(cache=True, nogil=True, inline="always")
def _words(G, b):
    """The held words of block ``b``: (row-block's, column-block's)."""
    return HELD + LINE * (b // G), HELD + LINE * (G + b % G)


@njit(cache=True, nogil=True, inline="always")
def release(sched, slot):
    """Free the words that still name block slot ``slot`` (``b + 1``; 0: nothing)."""
    if slot != 0:
        rw, cw = _words(sched[GRID], slot - 1)
        cas(sched, cw, slot, 0)
        cas(sched, rw, slot, 0)


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def claim(off, sched, mine, seed):
    """Claim a free non-empty block with the fewest completed passes: returns it, its
    two words set to its slot ``b + 1``, or -1 after :data:`CLAIM_TRIES` failed scans.
    Words that hold ``mine`` (the caller's previous block's slot; 0: none) count as
    free and are handed over. ``seed`` picks where the scan starts (the tie-break)."""
    G = sched[GRID]
    nblk = G * G
    pas = HELD + 2 * LINE * G
    for attempt in range(CLAIM_TRIES):
        b = _mix(seed + attempt * nblk) % nblk
        best = -1
        fewest = np.int64(0x7FFFFFFFFFFFFFFF)
        for _ in range(nblk):
            if off[b + 1] > off[b]:
                rw, cw = _words(G, b)
                hr = sched[rw]
                hc = sched[cw]
                if (hr == 0 or hr == mine) and (hc == 0 or hc == mine) \
                        and sched[pas + b] < fewest:
                    fewest = sched[pas + b]
                    best = b
            b = b + 1 if b + 1 < nblk else 0
        if best >= 0:
            rw, cw = _words(G, best)
            er = sched[rw]
            ec = sched[cw]
            if (er == 0 or er == mine) and (ec == 0 or ec == mine):
                if cas(sched, rw, er, best + 1) == er:
                    if cas(sched, cw, ec, best + 1) == ec:
                        fetch_add(sched, CLAIMS, 1)
                        return best
                    cas(sched, rw, best + 1, er)        # give the row word back
        sched_yield()
    return -1


@njit(cache=True, nogil=True, inline="always")
def _holds(off, sched, cur, pos):
    """The cursor's block slot ``cur`` is still this worker's: both its words name it
    and the position lies in it."""
    rw, cw = _words(sched[GRID], cur - 1)
    return (sched[rw] == cur and sched[cw] == cur and off[cur - 1] <= pos
            and pos <= off[cur])


@njit(cache=True, nogil=True, inline="always")
def block_sample(off, sched, cursor, nb, idx):
    """``idx[:nb]``: the next ``nb`` ratings of the worker's held blocks, claiming as
    the blocks run out (the module docstring), or the sweep's when no block can be
    claimed; ``cursor`` (one int64, the module docstring's encoding) is updated."""
    c = cursor[0]
    pos = c & POS_MASK
    cur = (c >> POS_BITS) & SLOT_MASK
    prev = (c >> (POS_BITS + SLOT_BITS)) & SLOT_MASK
    n = off[off.shape[0] - 1]
    if prev != cur:                     # its last ratings were applied last step
        release(sched, prev)            # (prev == cur: re-claimed, the words are cur's)
    prev = np.int64(0)                  # (a literal 0 made claim compile twice)
    if cur != 0 and not (_holds(off, sched, cur, pos) and pos < off[cur]):
        release(sched, cur)             # used up, or not ours (a resumed cursor)
        cur = 0
    j = 0
    while j < nb:
        if cur == 0:
            b = claim(off, sched, prev, c + j + pos)
            if b < 0:
                pos = _sweep(n, pos, j, nb, idx)
                fetch_add(sched, FALLBACKS, 1)
                break
            cur = b + 1
            pos = off[b]
        end = off[cur]
        take = min(nb - j, end - pos)
        for k in range(take):
            idx[j + k] = pos + k
        j += take
        pos += take
        if pos == end:                  # used up: a pass of this block is done
            sched[HELD + 2 * LINE * sched[GRID] + cur - 1] += 1
            if j < nb:                  # the batch goes on in another block
                if prev != cur:         # (re-claimed: its words are cur's)
                    release(sched, prev)
                prev = cur
                cur = 0
    cursor[0] = pos | (cur << POS_BITS) | (prev << (POS_BITS + SLOT_BITS))


@njit(cache=True, nogil=True, inline="always")
def _sweep(n, pos, j, nb, idx):
    """``idx[j:nb]`` from the stored order at ``pos`` (wrapping); the new position."""
    v = pos if pos < n else pos % n
    for k in range(j, nb):
        if v >= n:
            v -= n
        idx[k] = v
        v += 1
    return v if v < n else v - n


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def release_cursor(sched, c):
    """Free every block the cursor value ``c`` names (a context that goes away)."""
    release(sched, (c >> (POS_BITS + SLOT_BITS)) & SLOT_MASK)
    release(sched, (c >> POS_BITS) & SLOT_MASK)


def cursor_blocks(c):
    """``(block being read, previous block still held)`` of a cursor value (-1: none)."""
    c = int(c)
    return ((c >> POS_BITS) & SLOT_MASK) - 1, ((c >> (POS_BITS + SLOT_BITS)) & SLOT_MASK) - 1


def passes(sched):
    """The completed passes of every block, ``(G, G)`` (a copy)."""
    G = int(sched[GRID])
    start = HELD + 2 * LINE * G
    return sched[start:start + G * G].reshape(G, G).copy()
