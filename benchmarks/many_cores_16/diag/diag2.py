"""Where the worker's rate goes on the device: the same kernel in the parent, in a
spawned child (private and shared-memory factors), and hogkit's 1-worker run."""
import multiprocessing as mp, os, statistics, time, numpy as np
import hogkit

def setup():
    from hogkit import workloads
    wl = workloads.get("mf", preset="default")
    params, data = wl.build(0)
    return params["P"], params["Q"], data["u"], data["i"], data["r"]

def kernel_rounds(tag, shm, rounds=5):
    from multiprocessing import shared_memory
    from hogkit.benchmarks.peers import plain_mf_epoch
    from hogkit.benchmarks.lane import _aligned_copy
    from hogkit.kernels.mf import _sgd_span_plain
    P0, Q0, u, i, r = setup(); n = len(r); lr = 0.05
    segs = []
    def cp(a):
        if not shm: return _aligned_copy(a)
        s = shared_memory.SharedMemory(create=True, size=a.nbytes); segs.append(s)
        o = np.ndarray(a.shape, a.dtype, buffer=s.buf); o[...] = a; return o
    out = {"plain": [], "lane": []}
    for _ in range(rounds):
        for k in out:
            p, q = cp(P0), cp(Q0)
            t = time.perf_counter()
            if k == "plain": plain_mf_epoch(p, q, u, i, r, lr)
            else: _sgd_span_plain(p, q, u, i, r, 0, n, 0, 0, np.float32(lr), np.float32(0), np.float32(1e17), True)
            out[k].append(n / (time.perf_counter() - t) / 1e6)
            del p, q
    for s in segs: s.close(); s.unlink()
    print(f"{tag:28s} cpu {os.sched_getaffinity(0).__len__()} " + "  ".join(
        f"{k} {statistics.median(v):.1f} M/s [{min(v):.1f}-{max(v):.1f}]" for k, v in out.items()), flush=True)

def child(shm):
    kernel_rounds(f"child pid {os.getpid()} shm={shm}", shm)

if __name__ == "__main__":
    for f in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/shmem_enabled"):
        print(f, open(f).read().strip())
    kernel_rounds("parent private (warm)", False, 2)
    ctx = mp.get_context("spawn")
    from hogkit.engine.runtime import train
    from hogkit.rules.core import SGD
    from hogkit import workloads
    wl = workloads.get("mf", preset="default")
    for rnd in range(2):
        kernel_rounds(f"parent private r{rnd}", False)
        for shm in (False, True):
            p = ctx.Process(target=child, args=(shm,)); p.start(); p.join()
        got = []
        for _ in range(3):
            run = train(wl, workers=1, engine=hogkit.Engine("compiled", lane="sample"),
                        outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                        seconds=2.0, rule=SGD(0.05), batch=256)
            got.append(run.extra["samples"] / run.wall_s / 1e6)
        print(f"hogkit train 1w r{rnd}: " + ", ".join(f"{g:.1f}" for g in got) + " M/s", flush=True)
