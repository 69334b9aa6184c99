"""Live child processes of a pid (hogkit.procfs: read from /proc, no psutil), and the
hogkit segments in /dev/shm that this test process answers for."""

import os

from hogkit.procfs import children, parent

__all__ = ["children", "own_segments"]

SHM = "/dev/shm"


def _answers_for(pid):
    """True unless ``pid`` is a live process outside this process's tree: a segment
    named for it belongs to another test process (``pytest -n``: the suite runs in
    several) or to its workers. A gone process's segment is this test's business: no
    one is left to remove it."""
    me, p = os.getpid(), pid
    for _ in range(64):
        if p == me:
            return True
        up = parent(p)
        if up is None:
            return p == pid           # the named process is gone; an ancestor is not ours
        if up <= 1:
            return False
        p = up
    return False


def own_segments():
    """The ``hogkit_<pid>_...`` segments in /dev/shm named for this process, for one of
    its descendants (a worker, a Ray actor) or for a process that is gone: every one a
    test here could have left; not those of another live test process."""
    out = set()
    for name in os.listdir(SHM):
        if not name.startswith("hogkit_"):
            continue
        pid = name.split("_")[1]
        if not pid.isdigit() or _answers_for(int(pid)):
            out.add(name)
    return out
