import statistics
import hogkit
from hogkit import workloads
from hogkit.engine.runtime import train
from hogkit.rules.core import SGD
if __name__ == "__main__":
    wl = workloads.get("mf", preset="default")
    res = {}
    for rnd in range(2):
        for b in (256, 1024, 4096):
            run = train(wl, workers=1, engine=hogkit.Engine("compiled", lane="sample"),
                        outputs=hogkit.Outputs(eval_every=None, progress=False, keep_params=False),
                        seconds=2.0, rule=SGD(0.05), batch=b)
            res.setdefault(b, []).append(run.extra["samples"] / run.wall_s / 1e6)
    for b, v in res.items(): print(b, [round(x, 1) for x in v], round(statistics.median(v), 1))
