"""Process bodies for the store/clocks/reader tests (spawned children import this module;
``python -m`` / ``python store_procs.py <mode>`` runs it as an outside process).

Modes as a script (stdout carries one line the test reads):
  owner <mb> [--spawn-attacher]   create a store, optionally let a spawned child attach
                                  and exit, print the segment name, then sleep (to be killed)
  attach <name>                   attach by name, add 1 to w[0], print it, exit without close
  capacity <mb>                   create a store of <mb> MiB; print a JSON report of the
                                  error and of /dev/shm afterwards (run in a 16 MiB tmpfs)
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time


def child_write(handle, name, value):
    """Attach, write ``value`` into every element of ``name``, close (unmap only)."""
    from hogkit.state.store import ParamStore
    s = ParamStore.attach(handle)
    s[name][...] = value
    s.close()


def child_attach_and_exit(handle):
    """Attach and exit without closing: must leave the segment and its owner alone."""
    from hogkit.state.store import ParamStore
    s = ParamStore.attach(handle)
    s["w"][0] += 1


def child_bind_train(handle, seed):
    """Bind a fresh module of the same architecture and take one SGD step in place."""
    import torch
    from hogkit.state.store import ParamStore
    torch.manual_seed(seed)
    model = make_module()
    store = ParamStore.attach(handle)
    store.bind(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.ones(3, 4)
    loss = model(x).pow(2).sum()
    loss.backward()
    opt.step()
    store.close()


def make_module():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def child_worker(handle, rank, steps):
    """A real worker loop on the clocks/log: read, gap, tick, commit."""
    from hogkit.state.clocks import Clocks
    from hogkit.state.reader import Reader, StalenessLog
    from hogkit.state.store import ParamStore
    s = ParamStore.attach(handle)
    v = s.views()
    clocks, log = Clocks(v), StalenessLog(v)
    reader = Reader(clocks, log, rank)
    for k in range(steps):
        reader.read()
        g = reader.gap()
        clocks.tick_update(rank)
        reader.commit(k, g)
        clocks.tick_iteration(rank)
        clocks.beat(rank)
    clocks.set_state(rank, clocks.DONE)
    del v, clocks, log, reader
    s.close()


def _owner(mb, spawn_attacher):
    import numpy as np
    from hogkit.state.store import ParamStore
    s = ParamStore.create({"w": np.zeros(int(mb * 2**20) // 4, np.float32)}, tag="faults")
    if spawn_attacher:
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=child_attach_and_exit, args=(s.handle,))
        p.start()
        p.join()
        assert p.exitcode == 0, p.exitcode
        assert s["w"][0] == 1
    print(s.name, flush=True)
    time.sleep(120)


def _attach(name):
    from hogkit.state.store import ParamStore
    s = ParamStore.attach(name)
    s["w"][0] += 1
    print(float(s["w"][0]), flush=True)
    os._exit(0)  # no atexit, no close: the harshest clean exit


def _capacity(mb):
    import numpy as np
    from hogkit.errors import ShmCapacityError
    from hogkit.state.store import ParamStore
    out = {"free": None, "error": None, "errno": None, "left": None, "small_ok": False}
    st = os.statvfs("/dev/shm")
    out["free"] = st.f_bavail * st.f_frsize
    with ParamStore.create({"a": np.ones(2**20 // 4, np.float32)}, tag="small") as small:
        out["small_ok"] = bool(small["a"].sum() == 2**18)
    try:
        ParamStore.create({"w": ((int(mb * 2**20) // 8,), np.float64)}, tag="big")
    except ShmCapacityError as e:
        out["error"] = str(e)
        out["errno"] = e.errno
    out["left"] = sorted(n for n in os.listdir("/dev/shm") if n.startswith("hogkit_"))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "owner":
        _owner(float(sys.argv[2]), "--spawn-attacher" in sys.argv)
    elif mode == "attach":
        _attach(sys.argv[2])
    elif mode == "capacity":
        _capacity(float(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
