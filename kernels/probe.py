"""How long a 64-byte cache line takes to pass from one core to another.

Two threads, each on its own CPU, pass one integer back and forth: side 0 waits for
an even value and writes the next odd one, side 1 the reverse. Each hand-over moves
the line holding it from one core's cache to the other's, so the time per hand-over is
what a write to a line another core has just written costs: the price every Hogwild!
worker pays on the rows its peers write too: tens of ns between two cores under one
shared cache, well over a hundred between chiplets or sockets; a virtual machine's host
may move its vCPUs from one to the other while it runs (``hogkit.doctor``).
"""

from numba import njit

from ._intrinsics import load_acquire, monotonic_ns, store_release

#: spins between two reads of the clock while waiting (the deadline check)
_CHECK_EVERY = 1024


@njit(cache=True, nogil=True, fastmath=False)
def line_pingpong(flag, side, rounds, warm, deadline_ns):
    """Side ``side`` (0 or 1) of ``rounds`` round trips on ``flag[0]`` (0 at the start;
    both sides called at once, each from its own thread). Returns the ns side 0 saw
    from the hand-over of round ``warm`` to the last one's, over ``2 * (rounds - 1 -
    warm)`` hand-overs (the warm rounds leave out the other thread's start); side 1
    returns 0. -1 when ``deadline_ns`` (``monotonic_ns``) passed first (the other side
    never came) or ``flag[0]`` turned negative (the other side's caller gave up)."""
    t0 = 0
    t1 = 0
    for i in range(rounds):
        want = 2 * i + side
        n = 0
        while True:
            v = load_acquire(flag, 0)
            if v == want:
                break
            if v < 0:
                return -1
            n += 1
            if n == _CHECK_EVERY:
                n = 0
                if monotonic_ns() > deadline_ns:
                    return -1
        if i == warm:
            t0 = monotonic_ns()
        if i == rounds - 1:
            t1 = monotonic_ns()
        store_release(flag, 0, want + 1)
    return t1 - t0 if side == 0 else 0
